// CPU matrix products y[m, n] = x[m, k] W[n, k]^T (+ bias), f32 activations,
// f32/f16/bf16 weights, f32 accumulation (the block formats kQ8/kQ4 go to
// cpu_quant_matmul.h). One kernel per SIMD level (scalar,
// AVX2+FMA+F16C, AVX-512F; AMX adds tiles for bf16 weights and is AVX-512
// for everything else) compiled with function target attributes and
// chosen at run time; a thread pool splits the output columns.
//
// Within one SIMD level the result does not depend on the thread count: each
// output element is reduced by one thread in a fixed order.
#ifndef MOECACHE_KERNELS_CPU_MATMUL_H_
#define MOECACHE_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace moe {

class QuantizedInput;

// Ordered: a level includes every kernel of the levels below it. kAmx is
// kAvx512 plus AMX tiles for bf16 weights ("bf16 products on AMX" below)
// and for the interleaved int8 layouts (SmallRows16Amx, cpu_gguf_quant.h).
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

absl::string_view SimdLevelName(SimdLevel level);
// Whether this CPU (and OS) can run `level`. kAmx: AVX-512 and
// AMX-TILE/AMX-BF16/AMX-INT8, with the tile data state granted to this
// process by the kernel (AmxSupported).
bool SimdLevelSupported(SimdLevel level);
// The best supported level; $MOE_CPU_SIMD=scalar|avx2|avx512|amx caps it.
SimdLevel DetectSimdLevel();
// level is kAvx512 or above: the AVX-512 kernels (f32, f16, the block
// formats, the vector ops) run.
inline bool AtLeastAvx512(SimdLevel level) { return level >= SimdLevel::kAvx512; }

struct MatMulArgs {
  const float* x;     // [m, k]
  const void* w;      // [n, k] of dtype
  DType dtype;
  const float* bias;  // [n] or nullptr
  float* y;           // [m, n]
  int64_t m, n, k;
};

// Depth of one pass over k: x rows of this length stay in L1, the W rows of
// a column chunk in L2. Part of the reduction order, so of the results.
inline constexpr int64_t kMatMulKBlock = 1024;

// Computes the columns [n_begin, n_end) of y for all rows, single-threaded.
void MatMulColumnsScalar(const MatMulArgs& a, int64_t n_begin, int64_t n_end);
void MatMulColumnsAvx2(const MatMulArgs& a, int64_t n_begin, int64_t n_end);
void MatMulColumnsAvx512(const MatMulArgs& a, int64_t n_begin, int64_t n_end);

// Vector helpers for the other ops (attention), per SIMD level.
struct VectorOps {
  float (*dot)(const float* a, const float* b, int64_t n);   // sum a[i]*b[i]
  void (*axpy)(float alpha, const float* x, float* y, int64_t n);  // y += a*x
  // out[j] = dot(a, b + j * stride, n) * scale for j < rows: bit for bit
  // `dot` row by row, in one call (attention's scores).
  void (*dot_rows)(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float scale, float* out);
  // axpy(alpha[j], x + j * stride, y, n) for j = 0 .. rows - 1, bit for bit,
  // with y held in registers across the rows (attention's weighted values).
  void (*axpy_rows)(const float* alpha, const float* x, int64_t stride, int64_t rows, float* y,
                    int64_t n);
  // The largest of x[0, n), NaNs skipped (cpu::MaxValue: exact, the same at
  // every level).
  float (*max)(const float* x, int64_t n);
  // x[j] = e^(x[j] - shift) in place for j < n, returning their sum
  // (softmax numerators and denominator). Scalar and AVX2: std::exp of each
  // float difference, summed in index order; AVX-512: the vector exp of
  // cpu_ops_avx512.cc (within 1 ulp), summed in 16 lanes (lane l the terms
  // j = l mod 16, in order), then _mm512_reduce_add_ps. The same arithmetic
  // whatever the caller's batch or split, so attention's rows stay bit for
  // bit what one row alone gives.
  float (*exp_sum)(float* x, int64_t n, float shift);
  // dot_rows and axpy_rows over rows of bf16 (MLA's kv_b block as it is
  // stored): bit for bit the f32 helpers on the rows widened to f32, which
  // rounds nothing, without the widened copy.
  void (*dot_rows_bf16)(const float* a, const uint16_t* b, int64_t stride, int64_t rows,
                        int64_t n, float scale, float* out);
  void (*axpy_rows_bf16)(const float* alpha, const uint16_t* x, int64_t stride, int64_t rows,
                         float* y, int64_t n);
};
// REQUIRES: SimdLevelSupported(level).
VectorOps VectorOpsFor(SimdLevel level);
float DotAvx2(const float* a, const float* b, int64_t n);
void AxpyAvx2(float alpha, const float* x, float* y, int64_t n);
void DotRowsAvx2(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                 float scale, float* out);
void AxpyRowsAvx2(const float* alpha, const float* x, int64_t stride, int64_t rows, float* y,
                  int64_t n);
void DotRowsBf16Avx2(const float* a, const uint16_t* b, int64_t stride, int64_t rows, int64_t n,
                     float scale, float* out);
void AxpyRowsBf16Avx2(const float* alpha, const uint16_t* x, int64_t stride, int64_t rows,
                      float* y, int64_t n);
float DotAvx512(const float* a, const float* b, int64_t n);
void AxpyAvx512(float alpha, const float* x, float* y, int64_t n);
void DotRowsAvx512(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float scale, float* out);
void AxpyRowsAvx512(const float* alpha, const float* x, int64_t stride, int64_t rows, float* y,
                    int64_t n);
void DotRowsBf16Avx512(const float* a, const uint16_t* b, int64_t stride, int64_t rows, int64_t n,
                       float scale, float* out);
void AxpyRowsBf16Avx512(const float* alpha, const uint16_t* x, int64_t stride, int64_t rows,
                        float* y, int64_t n);

// bf16 products on AVX512_BF16. At the AVX-512 level, on a CPU with
// AVX512_BF16 (and unless $MOE_BF16_DOT=0, a diagnostic), a product with
// bf16 weights rounds its activations to bf16 once (RoundToBf16: FloatToBF16
// per element), as llama.cpp's BF16 products do, and sums them with
// vdpbf16ps: per output and k-block of kMatMulKBlock, 16 f32 lanes, lane l
// adding the products of elements 32c + 2l + 1 then 32c + 2l, each product
// exact and each addition rounded to nearest even (input bf16 denormals
// read as zero), chunks c in order; then the lanes' _mm512_reduce_add_ps,
// the k % 32 tail's products added one by one, and the k-blocks and the
// bias as the f32 kernels do. The same arithmetic for every m (decode and
// prompts alike), thread count and column split; other levels and CPUs keep
// the f32 activations (which the f32 kernels' AVX-512 results already
// differ from AVX2's in their summation order). Twice the products per
// instruction of the f32 FMA: ~1.8x the prompt throughput of a bf16
// expert's products on a zen4 core.
bool Bf16DotSupported();
// Tests: Bf16DotSupported() as if $MOE_BF16_DOT were unset (true) or 0
// (false), on a CPU that has AVX512_BF16; nullopt: the environment again,
// which is read once, at the first call.
void SetBf16DotForTest(std::optional<bool> on);
// dtype is kBF16, level kAvx512 or kAmx, and Bf16DotSupported().
bool UsesBf16Dot(DType dtype, SimdLevel level);
// out[i] = FloatToBF16(x[i]). REQUIRES: Bf16DotSupported() (it runs
// AVX-512).
void RoundToBf16(const float* x, int64_t count, uint16_t* out);
// The columns [n_begin, n_end) of y = xb a.w^T (+ a.bias) for bf16 a.w,
// with xb the activations a.x rounded by RoundToBf16 ([a.m, a.k]; a.x is
// not read). REQUIRES: Bf16DotSupported().
void Bf16DotColumns(const uint16_t* xb, const MatMulArgs& a, int64_t n_begin, int64_t n_end);

// bf16 products on AMX. At the kAmx level a product with bf16 weights
// whose k is a positive multiple of 32 (UsesAmx; any other k takes the
// vdpbf16ps products above) rounds its activations to bf16 as above and
// runs AMX tiles (kernels/cpu_amx.cc): an output is its 16-row weight
// tile's TDPBF16PS over k in steps of 32, in order, from zero, plus the
// bias. TDPBF16PS sums an instruction's 32 products with its own internal
// alignment (not IEEE additions in some order: measured on Sapphire
// Rapids, docs/architecture.md), so the bits differ from the vdpbf16ps
// path's; they are the same for every m (decode, batches and prompts
// alike), thread count and column split, because each element of a tile
// depends on its own weight row and activation row only. Each element is
// within a few float32 roundings of the float64 product of the rounded
// activations and the weights (tests/kernels/amx_test.cc bounds it).
// Decode reads the weights as the other paths do (one pass, at the memory
// bandwidth); prompts gain the tiles' 512 products per cycle.
// AMX-TILE, AMX-BF16, AMX-INT8, AVX512_BF16 and AVX-512 VNNI are present
// and Linux granted the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM,
// asked once here).
bool AmxSupported();
// UsesBf16Dot(dtype, level), level kAmx, and k a positive multiple of 32.
bool UsesAmx(DType dtype, SimdLevel level, int64_t k);
// The packed activations' length for m rows of k: m rounded up to 16, by k.
int64_t AmxPackedSize(int64_t m, int64_t k);
// Packs bf16 activations xb [m, k] (k even) for the tiles: per block of 16
// rows, per pair p of k, the 16 rows' elements 2p and 2p + 1, rows past m
// zero. out has AmxPackedSize(m, k) elements.
void PackForAmx(const uint16_t* xb, int64_t m, int64_t k, uint16_t* out);
// The columns [n_begin, n_end) of y = xb a.w^T (+ a.bias) for bf16 a.w,
// from the activations packed by PackForAmx (a.x is not read).
// REQUIRES: AmxSupported(), UsesAmx's k.
void AmxBf16Columns(const uint16_t* packed, const MatMulArgs& a, int64_t n_begin, int64_t n_end);

// The whole product on `pool` with the kernel of `level` (for kQ8/kQ4:
// CpuQuantMatMul; bf16 weights on AVX512_BF16: the products above).
// REQUIRES: SimdLevelSupported(level).
void CpuMatMul(ThreadPool& pool, SimdLevel level, const MatMulArgs& a);

// An expert's gate and up in one pass over the pool, then
// g = silu(g) * u in place: as two CpuMatMul calls and cpu::SiluMul, bit for
// bit, with one wake-up of the pool and (block formats) the activations
// quantized once.
// REQUIRES: SimdLevelSupported(level); dtype a weight dtype, k a multiple of
// its group.
void CpuGateUpSilu(ThreadPool& pool, SimdLevel level,
                   const float* x,     // [m, k]
                   const void* gate,   // [n, k] of dtype
                   const void* up,     // [n, k] of dtype
                   DType dtype,
                   float* g,           // [m, n]: silu(x gate^T) * (x up^T)
                   float* u,           // [m, n] scratch
                   int64_t m, int64_t n, int64_t k);

// Several experts of one layer (their gate and up share one dtype, as do
// their downs): every expert's gate, up and g = silu(g) * u in one pass over
// the pool (their rows concatenated), then every down in a second. Bit for
// bit CpuGateUpSilu and CpuMatMul per expert (a product's outputs do not
// depend on how its columns are split), with two wake-ups of the pool per
// layer instead of two per expert and longer runs over the weights.
// Block-format activations (and bf16 ones on AVX512_BF16) are prepared
// into `inputs` (one per expert, kept by the caller so that its buffers
// are reused).
struct ExpertPass {
  const float* x = nullptr;  // [count, hidden]
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
  float* g = nullptr;  // [count, inter]: silu(x gate^T) * (x up^T)
  float* u = nullptr;  // [count, inter] scratch
  float* d = nullptr;  // [count, hidden]: g down^T
  int64_t count = 0;
};
// REQUIRES: SimdLevelSupported(level); inputs.size() >= experts.size();
// hidden and inter multiples of the dtypes' groups and row groups.
void CpuExpertPasses(ThreadPool& pool, SimdLevel level, absl::Span<const ExpertPass> experts,
                     DType gate_up, DType down, int64_t hidden, int64_t inter,
                     absl::Span<QuantizedInput> inputs);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_MATMUL_H_
