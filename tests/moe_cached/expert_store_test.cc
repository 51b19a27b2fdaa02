#include "services/moe_cached/expert_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/fp8.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/moe_cached/daemon_process.h"

namespace moe::cached {
namespace {

TEST(ExpertStoreTest, OneAlignedBlockPerExpertEqualToTheCheckpoint) {
  moe::testing::TempDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("m"), 3).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto store = ExpertStore::Load("m", *desc);
  ASSERT_TRUE(store.ok()) << store.status();
  const ExpertStore& s = **store;
  EXPECT_EQ(s.num_layers(), 4);
  EXPECT_EQ(s.num_experts(), 8);
  EXPECT_EQ(s.top_k(), 2);
  EXPECT_EQ(s.slot_bytes() % kBlockAlign, 0u);
  EXPECT_GE(s.slot_bytes(), desc->bytes_per_expert());
  EXPECT_EQ(s.total_bytes(), 32 * s.slot_bytes());
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(s.layer(l).block_bytes, s.slot_bytes());
    EXPECT_EQ(s.layer(l).offset, 8 * l * s.slot_bytes());
  }
  ASSERT_EQ(s.layer(0).tensors.size(), 3u);
  const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                               TensorRole::kExpertDown};
  const char* names[3] = {"gate", "up", "down"};
  for (int r = 0; r < 3; ++r) {
    const ExpertTensorLayout& t = s.layer(0).tensors[r];
    EXPECT_EQ(t.role, names[r]);
    EXPECT_EQ(t.offset % kTensorAlign, 0u);
    EXPECT_LE(t.offset + t.nbytes, s.slot_bytes());
    if (r > 0) {
      EXPECT_GE(t.offset, s.layer(0).tensors[r - 1].offset + s.layer(0).tensors[r - 1].nbytes);
    }
  }
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 8; ++e) {
      for (int r = 0; r < 3; ++r) {
        auto v = desc->Expert(l, e, roles[r]);
        ASSERT_TRUE(v.ok());
        EXPECT_EQ(v->shape, s.layer(0).tensors[r].shape);
        EXPECT_EQ(std::memcmp(s.Block(l, e) + s.layer(0).tensors[r].offset, v->data, v->nbytes), 0)
            << "L" << l << "/E" << e << " " << names[r];
      }
    }
  }
}

// An FP8 checkpoint's experts are held as q8 unless asked otherwise (no
// kernel reads F8), each block the quantization of the exactly dequantized
// weights; bf16 and q4 may be asked for; a sharded FP8 checkpoint (scales in
// the index too) loads the same.
TEST(ExpertStoreTest, Fp8ExpertsAreHeldAsQ8ByDefault) {
  moe::testing::TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.fp8 = Fp8BlockScheme{32, 48};
  o.shards = 3;
  ASSERT_TRUE(MakeModel(o, dir.Sub("m")).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  ASSERT_TRUE(desc->checkpoint().sharded());
  ASSERT_EQ(desc->expert_dtype(), DType::kF8E4M3);
  auto store = ExpertStore::Load("m", *desc);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->formats()[3], ExpertDTypes::All(DType::kQ8));
  const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                               TensorRole::kExpertDown};
  for (int r = 0; r < 3; ++r) {
    auto v = desc->Expert(3, 5, roles[r]);
    ASSERT_TRUE(v.ok());
    const ExpertTensorLayout& t = (*store)->layer(3).tensors[r];
    ASSERT_EQ(t.nbytes, static_cast<uint64_t>(WeightBytes(DType::kQ8, v->shape[0], v->shape[1])));
    // The reference: dequantize every row exactly, then quantize to q8.
    std::vector<float> row(v->shape[1]);
    std::vector<uint8_t> want(t.nbytes);
    const int64_t row_bytes = WeightBytes(DType::kQ8, 1, v->shape[1]);
    for (int64_t i = 0; i < v->shape[0]; ++i) {
      for (int64_t c = 0; c < v->shape[1]; ++c) {
        row[c] = Fp8E4M3ToFloat(v->data[i * v->shape[1] + c]) *
                 reinterpret_cast<const float*>(
                     v->scales.data)[(i / 32) * v->scales.cols + c / 48];
      }
      ASSERT_TRUE(QuantizeRow(row.data(), v->shape[1], DType::kQ8,
                              want.data() + i * row_bytes).ok());
    }
    EXPECT_EQ(std::memcmp((*store)->Block(3, 5) + t.offset, want.data(), t.nbytes), 0)
        << t.role;
  }
  for (DType f : {DType::kBF16, DType::kQ4}) {
    ExpertStoreOptions opts;
    opts.format = f;
    auto other = ExpertStore::Load("m", *desc, opts);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ((*other)->formats()[0], ExpertDTypes::All(f));
  }
}

TEST(ExpertStoreTest, PinFailureAbortsTheLoad) {
  moe::testing::TempDir dir;
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

// Each projection keeps its own dtype (mixed files); a dtype that cannot be
// held is refused, naming the projection.
TEST(ExpertStoreTest, ProjectionsKeepTheirOwnDtypes) {
  std::vector<uint8_t> bytes(64);
  TensorView a{DType::kBF16, {4, 8}, bytes.data(), 64};
  TensorView b{DType::kF32, {4, 4}, bytes.data(), 64};
  std::vector<uint8_t> wide(256);
  TensorView rows32{DType::kBF16, {4, 32}, wide.data(), 256};
  uint64_t block = 0;
  auto mixed = ExpertStore::ComputeLayout(a, a, b, &block);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ((*mixed)[0].dtype, DType::kBF16);
  EXPECT_EQ((*mixed)[2].dtype, DType::kF32);
  EXPECT_EQ((*mixed)[2].nbytes, 64u);
  // Held as q8: gate and up (rows of 32) can be, down (rows of 4) cannot.
  auto refused = ExpertStore::ComputeLayout(rows32, rows32, b, &block, DType::kQ8);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("down"));
  auto ok = ExpertStore::ComputeLayout(a, a, a, &block);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[1].offset, kTensorAlign);
  EXPECT_EQ(block, kBlockAlign);
}

}  // namespace
}  // namespace moe::cached

namespace moe::cached {
namespace {

// --expert-format: every block holds the checkpoint's experts converted to
// the format, in about 1.9x (q8) / 3.5x (q4) fewer tensor bytes, and every
// weight dequantizes to within half a quantization step of the checkpoint.
TEST(ExpertStoreTest, QuantizedFormatsHoldFewerBytesOfTheSameWeights) {
  moe::testing::TempDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("m"), 3).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  ASSERT_EQ(desc->expert_dtype(), DType::kBF16);
  const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                               TensorRole::kExpertDown};
  for (DType format : {DType::kQ8, DType::kQ4}) {
    SCOPED_TRACE(DTypeName(format));
    ExpertStoreOptions o;
    o.format = format;
    auto store = ExpertStore::Load("m", *desc, o);
    ASSERT_TRUE(store.ok()) << store.status();
    const ExpertStore& s = **store;
    EXPECT_EQ(s.formats()[0], ExpertDTypes::All(format));
    uint64_t tensor_bytes = 0;
    for (const ExpertTensorLayout& t : s.layer(0).tensors) {
      EXPECT_EQ(t.dtype, format);
      EXPECT_EQ(int64_t(t.nbytes), WeightBytes(format, t.shape[0], t.shape[1]));
      tensor_bytes += t.nbytes;
    }
    const double ratio = double(desc->bytes_per_expert()) / tensor_bytes;
    EXPECT_NEAR(ratio, format == DType::kQ8 ? 1.88 : 3.56, 0.01);
    for (int l : {0, 3}) {
      for (int e : {0, 7}) {
        for (int r = 0; r < 3; ++r) {
          auto v = desc->Expert(l, e, roles[r]);
          ASSERT_TRUE(v.ok());
          const ExpertTensorLayout& t = s.layer(0).tensors[r];
          const int64_t n = t.shape[0] * t.shape[1];
          std::vector<float> want(n), got(n);
          ASSERT_TRUE(ConvertToFloat(v->data, v->dtype, n, want.data()).ok());
          DequantizeRow(s.Block(l, e) + t.offset, format, n, got.data());
          float amax = 0;
          for (float w : want) amax = std::max(amax, std::fabs(w));
          // A step is at most 2 amax / 127 (q8) or 2 amax / 15 (q4).
          const float step = format == DType::kQ8 ? amax / 127 : 2 * amax / 15;
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_LE(std::fabs(got[i] - want[i]), 0.51f * step + 1e-6f)
                << "L" << l << "/E" << e << " " << t.role << " at " << i;
          }
        }
      }
    }
  }
}

TEST(ExpertStoreTest, FormatsNeedWholeBlocks) {
  moe::testing::TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.hidden = 96;  // gate/up rows of 96: whole q8 blocks, not q4 blocks
  ASSERT_TRUE(MakeModel(o, dir.Sub("m")).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  ExpertStoreOptions so;
  so.format = DType::kQ4;
  auto store = ExpertStore::Load("m", *desc, so);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("whole blocks of 64"), std::string::npos)
      << store.status();
  so.format = DType::kQ8;
  EXPECT_TRUE(ExpertStore::Load("m", *desc, so).ok());
}

}  // namespace
}  // namespace moe::cached
