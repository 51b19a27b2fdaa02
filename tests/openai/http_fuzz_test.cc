// The HTTP layer of a live moe-worker under hostile clients, over raw TCP:
// bodies over the limit in every framing, long lines, many headers, slow
// clients, and a seeded stream of random requests (methods, paths, headers,
// chunk sizes, truncated and invalid chunk framing, huge declared lengths).
// The worker must stay up, answer the limits' statuses, and its peak RSS
// (VmHWM) must not grow by more than 64 MiB.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "tests/moe_worker/worker_process.h"

namespace moe::worker {
namespace {

using testing::WorkerProcess;

constexpr int64_t kMaxGrowthKiB = 64 << 10;
constexpr size_t kMaxBody = 64 << 10;

// The process's peak resident set, KiB (VmHWM).
int64_t PeakRssKiB(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      int64_t kib = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &kib)) {
        return kib;
      }
    }
  }
  return -1;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// What a raw exchange brought back.
struct Reply {
  int status = 0;    // of the first response; 0: none
  std::string text;  // everything read
};

// True once `text` holds a whole response with a Content-Length.
bool Complete(const std::string& text) {
  const size_t end = text.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const std::string head = absl::AsciiStrToLower(text.substr(0, end));
  const size_t at = head.find("content-length:");
  if (at == std::string::npos) return false;
  size_t length = 0;
  const size_t eol = head.find("\r\n", at);
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(head.substr(at + 15, eol - at - 15)), &length)) {
    return false;
  }
  return text.size() >= end + 4 + length;
}

// Sends what `next` produces (it returns false when done) while reading:
// sending stops at the first byte of an answer or when the server stops
// reading. Then half-closes when `half_close` and reads until a whole
// response has come, the server closes, or `timeout` passes.
Reply Exchange(int port, const std::function<bool(std::string*)>& next, bool half_close = false,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  Reply r;
  const int fd = Connect(port);
  if (fd < 0) return r;
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::string pending;
  bool sending = true;
  char buf[65536];
  while (std::chrono::steady_clock::now() < end) {
    if (sending && pending.empty() && !next(&pending)) {
      sending = false;
      if (half_close) shutdown(fd, SHUT_WR);
    }
    pollfd p = {fd, static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      r.text.append(buf, static_cast<size_t>(n));
      sending = false;
      if (Complete(r.text)) break;
      continue;
    }
    if (p.revents & POLLOUT) {
      const ssize_t n = send(fd, pending.data(), pending.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN) sending = false;
      if (n > 0) pending.erase(0, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (absl::StartsWith(r.text, "HTTP/1.")) (void)absl::SimpleAtoi(r.text.substr(9, 3), &r.status);
  return r;
}

Reply SendAll(int port, const std::string& bytes, bool half_close = false,
              std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  bool sent = false;
  return Exchange(
      port,
      [&](std::string* out) {
        if (sent) return false;
        *out = bytes;
        sent = true;
        return true;
      },
      half_close, timeout);
}

class HttpFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model).ok());
    ASSERT_TRUE(worker_.Spawn(
        {"--model", model, "--listen", "unix:" + dir_.Sub("w.sock"), "--backend", "cpu",
         "--metrics-addr", "", "--cache", "none", "--http-listen", "127.0.0.1:0",
         "--http-max-body-bytes", std::to_string(kMaxBody), "--http-read-timeout-s", "1.5",
         "--port-file", dir_.Sub("ports.json")},
        dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing("unix:" + dir_.Sub("w.sock"))) << worker_.Log();
    port_ = testing::PortFromFile(dir_.Sub("ports.json"), "http_port");
    ASSERT_GT(port_, 0);
    ASSERT_EQ(Health(), 200);
    baseline_kib_ = PeakRssKiB(worker_.pid());
    ASSERT_GT(baseline_kib_, 0);
  }

  int Health() { return SendAll(port_, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").status; }
  int64_t GrowthKiB() { return PeakRssKiB(worker_.pid()) - baseline_kib_; }

  moe::testing::TempDir dir_;
  WorkerProcess worker_;
  int port_ = 0;
  int64_t baseline_kib_ = 0;
};

TEST_F(HttpFuzzTest, ChunkedBodyOverTheLimitIs413WithoutBeingRead) {
  // 13 MB, the size that got through before: a prompt in 64 KiB chunks.
  const std::string chunk(64 << 10, 'a');
  int sent = 0;
  const Reply r = Exchange(port_, [&](std::string* out) {
    if (sent == 200) return false;
    *out = sent == 0 ? std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n")
                     : "";
    absl::StrAppend(out, absl::Hex(chunk.size()), "\r\n", chunk, "\r\n");
    ++sent;
    return true;
  });
  EXPECT_EQ(r.status, 413) << r.text;
  EXPECT_NE(r.text.find("--http-max-body-bytes"), std::string::npos) << r.text;
  EXPECT_LT(sent, 200);  // the worker stopped reading long before the end
  EXPECT_LT(GrowthKiB(), kMaxGrowthKiB);
  // The same body with a Content-Length: 413 before any of it.
  const Reply cl = SendAll(port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Length: 13000000\r\n\r\n");
  EXPECT_EQ(cl.status, 413) << cl.text;
  EXPECT_EQ(Health(), 200);
}

TEST_F(HttpFuzzTest, LongLinesAndManyHeadersAre414And431) {
  const std::string piece(1 << 20, 'a');
  int sent = 0;
  Reply r = Exchange(port_, [&](std::string* out) {
    if (sent++ == 50) return false;
    *out = sent == 1 ? "GET /" + piece : piece;
    return true;
  });
  EXPECT_EQ(r.status, 414) << r.text.substr(0, 200);
  sent = 0;
  r = Exchange(port_, [&](std::string* out) {
    if (sent++ == 100000) return false;
    *out = sent == 1 ? "GET /health HTTP/1.1\r\n" : absl::StrCat("X-", sent, ": ", piece.substr(0, 200), "\r\n");
    return true;
  });
  EXPECT_EQ(r.status, 431) << r.text.substr(0, 200);
  EXPECT_LT(GrowthKiB(), kMaxGrowthKiB);
  EXPECT_EQ(Health(), 200);
}

TEST_F(HttpFuzzTest, ASlowClientGets408) {
  // One header byte every 100 ms never finishes within --http-read-timeout-s.
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  size_t at = 0;
  const auto start = std::chrono::steady_clock::now();
  const Reply r = Exchange(
      port_,
      [&](std::string* out) {
        if (at > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the slow client
        *out = at < head.size() ? head.substr(at, 1) : "b";
        ++at;
        return true;
      },
      /*half_close=*/false, std::chrono::seconds(30));
  EXPECT_EQ(r.status, 408) << r.text;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(Health(), 200);
}

// One random request: a method, a path, headers, a framing and a body, any
// of them broken, perhaps cut short.
std::string RandomRequest(std::mt19937_64& rng, bool* truncated) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  const char* methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW", ""};
  const char* paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/tiny",
                         "/health", "/nope", "*", "/v1/models/%00"};
  const char* versions[] = {"HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", ""};
  std::string path = paths[pick(8)];
  if (pick(10) == 0) path += std::string(static_cast<size_t>(pick(20000)), 'p');
  std::string req = absl::StrCat(methods[pick(9)], " ", path, " ", versions[pick(5)], "\r\n");
  const int headers = pick(4) == 0 ? pick(300) : pick(5);
  for (int i = 0; i < headers; ++i) {
    const size_t len = pick(20) == 0 ? static_cast<size_t>(pick(20000)) : static_cast<size_t>(pick(40));
    absl::StrAppend(&req, pick(30) == 0 ? bytes(5) : absl::StrCat("X-", i), ": ",
                    std::string(len, 'v'), "\r\n");
  }
  std::string body = pick(2) == 0 ? R"({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})"
                                  : bytes(static_cast<size_t>(pick(200000)));
  switch (pick(5)) {
    case 0:  // a declared length: right, short, huge or garbage
      absl::StrAppend(&req, "Content-Length: ",
                      std::vector<std::string>{std::to_string(body.size()),
                                               std::to_string(body.size() / 2),
                                               "1000000000000000", "-5", "12abc"}[pick(5)],
                      "\r\n\r\n", body);
      break;
    case 1: {  // chunked, chunks of random sizes, perhaps with broken framing
      absl::StrAppend(&req, "Transfer-Encoding: chunked\r\n\r\n");
      for (size_t at = 0; at < body.size();) {
        const size_t n = std::min(body.size() - at, static_cast<size_t>(1 + pick(70000)));
        const int broken = pick(40);
        absl::StrAppend(&req, broken == 0 ? "zz" : broken == 1 ? "fffffffffffffff" : "",
                        absl::Hex(n), "\r\n", body.substr(at, n), broken == 2 ? "" : "\r\n");
        at += n;
      }
      if (pick(3) != 0) absl::StrAppend(&req, "0\r\n\r\n");
      break;
    }
    case 2:  // both framings
      absl::StrAppend(&req, "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
      break;
    case 3:  // raw bytes
      req = bytes(static_cast<size_t>(pick(100000)));
      break;
    default:
      absl::StrAppend(&req, "\r\n");
  }
  *truncated = pick(4) == 0;
  if (*truncated) req.resize(static_cast<size_t>(pick(static_cast<int>(req.size()) + 1)));
  return req;
}

TEST_F(HttpFuzzTest, RandomRequestsLeaveTheWorkerUpWithBoundedMemory) {
  std::mt19937_64 rng(1);
  int answered = 0;
  for (int i = 0; i < 150; ++i) {
    bool truncated = false;
    const std::string req = RandomRequest(rng, &truncated);
    // A request cut short ends with the client's half-close.
    const Reply r = SendAll(port_, req, truncated, std::chrono::seconds(3));
    if (r.status > 0) ++answered;
    if (r.status > 0) {
      EXPECT_TRUE(r.status < 500 || r.status == 501 || r.status == 503 || r.status == 505)
          << r.text.substr(0, 300) << "\nrequest: " << absl::CEscape(req.substr(0, 300));
    }
    if (i % 50 == 49) {
      ASSERT_FALSE(worker_.Exited()) << worker_.Log();
      ASSERT_EQ(Health(), 200) << "after request " << i << ": " << absl::CEscape(req.substr(0, 300));
    }
  }
  EXPECT_GT(answered, 50);
  EXPECT_LT(GrowthKiB(), kMaxGrowthKiB);
  EXPECT_FALSE(worker_.Exited()) << worker_.Log();
}

}  // namespace
}  // namespace moe::worker
