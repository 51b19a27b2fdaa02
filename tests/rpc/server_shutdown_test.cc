// rpc::Server::Shutdown drains: a call in flight finishes (OK) before it
// returns, however long the deadline; with none left it returns at once
// instead of waiting for idle client connections (moe_cached_process_test
// checks that part across processes, where an idle client answers late).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/rpc/rpc_util.h"

namespace moe::rpc {
namespace {

// GetStats blocks until released.
class SlowService final : public moe::v1::ExpertCache::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext*, const moe::v1::GetStatsRequest*,
                        moe::v1::GetStatsResponse* resp) override {
    entered_.Notify();
    release_.WaitForNotification();
    resp->add_models()->set_model("slow");
    return grpc::Status::OK;
  }
  absl::Notification entered_;
  absl::Notification release_;
};

TEST(ServerShutdownTest, InFlightCallFinishesBeforeShutdownReturns) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/rpc_shutdown_", ::getpid(), ".sock");
  SlowService service;
  ServerOptions options;
  options.listen.push_back(*ParseListenAddress("unix:" + path));
  options.services.push_back(&service);
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = moe::v1::ExpertCache::NewStub(MakeChannel(options.listen[0]));

  std::future<grpc::Status> call = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    moe::v1::GetStatsRequest req;
    moe::v1::GetStatsResponse resp;
    grpc::Status s = stub->GetStats(&ctx, req, &resp);
    if (s.ok() && (resp.models_size() != 1 || resp.models(0).model() != "slow")) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "wrong response");
    }
    return s;
  });
  service.entered_.WaitForNotification();
  std::future<void> shutdown =
      std::async(std::launch::async, [&] { (*server)->Shutdown(absl::Seconds(30)); });
  // The call holds shutdown (the only wait here checks that something does
  // not happen).
  EXPECT_EQ(shutdown.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  service.release_.Notify();
  const grpc::Status s = call.get();
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  // ... and once it is done, shutdown does not wait for the deadline.
  const absl::Time released = absl::Now();
  shutdown.get();
  EXPECT_LT(absl::Now() - released, absl::Seconds(5));
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // the socket is gone
}

}  // namespace
}  // namespace moe::rpc
