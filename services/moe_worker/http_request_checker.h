// Checks the bytes a client sends on one HTTP/1.x connection against the
// worker's limits as they arrive, before any of them reach the HTTP library:
// the request line and each header line are bounded, so are the header
// section and the header count, and the body is counted whatever its
// framing (Content-Length or chunked), so that a body over the limit is
// refused before more than the limit has been read.
//
// Why not leave this to cpp-httplib: Debian's 0.11.4 reads a chunked body
// whole whatever set_payload_max_length says, buffers a request line or a
// header line until its newline however long it is (a 50 MB line costs
// 50 MB), and has no limit on the number of headers (see HttpGuard, which
// runs this checker in front of the library, and docs/operations.md).
//
// The checker is stricter than the library so that both read the stream
// the same way (no request can look like two to one and one to the other):
// a body only on POST, PUT and PATCH, which must declare it (411 without
// Content-Length or chunked); no other Transfer-Encoding; never both; no
// trailers after the last chunk; no folded header lines.
//
// Not thread-safe: one checker per connection.
#ifndef MOECACHE_SERVICES_MOE_WORKER_HTTP_REQUEST_CHECKER_H_
#define MOECACHE_SERVICES_MOE_WORKER_HTTP_REQUEST_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace moe::worker {

struct HttpLimits {
  size_t max_body_bytes = 1 << 20;
  // The whole header section (request line included), and the number of
  // header fields.
  size_t max_header_bytes = 64 << 10;
  int max_headers = 100;
  // One request line or header line (cpp-httplib's own line limit).
  size_t max_line_bytes = 8192;
};

// A refusal: the HTTP status to answer and why.
struct HttpRefusal {
  int status = 0;  // 0: none
  std::string message;
};

class HttpRequestChecker {
 public:
  explicit HttpRequestChecker(const HttpLimits& limits) : limits_(limits) {}

  // Takes the next bytes from the client. Returns a refusal at the first
  // byte that breaks a rule (the connection is then beyond repair: answer
  // it and close), else status 0: every byte may go on. After a refusal
  // every later call returns it again.
  HttpRefusal Feed(absl::string_view bytes);

  // True while a request has begun but not all of it has arrived (the time
  // a client may take for that is bounded by the caller).
  bool MidRequest() const { return state_ != State::kRequestLine || !line_.empty(); }
  // Requests whose last byte has arrived.
  int64_t requests() const { return requests_; }

 private:
  enum class State { kRequestLine, kHeaders, kBody, kChunkSize, kChunkData, kChunkEnd, kLastCrlf };

  // Appends bytes of the current line; true once it ends (line_ then holds
  // it without CR LF), with *used the bytes taken from `in`.
  bool TakeLine(absl::string_view in, size_t* used, size_t cap);
  HttpRefusal OnRequestLine();
  HttpRefusal OnHeaderLine();
  HttpRefusal OnHeadersEnd();
  HttpRefusal OnChunkSize();
  void StartRequest();
  HttpRefusal Refuse(int status, std::string message);

  HttpLimits limits_;
  State state_ = State::kRequestLine;
  std::string line_;         // the current line, at most the cap + 1 bytes
  bool line_overflow_ = false;
  size_t header_bytes_ = 0;  // of this request's header section
  int headers_ = 0;
  bool body_allowed_ = false;
  bool chunked_ = false;
  bool has_length_ = false;
  uint64_t length_ = 0;      // Content-Length
  uint64_t body_bytes_ = 0;  // body data so far (chunk data for chunked)
  uint64_t left_ = 0;        // of the current body or chunk
  int64_t requests_ = 0;
  HttpRefusal refusal_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_HTTP_REQUEST_CHECKER_H_
