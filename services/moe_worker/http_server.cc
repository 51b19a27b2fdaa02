#include "services/moe_worker/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "services/rpc/tcp_probe.h"
#include "services/serving/request_proto.h"

namespace moe::worker {
namespace {

using openai::ApiError;
using openai::Json;

// One request's responses, handed from the engine thread to the HTTP thread.
class HttpSink : public ResponseSink {
 public:
  void Write(v1::GenerateResponse response) override {
    absl::MutexLock lock(&mu_);
    items_.push_back(std::move(response));
    cv_.SignalAll();
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
    cv_.SignalAll();
  }
  bool Cancelled() const override { return cancelled_.load(); }
  void Cancel() { cancelled_ = true; }

  // Blocks until something is there; moves every waiting response into
  // *out. False once nothing more will come (then status()).
  bool Take(std::deque<v1::GenerateResponse>* out) {
    absl::MutexLock lock(&mu_);
    while (items_.empty() && !done_) cv_.Wait(&mu_);
    if (items_.empty()) return false;
    out->swap(items_);
    items_.clear();
    return true;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;  // items_ or done_ changed
  std::deque<v1::GenerateResponse> items_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

// Server-sent events of one completion, as the runner produces them; the
// client going away cancels the generation.
void StreamCompletion(httplib::Response& res, std::shared_ptr<HttpSink> sink,
                      std::shared_ptr<openai::ApiRequest> request,
                      std::shared_ptr<openai::ResponseAssembler> assembler);

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(openai::Dump(body), "application/json");
}

// 429 (the queue is full) and 503 (not serving: the daemon is away, or
// draining) are worth retrying: Retry-After says when, as clients such as
// the official OpenAI ones honour it.
constexpr char kRetryAfterSeconds[] = "1";

void SendError(httplib::Response& res, const ApiError& e) {
  if (e.http_status == 429 || e.http_status == 503) {
    res.set_header("Retry-After", kRetryAfterSeconds);
  }
  SendJson(res, e.http_status, openai::ErrorBody(e));
}

Json ModelObject(const std::string& id) {
  return {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "moecache"}};
}

ApiError Error(int status, std::string message, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.code = std::move(code);
  if (status == 401) e.type = "authentication_error";
  return e;
}

void StreamCompletion(httplib::Response& res, std::shared_ptr<HttpSink> sink,
                      std::shared_ptr<openai::ApiRequest> request,
                      std::shared_ptr<openai::ResponseAssembler> assembler) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [sink, request, assembler](size_t, httplib::DataSink& out) {
        std::deque<v1::GenerateResponse> got;
        std::string text;
        const bool more = sink->Take(&got);
        for (const v1::GenerateResponse& r : got) {
          text += "data: " + openai::Dump(assembler->Chunk(r)) + "\n\n";
        }
        if (!more) {
          if (absl::Status st = sink->status(); !st.ok()) {
            text += "data: " + openai::Dump(openai::ErrorBody(openai::ErrorFromStatus(st))) +
                    "\n\n";
          } else if (request->include_usage) {
            text += "data: " + openai::Dump(assembler->UsageChunk()) + "\n\n";
          }
          text += "data: [DONE]\n\n";
        }
        if (!text.empty() && !out.write(text.data(), text.size())) {
          sink->Cancel();
          return false;
        }
        if (!more) out.done();
        return true;
      },
      [sink](bool success) {
        if (!success) sink->Cancel();  // the client went away
      });
}

// The body through the library's content reader, counted as it arrives:
// the library's own limit passes chunked bodies (0.11.4), this one does not.
// False with the error answered (413 past `max`, 400 when unreadable).
bool ReadBody(const httplib::ContentReader& reader, size_t max, httplib::Response& res,
              std::string* body) {
  bool too_big = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body->size() + n > max) {
      too_big = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (too_big || res.status == 413) {
    SendError(res, Error(413, absl::StrCat("request body over the limit of ", max,
                                           " bytes (--http-max-body-bytes)")));
    return false;
  }
  if (!ok) {
    SendError(res, Error(400, "the request body could not be read (bad framing or truncated)"));
    return false;
  }
  return true;
}

// Before the library reads a body: limits on what it has parsed (they
// matter under TLS, where no HttpGuard is in front), and a body on a route
// that takes none is refused unread (the library would read it whole).
httplib::Server::HandlerResponse PreRoute(const HttpOptions& options, const httplib::Request& req,
                                          httplib::Response& res) {
  size_t header_bytes = req.method.size() + req.target.size() + req.version.size();
  for (const auto& [name, value] : req.headers) header_bytes += name.size() + value.size() + 4;
  if (req.headers.size() > static_cast<size_t>(options.max_headers) ||
      header_bytes > options.max_header_bytes) {
    SendError(res, Error(431, "request header fields too large (--http-max-header-bytes, "
                              "--http-max-headers)"));
  } else if (req.method != "GET" && req.method != "POST") {
    SendError(res, Error(405, absl::StrCat("method ", req.method, " is not served")));
  } else if (req.method == "POST" && req.path != "/v1/completions" &&
             req.path != "/v1/chat/completions" && req.path != "/tokenize" &&
             req.path != "/detokenize") {
    SendError(res, Error(404, absl::StrCat("no such endpoint: POST ", req.path)));
  } else {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  res.set_header("Connection", "close");
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

absl::Status ParseHttpListen(const std::string& listen, std::string* host, int* port) {
  std::string port_text = listen;
  *host = "127.0.0.1";
  const size_t colon = listen.rfind(':');
  if (colon != std::string::npos) {
    *host = listen.substr(0, colon);
    port_text = listen.substr(colon + 1);
    if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
      *host = host->substr(1, host->size() - 2);
    }
    if (host->empty()) *host = "127.0.0.1";
  }
  if (!absl::SimpleAtoi(port_text, port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen: want PORT, HOST:PORT or [V6]:PORT, got '", listen, "'"));
  }
  return absl::OkStatus();
}

namespace {

// 127.0.0.0/8, ::1, ::ffff:127.x.x.x and "localhost": a listener only this
// machine reaches.
bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

// Which flag gives the API key ("" : none).
std::string ApiKeySource(const HttpOptions& options, const rpc::SecurityOptions& security) {
  if (!options.api_key_file.empty()) return "--api-key-file";
  if (!options.api_key_env.empty()) return "--api-key-env";
  if (!security.auth_token_file.empty()) return "--auth-token-file";
  return "";
}

absl::StatusOr<std::string> ReadApiKey(const HttpOptions& options,
                                       const rpc::SecurityOptions& security) {
  const std::string source = ApiKeySource(options, security);
  if (source == "--api-key-env") {
    const char* value = std::getenv(options.api_key_env.c_str());
    std::string key = value == nullptr ? "" : value;
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--api-key-env ", options.api_key_env, ": the variable is unset or empty"));
    }
    if (key.size() > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-key-env ", options.api_key_env, ": longer than 4096 bytes"));
    }
    return key;
  }
  if (source.empty()) return std::string();
  const std::string& file =
      source == "--api-key-file" ? options.api_key_file : security.auth_token_file;
  absl::StatusOr<std::string> key = rpc::ReadAuthTokenFile(file);
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat(source, " ", file, ": ", key.status().message()));
  }
  return key;
}

}  // namespace

absl::Status CheckHttpOptions(const HttpOptions& options, const rpc::SecurityOptions& security) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseHttpListen(options.listen, &host, &port); !s.ok()) return s;
  if (!options.api_key_file.empty() && !options.api_key_env.empty()) {
    return absl::InvalidArgumentError("--api-key-file and --api-key-env: give one of them");
  }
  if (absl::Status s = ReadApiKey(options, security).status(); !s.ok()) return s;
  const std::string key_source = ApiKeySource(options, security);
  const bool loopback = IsLoopbackHost(host);
  if (!key_source.empty() && security.tls_cert.empty() && !loopback &&
      !options.allow_plaintext_auth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen ", options.listen, " with ", key_source,
        ": an API key is accepted over plaintext HTTP on a loopback address only (it would "
        "cross the network in the clear); serve HTTPS with --tls-cert and --tls-key, or say "
        "--allow-plaintext-auth"));
  }
  if (port != 0) {
    const std::string err = rpc::BindError(absl::StrCat(
        host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port));
    if (!err.empty()) {
      // As for the other ports: it may be free after a restart (exit 1).
      return absl::UnavailableError(absl::StrCat("--http-listen ", options.listen, ": ", err));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, const rpc::SecurityOptions& security, GenerationRunner* runner,
    openai::ModelInfo model, std::function<bool()> serving) {
  if (absl::Status s = CheckHttpOptions(options, security); !s.ok()) return s;
  std::string host;
  int port = 0;
  (void)ParseHttpListen(options.listen, &host, &port);
  std::unique_ptr<HttpServer> h(new HttpServer());
  h->options_ = options;
  h->runner_ = runner;
  h->model_ = std::move(model);
  h->model_.aliases.clear();
  if (!options.served_model_names.empty()) {
    // vLLM's rule: answers carry the first name; the directory's name
    // keeps working.
    const std::string dir_name = h->model_.name;
    h->model_.name = options.served_model_names[0];
    for (const std::string& n : options.served_model_names) {
      if (!h->model_.Serves(n)) h->model_.aliases.push_back(n);
    }
    if (!h->model_.Serves(dir_name)) h->model_.aliases.push_back(dir_name);
  }
  h->serving_ = std::move(serving);
  const bool tls = !security.tls_cert.empty();
  absl::StatusOr<std::string> key = ReadApiKey(options, security);
  if (!key.ok()) return key.status();
  h->token_ = *std::move(key);
  if (h->token_.empty() && !IsLoopbackHost(host)) {
    MOE_LOG(WARNING) << "--http-listen " << options.listen
                     << ": the OpenAI API is open to the network WITHOUT AUTHENTICATION: anyone "
                        "who reaches this address can generate; set --api-key-file (and "
                        "--tls-cert/--tls-key), or listen on 127.0.0.1";
  } else if (!h->token_.empty() && !tls && !IsLoopbackHost(host)) {
    MOE_LOG(WARNING) << "--http-listen " << options.listen
                     << ": --allow-plaintext-auth: the API key crosses the network in the clear";
  }
  if (tls) {
    auto ssl = std::make_unique<httplib::SSLServer>(
        security.tls_cert.c_str(), security.tls_key.c_str(),
        security.tls_client_ca.empty() ? nullptr : security.tls_client_ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-listen: cannot load --tls-cert ", security.tls_cert, " / --tls-key ",
          security.tls_key, (security.tls_client_ca.empty() ? "" : " / --tls-client-ca "),
          security.tls_client_ca));
    }
    h->server_ = std::move(ssl);
  } else {
    h->server_ = std::make_unique<httplib::Server>();
  }
  h->server_->set_payload_max_length(options.max_body_bytes);
  if (options.threads > 0) {
    const int threads = options.threads;
    h->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  }
  h->Route();
  if (absl::Status s = h->Listen(host, port, tls); !s.ok()) return s;
  httplib::Server* server = h->server_.get();
  h->thread_ = std::thread([server] { server->listen_after_bind(); });
  MOE_LOG(INFO) << "HTTP (OpenAI API) on " << (tls ? "https://" : "http://") << host << ":"
                << h->port_;
  return h;
}

absl::Status HttpServer::Listen(const std::string& host, int port, bool tls) {
  const auto unavailable = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("--http-listen ", options_.listen, ": ", why));
  };
  if (tls) {
    // The guard cannot read inside TLS: the library serves the port itself.
    if (port == 0) {
      port = server_->bind_to_any_port(host);
    } else if (!server_->bind_to_port(host, port)) {
      port = -1;
    }
    if (port <= 0) {
      return unavailable(absl::StrCat("cannot listen on ", host, ":", options_.listen,
                                      " (address in use or not local?)"));
    }
    port_ = port;
    return absl::OkStatus();
  }
  // One request per inner connection: the guard does not pass a client's
  // close on (the library would drop answers still owed), so a kept-alive
  // inner connection would hold one of the library's threads for its whole
  // keep-alive timeout (5 s) after the client left, and a pool's worth of
  // short requests in a row then stalled the next for seconds. Answers say
  // `Connection: close`; clients reconnect (on loopback, ~0.1 ms).
  server_->set_keep_alive_max_count(1);
  const int inner = server_->bind_to_any_port("127.0.0.1");
  if (inner <= 0) return unavailable("cannot listen on a loopback port");
  HttpGuardOptions g;
  g.limits.max_body_bytes = options_.max_body_bytes;
  g.limits.max_header_bytes = options_.max_header_bytes;
  g.limits.max_headers = options_.max_headers;
  g.request_read_timeout = options_.read_timeout;
  // Room beyond the library's pool, whose extra connections wait in its
  // queue rather than being refused.
  g.max_connections = std::max(64, 2 * options_.threads);
  absl::StatusOr<std::unique_ptr<HttpGuard>> guard = HttpGuard::Start(host, port, inner, g);
  if (!guard.ok()) return unavailable(std::string(guard.status().message()));
  guard_ = *std::move(guard);
  port_ = guard_->port();
  return absl::OkStatus();
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (guard_ != nullptr) guard_->Stop();
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

bool HttpServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (token_.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  if (absl::StartsWith(auth, "Bearer ") && rpc::ConstantTimeEquals(auth.substr(7), token_)) {
    return true;
  }
  SendError(res, Error(401, auth.empty() ? "missing Authorization: Bearer <token>"
                                         : "invalid bearer token",
                       "invalid_api_key"));
  return false;
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return PreRoute(options_, req, res);
  });
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      SendError(res, Error(413, "request body too large (--http-max-body-bytes)"));
    } else if (res.status == 404) {
      SendError(res, Error(404, "no such endpoint: see /v1/completions, /v1/chat/completions, "
                                "/v1/models, /tokenize, /detokenize, /health"));
    } else {
      SendError(res, Error(res.status, absl::StrCat("HTTP ", res.status)));
    }
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool up = serving_();
    SendJson(res, up ? 200 : 503, {{"status", up ? "ok" : "unavailable"}});
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    Json data = Json::array();
    for (const std::string& id : model_.Ids()) data.push_back(ModelObject(id));
    SendJson(res, 200, {{"object", "list"}, {"data", data}});
  });
  // Ids may hold '/' (org/model), so the rest of the path is the id.
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (model_.Serves(id)) {
      SendJson(res, 200, ModelObject(id));
      return;
    }
    ApiError e = Error(404, absl::StrCat("the model '", id, "' does not exist; this worker serves '",
                                         absl::StrJoin(model_.Ids(), "', '"), "'"),
                       "model_not_found");
    e.param = "model";
    SendError(res, e);
  });
  for (const bool detokenize : {false, true}) {
    PostJson(detokenize ? "/detokenize" : "/tokenize",
             [this, detokenize](const Json& body, httplib::Response& res) {
               Tokenize(detokenize, body, res);
             });
  }
  for (const bool chat : {false, true}) {
    PostJson(chat ? "/v1/chat/completions" : "/v1/completions",
             [this, chat](const Json& body, httplib::Response& res) { Complete(chat, body, res); });
  }
}

void HttpServer::PostJson(const char* path,
                          std::function<void(const Json&, httplib::Response&)> handle) {
  server_->Post(path, [this, handle = std::move(handle)](const httplib::Request& req,
                                                         httplib::Response& res,
                                                         const httplib::ContentReader& reader) {
    if (!Authorized(req, res)) return;
    std::string text;
    if (!ReadBody(reader, options_.max_body_bytes, res, &text)) return;
    const Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
      SendError(res, Error(400, "the request body is not valid JSON"));
      return;
    }
    handle(body, res);
  });
}

void HttpServer::Tokenize(bool detokenize, const Json& body, httplib::Response& res) {
  ApiError error;
  std::optional<Json> answer = openai::TokenizeRequest(body, detokenize, model_, &error);
  if (!answer.has_value()) {
    SendError(res, error);
    return;
  }
  SendJson(res, 200, *answer);
}

void HttpServer::Complete(bool chat, const Json& body, httplib::Response& res) {
  ApiError error;
  std::optional<openai::ApiRequest> request = openai::ParseApiRequest(body, chat, model_, &error);
  if (!request.has_value()) {
    SendError(res, error);
    return;
  }
  const absl::Time deadline = options_.request_timeout > absl::ZeroDuration()
                                  ? absl::Now() + options_.request_timeout
                                  : absl::InfiniteFuture();
  auto sink = std::make_shared<HttpSink>();
  if (absl::Status s = runner_->Submit(
          serving::FromProto(request->generate, serving::Transport::kHttp), deadline, sink);
      !s.ok()) {
    SendError(res, openai::ErrorFromStatus(s));
    return;
  }
  const std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", next_id_.fetch_add(1));
  // The assembler refers to the request: both live as long as the content
  // provider, which outlives this handler.
  auto shared_request = std::make_shared<openai::ApiRequest>(*std::move(request));
  auto assembler = std::make_shared<openai::ResponseAssembler>(
      *shared_request, model_, id, absl::ToUnixSeconds(absl::Now()));
  if (shared_request->stream) {
    StreamCompletion(res, sink, shared_request, assembler);
    return;
  }
  std::deque<v1::GenerateResponse> got;
  while (sink->Take(&got)) {
    for (const v1::GenerateResponse& r : got) assembler->Add(r);
    got.clear();
  }
  if (absl::Status st = sink->status(); !st.ok()) {
    SendError(res, openai::ErrorFromStatus(st));
    return;
  }
  SendJson(res, 200, assembler->Final());
}

}  // namespace moe::worker
