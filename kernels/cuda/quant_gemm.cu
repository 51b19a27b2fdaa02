// Products with block-format weights (q8, q4, mxfp4; common/quant.h) read
// as stored: y[m, n] = x[m, k] W[n, k]^T (+ bias).
//
// The op is the CPU one (kernels/cpu_quant_matmul.h): activations are first
// rounded to 8 bits per 32 (f32 scale d_x = max|x| / 127, codes
// rint(x * 127 / max|x|), the same float operations as the CPU, so the same
// codes), then every 32-weight group contributes an exact integer dot
// product scaled once:
//   q8: y += d_w d_x sum(q_w q_x)
//   q4: y += d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)
//   mxfp4: y += 2^(e_w - 128) d_x sum((2 fp4_w) q_x)
// Only the order of the f32 additions differs from the CPU.
//  * m <= kQGemvMaxRows (decode, small expert groups): one warp per output
//    column, lanes over the column's weight blocks; every weight byte is read
//    once from global memory.
//  * larger m (prefill): a tiled kernel, kTileM rows x kTileN columns per
//    block, one weight group of codes staged in shared memory per step.
#include "kernels/cuda/common.cuh"

namespace moe::cuda {
namespace {

constexpr int kQGemvMaxRows = 8;
constexpr int kQGemvWarps = 8;
constexpr int kActGroup = 32;
constexpr int kTileM = 32;
constexpr int kTileN = 64;

// The block formats, as template arguments.
enum Fmt : int { kQ8 = 0, kQ4 = 1, kMx = 2 };
template <int F>
constexpr int kGroupOf = F == kQ4 ? 64 : 32;
template <int F>
constexpr int kBytesOf = F == kQ4 ? 36 : F == kMx ? 17 : 34;

// MXFP4 codes as the integers 2 * fp4(code) (cpu_quant_matmul.cc).
__constant__ int8_t kFp4Twice[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                     0, -1, -2, -3, -4, -6, -8, -12};

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  // Blocks are 2-byte aligned (34-byte q8 blocks).
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// d_w of a block: its f16 scale, or 2^(e - 128) for mxfp4.
template <int F>
__device__ __forceinline__ float BlockScale(const uint8_t* blk) {
  if constexpr (F == kMx) {
    return ldexpf(1.0f, static_cast<int>(blk[0]) - 128);
  } else {
    return LoadHalf(blk);
  }
}

// One thread per 32-activation group: codes, d_x and d_x * sum(q_x).
__global__ void QuantizeActivationsKernel(const float* __restrict__ x,
                                          int8_t* __restrict__ q,
                                          float* __restrict__ d,
                                          float* __restrict__ sd,
                                          int64_t groups) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const float* xs = x + g * kActGroup;
  float amax = 0.0f;
  for (int t = 0; t < kActGroup; ++t) amax = fmaxf(amax, fabsf(xs[t]));
  const float dx = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int t = 0; t < kActGroup; ++t) {
    const float v = fminf(fmaxf(rintf(xs[t] * inv), -127.0f), 127.0f);
    q[g * kActGroup + t] = static_cast<int8_t>(v);
    sum += static_cast<int>(v);
  }
  d[g] = dx;
  sd[g] = dx * static_cast<float>(sum);
}

// The integer dot product of 32 weight codes with 32 activation codes.
// Q4: `lo`/`hi` picks the nibble (group 0 or 1 of the 64-weight block).
template <int F>
__device__ __forceinline__ int Dot32(const uint8_t* codes, bool hi,
                                     const int8_t* xq) {
  int s = 0;
  if constexpr (F == kMx) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint8_t b = codes[i];
      s += kFp4Twice[b & 15] * xq[2 * i] + kFp4Twice[b >> 4] * xq[2 * i + 1];
    }
  } else if constexpr (F == kQ4) {
    const uint32_t* c4 = reinterpret_cast<const uint32_t*>(codes);
    const int* x4 = reinterpret_cast<const int*>(xq);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t v = c4[i];
      v = hi ? (v >> 4) & 0x0f0f0f0fu : v & 0x0f0f0f0fu;
      s = __dp4a(static_cast<int>(v), x4[i], s);
    }
  } else {
    const int8_t* c = reinterpret_cast<const int8_t*>(codes);
#pragma unroll
    for (int i = 0; i < 32; ++i) s += static_cast<int>(c[i]) * xq[i];
  }
  return s;
}

// One warp per output column j; lane l takes blocks l, l + 32, ...
template <int F>
__global__ void QuantGemvKernel(const int8_t* __restrict__ xq,
                                const float* __restrict__ xd,
                                const float* __restrict__ xsd,
                                const uint8_t* __restrict__ w,
                                const float* __restrict__ bias,
                                float* __restrict__ y, int m, int64_t n,
                                int64_t k) {
  constexpr int kGroup = kGroupOf<F>;
  constexpr int kBytes = kBytesOf<F>;
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kQGemvWarps + (threadIdx.x >> 5);
  if (j >= n) return;
  const int64_t blocks = k / kGroup;
  const int64_t act_groups = k / kActGroup;
  const uint8_t* row = w + j * blocks * kBytes;
  float acc[kQGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kQGemvMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t b = lane; b < blocks; b += 32) {
    const uint8_t* blk = row + b * kBytes;
    const float dw = BlockScale<F>(blk);
    if constexpr (F == kQ4) {
      const float mw = LoadHalf(blk + 2);
#pragma unroll
      for (int r = 0; r < kQGemvMaxRows; ++r) {
        if (r < m) {
          for (int h = 0; h < 2; ++h) {
            const int64_t g = r * act_groups + 2 * b + h;
            const int s = Dot32<kQ4>(blk + 4, h == 1, xq + g * kActGroup);
            acc[r] += dw * xd[g] * static_cast<float>(s) + mw * xsd[g];
          }
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < kQGemvMaxRows; ++r) {
        if (r < m) {
          const int64_t g = r * act_groups + b;
          const int s =
              Dot32<F>(blk + (F == kMx ? 1 : 2), false, xq + g * kActGroup);
          acc[r] += dw * xd[g] * static_cast<float>(s);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kQGemvMaxRows; ++r) {
    if (r < m) {
      const float s = WarpSum(acc[r]);
      if (lane == 0) y[r * n + j] = s + (bias ? bias[j] : 0.0f);
    }
  }
}

// Element `e` of one weight block as an int8 code: q4's nibbles (low
// halves first), mxfp4's doubled FP4 values, q8's bytes.
template <int F>
__device__ __forceinline__ int8_t WeightCode(const uint8_t* blk, int e) {
  if constexpr (F == kQ4) {
    const uint8_t byte = blk[4 + (e % 32)];
    return static_cast<int8_t>(e < 32 ? (byte & 0x0f) : (byte >> 4));
  } else if constexpr (F == kMx) {
    const uint8_t byte = blk[1 + e / 2];
    return kFp4Twice[e % 2 == 0 ? (byte & 0x0f) : (byte >> 4)];
  } else {
    return static_cast<int8_t>(blk[2 + e]);
  }
}

// kTileM x kTileN outputs per block of 256 threads; thread (ty, tx) owns
// rows 2 ty, 2 ty + 1 and columns tx + 16 c, c < 4. Each step stages one
// weight block per column (its codes widened to int8, its scale and min)
// and the matching activation codes.
template <int F>
__global__ void QuantGemmKernel(const int8_t* __restrict__ xq,
                                const float* __restrict__ xd,
                                const float* __restrict__ xsd,
                                const uint8_t* __restrict__ w,
                                const float* __restrict__ bias,
                                float* __restrict__ y, int64_t m, int64_t n,
                                int64_t k) {
  constexpr int kGroup = kGroupOf<F>;
  constexpr int kBytes = kBytesOf<F>;
  constexpr int kSub = kGroup / kActGroup;
  __shared__ int8_t xs[kTileM][kGroup];
  __shared__ float xds[kTileM][kSub];
  __shared__ float xsds[kTileM][kSub];
  __shared__ int8_t ws[kTileN][kGroup];
  __shared__ float wd[kTileN];
  __shared__ float wm[kTileN];
  const int tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t blocks = k / kGroup;
  const int64_t act_groups = k / kActGroup;
  float acc[2][4] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = tid; i < kTileM * kGroup; i += blockDim.x) {
      const int r = i / kGroup, e = i % kGroup;
      const int64_t gr = row0 + r;
      xs[r][e] = gr < m ? xq[gr * k + b * kGroup + e] : 0;
    }
    for (int i = tid; i < kTileM * kSub; i += blockDim.x) {
      const int r = i / kSub, h = i % kSub;
      const int64_t gr = row0 + r;
      const int64_t g = gr * act_groups + b * kSub + h;
      xds[r][h] = gr < m ? xd[g] : 0.0f;
      xsds[r][h] = gr < m ? xsd[g] : 0.0f;
    }
    for (int i = tid; i < kTileN * kGroup; i += blockDim.x) {
      const int c = i / kGroup, e = i % kGroup;
      const int64_t gc = col0 + c;
      ws[c][e] = gc < n ? WeightCode<F>(w + (gc * blocks + b) * kBytes, e) : 0;
    }
    for (int c = tid; c < kTileN; c += blockDim.x) {
      const int64_t gc = col0 + c;
      const uint8_t* blk = w + (gc * blocks + b) * kBytes;
      wd[c] = gc < n ? BlockScale<F>(blk) : 0.0f;
      wm[c] = gc < n && F == kQ4 ? LoadHalf(blk + 2) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = 2 * ty + rr;
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const int c = tx + 16 * cc;
#pragma unroll
        for (int h = 0; h < kSub; ++h) {
          int s = 0;
#pragma unroll 8
          for (int e = 0; e < kActGroup; ++e) {
            s += static_cast<int>(xs[r][h * kActGroup + e]) *
                 static_cast<int>(ws[c][h * kActGroup + e]);
          }
          acc[rr][cc] += wd[c] * xds[r][h] * static_cast<float>(s);
          if constexpr (F == kQ4) acc[rr][cc] += wm[c] * xsds[r][h];
        }
      }
    }
    __syncthreads();
  }
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t gr = row0 + 2 * ty + rr;
    if (gr >= m) continue;
    for (int cc = 0; cc < 4; ++cc) {
      const int64_t gc = col0 + tx + 16 * cc;
      if (gc < n) y[gr * n + gc] = acc[rr][cc] + (bias ? bias[gc] : 0.0f);
    }
  }
}

template <int F>
int Launch(const int8_t* xq, const float* xd, const float* xsd, const void* w,
           const float* bias, float* y, int64_t m, int64_t n, int64_t k,
           cudaStream_t stream) {
  const auto* wb = static_cast<const uint8_t*>(w);
  if (m <= kQGemvMaxRows) {
    QuantGemvKernel<F><<<Blocks(n, kQGemvWarps), kQGemvWarps * 32, 0, stream>>>(
        xq, xd, xsd, wb, bias, y, static_cast<int>(m), n, k);
  } else {
    const dim3 grid(Blocks(n, kTileN), Blocks(m, kTileM));
    QuantGemmKernel<F><<<grid, 256, 0, stream>>>(xq, xd, xsd, wb, bias, y, m,
                                                   n, k);
  }
  return LaunchCode();
}

}  // namespace

int QuantMatMulOnStream(const float* x, const void* w, int w_dtype,
                        const float* bias, float* y, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream) {
  const bool q4 = w_dtype == MOE_CUDA_DTYPE_Q4;
  const bool mx = w_dtype == MOE_CUDA_DTYPE_MXFP4;
  if (!q4 && !mx && w_dtype != MOE_CUDA_DTYPE_Q8) {
    return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  }
  const int64_t group = q4 ? 64 : 32;
  // q4 codes are read 4 bytes at a time: blocks (36 bytes) stay 4-aligned
  // only from a 4-aligned base.
  if (k % group != 0 || m <= 0 || n <= 0 ||
      (q4 && reinterpret_cast<uintptr_t>(w) % 4 != 0) ||
      n > INT32_MAX * int64_t{kQGemvWarps} || m > INT32_MAX) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  const int64_t groups = m * (k / kActGroup);
  // xq [m, k] int8 | d [groups] | sd [groups], the floats 4-aligned.
  const int64_t q_bytes = (m * k + 15) / 16 * 16;
  void* scratch = nullptr;
  MOE_CUDA_TRY(Code(cudaMallocAsync(&scratch, q_bytes + 2 * groups * sizeof(float), stream)));
  auto* xq = static_cast<int8_t*>(scratch);
  auto* xd = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + q_bytes);
  float* xsd = xd + groups;
  QuantizeActivationsKernel<<<Blocks(groups, 128), 128, 0, stream>>>(x, xq, xd, xsd, groups);
  int code = LaunchCode();
  if (code == 0) {
    code = q4   ? Launch<kQ4>(xq, xd, xsd, w, bias, y, m, n, k, stream)
           : mx ? Launch<kMx>(xq, xd, xsd, w, bias, y, m, n, k, stream)
                : Launch<kQ8>(xq, xd, xsd, w, bias, y, m, n, k, stream);
  }
  const int free_code = Code(cudaFreeAsync(scratch, stream));
  return code != 0 ? code : free_code;
}

}  // namespace moe::cuda
