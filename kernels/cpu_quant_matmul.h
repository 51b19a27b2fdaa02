// CPU products with block-format weights (kQ8, kQ4, kMxfp4;
// common/quant.h):
// y[m, n] = x[m, k] W[n, k]^T (+ bias), reading W's blocks directly.
//
// As in llama.cpp's vec_dot_q8_0_q8_0 / q4_1_q8_1, the activations are first
// rounded to 8 bits per 32 (QuantizeActivations: a scale per 32; ggml's
// K-quants per 256 instead, KActivations, kernels/cpu_gguf_quant.h), and
// each block's dot product is an exact integer sum, scaled once:
//   kQ8: y += d_w * d_x * sum(q_w * q_x)
//   kQ4: y += d_w * d_x * sum(q_w * q_x) + m_w * d_x * sum(q_x)
//   kMxfp4: y += 2^(e_w - 128) * d_x * sum((2 fp4_w) * q_x)
// So the result is the product of the dequantized weights and the rounded
// activations (RoundActivations) up to f32 rounding of the per-block terms;
// the integer sums make the kernels ~4x cheaper per weight than converting
// codes to floats, which is what makes the formats faster at decode than
// bf16 and not just smaller.
//
// Within one SIMD level the result does not depend on the thread count
// (each output is reduced by one thread, blocks in order), nor on how many
// activation rows are computed together (decode alone or a prompt's tile).
// The levels differ in the f32 rounding of the per-block terms' sum (since
// 2026-12-04 the AVX-512 q4 kernel sums the min terms of even and odd
// blocks apart, then adds them).
#ifndef MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_
#define MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu_matmul.h"

namespace moe {

inline constexpr int64_t kActGroup = 32;

// Activations rounded to 8 bits per kActGroup: q = round_half_even(x * 127
// / max|x|) and d per group, sd[g] = d[g] * sum of the group's q, with
// d and sd as `ActRounding` says:
//  * kF32: d = max|x| / 127 (our formats q8, q4, mxfp4);
//  * kGgmlQ8_0: d = ActScale32(max|x|), max|x| / 127 rounded to f16 as
//    ggml's block_q8_0 stores it (ggml's 32-weight blocks Q4_0, Q5_0: the
//    f32 d kept our log-probs ~0.005 nats from llama.cpp's on its files);
//    sd exact (11 x 12 bits);
//  * kGgmlQ8_1 (Q4_1, Q5_1): d as kGgmlQ8_0, sd = ActSum32: (max|x| / 127)
//    * sum rounded to f16, as block_q8_1's s.
// (q8 is byte for byte GGUF's Q8_0 but keeps kF32: a GGUF's Q8_0 tensors
// are the one ggml type whose activations still differ from llama.cpp's.)
enum class ActRounding { kF32, kGgmlQ8_0, kGgmlQ8_1 };
// The rounding a weight dtype meets (kGgml* for ggml's 32-weight types).
ActRounding ActRoundingFor(DType dtype);
struct QuantizedActivations {
  int64_t m = 0, k = 0;
  std::vector<int8_t> q;   // [m, k]
  std::vector<float> d;    // [m, k / kActGroup]
  std::vector<float> sd;   // [m, k / kActGroup]
  std::vector<int32_t> s;  // [m, k / kActGroup]: the sum of the group's q
};
// A group's scale: max|x| / 127, rounded to the nearest f16 where `ggml`
// (ggml's Q8_0) unless that f16 would be infinite (max|x| > ~8.3e6, where
// ggml's would make every product of the group inf or NaN).
float ActScale32(float amax, bool ggml);
// A Q8_1 group's sum term: (amax / 127) * sum rounded to the nearest f16,
// or unrounded where that f16 would be infinite.
float ActSum32(float amax, int32_t sum);
// REQUIRES: k % kActGroup == 0.
void QuantizeActivations(const float* x, int64_t m, int64_t k,
                         QuantizedActivations* out,
                         ActRounding rounding = ActRounding::kF32);
// x rounded as the kernels see it (d * q), for references.
std::vector<float> RoundActivations(const float* x, int64_t m, int64_t k,
                                    ActRounding rounding = ActRounding::kF32);

inline constexpr int64_t kKBlock = 256;

// The ggml K-quants' activations (kernels/cpu_gguf_quant.h), rounded to 8
// bits per 256 as ggml's Q8_K: per block of 256,
// inv = 127 / max|x|, q = round_half_even(x * inv), d = 1 / inv (0 and all
// codes 0 for a block of zeros), and bsums[t] = the sum of codes 16t ..
// 16t + 15.
struct KActivations {
  int64_t m = 0, k = 0;
  std::vector<int8_t> q;        // [m, k]
  std::vector<float> d;         // [m, k / 256]
  std::vector<int16_t> bsums;   // [m, k / 16]
};
// REQUIRES: k % 256 == 0. Grows the buffers, never shrinks them.
void SizeKActivations(int64_t m, int64_t k, KActivations* out);  // sets m, k; grows
void QuantizeKActivations(const float* x, int64_t m, int64_t k, KActivations* out);
// x rounded as the K kernels see it (d * q), for references.
std::vector<float> RoundKActivations(const float* x, int64_t m, int64_t k);
// QuantizeKActivations's arithmetic with AVX-512 (bit for bit the same;
// cpu_gguf_quant_avx512.cc). REQUIRES: Q8VnniSupported(), k % 256 == 0.
void QuantizeKActivationsAvx512(const float* x, int64_t m, int64_t k, KActivations* out);

// y[r * y_stride + c] = K-quant weight row c (at w + c * w_stride) .
// activation row i0 + r (+ bias[c] where bias is not null), for c < n_rows
// and r < rows (1 to kKMaxRows): a row's blocks are unpacked once for all
// `rows`, and each pair's sums run in the order they have alone, so a
// result does not depend on `rows` or `n_rows` (a prompt's tile, a decode
// step and any split of the rows between threads agree).
inline constexpr int kKMaxRows = 4;
// The fewest activation rows of a kQ8R16 / kQ4_0R16 product that run on the
// AMX-INT8 tiles at the kAmx level (the same bits either way). Below it the
// VNNI kernel: at one row (decode) the tiles were as fast for q8 and 12%
// slower for Q4_0, whose nibbles they unpack per block; a 200-token prompt
// was 1.4x faster for q8 (docs/benchmarks.md, "q8 and Q4_0 on AMX-INT8").
inline constexpr int64_t kAmxMinRows = 4;
using GgufKRowsFn = void (*)(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                             const KActivations& x, int64_t i0, int rows, const float* bias,
                             float* y, int64_t y_stride);

// The AVX-512 VNNI q8 dot product (cpu_quant_vnni.cc): one output y[i, j]
// of the q8 row `w`. REQUIRES: Q8VnniSupported().
float DotQ8Avx512Vnni(const uint8_t* w, const QuantizedActivations& x, int64_t i);

// q4 activations as the VNNI row kernels read them: the codes, the scale d
// of each 4-code lane's group (lane_d, so a block's scales are one vector
// multiply) and, per 64-weight block, sd of its two groups added (block_sd,
// the min term's factor); PrepareVnniLanes fills the last two.
// (Row-major q8 keeps the per-output DotQ8Avx512Vnni: a tile of 2 weight
// rows x 4 activation rows sharing each loaded block measured 7% slower;
// its per-block float work, not its loads, bounds it. Q8x16, 16 rows
// interleaved, shares that work between 16 rows: cpu_gguf_quant.h.)
struct VnniActivations {
  int64_t m = 0, k = 0;
  const int8_t* q = nullptr;        // [m, k]
  const float* lane_d = nullptr;    // [m, k / 4]
  const float* block_sd = nullptr;  // [m, k / 64]
};
void PrepareVnniLanes(const QuantizedActivations& x,
                      float* lane_d,     // [x.m, x.k / 4]
                      float* block_sd);  // [x.m, x.k / 64]
// QuantizeActivations's arithmetic with AVX-512 (bit for bit the same).
// REQUIRES: Q8VnniSupported(); q [m, k], d, sd and s [m, k / kActGroup].
void QuantizeActivationsAvx512(const float* x, int64_t m, int64_t k, int8_t* q, float* d,
                               float* sd, int32_t* s, ActRounding rounding);

// y[r * y_stride] = q4 row `w` . activation row i0 + r (+ bias), for
// r < rows (1 to kVnniMaxRows): one pass over the row's blocks serves all
// `rows`, and each row's sums run in the order they have alone (even and
// odd blocks in two accumulators each, for the codes and the min term), so
// a row's result does not depend on `rows`. REQUIRES: Q8VnniSupported().
inline constexpr int kVnniMaxRows = 4;
using VnniRowsFn = void (*)(const uint8_t* w, const VnniActivations& x, int64_t i0, int rows,
                            float bias, float* y, int64_t y_stride);
VnniRowsFn Q4RowsVnni();
// AVX512_VNNI, AVX512BW, AVX512VL and AVX512DQ are all present.
bool Q8VnniSupported();

// Whether products of `dtype` weights at `level` read activations prepared
// by a QuantizedInput: the block formats, and bf16 on AVX512_BF16
// (UsesBf16Dot, cpu_matmul.h: activations rounded to bf16; on AMX also
// packed for the tiles).
bool PreparesActivations(DType dtype, SimdLevel level);

// Activations quantized once for any number of products with them (an
// expert's gate and up share theirs), for one weight dtype and SIMD level,
// with the kernel that goes with them. Its buffers only grow, so a kept
// QuantizedInput allocates nothing once warm. Prepare is not thread-safe;
// Columns may run on several threads at once.
class QuantizedInput {
 public:
  // REQUIRES: PreparesActivations(dtype, level), k a multiple of its group,
  // SimdLevelSupported(level).
  void Prepare(const float* x,  // [m, k]
               int64_t m, int64_t k, DType dtype, SimdLevel level);
  // Columns [n_begin, n_end) of y = x W^T (+ bias), for every row of x.
  void Columns(const void* w,      // [n, k] of the prepared dtype
               const float* bias,  // [n] or nullptr
               float* y,           // [m, n]
               int64_t n, int64_t n_begin, int64_t n_end) const;

 private:
  QuantizedActivations x_;
  std::vector<float> lane_d_, block_sd_;
  VnniActivations vx_;
  VnniRowsFn vnni_rows_ = nullptr;
  KActivations kx_;                // the K-quants' activations (per 256)
  GgufKRowsFn k_rows_ = nullptr;   // set for the K-quants
  // The 32-weight ggml types on AVX-512 VNNI (GgufSmallRowsFn,
  // cpu_gguf_quant.h).
  void (*small_rows_)(const uint8_t*, int64_t, int64_t, const QuantizedActivations&, int64_t,
                      int, const float*, float*, int64_t) = nullptr;
  // ... and on AMX-INT8 for kQ8R16 / kQ4_0R16 (SmallRows16Amx) from
  // kAmxMinRows activation rows: the same bits, up to 16 rows a call.
  void (*amx_rows_)(const uint8_t*, int64_t, int64_t, const QuantizedActivations&, int64_t, int,
                    const float*, float*, int64_t) = nullptr;
  float (*dot_)(const uint8_t*, const QuantizedActivations&, int64_t) = nullptr;
  int64_t row_bytes_ = 0;
  // bf16 weights on AVX512_BF16: the activations rounded to bf16 [m, k].
  std::vector<uint16_t> xb_;
  int64_t xb_m_ = -1;  // >= 0 while xb_ is the prepared input
  // ... and on AMX (UsesAmx): xb_ packed for the tiles (PackForAmx).
  std::vector<uint16_t> xv_;
  bool amx_ = false;
};
// Where to prepare m x k activations: the calling thread's own
// QuantizedInput, kept for the thread's life, up to 8 Mi activations (its
// buffers then hold ~9 bytes per activation); `*local` above.
QuantizedInput& QuantizedInputFor(int64_t m, int64_t k, QuantizedInput* local);
// The ParallelFor grain over the n columns of a quantized product: whole
// row groups of `group` rows (RowGroupOf of the weights' dtype), so every
// chunk starts on one.
int64_t QuantColumnGrain(const ThreadPool& pool, int64_t m, int64_t n, int64_t k,
                         int64_t group);

// REQUIRES: IsQuantDType(a.dtype), a.k a multiple of its group,
// SimdLevelSupported(level). At the AVX-512 level q8 and q4 run the VNNI
// (vpdpbusd) kernels above where the CPU has them; without VNNI, and for
// MXFP4, the AVX2 kernels run.
void CpuQuantMatMul(ThreadPool& pool, SimdLevel level, const MatMulArgs& a);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_
