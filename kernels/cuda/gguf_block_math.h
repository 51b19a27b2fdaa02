// The per-block arithmetic of ggml's weight blocks (Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K; layouts in common/gguf_blocks.h) as the CUDA kernels
// (gguf_gemm.cu) run it, in functions that compile for the device (nvcc)
// and for the host (g++): tests/kernels/gguf_block_math_test.cc runs this
// very code on the CPU against the CPU kernels (kernels/cpu_gguf_quant.h)
// and a float64 reference, so the GPU's arithmetic is tested where there is
// no GPU.
//
// The op is the CPU one, operation for operation up to the order of the f32
// additions:
//  * Activations are rounded as the CPU rounds them (QuantizeActivations,
//    QuantizeKActivations, kernels/cpu_quant_matmul.h) with the same float
//    operations (ActScale32Of, ActScaleKOf, ActCode), so the codes, scales
//    and sums are the same bits: per 32 for the 32-weight types (codes, d_x
//    and d_x * sum(codes)), per 256 for the K-quants (ggml's Q8_K: codes,
//    d_x and the sum of every 16 codes).
//  * A block's dot product with its activations is one exact integer
//    (sub-block scales applied in integers), scaled once:
//      32-weight types: dot = s (d d_x), min = m (d_x sum(q_x)) (Q4_1, Q5_1)
//      K-quants:        dot = (d d_x) isum, min = -(dmin d_x) msum
//    and the block adds dot + min. The products are rounded as the CPU
//    rounds them (MulRn: never fused into an FMA), so every block's two
//    terms equal the CPU's to the bit; only their sum's order differs.
//
// The integers stay below 2^31 (cpu_gguf_quant.h). Units: a K block is read
// in 8 units of 32 weights (unit u: weights 32u .. 32u + 31; a sub-block of
// Q4_K / Q5_K, two of Q6_K), so eight lanes can share one block and add
// their integer parts exactly.
//
// REQUIRES for the device build: IEEE division and no flush-to-zero (no
// --use_fast_math, -ftz=false), as nvcc does by default.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_KERNELS_CUDA_GGUF_BLOCK_MATH_H_
#define MOECACHE_KERNELS_CUDA_GGUF_BLOCK_MATH_H_

#include <math.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOE_GGUF_HD __host__ __device__ __forceinline__
#else
#define MOE_GGUF_HD inline
#endif

namespace moe::gguf_math {

// The block types, numbered as DType and the CUDA ABI's MOE_CUDA_DTYPE_*
// (checked by the test and by kernels/cuda_backend.cc).
enum Kind : int {
  kQ4_0 = 18,
  kQ4_1 = 19,
  kQ5_0 = 20,
  kQ5_1 = 21,
  kQ4K = 22,
  kQ5K = 23,
  kQ6K = 24,
};

MOE_GGUF_HD constexpr bool IsKind(int t) { return t >= kQ4_0 && t <= kQ6K; }
MOE_GGUF_HD constexpr bool IsK(int t) { return t >= kQ4K && t <= kQ6K; }
// Has a min term: Q4_1, Q5_1 (+ m), Q4_K, Q5_K (- dmin m_j).
MOE_GGUF_HD constexpr bool HasMin(int t) {
  return t == kQ4_1 || t == kQ5_1 || t == kQ4K || t == kQ5K;
}
MOE_GGUF_HD constexpr bool HasFifthBit(int t) {
  return t == kQ5_0 || t == kQ5_1 || t == kQ5K;
}
MOE_GGUF_HD constexpr int BlockElems(int t) { return IsK(t) ? 256 : 32; }
MOE_GGUF_HD constexpr int BlockBytes(int t) {
  return t == kQ4_0   ? 18
         : t == kQ4_1 ? 20
         : t == kQ5_0 ? 22
         : t == kQ5_1 ? 24
         : t == kQ4K  ? 144
         : t == kQ5K  ? 176
                      : 210;
}
// Integer-scaled sub-blocks per block (1: the 32-weight types have none)
// and weights per sub-block.
MOE_GGUF_HD constexpr int SubBlocks(int t) {
  return t == kQ6K ? 16 : IsK(t) ? 8 : 1;
}
MOE_GGUF_HD constexpr int SubElems(int t) {
  return BlockElems(t) / SubBlocks(t);
}
// The 32-weight units of a block (the GEMV's lanes per block).
MOE_GGUF_HD constexpr int Units(int t) { return BlockElems(t) / 32; }

// ---- Scalars ----

MOE_GGUF_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// a * b rounded once. nvcc fuses a * b + c into an FMA by default; the CPU
// kernels round the product first, and so do we.
MOE_GGUF_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Little-endian loads at any alignment (blocks are 18 to 210 bytes).
MOE_GGUF_HD uint32_t Load16(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}
MOE_GGUF_HD uint32_t Load32(const uint8_t* p) {
  return Load16(p) | (Load16(p + 2) << 16);
}

// IEEE binary16 -> float, exact (subnormals included): moe::HalfToFloat.
MOE_GGUF_HD float HalfToF32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v =
        static_cast<float>(mant) * BitsToFloat(0x33800000u);  // 2^-24
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}
MOE_GGUF_HD float F16At(const uint8_t* p) { return HalfToF32(Load16(p)); }

// A finite float >= 0 rounded to the nearest binary16 (ties to even) and
// back: moe::HalfToFloat(moe::FloatToHalf(x)) (common/dtype.h) for these
// inputs; +inf above the largest half.
MOE_GGUF_HD float RoundToHalfNonNeg(float x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__float2half_rn(x));
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (u >= 0x477ff000u) return BitsToFloat(0x7f800000u);  // rounds past 65504
  uint32_t h;
  if (u < 0x38800000u) {  // below 2^-14: a half subnormal or zero
    const uint32_t exp = u >> 23;
    if (exp < 102) return 0.0f;  // below 2^-25
    const uint32_t mant = (u & 0x7fffffu) | 0x800000u;
    const int shift = static_cast<int>(126 - exp);
    const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    h = mant >> shift;
    if (rest > half || (rest == half && (h & 1u))) ++h;
  } else {
    const uint32_t r = u - (112u << 23);
    const uint32_t rest = r & 0x1fffu;
    h = r >> 13;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  }
  return HalfToF32(h);
#endif
}

// ---- Activations (the CPU quantizers' float operations) ----

struct ActScale {
  float d;    // the scale of the codes
  float inv;  // what x is multiplied by before rounding
};
// Per 32 (QuantizeActivations, ggml's Q8_0): d = ActScale32(amax) (amax /
// 127 rounded to f16, unrounded where that is infinite), inv = 127 / amax.
MOE_GGUF_HD ActScale ActScale32Of(float amax) {
  const float d = amax / 127.0f;
  const float h = RoundToHalfNonNeg(d);
  return {isfinite(h) ? h : d, amax > 0.0f ? 127.0f / amax : 0.0f};
}
// Per 256 (QuantizeKActivations, ggml's Q8_K): inv = 127 / amax, d = 1 / inv.
MOE_GGUF_HD ActScale ActScaleKOf(float amax) {
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  return {amax > 0.0f ? 1.0f / inv : 0.0f, inv};
}
// round_half_even(x * inv) within +-127.
MOE_GGUF_HD int ActCode(float x, float inv) {
  return static_cast<int>(fminf(fmaxf(rintf(x * inv), -127.0f), 127.0f));
}
// d_x * sum(codes) of a 32-group (the min terms' factor); for Q4_1 / Q5_1
// (ggml's Q8_1, `q8_1`) ActSum32: (amax / 127) * sum rounded to f16,
// unrounded where that is infinite.
MOE_GGUF_HD float ActSumScale(float d, int code_sum) {
  return MulRn(d, static_cast<float>(code_sum));
}
MOE_GGUF_HD float ActSum32(float amax, int code_sum) {
  const float s = MulRn(amax / 127.0f, static_cast<float>(code_sum));
  if (s < 0.0f) {
    const float h = -RoundToHalfNonNeg(-s);
    return isfinite(h) ? h : s;
  }
  const float h = RoundToHalfNonNeg(s);
  return isfinite(h) ? h : s;
}
// Whether a 32-weight kind meets Q8_1 activations (a min term).
MOE_GGUF_HD bool UsesQ8_1(int kind) { return kind == kQ4_1 || kind == kQ5_1; }

// One group of 32 activations, serially (the kernel does it one lane per
// activation with the same operations).
MOE_GGUF_HD void QuantizeGroup32(const float* x,  // [32]
                                 int8_t* q,       // [32]
                                 float* d, float* sd, bool q8_1 = false) {
  float amax = 0.0f;
  for (int t = 0; t < 32; ++t) amax = fmaxf(amax, fabsf(x[t]));
  const ActScale s = ActScale32Of(amax);
  int sum = 0;
  for (int t = 0; t < 32; ++t) {
    const int c = ActCode(x[t], s.inv);
    q[t] = static_cast<int8_t>(c);
    sum += c;
  }
  *d = s.d;
  *sd = q8_1 ? ActSum32(amax, sum) : ActSumScale(s.d, sum);
}

// One group of 256 activations as ggml's Q8_K, serially.
MOE_GGUF_HD void QuantizeGroup256(const float* x,  // [256]
                                  int8_t* q,       // [256]
                                  float* d,
                                  int16_t* bsums) {  // [16]
  float amax = 0.0f;
  for (int t = 0; t < 256; ++t) amax = fmaxf(amax, fabsf(x[t]));
  const ActScale s = ActScaleKOf(amax);
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) {
      const int c = ActCode(x[16 * g + l], s.inv);
      q[16 * g + l] = static_cast<int8_t>(c);
      sum += c;
    }
    bsums[g] = static_cast<int16_t>(sum);
  }
  *d = s.d;
}

// ---- Weights ----

// The block's f32 scale d, and its min factor (m of Q4_1 / Q5_1, dmin of
// Q4_K / Q5_K; 0 for the others).
template <int T>
MOE_GGUF_HD float BlockD(const uint8_t* blk) {
  return F16At(blk + (T == kQ6K ? 208 : 0));
}
template <int T>
MOE_GGUF_HD float BlockMin(const uint8_t* blk) {
  if constexpr (HasMin(T)) {
    return F16At(blk + 2);
  } else {
    return 0.0f;
  }
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed
// bytes at blk + 4 (sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7;
// 4-7 from a nibble of bytes 8-11 and the top 2 bits of bytes 0-7).
MOE_GGUF_HD void KScaleMin(const uint8_t* q, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Integer scale of sub-block j (< SubBlocks(T)) of a K block: Q4_K / Q5_K
// 0..63, Q6_K -128..127; 1 for the 32-weight types.
template <int T>
MOE_GGUF_HD int SubScale(const uint8_t* blk, int j) {
  if constexpr (T == kQ6K) {
    return static_cast<int8_t>(blk[192 + j]);
  } else if constexpr (IsK(T)) {
    int scale, min;
    KScaleMin(blk + 4, j, &scale, &min);
    return scale;
  } else {
    return 1;
  }
}
// Integer min of sub-block j (< 8) of a Q4_K / Q5_K block; 0 otherwise.
template <int T>
MOE_GGUF_HD int SubMin(const uint8_t* blk, int j) {
  if constexpr (T == kQ4K || T == kQ5K) {
    int scale, min;
    KScaleMin(blk + 4, j, &scale, &min);
    return min;
  } else {
    return 0;
  }
}

// The integer code of weight e (< BlockElems(T)) of a block, its offset
// applied: w = d * code (Q4_0, Q5_0: q - 8, q - 16), d * code + m (Q4_1,
// Q5_1: q), d * scale_j * code - dmin * min_j (Q4_K, Q5_K: q), d * scale_j
// * code (Q6_K: q - 32). Always within int8.
template <int T>
MOE_GGUF_HD int WeightCode(const uint8_t* blk, int e) {
  if constexpr (T == kQ6K) {
    // Half h of 128 weights, group k (0..3) of 32: a nibble of
    // ql[64h + 32 (k & 1) + l] (high for k >= 2), bits 2k, 2k + 1 of
    // qh[32h + l].
    const int h = e / 128, k = (e / 32) % 4, l = e % 32;
    const uint8_t byte = blk[64 * h + 32 * (k & 1) + l];
    const int lo = k >= 2 ? byte >> 4 : byte & 0x0F;
    return (lo | (((blk[128 + 32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
  } else if constexpr (IsK(T)) {
    // Units 2c and 2c + 1 share qs[32c .. 32c + 32) (low, high nibbles);
    // Q5_K's fifth bit of unit u is bit u of qh[l].
    constexpr int kQs = T == kQ5K ? 48 : 16;
    const int u = e / 32, l = e % 32;
    const uint8_t byte = blk[kQs + 32 * (u / 2) + l];
    int q = (u & 1) != 0 ? byte >> 4 : byte & 0x0F;
    if constexpr (T == kQ5K) q |= ((blk[16 + l] >> u) & 1) << 4;
    return q;
  } else {
    // Byte j of qs holds weights j (low nibble) and j + 16 (high); Q5's
    // fifth bit of weight e is bit e of qh.
    constexpr int kQs = BlockBytes(T) - 16;
    constexpr int kOffset = HasMin(T) ? 0 : (HasFifthBit(T) ? 16 : 8);
    const uint8_t byte = blk[kQs + e % 16];
    int q = e < 16 ? byte & 0x0F : byte >> 4;
    if constexpr (HasFifthBit(T)) {
      q |= static_cast<int>((Load32(blk + (HasMin(T) ? 4 : 2)) >> e) & 1u) << 4;
    }
    return q - kOffset;
  }
}

// The 32 codes of unit u (< Units(T)) of a block: WeightCode(blk, 32u + l)
// for l < 32, each byte of the block read once.
template <int T>
MOE_GGUF_HD void DecodeUnit(const uint8_t* blk, int u,
                            int8_t* out) {  // out: [32]
  if constexpr (T == kQ6K) {
    const int h = u / 4, k = u % 4;
    const uint8_t* ql = blk + 64 * h + 32 * (k & 1);
    const uint8_t* qh = blk + 128 + 32 * h;
    for (int l = 0; l < 32; ++l) {
      const int lo = k >= 2 ? ql[l] >> 4 : ql[l] & 0x0F;
      out[l] = static_cast<int8_t>((lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32);
    }
  } else if constexpr (IsK(T)) {
    constexpr int kQs = T == kQ5K ? 48 : 16;
    const uint8_t* qs = blk + kQs + 32 * (u / 2);
    const int shift = (u & 1) != 0 ? 4 : 0;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 0x0F;
      if constexpr (T == kQ5K) q |= ((blk[16 + l] >> u) & 1) << 4;
      out[l] = static_cast<int8_t>(q);
    }
  } else {
    constexpr int kQs = BlockBytes(T) - 16;
    constexpr int kOffset = HasMin(T) ? 0 : (HasFifthBit(T) ? 16 : 8);
    const uint32_t qh = HasFifthBit(T) ? Load32(blk + (HasMin(T) ? 4 : 2)) : 0u;
    for (int j = 0; j < 16; ++j) {
      int lo = blk[kQs + j] & 0x0F, hi = blk[kQs + j] >> 4;
      if constexpr (HasFifthBit(T)) {
        lo |= static_cast<int>((qh >> j) & 1u) << 4;
        hi |= static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      }
      out[j] = static_cast<int8_t>(lo - kOffset);
      out[j + 16] = static_cast<int8_t>(hi - kOffset);
    }
  }
}

// ---- Integer dot products ----

// sum over the sub-blocks j of `elems` weights (a multiple of SubElems(T)):
// scale[j] * sum(w * x). For the 32-weight types `scale` is not read.
template <int T>
MOE_GGUF_HD int32_t ScaledDot(const int8_t* w,   // [elems] codes
                              const int* scale,  // [elems / SubElems(T)]
                              const int8_t* x,   // [elems] activation codes
                              int elems) {
  constexpr int kSub = SubElems(T);
  int32_t total = 0;
  for (int j = 0; j < elems / kSub; ++j) {
    int32_t s = 0;
    for (int l = 0; l < kSub; ++l) {
      s += static_cast<int32_t>(w[kSub * j + l]) *
           static_cast<int32_t>(x[kSub * j + l]);
    }
    total += IsK(T) ? scale[j] * s : s;
  }
  return total;
}

// Q4_K / Q5_K: sum over `subs` sub-blocks j of min[j] * (the sum of the
// sub-block's 32 activation codes: bsums[2j] + bsums[2j + 1]); 0 otherwise.
template <int T>
MOE_GGUF_HD int32_t MinSum(const int* min,        // [subs]
                           const int16_t* bsums,  // [2 subs]
                           int subs) {
  int32_t total = 0;
  if constexpr (T == kQ4K || T == kQ5K) {
    for (int j = 0; j < subs; ++j) {
      total += min[j] * (static_cast<int32_t>(bsums[2 * j]) + bsums[2 * j + 1]);
    }
  }
  return total;
}

// Unit u (< 8) of a K block, decoded once for any number of activation
// rows: its 32 codes and the integer scales and mins of its sub-blocks (one
// of Q4_K / Q5_K, two of Q6_K).
template <int T>
struct KUnit {
  static constexpr int kSubs = 32 / SubElems(T);
  int8_t w[32];
  int scale[kSubs];
  int min[kSubs];
};
template <int T>
MOE_GGUF_HD void LoadKUnit(const uint8_t* blk, int u, KUnit<T>* unit) {
  DecodeUnit<T>(blk, u, unit->w);
  for (int j = 0; j < KUnit<T>::kSubs; ++j) {
    unit->scale[j] = SubScale<T>(blk, KUnit<T>::kSubs * u + j);
    unit->min[j] = SubMin<T>(blk, KUnit<T>::kSubs * u + j);
  }
}
// The unit against its 32 activation codes: the scale-weighted integer dot
// (*isum) and min sum (*msum). Summed over the 8 units: the block's
// integers.
template <int T>
MOE_GGUF_HD void KUnitSums(const KUnit<T>& unit, int u,
                           const int8_t* x,       // [32]: the unit's codes
                           const int16_t* bsums,  // [16]: the block's
                           int32_t* isum, int32_t* msum) {
  *isum = ScaledDot<T>(unit.w, unit.scale, x, 32);
  *msum = MinSum<T>(unit.min, bsums + 2 * u, HasMin(T) ? 1 : 0);
}

// ---- A block's f32 terms ----

// What one block adds to an output: dot + min, each rounded as the CPU
// kernel rounds it.
struct BlockTerms {
  float dot;
  float min;
};

// 32-weight types: dot = s (d d_x), min = m sd_x (sd_x = d_x sum(q_x)).
MOE_GGUF_HD BlockTerms SmallTerms(float d, float m, int32_t s, float xd,
                                  float xsd, bool has_min) {
  return {MulRn(static_cast<float>(s), MulRn(d, xd)),
          has_min ? MulRn(m, xsd) : 0.0f};
}
// K-quants: dot = (d d_x) isum, min = -(dmin d_x) msum.
MOE_GGUF_HD BlockTerms KTerms(float d, float dmin, float xd, int32_t isum,
                              int32_t msum) {
  return {MulRn(MulRn(d, xd), static_cast<float>(isum)),
          -MulRn(MulRn(dmin, xd), static_cast<float>(msum))};
}

}  // namespace moe::gguf_math

#endif  // MOECACHE_KERNELS_CUDA_GGUF_BLOCK_MATH_H_
