// Products with ggml's block formats read as stored (MOE_CUDA_DTYPE_Q4_0 ..
// Q6_K; common/gguf_blocks.h): y[m, n] = x[m, k] W[n, k]^T (+ bias).
//
// The op is the CPU one (kernels/cpu_gguf_quant.h); every piece of
// arithmetic on a block is in gguf_block_math.h, which the CPU tests run
// too (tests/kernels/gguf_block_math_test.cc). Activations are first
// rounded as the CPU rounds them (per 32 for the 32-weight types, per 256
// as ggml's Q8_K for the K-quants; the same codes and scales), then each
// block adds its exact integer dot product scaled once. Only the order of
// the f32 additions differs from the CPU.
//  * m <= kGemvMaxRows (decode, small expert groups): one warp per output
//    column. 32-weight types: lane l takes blocks l, l + 32, ...; K-quants:
//    eight lanes share a block (one 32-weight unit each) and add their
//    integer parts with shuffles before the block is scaled, so every lane
//    works even on short rows (k = 2048 is 8 blocks).
//  * larger m (prefill): a tiled kernel, kTileM rows x kTileN columns per
//    block of 256 threads; each step stages one weight block per column as
//    int8 codes with its integer sub-block scales, and the matching
//    activation codes, in shared memory.
//
// Never run on a GPU yet: compiled, and its block math tested on the CPU.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gguf_block_math.h"

namespace moe::cuda {
namespace {

namespace gm = ::moe::gguf_math;

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;
constexpr int kTileM = 32;
constexpr int kTileN = 64;
constexpr int kQuantWarps = 4;  // activation groups per block of the quantizers

__device__ __forceinline__ int WarpSumInt(int v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

// One warp per group of 32 activations, one lane per activation.
__global__ void QuantizeAct32Kernel(
    const float* __restrict__ x,  // [groups, 32]
    int8_t* __restrict__ q,       // [groups, 32]
    float* __restrict__ d,        // [groups]
    float* __restrict__ sd,       // [groups]
    int64_t groups, bool q8_1) {
  const int64_t g =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (g >= groups) return;  // whole warps
  const float v = x[g * 32 + lane];
  const float amax = WarpMax(fabsf(v));
  const gm::ActScale s = gm::ActScale32Of(amax);
  const int c = gm::ActCode(v, s.inv);
  q[g * 32 + lane] = static_cast<int8_t>(c);
  const int sum = WarpSumInt(c, 32);
  if (lane == 0) {
    d[g] = s.d;
    sd[g] = q8_1 ? gm::ActSum32(amax, sum) : gm::ActSumScale(s.d, sum);
  }
}

// One warp per group of 256 activations (ggml's Q8_K), lane l taking
// activations 8l .. 8l + 7; lanes 2t and 2t + 1 form bsums[t].
__global__ void QuantizeAct256Kernel(
    const float* __restrict__ x,  // [groups, 256]
    int8_t* __restrict__ q,       // [groups, 256]
    float* __restrict__ d,        // [groups]
    int16_t* __restrict__ bsums,  // [groups, 16]
    int64_t groups) {
  const int64_t g =
      (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (g >= groups) return;
  const float* xs = x + g * 256 + 8 * lane;
  float v[8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = xs[i];
    amax = fmaxf(amax, fabsf(v[i]));
  }
  const gm::ActScale s = gm::ActScaleKOf(WarpMax(amax));
  int part = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = gm::ActCode(v[i], s.inv);
    q[g * 256 + 8 * lane + i] = static_cast<int8_t>(c);
    part += c;
  }
  part += __shfl_xor_sync(0xffffffffu, part, 1);
  if ((lane & 1) == 0) bsums[g * 16 + lane / 2] = static_cast<int16_t>(part);
  if (lane == 0) d[g] = s.d;
}

// The rounded activations: codes, one scale per group, and per group the
// scaled code sum (32-weight types) or the sum of every 16 codes (K).
struct Acts {
  const int8_t* q;       // [m, k]
  const float* d;        // [m, k / group]
  const float* sd;       // [m, k / 32]  (32-weight types)
  const int16_t* bsums;  // [m, k / 16]  (K-quants)
};

// 32-weight types, m <= kGemvMaxRows: one warp per column j, lane l over
// blocks l, l + 32, ...; a block's codes are decoded once for all rows.
template <int T>
__global__ void SmallGemvKernel(Acts a, const uint8_t* __restrict__ w,
                                const float* __restrict__ bias,
                                float* __restrict__ y, int m, int64_t n,
                                int64_t k) {
  constexpr int kBytes = gm::BlockBytes(T);
  const int lane = threadIdx.x & 31;
  const int64_t j =
      static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (j >= n) return;
  const int64_t blocks = k / 32;
  const uint8_t* row = w + j * blocks * kBytes;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t b = lane; b < blocks; b += 32) {
    const uint8_t* blk = row + b * kBytes;
    int8_t codes[32];
    gm::DecodeUnit<T>(blk, 0, codes);
    const float dw = gm::BlockD<T>(blk), mw = gm::BlockMin<T>(blk);
#pragma unroll
    for (int r = 0; r < kGemvMaxRows; ++r) {
      if (r < m) {
        const int64_t g = r * blocks + b;
        const int32_t s = gm::ScaledDot<T>(codes, nullptr, a.q + g * 32, 32);
        const gm::BlockTerms t =
            gm::SmallTerms(dw, mw, s, a.d[g], a.sd[g], gm::HasMin(T));
        acc[r] += t.dot + t.min;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < m) {
      const float s = WarpSum(acc[r]);
      if (lane == 0) y[r * n + j] = s + (bias != nullptr ? bias[j] : 0.0f);
    }
  }
}

// K-quants, m <= kGemvMaxRows: one warp per column j; per step the warp
// takes 4 blocks, lane l unit l % 8 of block l / 8. The eight lanes of a
// block add their integers (exact), then one of them scales the block.
// Every lane runs every step (shuffles need the whole warp).
template <int T>
__global__ void KGemvKernel(Acts a, const uint8_t* __restrict__ w,
                            const float* __restrict__ bias,
                            float* __restrict__ y, int m, int64_t n,
                            int64_t k) {
  constexpr int kBytes = gm::BlockBytes(T);
  const int lane = threadIdx.x & 31;
  const int u = lane & 7;
  const int64_t j =
      static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (j >= n) return;
  const int64_t blocks = k / 256;
  const uint8_t* row = w + j * blocks * kBytes;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t b0 = 0; b0 < blocks; b0 += 4) {
    const int64_t b = b0 + (lane >> 3);
    const bool live = b < blocks;
    const uint8_t* blk = row + b * kBytes;
    gm::KUnit<T> unit;
    if (live) gm::LoadKUnit<T>(blk, u, &unit);
#pragma unroll
    for (int r = 0; r < kGemvMaxRows; ++r) {
      if (r < m) {  // m is the same on every lane
        int32_t isum = 0, msum = 0;
        const int64_t base = r * k + b * 256;  // the block's first activation
        if (live)
          gm::KUnitSums<T>(unit, u, a.q + base + 32 * u, a.bsums + base / 16,
                           &isum, &msum);
        isum = WarpSumInt(isum, 8);
        msum = WarpSumInt(msum, 8);
        if (live && u == 0) {
          const gm::BlockTerms t =
              gm::KTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk),
                         a.d[r * blocks + b], isum, msum);
          acc[r] += t.dot + t.min;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < m) {
      const float s = WarpSum(acc[r]);
      if (lane == 0) y[r * n + j] = s + (bias != nullptr ? bias[j] : 0.0f);
    }
  }
}

// kTileM x kTileN outputs per block of 256 threads; thread (ty, tx) owns
// rows 2 ty, 2 ty + 1 and columns tx + 16 c, c < 4. Rows of the staged
// codes are padded by 4 bytes so that 16 columns read 16 banks.
template <int T>
__global__ void GgufGemmKernel(Acts a, const uint8_t* __restrict__ w,
                               const float* __restrict__ bias,
                               float* __restrict__ y, int64_t m, int64_t n,
                               int64_t k) {
  constexpr int kGroup = gm::BlockElems(T);
  constexpr int kBytes = gm::BlockBytes(T);
  constexpr int kSubs = gm::SubBlocks(T);
  constexpr int kMins = T == gm::kQ4K || T == gm::kQ5K ? 8 : 1;
  constexpr bool kK = gm::IsK(T);
  __shared__ int8_t xs[kTileM][kGroup + 4];
  __shared__ float xds[kTileM];
  __shared__ float xsds[kTileM];                // 32-weight types
  __shared__ int16_t xbs[kTileM][kK ? 16 : 1];  // K-quants
  __shared__ int8_t ws[kTileN][kGroup + 4];
  __shared__ int wsc[kTileN][kSubs];
  __shared__ int wmn[kTileN][kMins];
  __shared__ float wd[kTileN];
  __shared__ float wm[kTileN];
  const int tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t blocks = k / kGroup;
  float acc[2][4] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = tid; i < kTileM * kGroup; i += blockDim.x) {
      const int r = i / kGroup, e = i % kGroup;
      const int64_t gr = row0 + r;
      xs[r][e] = gr < m ? a.q[gr * k + b * kGroup + e] : 0;
    }
    for (int r = tid; r < kTileM; r += blockDim.x) {
      const int64_t gr = row0 + r;
      xds[r] = gr < m ? a.d[gr * blocks + b] : 0.0f;
      if constexpr (!kK) xsds[r] = gr < m ? a.sd[gr * blocks + b] : 0.0f;
    }
    if constexpr (kK) {
      for (int i = tid; i < kTileM * 16; i += blockDim.x) {
        const int r = i / 16, t = i % 16;
        const int64_t gr = row0 + r;
        xbs[r][t] = gr < m ? a.bsums[(gr * k + b * kGroup) / 16 + t] : 0;
      }
    }
    for (int i = tid; i < kTileN * kGroup; i += blockDim.x) {
      const int c = i / kGroup, e = i % kGroup;
      const int64_t gc = col0 + c;
      ws[c][e] = gc < n ? static_cast<int8_t>(gm::WeightCode<T>(
                              w + (gc * blocks + b) * kBytes, e))
                        : 0;
    }
    for (int i = tid; i < kTileN * kSubs; i += blockDim.x) {
      const int c = i / kSubs, s = i % kSubs;
      const int64_t gc = col0 + c;
      const uint8_t* blk = w + (gc * blocks + b) * kBytes;
      wsc[c][s] = gc < n ? gm::SubScale<T>(blk, s) : 0;
      if (s < kMins) wmn[c][s] = gc < n ? gm::SubMin<T>(blk, s) : 0;
    }
    for (int c = tid; c < kTileN; c += blockDim.x) {
      const int64_t gc = col0 + c;
      const uint8_t* blk = w + (gc * blocks + b) * kBytes;
      wd[c] = gc < n ? gm::BlockD<T>(blk) : 0.0f;
      wm[c] = gc < n ? gm::BlockMin<T>(blk) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = 2 * ty + rr;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const int c = tx + 16 * cc;
        const int32_t s = gm::ScaledDot<T>(ws[c], wsc[c], xs[r], kGroup);
        gm::BlockTerms t;
        if constexpr (kK) {
          t = gm::KTerms(wd[c], wm[c], xds[r], s,
                         gm::MinSum<T>(wmn[c], xbs[r], kMins));
        } else {
          t = gm::SmallTerms(wd[c], wm[c], s, xds[r], xsds[r], gm::HasMin(T));
        }
        acc[rr][cc] += t.dot + t.min;
      }
    }
    __syncthreads();
  }
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t gr = row0 + 2 * ty + rr;
    if (gr >= m) continue;
    for (int cc = 0; cc < 4; ++cc) {
      const int64_t gc = col0 + tx + 16 * cc;
      if (gc < n)
        y[gr * n + gc] = acc[rr][cc] + (bias != nullptr ? bias[gc] : 0.0f);
    }
  }
}

template <int T>
int Launch(const Acts& a, const void* w, const float* bias, float* y, int64_t m,
           int64_t n, int64_t k, cudaStream_t stream) {
  const auto* wb = static_cast<const uint8_t*>(w);
  if (m <= kGemvMaxRows) {
    if constexpr (gm::IsK(T)) {
      KGemvKernel<T><<<Blocks(n, kGemvWarps), kGemvWarps * 32, 0, stream>>>(
          a, wb, bias, y, static_cast<int>(m), n, k);
    } else {
      SmallGemvKernel<T><<<Blocks(n, kGemvWarps), kGemvWarps * 32, 0, stream>>>(
          a, wb, bias, y, static_cast<int>(m), n, k);
    }
  } else {
    const dim3 grid(Blocks(n, kTileN), Blocks(m, kTileM));
    GgufGemmKernel<T><<<grid, 256, 0, stream>>>(a, wb, bias, y, m, n, k);
  }
  return LaunchCode();
}

int LaunchFor(int w_dtype, const Acts& a, const void* w, const float* bias,
              float* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  switch (w_dtype) {
    case gm::kQ4_0:
      return Launch<gm::kQ4_0>(a, w, bias, y, m, n, k, stream);
    case gm::kQ4_1:
      return Launch<gm::kQ4_1>(a, w, bias, y, m, n, k, stream);
    case gm::kQ5_0:
      return Launch<gm::kQ5_0>(a, w, bias, y, m, n, k, stream);
    case gm::kQ5_1:
      return Launch<gm::kQ5_1>(a, w, bias, y, m, n, k, stream);
    case gm::kQ4K:
      return Launch<gm::kQ4K>(a, w, bias, y, m, n, k, stream);
    case gm::kQ5K:
      return Launch<gm::kQ5K>(a, w, bias, y, m, n, k, stream);
    default:
      return Launch<gm::kQ6K>(a, w, bias, y, m, n, k, stream);
  }
}

}  // namespace

static_assert(MOE_CUDA_DTYPE_Q4_0 == gm::kQ4_0 &&
              MOE_CUDA_DTYPE_Q4_1 == gm::kQ4_1 &&
              MOE_CUDA_DTYPE_Q5_0 == gm::kQ5_0 &&
              MOE_CUDA_DTYPE_Q5_1 == gm::kQ5_1 &&
              MOE_CUDA_DTYPE_Q4_K == gm::kQ4K &&
              MOE_CUDA_DTYPE_Q5_K == gm::kQ5K &&
              MOE_CUDA_DTYPE_Q6_K == gm::kQ6K);

int GgufMatMulOnStream(const float* x, const void* w, int w_dtype,
                       const float* bias, float* y, int64_t m, int64_t n,
                       int64_t k, cudaStream_t stream) {
  if (!gm::IsKind(w_dtype)) return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  const bool kquant = gm::IsK(w_dtype);
  const int64_t group = kquant ? 256 : 32;
  if (k % group != 0 || k <= 0 || m <= 0 || n <= 0 || m > INT32_MAX ||
      n > INT32_MAX * int64_t{kGemvWarps} ||
      (m > kGemvMaxRows && m > 65535 * int64_t{kTileM})) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  const int64_t groups = m * (k / group);
  // q [m, k] int8 | d [groups] f32 | sd [m k / 32] f32 or bsums [m k / 16] i16.
  const int64_t q_bytes = (m * k + 15) / 16 * 16;
  const int64_t d_bytes = (groups * int64_t{sizeof(float)} + 15) / 16 * 16;
  const int64_t tail_bytes = kquant ? m * k / 16 * int64_t{sizeof(int16_t)}
                                    : groups * int64_t{sizeof(float)};
  void* scratch = nullptr;
  MOE_CUDA_TRY(
      Code(cudaMallocAsync(&scratch, q_bytes + d_bytes + tail_bytes, stream)));
  auto* base = static_cast<uint8_t*>(scratch);
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + q_bytes);
  Acts acts{q, d, nullptr, nullptr};
  const unsigned quant_blocks = Blocks(groups, kQuantWarps);
  if (kquant) {
    auto* bsums = reinterpret_cast<int16_t*>(base + q_bytes + d_bytes);
    acts.bsums = bsums;
    QuantizeAct256Kernel<<<quant_blocks, kQuantWarps * 32, 0, stream>>>(
        x, q, d, bsums, groups);
  } else {
    auto* sd = reinterpret_cast<float*>(base + q_bytes + d_bytes);
    acts.sd = sd;
    QuantizeAct32Kernel<<<quant_blocks, kQuantWarps * 32, 0, stream>>>(
        x, q, d, sd, groups, gm::UsesQ8_1(w_dtype));
  }
  int code = LaunchCode();
  if (code == 0) code = LaunchFor(w_dtype, acts, w, bias, y, m, n, k, stream);
  const int free_code = Code(cudaFreeAsync(scratch, stream));
  return code != 0 ? code : free_code;
}

}  // namespace moe::cuda
