// FP8 E4M3 block-scaled checkpoints: the E4M3 codec, quantization_config,
// scale validation and dequantization (common/fp8.h).
#include "common/fp8.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "common/safetensors.h"
#include "common/splitmix64.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using ::testing::HasSubstr;

TEST(Fp8E4M3Test, KnownCodes) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);    // e 7, m 0
  EXPECT_EQ(Fp8E4M3ToFloat(0xb8), -1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x39), 1.125f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x07), 7 * 0x1p-9f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
}

TEST(Fp8E4M3Test, EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToFp8E4M3(Fp8E4M3ToFloat(static_cast<uint8_t>(b))), b) << b;
  }
  EXPECT_EQ(FloatToFp8E4M3(std::nanf("")), 0x7f);
}

// Against brute force: the nearest code, ties to the even mantissa,
// saturation above 448.
TEST(Fp8E4M3Test, RoundsToNearestEven) {
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1.0625f)), 1.0f);  // tie, to even
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1.1875f)), 1.25f);  // tie, to even
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1e6f)), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(-500.0f)), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(0x1p-11f)), 0.0f);
  uint64_t state = 99;
  for (int i = 0; i < 20000; ++i) {
    const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1p-53;
    const float x = static_cast<float>((u - 0.5) * std::ldexp(1.0, i % 20 - 8));
    const float got = Fp8E4M3ToFloat(FloatToFp8E4M3(x));
    float best = 0.0f;
    double best_err = 1e30;
    for (int b = 0; b < 256; ++b) {
      const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
      if (std::isnan(v)) continue;
      const double err = std::fabs(static_cast<double>(v) - x);
      if (err < best_err) {
        best_err = err;
        best = v;
      }
    }
    ASSERT_EQ(std::fabs(static_cast<double>(got) - x), best_err)
        << x << " -> " << got << ", nearest " << best;
  }
}

absl::StatusOr<std::optional<Fp8BlockScheme>> ParseQ(const std::string& q) {
  return ParseQuantizationConfig(
      nlohmann::json::parse(absl::StrCat("{\"quantization_config\": ", q, "}")));
}

TEST(QuantizationConfigTest, AcceptsThePublishedFp8Config) {
  auto s = ParseQ(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
                      "quant_method": "fp8", "weight_block_size": [128, 64]})");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->has_value());
  EXPECT_EQ((*s)->block_rows, 128);
  EXPECT_EQ((*s)->block_cols, 64);
  auto none = ParseQuantizationConfig(nlohmann::json::parse("{}"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto null = ParseQ("null");
  ASSERT_TRUE(null.ok());
  EXPECT_FALSE(null->has_value());
  // Round trip through the writer's JSON.
  auto back = ParseQuantizationConfig(nlohmann::json::parse(
      absl::StrCat("{\"quantization_config\": ",
                   QuantizationConfigJson({16, 32}).dump(), "}")));
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->block_rows, 16);
  EXPECT_EQ((*back)->block_cols, 32);
}

TEST(QuantizationConfigTest, RefusesWhatWeDoNotSupport) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"quant_method": "gptq", "bits": 4})", "quant_method 'gptq'"},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})",
       "fmt 'e5m2'"},
      {R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})",
       "activation_scheme 'static'"},
      {R"({"quant_method": "fp8"})", "no weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [128]})", "not two positive"},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 128]})", "not two positive"},
      {R"({"quant_method": "fp8", "weight_block_size": "128"})", "not two positive"},
      {R"({"fmt": "e4m3"})", "no quant_method"},
      {R"([1, 2])", "not an object"},
  };
  for (const auto& [q, want] : cases) {
    auto s = ParseQ(q);
    ASSERT_FALSE(s.ok()) << q;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << q;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(want)) << q;
  }
}

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  uint64_t state = seed;
  for (size_t i = 0; i < w.size(); ++i) {
    const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1p-53;
    // Blocks of very different magnitude, so that a scale read from the
    // wrong block shows.
    const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
    w[i] = static_cast<float>((u - 0.5) * std::ldexp(1.0, static_cast<int>((r / 16 + c / 24) % 7)));
  }
  return w;
}

// Writes a one-tensor-plus-scales checkpoint and returns its directory.
std::string WriteCheckpoint(const std::string& name,
                            const std::vector<std::pair<std::string, std::pair<DType, std::vector<int64_t>>>>& tensors,
                            const std::vector<std::vector<uint8_t>>& bytes) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/fp8_", name);
  std::filesystem::create_directories(dir);
  SafetensorsWriter w;
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(w.Add(tensors[i].first, tensors[i].second.first,
                      tensors[i].second.second, bytes[i])
                    .ok());
  }
  EXPECT_TRUE(w.Write(dir + "/model.safetensors").ok());
  return dir;
}

std::vector<uint8_t> AsBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(Fp8WeightTest, DequantizesEveryBlockWithItsOwnScale) {
  const int64_t rows = 70, cols = 100;  // partial blocks on both axes
  const Fp8BlockScheme scheme{32, 48};
  std::vector<float> w = RandomMatrix(rows, cols, 5);
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> scales(3 * 3);
  QuantizeFp8Blocks(w.data(), rows, cols, scheme, q.data(), scales.data());
  const std::string dir = WriteCheckpoint(
      "dequant", {{"w.weight", {DType::kF8E4M3, {rows, cols}}},
                  {"w.weight_scale_inv", {DType::kF32, {3, 3}}}},
      {q, AsBytes(scales)});
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto view = (*ckpt)->Get("w.weight");
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(ResolveWeightDType(**ckpt, "w.weight", scheme, &*view).ok());
  ASSERT_NE(view->scales.data, nullptr);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(DequantizeFp8Row(*view, r, row.data()).ok());
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scales[(r / 32) * 3 + c / 48];
      // Exactly the stored code times its block's scale ...
      ASSERT_EQ(row[c], Fp8E4M3ToFloat(q[r * cols + c]) * s) << r << "," << c;
      // ... and within E4M3's half step of the original.
      const float x = w[r * cols + c];
      ASSERT_LE(std::fabs(row[c] - x),
                std::max(std::fabs(x) * 0.0625f, s * 0x1p-10f) * 1.0001f)
          << r << "," << c;
    }
  }
  // To q8 through the float rows: the same as quantizing the dequantized
  // matrix directly.
  const int64_t cols32 = 96;
  std::vector<float> w2 = RandomMatrix(40, cols32, 6);
  std::vector<uint8_t> q2(40 * cols32);
  std::vector<float> s2(2 * 2);
  QuantizeFp8Blocks(w2.data(), 40, cols32, scheme, q2.data(), s2.data());
  TensorView v2{DType::kF8E4M3, {40, cols32}, q2.data(), q2.size(),
                {DType::kF32, reinterpret_cast<const uint8_t*>(s2.data()), 2, 2, 32, 48, 16}};
  std::vector<uint8_t> got(WeightBytes(DType::kQ8, 40, cols32));
  ASSERT_TRUE(ConvertWeightView(v2, DType::kQ8, got.data()).ok());
  std::vector<float> deq(40 * cols32);
  for (int64_t r = 0; r < 40; ++r) {
    ASSERT_TRUE(DequantizeFp8Row(v2, r, deq.data() + r * cols32).ok());
  }
  std::vector<uint8_t> want(got.size());
  ASSERT_TRUE(ConvertWeights(deq.data(), DType::kF32, 40, cols32, DType::kQ8,
                             want.data())
                  .ok());
  EXPECT_EQ(got, want);
  // A NaN code is refused, not propagated.
  q2[5] = 0xff;
  EXPECT_THAT(std::string(ConvertWeightView(v2, DType::kBF16, deq.data()).message()),
              HasSubstr("NaN"));
}

// Some releases store the scales as BF16: read as such, not as F32 bits.
TEST(Fp8WeightTest, Bf16ScalesAreRead) {
  const Fp8BlockScheme scheme{2, 2};
  const std::vector<uint8_t> q = {0x38, 0x38, 0x38, 0x38,   // 1.0
                                  0xb8, 0xb8, 0xb8, 0xb8};  // -1.0
  std::vector<uint8_t> scales(2 * 2 * 2);
  const float values[4] = {0.5f, 2.0f, 3.0f, 0.25f};
  for (int i = 0; i < 4; ++i) {
    const uint16_t h = FloatToBF16(values[i]);
    std::memcpy(scales.data() + 2 * i, &h, 2);
  }
  const std::string dir = WriteCheckpoint(
      "bf16_scales", {{"w.weight", {DType::kF8E4M3, {4, 2}}},
                      {"w.weight_scale_inv", {DType::kBF16, {2, 1}}}},
      {q, std::vector<uint8_t>(scales.begin(), scales.begin() + 4)});
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto view = (*ckpt)->Get("w.weight");
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(ResolveWeightDType(**ckpt, "w.weight", scheme, &*view).ok());
  std::vector<float> out(8);
  ASSERT_TRUE(ConvertWeightView(*view, DType::kF32, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, -2.0f, -2.0f, -2.0f, -2.0f}));
}

TEST(Fp8WeightTest, ValidationNamesTheProblem) {
  const Fp8BlockScheme scheme{4, 4};
  std::vector<uint8_t> q(8 * 6, 0x38);
  const std::vector<float> ok_scales(2 * 2, 0.5f);
  struct Case {
    std::string name;
    std::vector<std::pair<std::string, std::pair<DType, std::vector<int64_t>>>> tensors;
    std::vector<std::vector<uint8_t>> bytes;
    std::optional<Fp8BlockScheme> scheme;
    std::string want;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"missing", {{"w.weight", {DType::kF8E4M3, {8, 6}}}}, {q}, scheme,
       "lacks its scales 'w.weight_scale_inv'"},
      {"shape", {{"w.weight", {DType::kF8E4M3, {8, 6}}}, {"w.weight_scale_inv", {DType::kF32, {2, 1}}}},
       {q, AsBytes({0.5f, 0.5f})}, scheme, "of shape [2, 1], expected [2, 2]"},
      {"dtype", {{"w.weight", {DType::kF8E4M3, {8, 6}}}, {"w.weight_scale_inv", {DType::kI32, {2, 2}}}},
       {q, AsBytes(ok_scales)}, scheme, "of dtype I32"},
      {"nan", {{"w.weight", {DType::kF8E4M3, {8, 6}}}, {"w.weight_scale_inv", {DType::kF32, {2, 2}}}},
       {q, AsBytes({0.5f, nan, 0.5f, 0.5f})}, scheme, "finite and non-negative"},
      {"noconfig", {{"w.weight", {DType::kF8E4M3, {8, 6}}}, {"w.weight_scale_inv", {DType::kF32, {2, 2}}}},
       {q, AsBytes(ok_scales)}, std::nullopt, "no fp8 quantization_config"},
      {"float_with_scale", {{"w.weight", {DType::kF32, {2, 2}}}, {"w.weight_scale_inv", {DType::kF32, {1, 1}}}},
       {AsBytes(ok_scales), AsBytes({1.0f})}, scheme, "only F8_E4M3 weights take block scales"},
      {"one_dim", {{"w.weight", {DType::kF8E4M3, {48}}}, {"w.weight_scale_inv", {DType::kF32, {2, 2}}}},
       {q, AsBytes(ok_scales)}, scheme, "only 2-D weights"},
      {"e5m2", {{"w.weight", {DType::kF8E5M2, {8, 6}}}}, {q}, scheme, "has dtype F8_E5M2"},
  };
  for (const Case& c : cases) {
    const std::string dir = WriteCheckpoint(c.name, c.tensors, c.bytes);
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << c.name << ": " << ckpt.status();
    auto view = (*ckpt)->Get("w.weight");
    ASSERT_TRUE(view.ok());
    absl::Status s = ResolveWeightDType(**ckpt, "w.weight", c.scheme, &*view);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.name;
  }
}

// An empty weight may have a huge other dimension (safetensors allows
// [2^63-1, 0]); its block count must be computed without overflow, so the
// expected scale shape in the error is the true one.
TEST(Fp8WeightTest, BlockCountOfAHugeDimensionDoesNotOverflow) {
  const Fp8BlockScheme scheme{128, 128};
  const int64_t rows = std::numeric_limits<int64_t>::max();
  const std::string dir = WriteCheckpoint(
      "huge_rows", {{"w.weight", {DType::kF8E4M3, {rows, 0}}},
                    {"w.weight_scale_inv", {DType::kF32, {1, 1}}}},
      {{}, AsBytes({1.0f})});
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto view = (*ckpt)->Get("w.weight");
  ASSERT_TRUE(view.ok()) << view.status();
  absl::Status s = ResolveWeightDType(**ckpt, "w.weight", scheme, &*view);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // ceil((2^63 - 1) / 128) = 2^56.
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected [72057594037927936, 0]"));
}

// make-model's fp8 layout is what ModelDescription reads: F8_E4M3 experts
// and attention with F32 scales, bf16 router/norms/embeddings, and bytes per
// expert that count the scales.
TEST(Fp8ModelTest, MadeCheckpointHasThePublishedLayout) {
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen2Moe);
  o.fp8 = Fp8BlockScheme{32, 32};
  o.seed = 3;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/fp8_made");
  ASSERT_TRUE(MakeModel(o, dir).ok());
  auto d = ModelDescription::Open(dir);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->config().fp8.has_value());
  EXPECT_EQ(d->config().fp8->block_rows, 32);
  EXPECT_EQ(d->expert_dtype(), DType::kF8E4M3);
  const ModelConfig& c = d->config();
  const int64_t h = c.hidden_size, i = c.moe_intermediate_size;
  auto blocks = [](int64_t n) { return (n + 31) / 32; };
  const uint64_t want = 3 * h * i + 4 * 2 * blocks(h) * blocks(i) +
                        4 * blocks(h) * blocks(i);
  EXPECT_EQ(d->bytes_per_expert(), want);
  auto q = d->Dense(TensorRole::kQProj, 0);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->dtype, DType::kF8E4M3);
  EXPECT_NE(q->scales.data, nullptr);
  for (TensorRole r : {TensorRole::kRouter, TensorRole::kSharedExpertGate,
                       TensorRole::kInputNorm}) {
    auto v = d->Dense(r, 0);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->dtype, DType::kBF16) << TensorRoleName(r);
  }
  EXPECT_EQ(d->Dense(TensorRole::kEmbed)->dtype, DType::kBF16);
  EXPECT_EQ(DefaultHeldFormat(d->expert_dtype()), DType::kQ8);
}

}  // namespace
}  // namespace moe
