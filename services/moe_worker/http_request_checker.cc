#include "services/moe_worker/http_request_checker.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moe::worker {
namespace {

// A chunk-size line: hex digits and perhaps an extension; longer is abuse.
constexpr size_t kMaxChunkLine = 1024;

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(c) && absl::string_view("!#$%&'*+-.^_`|~").find(c) ==
                                       absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

}  // namespace

HttpRefusal HttpRequestChecker::Refuse(int status, std::string message) {
  refusal_ = {status, std::move(message)};
  return refusal_;
}

void HttpRequestChecker::StartRequest() {
  state_ = State::kRequestLine;
  header_bytes_ = 0;
  headers_ = 0;
  body_allowed_ = chunked_ = has_length_ = false;
  length_ = body_bytes_ = left_ = 0;
}

bool HttpRequestChecker::TakeLine(absl::string_view in, size_t* used, size_t cap) {
  const size_t nl = in.find('\n');
  const size_t take = nl == absl::string_view::npos ? in.size() : nl + 1;
  *used = take;
  // Keep at most cap + 1 bytes: enough to tell that the line is too long.
  const size_t room = cap + 1 > line_.size() ? cap + 1 - line_.size() : 0;
  line_.append(in.data(), std::min(take, room));
  if (take > room) line_overflow_ = true;
  if (nl == absl::string_view::npos) return line_overflow_;  // overflow ends it early
  if (!line_.empty() && line_.back() == '\n') line_.pop_back();
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  return true;
}

HttpRefusal HttpRequestChecker::OnRequestLine() {
  const std::vector<absl::string_view> parts = absl::StrSplit(line_, ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty()) {
    return Refuse(400, "malformed request line");
  }
  if (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
    return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }
  body_allowed_ = parts[0] == "POST" || parts[0] == "PUT" || parts[0] == "PATCH";
  state_ = State::kHeaders;
  return {};
}

HttpRefusal HttpRequestChecker::OnHeaderLine() {
  if (line_[0] == ' ' || line_[0] == '\t') return Refuse(400, "folded header lines are refused");
  const size_t colon = line_.find(':');
  if (colon == std::string::npos || !IsToken(absl::string_view(line_).substr(0, colon))) {
    return Refuse(400, "malformed header line");
  }
  if (++headers_ > limits_.max_headers) {
    return Refuse(431, absl::StrCat("more than ", limits_.max_headers, " header fields"));
  }
  const absl::string_view name = absl::string_view(line_).substr(0, colon);
  const absl::string_view value = absl::StripAsciiWhitespace(absl::string_view(line_).substr(colon + 1));
  if (absl::EqualsIgnoreCase(name, "Content-Length")) {
    uint64_t n = 0;
    if (value.empty() || !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(value, &n) || (has_length_ && n != length_)) {
      return Refuse(400, "invalid Content-Length");
    }
    has_length_ = true;
    length_ = n;
  } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
    // The library understands exactly "chunked" and would read anything
    // else to the end of the connection.
    if (!absl::EqualsIgnoreCase(value, "chunked") || chunked_) {
      return Refuse(501, absl::StrCat("Transfer-Encoding '", value, "' is not supported"));
    }
    chunked_ = true;
  }
  return {};
}

HttpRefusal HttpRequestChecker::OnHeadersEnd() {
  if (chunked_ && has_length_) return Refuse(400, "both Content-Length and Transfer-Encoding");
  const bool has_body = chunked_ || (has_length_ && length_ > 0);
  if (!body_allowed_) {
    if (has_body) return Refuse(400, "only POST, PUT and PATCH take a body");
  } else if (!chunked_ && !has_length_) {
    return Refuse(411, "a body needs Content-Length or Transfer-Encoding: chunked");
  }
  if (has_length_ && length_ > limits_.max_body_bytes) {
    return Refuse(413, absl::StrCat("request body of ", length_, " bytes is over the limit of ",
                                    limits_.max_body_bytes, " (--http-max-body-bytes)"));
  }
  if (chunked_) {
    state_ = State::kChunkSize;
  } else if (has_body) {
    state_ = State::kBody;
    left_ = length_;
  } else {
    ++requests_;
    StartRequest();
  }
  return {};
}

HttpRefusal HttpRequestChecker::OnChunkSize() {
  const absl::string_view size = absl::string_view(line_).substr(0, line_.find(';'));
  const absl::string_view digits = absl::StripAsciiWhitespace(size);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isxdigit)) {
    return Refuse(400, "malformed chunk size");
  }
  // More than 16 hex digits overflows; anything near that is over the limit.
  uint64_t n = 0;
  if (digits.size() > 15 || !absl::SimpleHexAtoi(digits, &n) ||
      body_bytes_ + n > limits_.max_body_bytes) {
    return Refuse(413, absl::StrCat("chunked request body over the limit of ",
                                    limits_.max_body_bytes, " bytes (--http-max-body-bytes)"));
  }
  body_bytes_ += n;
  left_ = n;
  state_ = n == 0 ? State::kLastCrlf : State::kChunkData;
  return {};
}

HttpRefusal HttpRequestChecker::Feed(absl::string_view in) {
  if (refusal_.status != 0) return refusal_;
  while (!in.empty()) {
    if (state_ == State::kBody || state_ == State::kChunkData) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, in.size()));
      in.remove_prefix(n);
      left_ -= n;
      if (left_ > 0) break;
      if (state_ == State::kChunkData) {
        state_ = State::kChunkEnd;
      } else {
        ++requests_;
        StartRequest();
      }
      continue;
    }
    const bool header = state_ == State::kRequestLine || state_ == State::kHeaders;
    const size_t cap = header ? limits_.max_line_bytes : kMaxChunkLine;
    size_t used = 0;
    const bool done = TakeLine(in, &used, cap);
    if (header) {
      header_bytes_ += used;
      if (header_bytes_ > limits_.max_header_bytes) {
        return Refuse(431, absl::StrCat("header section over ", limits_.max_header_bytes, " bytes"));
      }
    }
    in.remove_prefix(used);
    if (!done) break;
    if (line_overflow_) {
      if (state_ == State::kRequestLine) return Refuse(414, "request line too long");
      if (state_ == State::kHeaders) return Refuse(431, "header line too long");
      return Refuse(400, "chunk framing line too long");
    }
    HttpRefusal r;
    switch (state_) {
      case State::kRequestLine:
        // Empty lines between requests are tolerated (RFC 9112 2.2).
        if (!line_.empty()) r = OnRequestLine();
        break;
      case State::kHeaders:
        r = line_.empty() ? OnHeadersEnd() : OnHeaderLine();
        break;
      case State::kChunkSize:
        r = OnChunkSize();
        break;
      case State::kChunkEnd:
        if (!line_.empty()) r = Refuse(400, "chunk data longer than its size");
        state_ = State::kChunkSize;
        break;
      case State::kLastCrlf:
        // cpp-httplib takes no trailer fields.
        if (!line_.empty()) r = Refuse(400, "trailer fields are not supported");
        ++requests_;
        StartRequest();
        break;
      default:
        break;
    }
    line_.clear();
    line_overflow_ = false;
    if (r.status != 0) return r;
  }
  return {};
}

}  // namespace moe::worker
