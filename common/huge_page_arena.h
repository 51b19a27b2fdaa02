// HugePageArena: host memory for weights that are read in full on every
// token (converted experts, dequantized or permuted dense weights), backed
// by transparent huge pages where the kernel gives them.
//
// Why: a decode step streams every held weight once. With 4 KiB pages that
// is a TLB miss (a page walk) every 4 KiB, which the hardware prefetchers do
// not run ahead of; measured on a zen4 VM (docs/benchmarks.md, "Weights on
// huge pages"), one thread streams 25-29 GB/s from huge pages against 17-21
// from 4 KiB pages; `moectl run` decoded q8 experts 1.07x and bf16 ones
// 1.11x faster with them (alternated runs), before the dense weights moved
// here too.
//
// Contract:
//  - Allocate(bytes) returns `bytes` of zero-filled memory aligned to 64
//    bytes (4096 for blocks of 4096 or more), valid until the arena is
//    destroyed. Memory is never reused or freed one allocation at a time.
//  - Memory comes from anonymous mappings aligned to 2 MiB of at least
//    `block_bytes` (64 MiB by default; a larger request gets its own),
//    advised MADV_HUGEPAGE. Whether the kernel backs them with huge pages is
//    its choice (`/sys/kernel/mm/transparent_hugepage/enabled` must be
//    `always` or `madvise`); without them this is plain memory, same bits.
//  - Untouched tails of a block cost address space only.
//
// Errors: RESOURCE_EXHAUSTED when the mapping fails (message with the size
// and strerror); INVALID_ARGUMENT for 0 bytes.
//
// Thread-compatible: one thread allocates; the memory itself may be read
// from any thread.
#ifndef MOECACHE_COMMON_HUGE_PAGE_ARENA_H_
#define MOECACHE_COMMON_HUGE_PAGE_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace moe {

class HugePageArena {
 public:
  static constexpr uint64_t kHugePage = uint64_t{2} << 20;

  explicit HugePageArena(uint64_t block_bytes = uint64_t{64} << 20);
  ~HugePageArena();
  HugePageArena(HugePageArena&& other) noexcept;
  HugePageArena& operator=(HugePageArena&& other) noexcept;
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes);

  // Whether `p` lies in memory this arena mapped.
  bool Holds(const void* p) const;

  // Bytes handed out (with alignment padding) and bytes mapped.
  uint64_t used_bytes() const { return used_; }
  uint64_t mapped_bytes() const;

 private:
  struct Block {
    uint8_t* base = nullptr;
    uint64_t size = 0;
  };
  void Release();

  uint64_t block_bytes_;
  std::vector<Block> blocks_;
  uint64_t offset_ = 0;  // next free byte in blocks_.back()
  uint64_t used_ = 0;
};

}  // namespace moe

#endif  // MOECACHE_COMMON_HUGE_PAGE_ARENA_H_
