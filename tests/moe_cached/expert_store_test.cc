#include "services/moe_cached/expert_store.h"

#include <cstring>

#include "gtest/gtest.h"
#include "tests/moe_cached/daemon_process.h"

namespace moe::cached {
namespace {

TEST(ExpertStoreTest, OneAlignedBlockPerExpertEqualToTheCheckpoint) {
  moe::testing::ScratchDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("m"), 3).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto store = ExpertStore::Load("m", *desc);
  ASSERT_TRUE(store.ok()) << store.status();
  const ExpertStore& s = **store;
  EXPECT_EQ(s.num_layers(), 4);
  EXPECT_EQ(s.num_experts(), 8);
  EXPECT_EQ(s.top_k(), 2);
  EXPECT_EQ(s.block_bytes() % kBlockAlign, 0u);
  EXPECT_GE(s.block_bytes(), desc->bytes_per_expert());
  EXPECT_EQ(s.total_bytes(), 32 * s.block_bytes());
  ASSERT_EQ(s.layout().size(), 3u);
  const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                               TensorRole::kExpertDown};
  const char* names[3] = {"gate", "up", "down"};
  for (int r = 0; r < 3; ++r) {
    const ExpertTensorLayout& t = s.layout()[r];
    EXPECT_EQ(t.role, names[r]);
    EXPECT_EQ(t.offset % kTensorAlign, 0u);
    EXPECT_LE(t.offset + t.nbytes, s.block_bytes());
    if (r > 0) {
      EXPECT_GE(t.offset, s.layout()[r - 1].offset + s.layout()[r - 1].nbytes);
    }
  }
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 8; ++e) {
      for (int r = 0; r < 3; ++r) {
        auto v = desc->Expert(l, e, roles[r]);
        ASSERT_TRUE(v.ok());
        EXPECT_EQ(v->shape, s.layout()[r].shape);
        EXPECT_EQ(std::memcmp(s.Block(l, e) + s.layout()[r].offset, v->data, v->nbytes), 0)
            << "L" << l << "/E" << e << " " << names[r];
      }
    }
  }
}

TEST(ExpertStoreTest, PinFailureAbortsTheLoad) {
  moe::testing::ScratchDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("m")).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok());
  ExpertStoreOptions o;
  uint64_t pinned = 0;
  o.pin = [&](void*, uint64_t bytes) {
    pinned = bytes;
    return absl::ResourceExhaustedError("memlock limit 8 MiB (LimitMEMLOCK=infinity?)");
  };
  auto store = ExpertStore::Load("m", *desc, o);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GT(pinned, 0u);
}

TEST(ExpertStoreTest, MixedDtypesAreRejected) {
  std::vector<uint8_t> bytes(64);
  TensorView a{DType::kBF16, {4, 8}, bytes.data(), 64};
  TensorView b{DType::kF32, {4, 4}, bytes.data(), 64};
  uint64_t block = 0;
  EXPECT_EQ(ExpertStore::ComputeLayout(a, a, b, &block).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ok = ExpertStore::ComputeLayout(a, a, a, &block);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[1].offset, kTensorAlign);
  EXPECT_EQ(block, kBlockAlign);
}

}  // namespace
}  // namespace moe::cached
