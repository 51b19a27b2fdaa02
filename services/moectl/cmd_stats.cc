// moectl stats: the cache's and the worker's view of serving.
//   --cache ADDR   moe-cached's gRPC address: ExpertCache.GetStats per model
//                  (hit rate, stall, prefetch, residency, policy).
//   --worker ADDR  moe-worker's metrics address HOST:PORT (its
//                  --metrics-addr), or its gRPC address (unix:PATH, or a
//                  HOST:PORT that serves no /metrics: Inference.GetMetrics
//                  returns the same text): reads its metrics and prints requests,
//                  tokens, mean TTFT and TPOT (histogram sum / count) and the
//                  worker-side expert hit rate and wait. Scraping keeps one
//                  source of truth for those numbers: the same series
//                  Prometheus collects.
// Either or both. --json prints one object {"cache":[..],"worker":{..}}.
// Exit codes: 0 success, 2 bad flags, 1 an address could not be read.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "moe/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/moectl/client_channel.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"
#include "services/rpc/rpc_util.h"

namespace moe::moectl {
namespace {

using json = nlohmann::ordered_json;

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

absl::StatusOr<json> CacheStats(const FlagSet& f, const std::string& address) {
  ASSIGN_OR_RETURN(auto channel, DialService(f, address, MoeService::kCache, "--cache"));
  auto stub = v1::ExpertCache::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsResponse resp;
  RETURN_IF_ERROR(rpc::FromGrpcStatus(
      stub->GetStats(&ctx, v1::GetStatsRequest(), &resp)));
  json models = json::array();
  for (const v1::ModelStats& m : resp.models()) {
    models.push_back(json{
        {"model", m.model()},
        {"policy", m.policy()},
        {"hits", m.hits()},
        {"misses", m.misses()},
        {"hit_rate", Ratio(m.hits(), m.hits() + m.misses())},
        {"stall_seconds", m.stall_seconds()},
        {"prefetch_issued", m.prefetch_issued()},
        {"prefetch_used", m.prefetch_used()},
        {"prefetch_wasted", m.prefetch_wasted()},
        {"host_runs", m.host_runs()},
        {"miss_mode", m.miss_mode()},
        {"bytes_copied", m.bytes_copied()},
        {"resident_experts", m.resident_experts()},
        {"capacity_experts", m.capacity_experts()},
        {"eamc_entries", m.eamc_entries()}});
  }
  return models;
}

// The body of GET http://HOST:PORT/metrics.
absl::StatusOr<std::string> HttpGetMetrics(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker wants HOST:PORT, got '", host_port, "'"));
  }
  const std::string host = host_port.substr(0, colon);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), host_port.substr(colon + 1).c_str(), &hints,
                  &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host_port, "'"));
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0) {
    const timeval timeout{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  }
  const bool connected =
      fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  std::string out;
  if (connected) {
    const std::string req =
        absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
    if (::write(fd, req.data(), req.size()) ==
        static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
  }
  if (fd >= 0) ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  const bool ok_status = out.rfind("HTTP/1.1 200", 0) == 0 ||
                         out.rfind("HTTP/1.0 200", 0) == 0;
  if (!connected || body == std::string::npos || !ok_status) {
    return absl::UnavailableError(
        absl::StrCat("no metrics at http://", host_port, "/metrics"));
  }
  return out.substr(body + 4);
}

// Series (name with labels, as exposed) -> value.
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space != absl::string_view::npos &&
        absl::SimpleAtod(line.substr(space + 1), &v)) {
      samples[std::string(line.substr(0, space))] = v;
    }
  }
  return samples;
}

// The worker's metrics over gRPC (Inference.GetMetrics).
absl::StatusOr<std::string> GrpcGetMetrics(const FlagSet& f, const std::string& address) {
  ASSIGN_OR_RETURN(auto channel, DialService(f, address, MoeService::kWorker, "--worker"));
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetMetricsResponse resp;
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->GetMetrics(&ctx, v1::GetMetricsRequest(), &resp)));
  return resp.text();
}

// unix:PATH and tcp://HOST:PORT are gRPC; a HOST:PORT is tried as /metrics
// first, then as the worker's gRPC address.
absl::StatusOr<std::string> WorkerMetricsText(const FlagSet& f, const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "tcp://")) {
    return GrpcGetMetrics(f, address);
  }
  absl::StatusOr<std::string> http = HttpGetMetrics(address);
  if (http.ok() || http.status().code() == absl::StatusCode::kInvalidArgument) return http;
  absl::StatusOr<std::string> grpc = GrpcGetMetrics(f, address);
  if (grpc.ok() || grpc.status().code() == absl::StatusCode::kFailedPrecondition) return grpc;
  return absl::UnavailableError(absl::StrCat(
      http.status().message(), ", and no moe-worker gRPC service there either (",
      grpc.status().message(), ")"));
}

absl::StatusOr<json> WorkerStats(const FlagSet& f, const std::string& address) {
  ASSIGN_OR_RETURN(std::string text, WorkerMetricsText(f, address));
  std::map<std::string, double> s = ParseSamples(text);
  json requests = json::object();
  const std::string prefix = "moe_worker_requests_total{status=\"";
  for (const auto& [series, v] : s) {
    if (series.rfind(prefix, 0) == 0) {
      requests[series.substr(prefix.size(),
                             series.size() - prefix.size() - 2)] = v;
    }
  }
  const double hits = s["moe_worker_expert_hits_total"];
  const double misses = s["moe_worker_expert_misses_total"];
  return json{
      {"requests", requests},
      {"tokens_generated", s["moe_worker_tokens_generated_total"]},
      {"ttft_mean_seconds", Ratio(s["moe_worker_ttft_seconds_sum"],
                                  s["moe_worker_ttft_seconds_count"])},
      {"tpot_mean_seconds", Ratio(s["moe_worker_tpot_seconds_sum"],
                                  s["moe_worker_tpot_seconds_count"])},
      {"expert_hit_rate", Ratio(hits, hits + misses)},
      {"expert_wait_seconds", s["moe_worker_expert_wait_seconds_total"]},
      {"expert_stall_seconds", s["moe_worker_expert_stall_seconds_total"]},
      {"kv_cache_bytes", s["moe_worker_kv_cache_bytes"]},
      {"kv_preemptions", s["moe_worker_kv_preemptions_total"]},
      // Batched steps in which every sequence decoded: totals, for deltas.
      {"decode_steps", s["moe_worker_decode_step_seconds_count"]},
      {"decode_step_seconds", s["moe_worker_decode_step_seconds_sum"]},
      {"decode_step_sequences", s["moe_worker_decode_step_sequences_total"]}};
}

void PrintText(const json& cache, const json& worker) {
  for (const json& m : cache) {
    std::printf(
        "cache %s (%s): hit rate %.1f%% (%llu hits, %llu misses), stall "
        "%.3f s, prefetch %llu issued / %llu used / %llu wasted, resident "
        "%u/%u experts, %llu misses run on the host (miss mode %s), %u activation "
        "matrices learned\n",
        m["model"].get<std::string>().c_str(),
        m["policy"].get<std::string>().c_str(),
        100 * m["hit_rate"].get<double>(), m["hits"].get<unsigned long long>(),
        m["misses"].get<unsigned long long>(), m["stall_seconds"].get<double>(),
        m["prefetch_issued"].get<unsigned long long>(),
        m["prefetch_used"].get<unsigned long long>(),
        m["prefetch_wasted"].get<unsigned long long>(),
        m["resident_experts"].get<unsigned>(),
        m["capacity_experts"].get<unsigned>(), m["host_runs"].get<unsigned long long>(),
        m["miss_mode"].get<std::string>().c_str(), m["eamc_entries"].get<unsigned>());
  }
  if (worker.is_null()) return;
  std::string requests;
  for (const auto& [status, n] : worker["requests"].items()) {
    absl::StrAppend(&requests, requests.empty() ? "" : ", ", status, " ",
                    n.get<double>());
  }
  std::printf(
      "worker: requests {%s}, %.0f tokens, TTFT %.2f ms, TPOT %.3f ms, "
      "expert hit rate %.1f%%, expert wait %.3f s, stall %.3f s, KV %.0f bytes held, "
      "%.0f KV preemptions\n",
      requests.c_str(), worker["tokens_generated"].get<double>(),
      worker["ttft_mean_seconds"].get<double>() * 1e3,
      worker["tpot_mean_seconds"].get<double>() * 1e3,
      100 * worker["expert_hit_rate"].get<double>(),
      worker["expert_wait_seconds"].get<double>(),
      worker["expert_stall_seconds"].get<double>(), worker["kv_cache_bytes"].get<double>(),
      worker["kv_preemptions"].get<double>());
}

int RunStats(const Args& args) {
  FlagSet f("stats", "[--cache ADDR] [--worker ADDR] [--json]");
  f.String("cache", "", "moe-cached gRPC address (unix:PATH or HOST:PORT)");
  f.String("worker", "",
           "moe-worker's metrics HOST:PORT, or its gRPC address (unix:PATH or HOST:PORT)");
  f.Bool("json", false, "print one JSON object");
  DeclareClientSecurityFlags(f);  // for --cache, and --worker over gRPC
  absl::Status parsed = f.Parse(args);
  if (f.help()) {
    std::fputs(f.Usage().c_str(), stdout);
    return 0;
  }
  if (parsed.ok() && !f.IsSet("cache") && !f.IsSet("worker")) {
    parsed = absl::InvalidArgumentError("give --cache, --worker or both");
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "moectl stats: %s\n%s", parsed.ToString().c_str(),
                 f.Usage().c_str());
    return 2;
  }
  json cache = json::array(), worker;
  absl::Status status;
  if (f.IsSet("cache")) {
    absl::StatusOr<json> c = CacheStats(f, f.GetString("cache"));
    if (c.ok()) cache = *std::move(c); else status = c.status();
  }
  if (status.ok() && f.IsSet("worker")) {
    absl::StatusOr<json> w = WorkerStats(f, f.GetString("worker"));
    if (w.ok()) worker = *std::move(w); else status = w.status();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "moectl stats: %s\n", status.ToString().c_str());
    return 1;
  }
  if (f.GetBool("json")) {
    std::printf("%s\n", json{{"cache", cache}, {"worker", worker}}.dump().c_str());
  } else {
    PrintText(cache, worker);
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"stats", "print cache and worker statistics (hit rate, stall, TTFT, TPOT)",
     &RunStats});

}  // namespace
}  // namespace moe::moectl
