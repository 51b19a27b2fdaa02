// The fixture of the tests that drive moe-cached as a real process: the
// tiny model in a temp dir, the daemon on it, clients attached to it, and
// the check that a leased (or pinned) slot holds the checkpoint's bytes.
#ifndef MOECACHE_TESTS_MOE_CACHED_TINY_DAEMON_TEST_H_
#define MOECACHE_TESTS_MOE_CACHED_TINY_DAEMON_TEST_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/model_desc.h"
#include "gtest/gtest.h"
#include "services/client/cache_client.h"
#include "tests/moe_cached/daemon_process.h"

namespace moe::cached::testing {

class TinyDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model_dir_).ok());
    auto desc = ModelDescription::Open(model_dir_);
    ASSERT_TRUE(desc.ok()) << desc.status();
    desc_ = std::make_unique<ModelDescription>(std::move(*desc));
  }

  void StartDaemon(std::vector<std::string> extra, bool metrics = false) {
    moe::testing::DaemonConfig c;
    c.models = {model_dir_};
    c.extra_args = std::move(extra);
    c.metrics = metrics;
    absl::Status s = daemon_.Start(c);
    ASSERT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<client::CacheClient> Connect(bool use_shm = true) {
    client::CacheClientOptions o;
    o.address = daemon_.address();
    o.model = "tiny";
    o.worker_id = "test";
    o.use_shm = use_shm;
    o.timeout = absl::Seconds(20);
    auto c = client::CacheClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Every tensor of the leased expert equals the checkpoint, byte for byte.
  void ExpectSlotMatches(const client::CacheClient& client, int layer, const SlotLease& lease) {
    static constexpr TensorRole kRoles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                                             TensorRole::kExpertDown};
    ASSERT_EQ(client.layout(layer).tensors.size(), 3u);
    EXPECT_EQ(lease.key.layer, layer);
    for (int r = 0; r < 3; ++r) {
      auto view = desc_->Expert(layer, lease.key.expert, kRoles[r]);
      ASSERT_TRUE(view.ok());
      const client::SlotTensor& t = client.layout(layer).tensors[r];
      ASSERT_EQ(t.nbytes, view->nbytes);
      EXPECT_EQ(std::memcmp(client.SlotData(lease.slot) + t.offset, view->data, view->nbytes), 0)
          << "L" << layer << "/E" << lease.key.expert << " " << t.role << " in slot "
          << lease.slot;
    }
  }

  // Starts moe_cached_lease_holder, which leases (or pins) every expert of
  // `layer` and holds them until killed; waits for its "HELD <n>".
  void SpawnLeaseHolder(moe::testing::ChildProcess& holder, int layer, int experts) {
    ASSERT_TRUE(holder
                    .Spawn(moe::testing::LeaseHolderBinary(),
                           {daemon_.address(), "tiny", std::to_string(layer)},
                           dir_.Sub("holder.stderr"))
                    .ok());
    auto line = holder.ReadLine(absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << line.status();
    EXPECT_EQ(*line, "HELD " + std::to_string(experts));
  }

  moe::testing::TempDir dir_;
  std::string model_dir_;
  std::unique_ptr<ModelDescription> desc_;
  moe::testing::DaemonProcess daemon_{dir_};
};

}  // namespace moe::cached::testing

#endif  // MOECACHE_TESTS_MOE_CACHED_TINY_DAEMON_TEST_H_
