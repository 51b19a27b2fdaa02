// moectl chat: a terminal conversation with a moe-worker through its
// OpenAI-compatible HTTP API (--http-listen), streamed token by token, with
// the model's chat template applied by the worker.
//   moectl chat [--url http://127.0.0.1:8080 | --worker-port-file FILE] [--system TEXT]
//               [--max-tokens N] [sampler flags] [--auth-token-file F] [--tls-ca F]
// The sampler flags and their defaults are `moectl run`'s and `moectl
// generate`'s (sampling_flags.h), which are the worker's own. --worker-port-file
// reads the HTTP port the worker wrote to its --port-file ("http_port").
// One line of stdin is one user turn; "/reset" forgets the conversation;
// EOF ends. Exit codes: 0 at EOF, 2 bad flags, 1 a request failed.
#include <httplib.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/moectl/commands.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "services/moectl/flags.h"
#include "services/moectl/sampling_flags.h"
#include "services/rpc/security.h"

namespace moe::moectl {
namespace {

using json = nlohmann::ordered_json;

// Feeds Server-Sent Events bytes; calls `on_data` with each `data:` payload.
class SseParser {
 public:
  template <typename F>
  void Feed(const char* data, size_t n, F&& on_data) {
    buffer_.append(data, n);
    size_t end;
    while ((end = buffer_.find("\n\n")) != std::string::npos) {
      std::string event = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      if (absl::StartsWith(event, "data: ")) on_data(event.substr(6));
    }
  }

 private:
  std::string buffer_;
};

// One streamed chat turn: prints the reply as it comes and returns it, or
// the transport's or the server's error.
absl::StatusOr<std::string> StreamTurn(httplib::Client& client,
                                       const httplib::Headers& headers,
                                       const json& body) {
  std::string reply, error, raw;
  SseParser sse;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    raw.append(data, n);
    sse.Feed(data, n, [&](const std::string& payload) {
      if (payload == "[DONE]") return;
      json chunk = json::parse(payload, nullptr, false);
      if (chunk.contains("error")) {
        error = chunk["error"].value("message", payload);
      } else if (chunk.contains("choices") && !chunk["choices"].empty()) {
        const std::string piece =
            chunk["choices"][0]["delta"].value("content", "");
        reply += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    });
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = client.send(req, res, err);
  std::fputs("\n", stdout);
  if (!ok) return absl::UnavailableError(httplib::to_string(err));
  if (res.status != 200 || !error.empty()) {
    json j = json::parse(raw, nullptr, false);
    if (error.empty() && j.contains("error"))
      error = j["error"].value("message", raw);
    return absl::UnavailableError(
        absl::StrCat("HTTP ", res.status, ": ", error.empty() ? raw : error));
  }
  return reply;
}

// --url, or with --worker-port-file the same scheme and host at the port the
// worker reported.
absl::StatusOr<std::string> ChatUrl(const FlagSet& f) {
  const std::string url = f.GetString("url");
  if (f.GetString("worker-port-file").empty()) return url;
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(f.GetString("worker-port-file")));
  const json ports = json::parse(text, nullptr, false);
  if (!ports.is_object() || !ports.contains("http_port") ||
      !ports["http_port"].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker-port-file ", f.GetString("worker-port-file"),
        " names no http_port (is the worker started with --http-listen?)"));
  }
  // scheme://host[:port][/...] -> scheme://host:http_port
  const size_t host = url.find("://") == std::string::npos ? 0 : url.find("://") + 3;
  size_t end = url.find('/', host);
  if (end == std::string::npos) end = url.size();
  std::string authority = url.substr(host, end - host);
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']', colon) == std::string::npos) {
    authority.resize(colon);
  }
  return absl::StrCat(url.substr(0, host), authority, ":", ports["http_port"].get<int>());
}

int RunChat(const Args& args) {
  FlagSet f("chat", "--url URL [flags]");
  f.String("url", "http://127.0.0.1:8080", "the worker's --http-listen address");
  f.String("worker-port-file", "",
           "the worker's --port-file: talk to the http_port it reports (on --url's host)");
  f.String("system", "", "a system message to start the conversation with");
  f.Int("max-tokens", 256, "longest reply");
  DeclareSamplingFlags(f);
  f.String("auth-token-file", "", "bearer token file (the worker's --auth-token-file)");
  f.String("tls-ca", "", "CA certificate to verify an https:// worker");
  if (absl::Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "moectl chat: %s\n%s", std::string(s.message()).c_str(),
                 f.Usage().c_str());
    return 2;
  }
  if (f.help()) {
    std::printf("%s", f.Usage().c_str());
    return 0;
  }
  serving::Request sampling;
  absl::StatusOr<std::string> url = ChatUrl(f);
  absl::Status sampled = SamplingFromFlags(f, &sampling);
  if (!url.ok() || !sampled.ok()) {
    std::fprintf(stderr, "moectl chat: %s\n",
                 std::string((url.ok() ? sampled : url.status()).message()).c_str());
    return 2;
  }
  httplib::Client client(*url);
  if (!client.is_valid()) {
    std::fprintf(stderr, "moectl chat: bad --url %s\n", url->c_str());
    return 2;
  }
  if (!f.GetString("tls-ca").empty()) client.set_ca_cert_path(f.GetString("tls-ca").c_str());
  client.set_read_timeout(600, 0);
  httplib::Headers headers;
  if (!f.GetString("auth-token-file").empty()) {
    absl::StatusOr<std::string> token = rpc::ReadAuthTokenFile(f.GetString("auth-token-file"));
    if (!token.ok()) {
      std::fprintf(stderr, "moectl chat: --auth-token-file: %s\n",
                   std::string(token.status().message()).c_str());
      return 2;
    }
    headers.emplace("Authorization", "Bearer " + *token);
  }
  json messages = json::array();
  auto reset = [&] {
    messages = json::array();
    if (!f.GetString("system").empty()) {
      messages.push_back({{"role", "system"}, {"content", f.GetString("system")}});
    }
  };
  reset();
  std::string line;
  while (std::fputs("> ", stderr), std::getline(std::cin, line)) {
    if (line == "/reset") {
      reset();
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    json body = {{"messages", messages}, {"max_tokens", f.GetInt("max-tokens")}};
    body.update(SamplingJson(sampling));
    body["stream"] = true;
    absl::StatusOr<std::string> reply = StreamTurn(client, headers, body);
    if (!reply.ok()) {
      std::fprintf(stderr, "moectl chat: %s\n",
                   std::string(reply.status().message()).c_str());
      return 1;
    }
    messages.push_back({{"role", "assistant"}, {"content", *reply}});
  }
  return 0;
}

const bool kRegistered =
    RegisterCommand({"chat", "talk to a worker's chat template over its HTTP API", &RunChat});

}  // namespace
}  // namespace moe::moectl
