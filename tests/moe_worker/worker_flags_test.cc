#include "services/moe_worker/worker_flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(WorkerFlagsTest, DefaultsAreSafe) {
  auto f = ParseWorkerFlags({"--model", "/m"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.model_dir, "/m");
  EXPECT_TRUE(f->options.listen.empty());  // the worker uses kDefaultListen
  EXPECT_EQ(std::string(kDefaultListen).rfind("unix:", 0), 0u);
  EXPECT_EQ(f->options.cache, "none");
  EXPECT_EQ(f->options.metrics_addr, kDefaultMetricsAddr);
  EXPECT_EQ(f->options.backend, "auto");
  EXPECT_FALSE(f->help);
}

TEST(WorkerFlagsTest, ListenRepeatsAndValuesParse) {
  auto f = ParseWorkerFlags(
      {"--model=/m", "--listen", "unix:/tmp/a.sock", "--listen=127.0.0.1:0",
       "--backend", "cpu", "--max-queue", "3", "--max-prompt-tokens=100",
       "--metrics-addr=", "--cache", "unix:/tmp/c.sock", "--cache-model", "x",
       "--record-trace", "/tmp/t", "--shutdown-grace-s", "2", "--port-file",
       "/tmp/p", "--pregate-hints", "on"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->options.runner.pregate_hints);
  EXPECT_EQ(f->options.runner.max_batch, 0);  // auto: chosen from the KV budget at start
  auto b16 = ParseWorkerFlags({"--model=/m", "--max-batch", "16", "--prefill-chunk=8",
                               "--kv-budget-mb", "3"});
  ASSERT_TRUE(b16.ok()) << b16.status();
  EXPECT_EQ(b16->options.runner.max_batch, 16);
  EXPECT_EQ(b16->options.runner.prefill_chunk, 8);
  EXPECT_EQ(b16->options.runner.kv_budget_bytes, int64_t{3} << 20);
  EXPECT_EQ(b16->options.runner.kv_block_tokens, 64);
  auto small = ParseWorkerFlags({"--model=/m", "--max-batch", "4", "--kv-budget-mb", "0.25",
                                 "--kv-block-tokens", "16"});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->options.runner.kv_budget_bytes, int64_t{1} << 18);
  EXPECT_EQ(small->options.runner.kv_block_tokens, 16);
  EXPECT_FALSE(ParseWorkerFlags({"--model=/m", "--pregate-hints", "yes"}).ok());
  EXPECT_EQ(f->options.runner.pregate_distance, 1);
  auto d = ParseWorkerFlags({"--model=/m", "--pregate-distance", "2"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->options.runner.pregate_distance, 2);
  for (const char* bad : {"0", "-1", "9", "two", "2.5", ""}) {
    auto b = ParseWorkerFlags({"--model=/m", "--pregate-distance", bad});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("--pregate-distance")) << bad;
  }
  EXPECT_THAT(f->options.listen,
              ElementsAre("unix:/tmp/a.sock", "127.0.0.1:0"));
  EXPECT_EQ(f->options.backend, "cpu");
  EXPECT_EQ(f->options.runner.max_queue, 3);
  EXPECT_EQ(f->options.runner.max_prompt_tokens, 100);
  EXPECT_EQ(f->options.metrics_addr, "");
  EXPECT_EQ(f->options.cache, "unix:/tmp/c.sock");
  EXPECT_EQ(f->options.cache_model, "x");
  EXPECT_EQ(f->options.record_trace, "/tmp/t");
  EXPECT_EQ(f->options.shutdown_grace, absl::Seconds(2));
  EXPECT_EQ(f->options.port_file, "/tmp/p");
}

TEST(WorkerFlagsTest, BadFlagsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--bogus", "1"}, "unknown flag --bogus"},
      {{"--model", "/a", "--model", "/b"}, "--model given more than once"},
      {{"--max-queue", "many"}, "--max-queue"},
      {{"--max-batch", "lots"}, "--max-batch"},
      {{"--kv-budget-mb", "-1"}, "--kv-budget-mb"},
      {{"--kv-budget-mb", "lots"}, "--kv-budget-mb"},
      {{"--kv-budget-mb", "nan"}, "--kv-budget-mb"},
      {{"--kv-block-tokens", "few"}, "--kv-block-tokens"},
      {{"--backend", "tpu"}, "--backend"},
      {{"--model"}, "--model needs a value"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--shutdown-grace-s", "-1"}, "--shutdown-grace-s"},
      {{"--http-max-body-bytes", "10"}, "--http-max-body-bytes"},
      {{"--http-request-timeout-s", "soon"}, "--http-request-timeout-s"},
      {{"--http-max-headers", "0"}, "--http-max-headers"},
      {{"--http-max-header-bytes", "1"}, "--http-max-header-bytes"},
      {{"--http-read-timeout-s", "-1"}, "--http-read-timeout-s"},
  };
  for (const Case& c : cases) {
    auto f = ParseWorkerFlags(c.args);
    ASSERT_FALSE(f.ok()) << c.message;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.message));
  }
}

TEST(WorkerFlagsTest, HttpFlagsParseAndTheAddressIsChecked) {
  auto f = ParseWorkerFlags({"--http-listen", "8080", "--http-max-body-bytes", "65536",
                             "--http-request-timeout-s", "2.5"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.http.listen, "8080");
  EXPECT_EQ(f->options.http.max_body_bytes, 65536u);
  EXPECT_EQ(f->options.http.request_timeout, absl::Milliseconds(2500));
  EXPECT_TRUE(ParseWorkerFlags({})->options.http.listen.empty());  // off by default
  f = ParseWorkerFlags({"--served-model-name", "gpt-4", "--alias", "llama", "--http-max-headers",
                        "20", "--http-max-header-bytes", "16K", "--http-read-timeout-s", "3"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->options.http.served_model_names, ElementsAre("gpt-4", "llama"));
  EXPECT_EQ(f->options.http.max_headers, 20);
  EXPECT_EQ(f->options.http.max_header_bytes, 16384u);
  EXPECT_EQ(f->options.http.read_timeout, absl::Seconds(3));
  std::string host;
  int port = 0;
  ASSERT_TRUE(ParseHttpListen("8080", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");  // loopback unless an address is given
  EXPECT_EQ(port, 8080);
  ASSERT_TRUE(ParseHttpListen("[::1]:9", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_FALSE(ParseHttpListen("host:port", &host, &port).ok());
  EXPECT_FALSE(ParseHttpListen("70000", &host, &port).ok());
}

TEST(WorkerFlagsTest, HelpIsRecognised) {
  auto f = ParseWorkerFlags({"--help"});
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->help);
  EXPECT_THAT(WorkerUsage(), HasSubstr("--max-queue"));
}

}  // namespace
}  // namespace moe::worker
