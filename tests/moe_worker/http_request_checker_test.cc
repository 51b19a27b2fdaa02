// HttpRequestChecker: the limits hold at the byte that breaks them, for
// every framing and however the bytes are split into reads.
#include "services/moe_worker/http_request_checker.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moe::worker {
namespace {

HttpLimits Limits() {
  HttpLimits l;
  l.max_body_bytes = 1000;
  l.max_header_bytes = 4096;
  l.max_headers = 10;
  l.max_line_bytes = 1024;
  return l;
}

// Feeds `bytes` whole; the refusal's status (0: none).
int Status(const std::string& bytes) {
  HttpRequestChecker c(Limits());
  return c.Feed(bytes).status;
}

std::string Post(const std::string& headers, const std::string& body) {
  return absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n", headers, "\r\n", body);
}

std::string Chunk(size_t n) { return absl::StrCat(absl::Hex(n), "\r\n", std::string(n, 'a'), "\r\n"); }

TEST(HttpRequestCheckerTest, WellFormedRequestsPassAndAreCounted) {
  HttpRequestChecker c(Limits());
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string post = Post("Content-Length: 5\r\n", "hello");
  const std::string chunked =
      Post("Transfer-Encoding: chunked\r\n", Chunk(400) + Chunk(600) + "0\r\n\r\n");
  EXPECT_EQ(c.Feed(get + post + chunked).status, 0);
  EXPECT_EQ(c.requests(), 3);
  EXPECT_FALSE(c.MidRequest());
  EXPECT_EQ(c.Feed("GET / HT").status, 0);
  EXPECT_TRUE(c.MidRequest());
}

TEST(HttpRequestCheckerTest, ChunkedBodyOverTheLimitIsRefusedAtItsSizeLine) {
  // 600 + 401 > 1000: refused at the second size line, before its data.
  HttpRequestChecker c(Limits());
  EXPECT_EQ(c.Feed(Post("Transfer-Encoding: chunked\r\n", Chunk(600))).status, 0);
  const HttpRefusal r = c.Feed("191\r\n");
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.message.find("--http-max-body-bytes"), std::string::npos);
  // Sticky: nothing more is taken.
  EXPECT_EQ(c.Feed("0\r\n\r\n").status, 413);
  // Many small chunks add up; a huge declared size is refused at once.
  std::string small;
  for (int i = 0; i < 101; ++i) small += Chunk(10);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", small)), 413);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", "ffffffffffffffffffff\r\n")), 413);
}

TEST(HttpRequestCheckerTest, DeclaredLengthOverTheLimitIsRefusedBeforeTheBody) {
  EXPECT_EQ(Status(Post("Content-Length: 1001\r\n", "")), 413);
  EXPECT_EQ(Status(Post("Content-Length: 99999999999999999999999\r\n", "")), 400);
  EXPECT_EQ(Status(Post("Content-Length: 1000\r\n", std::string(1000, 'a'))), 0);
}

TEST(HttpRequestCheckerTest, LongLinesAreRefusedWithoutBeingKept) {
  HttpRequestChecker c(Limits());
  int status = 0;
  size_t fed = 0;
  const std::string piece(100, 'a');
  EXPECT_EQ(c.Feed("GET /").status, 0);
  while (status == 0 && fed < (1 << 20)) {
    status = c.Feed(piece).status;
    fed += piece.size();
  }
  EXPECT_EQ(status, 414);
  EXPECT_LE(fed, 1100u);  // refused just past the 1024-byte line limit
  EXPECT_EQ(Status("GET / HTTP/1.1\r\nX: " + std::string(2000, 'b') + "\r\n\r\n"), 431);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", std::string(2000, '0'))), 400);
}

TEST(HttpRequestCheckerTest, HeaderCountAndSectionSizeAreBounded) {
  std::string ten, eleven, big;
  for (int i = 0; i < 9; ++i) ten += absl::StrCat("X-", i, ": v\r\n");
  eleven = ten + "X-a: v\r\nX-b: v\r\n";
  for (int i = 0; i < 5; ++i) big += absl::StrCat("X-", i, ": ", std::string(1000, 'v'), "\r\n");
  EXPECT_EQ(Status("GET / HTTP/1.1\r\nHost: x\r\n" + ten + "\r\n"), 0);
  EXPECT_EQ(Status("GET / HTTP/1.1\r\nHost: x\r\n" + eleven + "\r\n"), 431);
  EXPECT_EQ(Status("GET / HTTP/1.1\r\n" + big + "\r\n"), 431);
}

TEST(HttpRequestCheckerTest, AmbiguousFramingIsRefused) {
  EXPECT_EQ(Status(Post("", "")), 411);
  EXPECT_EQ(Status("GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"), 400);
  EXPECT_EQ(Status("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 0);
  EXPECT_EQ(Status(Post("Transfer-Encoding: gzip, chunked\r\n", "")), 501);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "")), 400);
  EXPECT_EQ(Status(Post("Content-Length: 3\r\nContent-Length: 4\r\n", "")), 400);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", "3\r\nabcd\r\n")), 400);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", "zz\r\n")), 400);
  EXPECT_EQ(Status(Post("Transfer-Encoding: chunked\r\n", "0\r\nX-T: 1\r\n\r\n")), 400);
  EXPECT_EQ(Status("GET / HTTP/1.1\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(Status("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(Status("GET /\r\n\r\n"), 400);
}

TEST(HttpRequestCheckerTest, AnySplitIntoReadsGivesTheSameVerdict) {
  const std::string ok = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                         Post("Transfer-Encoding: chunked\r\n", Chunk(300) + "0\r\n\r\n") +
                         Post("Content-Length: 4\r\n", "abcd");
  const std::string over = Post("Transfer-Encoding: chunked\r\n", Chunk(900) + Chunk(200));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    for (const std::string* s : {&ok, &over}) {
      HttpRequestChecker c(Limits());
      int status = 0;
      for (size_t at = 0; at < s->size() && status == 0;) {
        const size_t n = std::min<size_t>(s->size() - at, 1 + rng() % 64);
        status = c.Feed(s->substr(at, n)).status;
        at += n;
      }
      EXPECT_EQ(status, s == &ok ? 0 : 413);
      if (s == &ok) {
        EXPECT_EQ(c.requests(), 3);
      }
    }
  }
}

}  // namespace
}  // namespace moe::worker
