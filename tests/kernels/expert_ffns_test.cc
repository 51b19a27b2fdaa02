// Backend::ExpertFfns (several routed experts in one op; the CPU runs
// decode-sized calls as two parallel passes) gives the bits of ExpertFfn
// called for each expert in turn: the dtypes the passes take (bf16, f32,
// q8, q4, Q4_K, Q4_Kx16, a Q6_K down beside Q4_Kx16 gate/up) and the loop
// they fall back to (mixed gate/up dtypes, big calls), with rows and
// weights, on 1 and 2 threads at every SIMD level; bad calls are refused naming
// the call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/row_interleave.h"
#include "common/quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "tests/kernels/gguf_test_blocks.h"

namespace moe {
namespace {

struct Expert {
  std::vector<uint8_t> gate, up, down;
};

// A [rows, cols] weight of `t`: quantized from normal floats for our
// formats, random ggml blocks (interleaved for Q4_Kx16) otherwise.
std::vector<uint8_t> Weight(DType t, int64_t rows, int64_t cols,
                            std::mt19937& rng) {
  if (t == DType::kQ4K || t == DType::kQ6K || t == DType::kQ4KR16) {
    const DType plain = t == DType::kQ4KR16 ? DType::kQ4K : t;
    std::vector<uint8_t> w =
        gguf_test::RandomBlocks(plain, rows, cols, rng, 0.05f);
    if (t != DType::kQ4KR16) return w;
    std::vector<uint8_t> out(w.size());
    EXPECT_TRUE(InterleaveQ4KRows16(w.data(), rows, cols, out.data()).ok());
    return out;
  }
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> out(static_cast<size_t>(WeightBytes(t, rows, cols)));
  EXPECT_TRUE(
      ConvertWeights(f.data(), DType::kF32, rows, cols, t, out.data()).ok());
  return out;
}

struct Case {
  std::string name;
  ExpertDTypes dtypes;
  int64_t tokens;  // each expert takes `per_expert` of them
  int64_t per_expert;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExpertFfnsTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertFfnsTest, EqualsExpertFfnPerCallInOrder) {
  const Case& c = GetParam();
  const int64_t hidden = 256, inter = 512, experts = 5;
  std::mt19937 rng(7);
  std::vector<Expert> e(experts);
  for (Expert& x : e) {
    x.gate = Weight(c.dtypes.gate, inter, hidden, rng);
    x.up = Weight(c.dtypes.up, inter, hidden, rng);
    x.down = Weight(c.dtypes.down, hidden, inter, rng);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.tokens * hidden));
  for (float& v : x) v = normal(rng);
  // Expert i takes tokens (i + j) % tokens, j < per_expert, ascending.
  std::vector<std::vector<int32_t>> rows(experts);
  std::vector<std::vector<float>> weights(experts);
  for (int64_t i = 0; i < experts; ++i) {
    std::vector<int32_t>& r = rows[i];
    for (int64_t j = 0; j < c.per_expert; ++j)
      r.push_back(static_cast<int32_t>((i + j) % c.tokens));
    std::sort(r.begin(), r.end());
    for (size_t j = 0; j < r.size(); ++j)
      weights[i].push_back(0.25f + 0.1f * i + 0.01f * j);
  }
  for (int threads : {1, 2}) {
    for (SimdLevel level :
         {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
      if (!SimdLevelSupported(level)) continue;
      SCOPED_TRACE(::testing::Message()
                   << c.name << ", " << threads << " thread(s), "
                   << SimdLevelName(level));
      CpuBackend be(threads);
      ASSERT_TRUE(be.ForceSimdLevelForTest(level).ok());
      std::vector<float> loop(x.size(), 0.5f), fused(x.size(), 0.5f);
      std::vector<Backend::ExpertCall> calls;
      for (int64_t i = 0; i < experts; ++i) {
        const bool all =
            c.per_expert == c.tokens && i == 0;  // rows == nullptr: 0..count-1
        ASSERT_TRUE(be.ExpertFfn(x.data(), all ? nullptr : rows[i].data(),
                                 weights[i].data(), e[i].gate.data(),
                                 e[i].up.data(), e[i].down.data(), c.dtypes,
                                 loop.data(), c.tokens, c.per_expert, hidden,
                                 inter)
                        .ok());
        calls.push_back({all ? nullptr : rows[i].data(), weights[i].data(),
                         e[i].gate.data(), e[i].up.data(), e[i].down.data(),
                         c.dtypes, c.per_expert});
      }
      ASSERT_TRUE(
          be.ExpertFfns(x.data(), calls, fused.data(), c.tokens, hidden, inter)
              .ok());
      ASSERT_EQ(0, std::memcmp(loop.data(), fused.data(),
                               loop.size() * sizeof(float)));
      double moved = 0;
      for (size_t i = 0; i < loop.size(); ++i)
        moved += std::fabs(loop[i] - 0.5f);
      EXPECT_GT(moved, 1e-3);  // the experts added something
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExpertFfnsTest,
    ::testing::Values(
        Case{"q8_decode", ExpertDTypes::All(DType::kQ8), 1, 1},
        Case{"q4_decode", ExpertDTypes::All(DType::kQ4), 1, 1},
        Case{"q4k_two_tokens", ExpertDTypes::All(DType::kQ4K), 3, 2},
        Case{"q4kx16_decode", ExpertDTypes::All(DType::kQ4KR16), 1, 1},
        Case{"q4kx16_gate_up_q6k_down",
             {DType::kQ4KR16, DType::kQ4KR16, DType::kQ6K},
             4,
             3},
        Case{"bf16_decode", ExpertDTypes::All(DType::kBF16), 1, 1},
        Case{"bf16_two_tokens", ExpertDTypes::All(DType::kBF16), 2, 1},
        Case{"f32_three_tokens", ExpertDTypes::All(DType::kF32), 3, 2},
        Case{"mixed_gate_up_loop", {DType::kQ8, DType::kQ4, DType::kQ8}, 2, 2},
        Case{"big_calls_loop", ExpertDTypes::All(DType::kQ8), 300, 300}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(ExpertFfnsCheckTest, RefusesABadCallNamingIt) {
  CpuBackend be(1);
  const int64_t hidden = 256, inter = 512;
  std::mt19937 rng(3);
  const std::vector<uint8_t> g = Weight(DType::kQ8, inter, hidden, rng);
  const std::vector<uint8_t> d = Weight(DType::kQ8, hidden, inter, rng);
  std::vector<float> x(hidden, 1.0f), out(hidden, 0.0f);
  std::vector<Backend::ExpertCall> calls(2);
  for (Backend::ExpertCall& c : calls) {
    c = {nullptr,  nullptr,  g.data(),
         g.data(), d.data(), ExpertDTypes::All(DType::kQ8),
         1};
  }
  calls[1].count = 2;  // more rows than tokens
  absl::Status s = be.ExpertFfns(x.data(), calls, out.data(), 1, hidden, inter);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ExpertFfns call 1"), std::string::npos) << s;
  calls[1].count = 1;
  calls[0].down = nullptr;
  s = be.ExpertFfns(x.data(), calls, out.data(), 1, hidden, inter);
  EXPECT_NE(s.message().find("ExpertFfns call 0"), std::string::npos) << s;
  // A Q4_Kx16 gate of rows that are not whole 16-row groups.
  calls[0].down = d.data();
  calls[0].dtypes = {DType::kQ4KR16, DType::kQ4KR16, DType::kQ8};
  s = be.ExpertFfns(x.data(), calls, out.data(), 1, hidden, 520);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(hidden, 0.0f));  // nothing written
}

}  // namespace
}  // namespace moe
