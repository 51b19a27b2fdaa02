// The start-up self-check of a backend's kernels for ggml's block formats
// (kQ4_0 .. kQ6K): each type once on small deterministic problems, against
// the host's answer from the very block math the CUDA kernels run
// (kernels/cuda/gguf_block_math.h compiled as host C++). The CUDA backend
// runs it when it is created (kernels/cuda_backend.cc) and reports
// supports_gguf_blocks only if it passes, so kernels that have never run on
// a GPU cannot silently corrupt outputs. Once per backend, when it is
// created rather than on first use: callers read supports_gguf_blocks to
// choose how to hold the weights before any product runs
// (services/engine/moe_model.cc, in_memory_provider.cc,
// services/moe_worker/daemon_provider.cc).
//
// Problems: k = 512 (16 blocks of 32, 2 of 256), n = 24 columns, m = 1 row
// (the GEMV) and m = 9 rows with a bias (the tiled kernel: partial row and
// column tiles); random valid blocks (every code, scale and min bit; finite
// f16 scales of either sign), activations with an outlier and a group of
// zeros. Cost per run: 14 products, ~30 KB of device memory for a few ms.
//
// The bound per output: 1e-6 x (sum over its blocks of |dot| + |min| +
// |bias|): each block's two terms are the host's bits (the same operations),
// so only the order of the f32 additions may differ (as
// tests/kernels/gguf_block_math_test.cc bounds the CUDA orders). One
// misread weight code typically moves an output by 1e-3 of that sum or
// more: a thousand times the bound.
//
// Thread-safety: pure functions, except RunGgufSelfCheck, which issues work
// on the backend's default stream.
#ifndef MOECACHE_KERNELS_CUDA_GGUF_SELF_CHECK_H_
#define MOECACHE_KERNELS_CUDA_GGUF_SELF_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace moe {

inline constexpr int64_t kGgufCheckK = 512;
inline constexpr int64_t kGgufCheckN = 24;
// The GEMV (m <= 8 in gguf_gemm.cu) and the tiled kernel.
inline constexpr int64_t kGgufCheckRows[] = {1, 9};
inline constexpr DType kGgufCheckTypes[] = {
    DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
    DType::kQ4K,  DType::kQ5K,  DType::kQ6K};

// y = x W^T (+ bias) for weights of `type`.
struct GgufCheckProblem {
  DType type = DType::kQ4_0;
  int64_t m = 0, n = 0, k = 0;
  std::vector<uint8_t> w;   // [n, k] of type
  std::vector<float> x;     // [m, k]
  std::vector<float> bias;  // [n], or empty for none
};

// The host's answer and the bound of each output.
struct GgufCheckExpected {
  std::vector<float> y;       // [m, n]
  std::vector<double> bound;  // [m, n]
};

// The problem for `type` and m rows (a bias when m > 1; row 1's first 256
// activations are zeros): the same bytes on every machine and every call.
// REQUIRES: IsGgufBlockDType(type), m >= 1.
GgufCheckProblem MakeGgufCheckProblem(DType type, int64_t m);

// The host's y: activations rounded as the kernels round them, each block's
// terms from gguf_block_math.h, added block after block (the tiled kernel's
// order), then the bias.
GgufCheckExpected ExpectedGgufProduct(const GgufCheckProblem& p);

// OK when every got[o] is within want.bound[o] of want.y[o]; otherwise
// INTERNAL naming the type, m, the worst output (by error / bound; a NaN or
// an infinity is the worst), its value, the host's and the bound, and how
// many outputs are out of bound. got.size() != m n is INVALID_ARGUMENT.
absl::Status CompareGgufProduct(const GgufCheckProblem& p,
                                const GgufCheckExpected& want,
                                absl::Span<const float> got);

// Runs every type of kGgufCheckTypes for every m of kGgufCheckRows on
// `backend` (its public MatMul, default stream) and compares. OK, or
// INTERNAL listing each type that failed; a backend error (allocation, a
// kernel's launch or run) returns at once with the type it happened on.
// Frees what it allocated in every case.
absl::Status RunGgufSelfCheck(Backend& backend);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CUDA_GGUF_SELF_CHECK_H_
