#include "common/row_interleave.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace moe {
namespace {

constexpr int64_t kBlockBytes = 144;

// The 6-bit scale and min of sub-block j of a Q4_K block's 12 packed bytes
// (ggml's get_scale_min_k4).
void ScaleMin(const uint8_t* q, int j, int* s, int* m) {
  if (j < 4) {
    *s = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *s = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Puts 6-bit value v at target t of a 96-byte scale (or min) area:
// 64 low-nibble bytes then 32 top-bit bytes.
void PutTarget(uint8_t* area, int t, int v) {
  uint8_t& lo = area[t % 64];
  lo = static_cast<uint8_t>(t < 64 ? (lo & 0xF0) | (v & 15)
                                   : (lo & 0x0F) | ((v & 15) << 4));
  const int h = t / 32, i = t % 32;
  uint8_t& hi = area[64 + i];
  hi = static_cast<uint8_t>((hi & ~(3 << (2 * h))) | ((v >> 4) << (2 * h)));
}

int GetTarget(const uint8_t* area, int t) {
  const int lo = t < 64 ? (area[t] & 15) : (area[t - 64] >> 4);
  return lo | (((area[64 + t % 32] >> (2 * (t / 32))) & 3) << 4);
}

// Packs scales s[8] and mins m[8] as a Q4_K block's 12 bytes (the inverse
// of ScaleMin).
void PackScales(const int s[8], const int m[8], uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((s[j] & 63) | ((s[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((s[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// Row r's Q4_K block `b` into its group block `g` (the scale and min
// areas are or-ed into: zero them before row 0).
void PutQ4KRow(const uint8_t* b, int r, uint8_t* g) {
  std::memcpy(g + 2 * r, b, 2);
  std::memcpy(g + 32 + 2 * r, b + 2, 2);
  for (int j = 0; j < 8; ++j) {
    int s, m;
    ScaleMin(b + 4, j, &s, &m);
    const int t = 32 * (j / 2) + 2 * r + j % 2;
    PutTarget(g + 64, t, s);
    PutTarget(g + 160, t, m);
  }
  for (int c = 0; c < 4; ++c) {
    for (int t = 0; t < 8; ++t) {
      std::memcpy(g + 256 + 64 * (8 * c + t) + 4 * r, b + 16 + 32 * c + 4 * t,
                  4);
    }
  }
}

// fn(row-major block offset, group block offset, r) for every block of a
// [rows, cols] matrix of `group`-weight blocks of `block_bytes`: its place
// in the row-major matrix and row r's in its 16-row group block.
template <typename Fn>
absl::Status EachRowBlock(const char* what, const char* format, int64_t group,
                          int64_t block_bytes, int64_t rows, int64_t cols,
                          const Fn& fn) {
  if (rows < 0 || cols < 0 || rows % kQ4KR16Rows != 0 || cols % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a [", rows, ", ", cols, "] ", format,
        " matrix is not whole groups of 16 rows of ", group, "-weight blocks"));
  }
  const int64_t blocks = cols / group, row_bytes = blocks * block_bytes;
  for (int64_t g = 0; g < rows / kQ4KR16Rows; ++g) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int r = 0; r < 16; ++r) {
        fn((16 * g + r) * row_bytes + b * block_bytes,
           (g * blocks + b) * kQ4KR16Rows * block_bytes, r);
      }
    }
  }
  return absl::OkStatus();
}

// The small-block layouts (kQ4R16, kQ8R16): a group block is the 16 rows'
// f16 fields (`head` bytes per row, each field's 16 values together), then
// their codes, 4 bytes of each row per 64 (`code_bytes` per row).
void PutSmallRow(const uint8_t* blk, int r, int head, int code_bytes,
                 uint8_t* grp) {
  for (int f = 0; f < head / 2; ++f)
    std::memcpy(grp + 32 * f + 2 * r, blk + 2 * f, 2);
  for (int t = 0; t < code_bytes / 4; ++t) {
    std::memcpy(grp + 16 * head + 64 * t + 4 * r, blk + head + 4 * t, 4);
  }
}

void GetSmallRow(const uint8_t* grp, int r, int head, int code_bytes,
                 uint8_t* blk) {
  for (int f = 0; f < head / 2; ++f)
    std::memcpy(blk + 2 * f, grp + 32 * f + 2 * r, 2);
  for (int t = 0; t < code_bytes / 4; ++t) {
    std::memcpy(blk + head + 4 * t, grp + 16 * head + 64 * t + 4 * r, 4);
  }
}

}  // namespace

void Q4KR16RowBlock(const uint8_t* g, int r, uint8_t* out) {
  std::memcpy(out, g + 2 * r, 2);
  std::memcpy(out + 2, g + 32 + 2 * r, 2);
  int s[8], m[8];
  for (int j = 0; j < 8; ++j) {
    const int t = 32 * (j / 2) + 2 * r + j % 2;
    s[j] = GetTarget(g + 64, t);
    m[j] = GetTarget(g + 160, t);
  }
  PackScales(s, m, out + 4);
  for (int c = 0; c < 4; ++c) {
    for (int t = 0; t < 8; ++t) {
      std::memcpy(out + 16 + 32 * c + 4 * t, g + 256 + 64 * (8 * c + t) + 4 * r,
                  4);
    }
  }
}

void Q4R16RowBlock(const uint8_t* g, int r, uint8_t* out) {
  GetSmallRow(g, r, 4, 32, out);
}

void Q4_0R16RowBlock(const uint8_t* g, int r, uint8_t* out) {
  GetSmallRow(g, r, 2, 16, out);
}

void Q8R16RowBlock(const uint8_t* g, int r, uint8_t* out) {
  GetSmallRow(g, r, 2, 32, out);
}

namespace {

// What the walk over a layout's blocks needs to know.
struct Layout {
  const char* name;    // in messages: "Q4KRows16"
  const char* format;  // the row-major dtype's name
  int64_t group, block_bytes;
  int head;        // bytes of f16 fields per block (the small-block layouts)
  int code_bytes;  // bytes of codes per block (the small-block layouts)
};

const Layout* LayoutOf(DType interleaved) {
  static const Layout kQ4K{"Q4KRows16", "Q4_K", 256, kBlockBytes, 0, 0};
  static const Layout kQ4{"Q4Rows16", "q4", 64, 36, 4, 32};
  static const Layout kQ8{"Q8Rows16", "q8", 32, 34, 2, 32};
  static const Layout kQ4_0{"Q4_0Rows16", "Q4_0", 32, 18, 2, 16};
  switch (interleaved) {
    case DType::kQ4KR16:
      return &kQ4K;
    case DType::kQ4R16:
      return &kQ4;
    case DType::kQ8R16:
      return &kQ8;
    case DType::kQ4_0R16:
      return &kQ4_0;
    default:
      return nullptr;
  }
}

// Row-major -> interleaved (`into`) or back, every block of the matrix.
absl::Status Rows16(bool into, DType interleaved, const void* src, int64_t rows,
                    int64_t cols, void* dst) {
  const Layout* l = LayoutOf(interleaved);
  if (l == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(DTypeName(interleaved), " is not an interleaved layout"));
  }
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  const bool q4k = interleaved == DType::kQ4KR16;
  const std::string what =
      absl::StrCat(into ? "Interleave" : "Deinterleave", l->name);
  return EachRowBlock(
      what.c_str(), l->format, l->group, l->block_bytes, rows, cols,
      [&](int64_t p, int64_t gb, int r) {
        if (!into) {
          return q4k ? Q4KR16RowBlock(in + gb, r, out + p)
                     : GetSmallRow(in + gb, r, l->head, l->code_bytes, out + p);
        }
        if (!q4k)
          return PutSmallRow(in + p, r, l->head, l->code_bytes, out + gb);
        if (r == 0) std::memset(out + gb, 0, 256);
        PutQ4KRow(in + p, r, out + gb);
      });
}

}  // namespace

absl::Status InterleaveRows16(DType interleaved, const void* src, int64_t rows,
                              int64_t cols, void* dst) {
  return Rows16(true, interleaved, src, rows, cols, dst);
}

absl::Status DeinterleaveRows16(DType interleaved, const void* src,
                                int64_t rows, int64_t cols, void* dst) {
  return Rows16(false, interleaved, src, rows, cols, dst);
}

absl::Status InterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                 void* dst) {
  return InterleaveRows16(DType::kQ4KR16, src, rows, cols, dst);
}

absl::Status DeinterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                   void* dst) {
  return DeinterleaveRows16(DType::kQ4KR16, src, rows, cols, dst);
}

absl::Status InterleaveQ4Rows16(const void* src, int64_t rows, int64_t cols,
                                void* dst) {
  return InterleaveRows16(DType::kQ4R16, src, rows, cols, dst);
}

absl::Status DeinterleaveQ4Rows16(const void* src, int64_t rows, int64_t cols,
                                  void* dst) {
  return DeinterleaveRows16(DType::kQ4R16, src, rows, cols, dst);
}

absl::Status InterleaveQ8Rows16(const void* src, int64_t rows, int64_t cols,
                                void* dst) {
  return InterleaveRows16(DType::kQ8R16, src, rows, cols, dst);
}

absl::Status DeinterleaveQ8Rows16(const void* src, int64_t rows, int64_t cols,
                                  void* dst) {
  return DeinterleaveRows16(DType::kQ8R16, src, rows, cols, dst);
}

DType InterleavedOf(DType plain) {
  if (plain == DType::kQ4K) return DType::kQ4KR16;
  if (plain == DType::kQ4) return DType::kQ4R16;
  if (plain == DType::kQ8) return DType::kQ8R16;
  if (plain == DType::kQ4_0) return DType::kQ4_0R16;
  return plain;
}

DType RowMajorOf(DType interleaved) {
  if (interleaved == DType::kQ4KR16) return DType::kQ4K;
  if (interleaved == DType::kQ4R16) return DType::kQ4;
  if (interleaved == DType::kQ8R16) return DType::kQ8;
  if (interleaved == DType::kQ4_0R16) return DType::kQ4_0;
  return interleaved;
}

DType InterleavedHeld(DType held, int64_t rows, int64_t cols, bool interleave) {
  const DType to = InterleavedOf(held);
  return interleave && to != held && rows % kQ4KR16Rows == 0 &&
                 cols % QuantGroupSize(held) == 0
             ? to
             : held;
}

}  // namespace moe
