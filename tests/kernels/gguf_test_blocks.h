// Test inputs for the kernels that read ggml's blocks
// (gguf_block_math_test.cc, cuda_gguf_ops_test.cc): random blocks (every
// code, scale and min bit pattern, finite f16 scales) rather than quantized
// floats, so that every field matters, and the float64 product of their
// decoded weights (common/gguf_blocks.h) with given activations.
#ifndef MOECACHE_TESTS_KERNELS_GGUF_TEST_BLOCKS_H_
#define MOECACHE_TESTS_KERNELS_GGUF_TEST_BLOCKS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "common/gguf_blocks.h"
#include "gtest/gtest.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/cuda/gguf_block_math.h"

namespace moe::gguf_test {

inline constexpr DType kGgufBlockDTypes[] = {
    DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
    DType::kQ4K,  DType::kQ5K,  DType::kQ6K};


// `rows` rows of k weights of random blocks of `t`; the f16 fields are
// finite, of either sign, within 2^-10 .. 4 in magnitude (times `scale`).
inline std::vector<uint8_t> RandomBlocks(DType t, int64_t rows, int64_t k,
                                         std::mt19937& rng,
                                         float scale = 1.0f) {
  const int64_t blocks = rows * k / QuantGroupSize(t);
  const int64_t bb = QuantBlockBytes(t);
  std::vector<uint8_t> w(static_cast<size_t>(blocks * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-10, 2);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int off : GgufF16FieldOffsets(t)) {
      const uint16_t h =
          FloatToHalf(scale * std::ldexp(mant(rng), octave(rng)));
      std::memcpy(&w[static_cast<size_t>(b * bb + off)], &h, 2);
    }
  }
  return w;
}

// f(std::integral_constant<int, kind>{}) for the block dtype t.
template <typename F>
void WithKind(DType t, const F& f) {
  switch (t) {
    case DType::kQ4_0:
      return f(std::integral_constant<int, gguf_math::kQ4_0>{});
    case DType::kQ4_1:
      return f(std::integral_constant<int, gguf_math::kQ4_1>{});
    case DType::kQ5_0:
      return f(std::integral_constant<int, gguf_math::kQ5_0>{});
    case DType::kQ5_1:
      return f(std::integral_constant<int, gguf_math::kQ5_1>{});
    case DType::kQ4K:
      return f(std::integral_constant<int, gguf_math::kQ4K>{});
    case DType::kQ5K:
      return f(std::integral_constant<int, gguf_math::kQ5K>{});
    default:
      return f(std::integral_constant<int, gguf_math::kQ6K>{});
  }
}

// The SIMD levels this machine runs, scalar first.
inline std::vector<SimdLevel> SupportedLevels() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (SimdLevelSupported(l)) out.push_back(l);
  }
  return out;
}

// A test name for a block dtype parameter ("Q4_K" -> "Q4K").
inline std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  std::string name(DTypeName(info.param));
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
  return name;
}

// Row j of W decoded by ggml's reference decoder.
inline std::vector<float> DecodedRow(DType t, const std::vector<uint8_t>& w,
                                     int64_t j, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  const int64_t row_bytes = WeightBytes(t, 1, k);
  EXPECT_TRUE(DequantizeGguf(*GgufTypeOfDType(t), w.data() + j * row_bytes, k,
                             out.data())
                  .ok());
  return out;
}

// y = W x in float64 for activations `x` [m, k] as given (rounded or not),
// and per output a scale that bounds the partial sums the f32 kernels form:
// sum |w x|, plus per group of 32, 2 max|w| sum|x| (a group's min or offset
// term is at most that); as gguf_quant_matmul_test's reference.
struct Reference {
  std::vector<double> y;      // [m, n]
  std::vector<double> scale;  // [m, n]
};
// What ggml's Q8_1 sum terms (Q4_1, Q5_1: ActSum32,
// kernels/cpu_quant_matmul.h) add to y[i, j] over the decoded weights times
// d * q: per block, its min m times (s - d sum(q)); 0 for other types.
inline double Q8_1Shift(DType t, const std::vector<uint8_t>& w, const std::vector<float>& x,
                        int64_t i, int64_t j, int64_t m, int64_t k) {
  if (t != DType::kQ4_1 && t != DType::kQ5_1) return 0.0;
  QuantizedActivations plain, q8_1;
  QuantizeActivations(x.data(), m, k, &plain, ActRounding::kGgmlQ8_0);
  QuantizeActivations(x.data(), m, k, &q8_1, ActRounding::kGgmlQ8_1);
  const int64_t blocks = k / 32, block_bytes = t == DType::kQ4_1 ? 20 : 24;
  double shift = 0;
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* blk = w.data() + (j * blocks + g) * block_bytes;
    const double min = HalfToFloat(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
    shift += min * (double(q8_1.sd[i * blocks + g]) - double(plain.sd[i * blocks + g]));
  }
  return shift;
}

// `x_given`: the activations before rounding, where `x` is rounded (d * q):
// then y includes Q8_1Shift.
inline Reference Expected(DType t, const std::vector<uint8_t>& w,
                          const std::vector<float>& x, int64_t m, int64_t n,
                          int64_t k, const std::vector<float>* x_given = nullptr) {
  Reference r{std::vector<double>(static_cast<size_t>(m * n)),
              std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t j = 0; j < n; ++j) {
    const std::vector<float> wr = DecodedRow(t, w, j, k);
    for (int64_t i = 0; i < m; ++i) {
      double y = 0, s = 0;
      for (int64_t g = 0; g < k / 32; ++g) {
        double wmax = 0, xsum = 0;
        for (int64_t c = 32 * g; c < 32 * g + 32; ++c) {
          const double wv = wr[c], xv = x[i * k + c];
          y += wv * xv;
          s += std::fabs(wv * xv);
          wmax = std::max(wmax, std::fabs(wv));
          xsum += std::fabs(xv);
        }
        s += 2 * wmax * xsum;
      }
      r.y[i * n + j] = y + (x_given ? Q8_1Shift(t, w, *x_given, i, j, m, k) : 0.0);
      r.scale[i * n + j] = s;
    }
  }
  return r;
}

}  // namespace moe::gguf_test

#endif  // MOECACHE_TESTS_KERNELS_GGUF_TEST_BLOCKS_H_
