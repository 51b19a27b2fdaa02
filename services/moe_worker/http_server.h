// The OpenAI-compatible HTTP API of moe-worker (--http-listen): POST
// /v1/completions, POST /v1/chat/completions, GET /v1/models[/{id}], POST
// /tokenize and /detokenize (llama-server's shapes), GET /health.
// Requests go to the same GenerationRunner as gRPC Generate (one queue, one
// set of limits and metrics); services/openai translates the JSON.
//
// Security as for gRPC (security.h): --tls-cert/--tls-key serve HTTPS
// (--tls-client-ca: client certificates required). An API key
// (--api-key-file, --api-key-env, else --auth-token-file) requires
// `Authorization: Bearer <key>` on everything but /health; on plaintext HTTP
// it is accepted on a loopback listener (as llama-server's --api-key) and
// refused at start on any other unless --allow-plaintext-auth (the key would
// cross the network in the clear). A non-loopback listener without a key
// starts with a WARNING. A streaming client that goes away cancels its
// generation at the next token.
//
// Limits (docs/operations.md "HTTP limits"): a body over max_body_bytes gets
// 413 before more than max_body_bytes of it has been read, with
// Content-Length or chunked; a header section over max_header_bytes or with
// more than max_headers fields gets 431; a request that has not fully
// arrived read_timeout after its first byte gets 408. On plaintext HTTP an
// HttpGuard in front of cpp-httplib holds them (the library alone reads
// chunked bodies whole and buffers header lines without bound); under TLS
// the library serves the port itself, and only the body limit (counted as
// the body is read) and the header count and size (checked once the library
// has parsed them) hold.
//
// Thread-safe: requests are served on the library's thread pool.
#ifndef MOECACHE_SERVICES_MOE_WORKER_HTTP_SERVER_H_
#define MOECACHE_SERVICES_MOE_WORKER_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/http_guard.h"
#include "services/openai/openai_api.h"
#include "services/rpc/security.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace moe::worker {

struct HttpOptions {
  // "" : off. PORT (loopback), HOST:PORT or [V6]:PORT; port 0 picks one.
  std::string listen;
  // --served-model-name: names the model answers to besides its
  // directory's; the first is the id answers carry.
  std::vector<std::string> served_model_names;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 64 << 10;  // request line and header fields
  int max_headers = 100;
  // From a request's first byte to its last (slow clients); zero: none.
  absl::Duration read_timeout = absl::Seconds(30);
  // Per request; zero: none.
  absl::Duration request_timeout = absl::ZeroDuration();
  // The API key clients send as `Authorization: Bearer KEY` (llama-server's
  // --api-key): read from api_key_file, else from the environment variable
  // api_key_env, else the worker's --auth-token-file (shared with gRPC).
  // On plaintext HTTP a key is accepted on a loopback listener only, unless
  // allow_plaintext_auth (it would cross the network in the clear).
  std::string api_key_file;
  std::string api_key_env;
  bool allow_plaintext_auth = false;
  // Connections served at once (each waiting request holds one); 0: the
  // library's default. The worker sets it above --max-queue so that a full
  // queue answers 429 rather than leaving connections unserved.
  int threads = 0;
};

class HttpServer {
 public:
  // `runner` and everything `model` points to must outlive the server.
  // `serving` says whether /health is 200 (it follows gRPC health).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpOptions& options, const rpc::SecurityOptions& security,
      GenerationRunner* runner, openai::ModelInfo model, std::function<bool()> serving);
  ~HttpServer();  // Stop()

  // Stops accepting, closes connections, joins the listener. Idempotent.
  void Stop();
  int port() const { return port_; }

 private:
  HttpServer() = default;
  void Route();
  // The bearer check (true without a token); answers 401 itself.
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  // POST /v1/completions and /v1/chat/completions: parse, submit, answer
  // whole or stream.
  // POST `path`: the bearer check, the body read within
  // --http-max-body-bytes and parsed (400 unless JSON), then `handle`.
  void PostJson(const char* path,
                std::function<void(const openai::Json&, httplib::Response&)> handle);
  void Complete(bool chat, const openai::Json& body, httplib::Response& res);
  // POST /tokenize (`detokenize` false) and /detokenize.
  void Tokenize(bool detokenize, const openai::Json& body, httplib::Response& res);
  // Binds the library's server (behind an HttpGuard on plaintext HTTP);
  // sets port_.
  absl::Status Listen(const std::string& host, int port, bool tls);

  HttpOptions options_;
  GenerationRunner* runner_ = nullptr;
  openai::ModelInfo model_;
  std::function<bool()> serving_;
  std::string token_;  // "" : no auth
  std::unique_ptr<httplib::Server> server_;
  std::unique_ptr<HttpGuard> guard_;  // null under TLS
  std::thread thread_;
  int port_ = 0;
  std::atomic<uint64_t> next_id_{1};
};

// Splits an --http-listen value into host and port (INVALID_ARGUMENT).
absl::Status ParseHttpListen(const std::string& listen, std::string* host, int* port);

// What can be checked before the model loads: the address parses and can be
// bound (FAILED_PRECONDITION naming the error, e.g. in use), and a token
// comes with TLS (INVALID_ARGUMENT).
absl::Status CheckHttpOptions(const HttpOptions& options, const rpc::SecurityOptions& security);

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_HTTP_SERVER_H_
