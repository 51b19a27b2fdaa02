// Per-token cost of the HTTP (OpenAI SSE) path against gRPC Generate on one
// live moe-worker: the same greedy request, alternating transports, timed at
// the client as the interval between the first and the last token divided by
// the tokens in between (generation itself is shared, so the difference is
// what each transport adds per streamed token).
//   http_stream_bench --grpc unix:/tmp/w.sock --http 127.0.0.1:8080
//       [--tokens 256] [--reps 9]
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/threads.h"
#include "moe/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/rpc/rpc_util.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  int tokens = 0;
  double per_token_ms = 0;
  double total_ms = 0;  // request sent -> last token received
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55};

Run Grpc(moe::v1::Inference::Stub* stub, int tokens) {
  grpc::ClientContext ctx;
  moe::v1::GenerateRequest r;
  for (int32_t id : kPrompt) r.add_prompt_token_ids(id);
  r.set_max_new_tokens(tokens);
  Run run;
  const Clock::time_point start = Clock::now();
  auto reader = stub->Generate(&ctx, r);
  moe::v1::GenerateResponse resp;
  Clock::time_point first, last;
  while (reader->Read(&resp)) {
    last = Clock::now();
    if (run.tokens++ == 0) first = last;
  }
  if (!reader->Finish().ok()) std::exit(1);
  run.total_ms = Ms(last - start);
  run.per_token_ms = run.tokens > 1 ? Ms(last - first) / (run.tokens - 1) : 0;
  return run;
}

Run Http(httplib::Client* client, int tokens) {
  nlohmann::json body = {{"prompt", kPrompt}, {"max_tokens", tokens}, {"temperature", 0},
                         {"stream", true}};
  Run run;
  Clock::time_point first, last;
  std::string pending;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const bool token = pending.compare(0, 7, "data: {") == 0 &&
                         pending.find("\"choices\":[]") > end;
      pending.erase(0, end + 2);
      if (!token) continue;
      last = Clock::now();
      if (run.tokens++ == 0) first = last;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  const Clock::time_point start = Clock::now();
  if (!client->send(req, res, err) || res.status != 200) std::exit(1);
  run.total_ms = Ms(last - start);
  run.per_token_ms = run.tokens > 1 ? Ms(last - first) / (run.tokens - 1) : 0;
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  std::string grpc_addr, http_addr;
  int tokens = 256, reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--grpc") grpc_addr = v;
    else if (k == "--http") http_addr = v;
    else if (k == "--tokens") tokens = std::atoi(v.c_str());
    else if (k == "--reps") reps = std::atoi(v.c_str());
  }
  if (grpc_addr.empty() || http_addr.empty()) {
    std::fprintf(stderr, "usage: http_stream_bench --grpc ADDR --http HOST:PORT "
                         "[--tokens N] [--reps N]\n");
    return 2;
  }
  auto stub = moe::v1::Inference::NewStub(
      moe::rpc::MakeChannel(*moe::rpc::ParseListenAddress(grpc_addr)));
  httplib::Client client(absl::StrCat("http://", http_addr));
  client.set_read_timeout(600, 0);
  Grpc(stub.get(), 8);  // warm both paths
  Http(&client, 8);
  std::vector<double> g, h, gt, ht;
  int g_tokens = 0, h_tokens = 0;
  for (int i = 0; i < reps; ++i) {
    Run a = Grpc(stub.get(), tokens);
    Run b = Http(&client, tokens);
    g.push_back(a.per_token_ms);
    h.push_back(b.per_token_ms);
    gt.push_back(a.total_ms);
    ht.push_back(b.total_ms);
    g_tokens = a.tokens;
    h_tokens = b.tokens;
  }
  const double gm = Median(g), hm = Median(h);
  std::printf("tokens/request grpc %d http %d, %d interleaved requests each\n", g_tokens,
              h_tokens, reps);
  std::printf("per streamed token (median): grpc %.4f ms  http %.4f ms  http - grpc %+.4f ms\n",
              gm, hm, hm - gm);
  const double gtm = Median(gt), htm = Median(ht);
  std::printf("whole request (median): grpc %.3f ms  http %.3f ms  http - grpc %+.3f ms "
              "(%+.4f ms per token)\n",
              gtm, htm, htm - gtm, (htm - gtm) / std::max(1, h_tokens));
  return 0;
}
