#include "kernels/cpu_quant_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/quant.h"
#include "kernels/cpu_gguf_quant.h"

#define MOE_QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace moe {
namespace {

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One output y[i, j] over all of k, blocks in order.
float DotQ8Scalar(const uint8_t* w, const QuantizedActivations& x, int64_t i) {
  const int64_t blocks = x.k / kQ8Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kQ8BlockBytes;
    int32_t s = 0;
    for (int t = 0; t < kQ8Group; ++t) {
      s += static_cast<int8_t>(blk[2 + t]) * xq[b * kQ8Group + t];
    }
    acc += static_cast<float>(s) * (HalfToFloat(Load16(blk)) * xd[b]);
  }
  return acc;
}

float DotQ4Scalar(const uint8_t* w, const QuantizedActivations& x, int64_t i) {
  const int64_t groups = x.k / kQ4Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * (x.k / kActGroup);
  const float* sd = x.sd.data() + i * (x.k / kActGroup);
  float acc = 0.0f, macc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* blk = w + g * kQ4BlockBytes;
    int32_t s0 = 0, s1 = 0;
    for (int t = 0; t < 32; ++t) {
      s0 += (blk[4 + t] & 0x0f) * xq[g * kQ4Group + t];
      s1 += (blk[4 + t] >> 4) * xq[g * kQ4Group + 32 + t];
    }
    const float d = HalfToFloat(Load16(blk)), m = HalfToFloat(Load16(blk + 2));
    acc += static_cast<float>(s0) * (d * xd[2 * g]);
    acc += static_cast<float>(s1) * (d * xd[2 * g + 1]);
    macc += m * (sd[2 * g] + sd[2 * g + 1]);
  }
  return acc + macc;
}

// MXFP4 codes as integers: 2 * fp4(code), so a block's weights are
// q * 2^(e - 128) with q in [-12, 12], and its dot product an exact integer
// sum like q8's (the same numbers as the block held as q8 with
// d = 2^(e - 128)).
constexpr int8_t kFp4Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) for every scale byte, from a table: a libm ldexp call per
// 32-weight block held the MXFP4 kernels to ~5 giga-weights/s, a tenth of
// q8's. The same values (the table is ldexp's), so the same bits.
struct Mxfp4Scales {
  float v[256];
  Mxfp4Scales() {
    for (int e = 0; e < 256; ++e) v[e] = std::ldexp(1.0f, e - 128);
  }
};
const Mxfp4Scales kMxfp4Scales;

inline float Mxfp4Scale(uint8_t e) { return kMxfp4Scales.v[e]; }

float DotMxfp4Scalar(const uint8_t* w, const QuantizedActivations& x, int64_t i) {
  const int64_t blocks = x.k / 32;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kMxfp4BlockBytes;
    int32_t s = 0;
    for (int t = 0; t < 16; ++t) {
      s += kFp4Twice[blk[1 + t] & 15] * xq[b * 32 + 2 * t];
      s += kFp4Twice[blk[1 + t] >> 4] * xq[b * 32 + 2 * t + 1];
    }
    acc += static_cast<float>(s) * (Mxfp4Scale(blk[0]) * xd[b]);
  }
  return acc;
}

MOE_QUANT_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The scaled integer dot product of one q8 block with 32 activations.
MOE_QUANT_AVX2 inline __m256 BlockQ8Avx2(const uint8_t* blk, const int8_t* xq, float xd,
                                         __m256 acc) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  // |w| * (x signed like w): u8 x s8 pairs. |w| may be 128 (a GGUF Q8_0
  // code of -128 reads as u8 128), x stays within +-127 (negating it never
  // overflows): |sum| <= 2 * 128 * 127 < 2^15.
  const __m256i p = _mm256_madd_epi16(
      _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv)),
      _mm256_set1_epi16(1));
  const __m256 scale = _mm256_set1_ps(_cvtsh_ss(Load16(blk)) * xd);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc);
}

// Two accumulators (even and odd blocks) hide the FMA latency.
MOE_QUANT_AVX2 float DotQ8Avx2(const uint8_t* w, const QuantizedActivations& x,
                               int64_t i) {
  const int64_t blocks = x.k / kQ8Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    acc0 = BlockQ8Avx2(w + b * kQ8BlockBytes, xq + b * kQ8Group, xd[b], acc0);
    acc1 = BlockQ8Avx2(w + (b + 1) * kQ8BlockBytes, xq + (b + 1) * kQ8Group, xd[b + 1],
                       acc1);
  }
  if (b < blocks) acc0 = BlockQ8Avx2(w + b * kQ8BlockBytes, xq + b * kQ8Group, xd[b], acc0);
  return HSum(_mm256_add_ps(acc0, acc1));
}

// One MXFP4 block: the codes through a 16-entry shuffle table (lane-local,
// so the table sits in both lanes), interleaved back to element order, then
// BlockQ8Avx2's signed 8-bit dot product.
MOE_QUANT_AVX2 inline __m256 BlockMxfp4Avx2(const uint8_t* blk, const int8_t* xq, float xd,
                                            __m256 acc) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kFp4Twice));
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 1));
  const __m128i low = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, low));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
  const __m256i wv = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i p = _mm256_madd_epi16(
      _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv)),
      _mm256_set1_epi16(1));
  const __m256 scale = _mm256_set1_ps(Mxfp4Scale(blk[0]) * xd);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc);
}

MOE_QUANT_AVX2 float DotMxfp4Avx2(const uint8_t* w, const QuantizedActivations& x,
                                  int64_t i) {
  const int64_t blocks = x.k / 32;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    acc0 = BlockMxfp4Avx2(w + b * kMxfp4BlockBytes, xq + b * 32, xd[b], acc0);
    acc1 = BlockMxfp4Avx2(w + (b + 1) * kMxfp4BlockBytes, xq + (b + 1) * 32, xd[b + 1], acc1);
  }
  if (b < blocks) acc0 = BlockMxfp4Avx2(w + b * kMxfp4BlockBytes, xq + b * 32, xd[b], acc0);
  return HSum(_mm256_add_ps(acc0, acc1));
}

MOE_QUANT_AVX2 float DotQ4Avx2(const uint8_t* w, const QuantizedActivations& x,
                               int64_t i) {
  const int64_t groups = x.k / kQ4Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * (x.k / kActGroup);
  const float* sd = x.sd.data() + i * (x.k / kActGroup);
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  float macc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* blk = w + g * kQ4BlockBytes;
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 4));
    const __m256i lo = _mm256_and_si256(bytes, low);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
    const int8_t* xg = xq + g * kQ4Group;
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 32));
    // codes (u8, <= 15) x activations (s8): pairs stay far below 2^15.
    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones);
    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones);
    const float d = _cvtsh_ss(Load16(blk)), m = _cvtsh_ss(Load16(blk + 2));
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * xd[2 * g]), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * xd[2 * g + 1]),
                             acc[1]);
    macc += m * (sd[2 * g] + sd[2 * g + 1]);
  }
  return HSum(_mm256_add_ps(acc[0], acc[1])) + macc;
}

// The scalar rounding of QuantizeActivations, into raw buffers.
void QuantizeScalar(const float* x, int64_t m, int64_t k, int8_t* q_out, float* d_out,
                    float* sd_out, int32_t* s_out, ActRounding rounding) {
  for (int64_t g = 0; g < m * (k / kActGroup); ++g) {
    const float* xs = x + g * kActGroup;
    float amax = 0.0f;
    for (int64_t t = 0; t < kActGroup; ++t) amax = std::max(amax, std::fabs(xs[t]));
    const float d = ActScale32(amax, rounding != ActRounding::kF32);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t t = 0; t < kActGroup; ++t) {
      const float q = std::clamp(std::nearbyint(xs[t] * inv), -127.0f, 127.0f);
      q_out[g * kActGroup + t] = static_cast<int8_t>(q);
      sum += static_cast<int32_t>(q);
    }
    d_out[g] = d;
    s_out[g] = sum;
    sd_out[g] = rounding == ActRounding::kGgmlQ8_1 ? ActSum32(amax, sum)
                                                   : d * static_cast<float>(sum);
  }
}

// Grows v to at least n elements; never shrinks (no refill of a regrown tail).
template <typename T>
T* AtLeast(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

ActRounding ActRoundingFor(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
    case DType::kQ4_0R16:
    case DType::kQ5_0:
      return ActRounding::kGgmlQ8_0;
    case DType::kQ4_1:
    case DType::kQ5_1:
      return ActRounding::kGgmlQ8_1;
    default:
      return ActRounding::kF32;
  }
}

namespace {
// v rounded to the nearest f16, or v itself where that is infinite.
float RoundToHalfIfFinite(float v) {
  const float h = HalfToFloat(FloatToHalf(v));
  return std::isfinite(h) ? h : v;
}
}  // namespace

float ActScale32(float amax, bool ggml) {
  const float d = amax / 127.0f;
  return ggml ? RoundToHalfIfFinite(d) : d;
}

float ActSum32(float amax, int32_t sum) {
  return RoundToHalfIfFinite(amax / 127.0f * static_cast<float>(sum));
}

void QuantizeActivations(const float* x, int64_t m, int64_t k,
                         QuantizedActivations* out, ActRounding rounding) {
  const int64_t groups = k / kActGroup;
  out->m = m;
  out->k = k;
  out->q.resize(static_cast<size_t>(m * k));
  out->d.resize(static_cast<size_t>(m * groups));
  out->sd.resize(static_cast<size_t>(m * groups));
  out->s.resize(static_cast<size_t>(m * groups));
  QuantizeScalar(x, m, k, out->q.data(), out->d.data(), out->sd.data(), out->s.data(),
                 rounding);
}

std::vector<float> RoundActivations(const float* x, int64_t m, int64_t k,
                                    ActRounding rounding) {
  QuantizedActivations qa;
  QuantizeActivations(x, m, k, &qa, rounding);
  std::vector<float> out(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) out[i] = qa.d[i / kActGroup] * qa.q[i];
  return out;
}

void SizeKActivations(int64_t m, int64_t k, KActivations* out) {
  const int64_t blocks = m * (k / kKBlock);
  out->m = m;
  out->k = k;
  AtLeast(out->q, m * k);
  AtLeast(out->d, blocks);
  AtLeast(out->bsums, blocks * 16);
}

void QuantizeKActivations(const float* x, int64_t m, int64_t k, KActivations* out) {
  SizeKActivations(m, k, out);
  const int64_t blocks = m * (k / kKBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xs = x + b * kKBlock;
    int8_t* q = out->q.data() + b * kKBlock;
    float amax = 0.0f;
    for (int64_t t = 0; t < kKBlock; ++t) amax = std::max(amax, std::fabs(xs[t]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t t = 0; t < kKBlock; ++t) {
      q[t] = static_cast<int8_t>(std::clamp(std::nearbyint(xs[t] * inv), -127.0f, 127.0f));
    }
    out->d[b] = amax > 0.0f ? 1.0f / inv : 0.0f;
    for (int t = 0; t < 16; ++t) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * t + l];
      out->bsums[b * 16 + t] = static_cast<int16_t>(sum);
    }
  }
}

std::vector<float> RoundKActivations(const float* x, int64_t m, int64_t k) {
  KActivations qa;
  QuantizeKActivations(x, m, k, &qa);
  std::vector<float> out(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) out[i] = qa.d[i / kKBlock] * qa.q[i];
  return out;
}

bool PreparesActivations(DType dtype, SimdLevel level) {
  return IsQuantDType(dtype) || UsesBf16Dot(dtype, level);
}

void QuantizedInput::Prepare(const float* x, int64_t m, int64_t k, DType dtype,
                             SimdLevel level) {
  x_.m = m;
  x_.k = k;
  if (dtype == DType::kBF16) {  // UsesBf16Dot (the caller's REQUIRES)
    xb_m_ = m;
    RoundToBf16(x, m * k, AtLeast(xb_, m * k));
    amx_ = UsesAmx(dtype, level, k);
    if (amx_) PackForAmx(xb_.data(), m, k, AtLeast(xv_, AmxPackedSize(m, k)));
    return;
  }
  xb_m_ = -1;
  static const bool vnni = Q8VnniSupported();
  const bool simd = level != SimdLevel::kScalar;
  const bool avx512_vnni = AtLeastAvx512(level) && vnni;
  const bool q8 = dtype == DType::kQ8;
  dot_ = q8 ? (simd ? (avx512_vnni ? &DotQ8Avx512Vnni : &DotQ8Avx2) : &DotQ8Scalar)
            : (simd ? &DotQ4Avx2 : &DotQ4Scalar);
  if (dtype == DType::kMxfp4) dot_ = simd ? &DotMxfp4Avx2 : &DotMxfp4Scalar;
  // Every kernel pointer is set before any return: a kept QuantizedInput
  // serves products of any dtype in turn (Columns takes the first set).
  k_rows_ = IsGgufKDType(dtype) ? GgufKRowsFor(dtype, level) : nullptr;  // cpu_gguf_quant.h
  if (IsGgufBlockDType(dtype) && k_rows_ == nullptr) dot_ = GgufDotFor(dtype, level);
  vnni_rows_ = avx512_vnni && dtype == DType::kQ4 ? Q4RowsVnni() : nullptr;
  small_rows_ = avx512_vnni ? GgufSmallRowsAvx512Vnni(dtype) : nullptr;
  if (RowGroupOf(dtype) == 16 && !k_rows_) small_rows_ = SmallRows16For(dtype, level);
  // The same bits on the tiles (SmallRows16Amx: nullptr for other dtypes),
  // from kAmxMinRows rows.
  amx_rows_ = level == SimdLevel::kAmx && m >= kAmxMinRows ? SmallRows16Amx(dtype) : nullptr;
  row_bytes_ = WeightBytes(dtype, 1, k);
  if (k_rows_ != nullptr) {
    if (avx512_vnni) {
      QuantizeKActivationsAvx512(x, m, k, &kx_);
    } else {
      QuantizeKActivations(x, m, k, &kx_);
    }
    return;
  }
  const int64_t groups = m * (k / kActGroup);
  int8_t* q = AtLeast(x_.q, m * k);
  float* d = AtLeast(x_.d, groups);
  float* sd = AtLeast(x_.sd, groups);
  int32_t* sums = AtLeast(x_.s, groups);
  const ActRounding rounding = ActRoundingFor(dtype);
  if (avx512_vnni) {
    QuantizeActivationsAvx512(x, m, k, q, d, sd, sums, rounding);
  } else {
    QuantizeScalar(x, m, k, q, d, sd, sums, rounding);
  }
  if (vnni_rows_ == nullptr) return;
  vx_ = VnniActivations{m, k, q, AtLeast(lane_d_, m * k / 4),
                        AtLeast(block_sd_, m * k / kQ4Group)};
  PrepareVnniLanes(x_, lane_d_.data(), block_sd_.data());
}

void QuantizedInput::Columns(const void* w, const float* bias, float* y, int64_t n,
                             int64_t n_begin, int64_t n_end) const {
  if (xb_m_ >= 0) {
    const MatMulArgs a{nullptr, w, DType::kBF16, bias, y, xb_m_, n, x_.k};
    if (amx_) return AmxBf16Columns(xv_.data(), a, n_begin, n_end);
    return Bf16DotColumns(xb_.data(), a, n_begin, n_end);
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  // The rows kernels: the chunk's weight rows in one call per group of up
  // to kKMaxRows activation rows.
  auto rows_kernel = [&](auto* kernel, const auto& acts, int64_t max_rows = kKMaxRows) {
    for (int64_t i = 0; i < acts.m; i += max_rows) {
      const int rows = static_cast<int>(std::min<int64_t>(max_rows, acts.m - i));
      kernel(wb + n_begin * row_bytes_, row_bytes_, n_end - n_begin, acts, i, rows,
             bias != nullptr ? bias + n_begin : nullptr, y + i * n + n_begin, n);
    }
  };
  if (amx_rows_ != nullptr) return rows_kernel(amx_rows_, x_, kAmxMaxRows);
  if (small_rows_ != nullptr) return rows_kernel(small_rows_, x_);
  if (k_rows_ != nullptr) return rows_kernel(k_rows_, kx_);
  const int64_t m = x_.m;
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* wj = wb + j * row_bytes_;
    const float bj = bias ? bias[j] : 0.0f;
    if (vnni_rows_ != nullptr) {
      for (int64_t i = 0; i < m; i += kVnniMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kVnniMaxRows, m - i));
        vnni_rows_(wj, vx_, i, rows, bj, y + i * n + j, n);
      }
    } else {
      for (int64_t i = 0; i < m; ++i) y[i * n + j] = dot_(wj, x_, i) + bj;
    }
  }
}

int64_t QuantColumnGrain(const ThreadPool& pool, int64_t m, int64_t n, int64_t k,
                         int64_t group) {
  if (!pool.WorthSplitting(m, n * k)) return n;
  // Decode (one row) streams the weights from memory: two long runs per
  // thread keep the prefetchers going (~5% faster than eight short ones);
  // batches balance eight chunks per thread.
  const int64_t chunks = pool.size() * (m == 1 ? 2 : 8);
  const int64_t grain = std::max<int64_t>(8, (n + chunks - 1) / chunks);
  return (grain + group - 1) / group * group;
}

QuantizedInput& QuantizedInputFor(int64_t m, int64_t k, QuantizedInput* local) {
  if (m * k > (int64_t{8} << 20)) return *local;
  thread_local QuantizedInput kept;
  return kept;
}

void CpuQuantMatMul(ThreadPool& pool, SimdLevel level, const MatMulArgs& a) {
  QuantizedInput local;
  QuantizedInput& in = QuantizedInputFor(a.m, a.k, &local);
  in.Prepare(a.x, a.m, a.k, a.dtype, level);
  const int64_t grain = QuantColumnGrain(pool, a.m, a.n, a.k, RowGroupOf(a.dtype));
  pool.ParallelFor(a.n, grain, [&](int64_t b, int64_t e) {
    in.Columns(a.w, a.bias, a.y, a.n, b, e);
  });
}

}  // namespace moe
