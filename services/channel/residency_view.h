// The hit path that does not cross processes: what moe-cached tells one
// worker of its model's ready slots, and the worker's pins on them. It lies
// in the worker's channel region, after the rings (ChannelRegionBytes), so
// each worker has its own copy, written by the daemon, and its own pins.
//
// Keys are layer * experts + expert (ResidencyShape::Key). Per key, the
// slot that holds it ready
// (-1: none; a hint, checked against `held`); per slot, the key it holds
// ready, plus one (0: none), and the worker's pin count.
//
// Protocol, a Dekker pair per slot and worker (sequentially consistent):
//   worker, to read slot s for key k:  pins[s] += 1, then read held[s]; the
//       slot is the worker's until it unpins iff held[s] == k + 1, else
//       pins[s] -= 1 and it asks the daemon (an acquire).
//   daemon, before s changes:  held[s] = 0, then read pins[s]; nonzero: a
//       worker holds s, held[s] = k + 1 again and s stays as it is.
// One of the two sees the other's write, so a pinned slot never changes
// under its reader (design invariant 1, as for leases).
//
// The region is writable by the worker: the daemon only writes `slot_of`
// and `held`, and only reads `pins` (any nonzero value means pinned), so a
// worker that scribbles misleads only itself (it reads within the arena it
// maps anyway), or keeps slots pinned, as leases it never released would.
//
// Thread-safety: the daemon's side under its own lock (one writer); the
// worker's pins from one thread at a time.
#ifndef MOECACHE_SERVICES_CHANNEL_RESIDENCY_VIEW_H_
#define MOECACHE_SERVICES_CHANNEL_RESIDENCY_VIEW_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace moe::channel {

struct ResidencyShape {
  uint32_t layers = 0;   // MoE layers
  uint32_t experts = 0;  // per layer
  uint32_t slots = 0;    // the arena's

  uint32_t keys() const { return layers * experts; }
  // REQUIRES: layer < layers, expert < experts.
  uint32_t Key(uint32_t layer, uint32_t expert) const { return layer * experts + expert; }
};

// Bytes of one view, and of a whole channel region (the rings, then the
// view at ResidencyOffset()).
size_t ResidencyBytes(const ResidencyShape& shape);
size_t ResidencyOffset();
size_t ChannelRegionBytes(const ResidencyShape& shape);

class ResidencyView {
 public:
  // `region`: a channel region of ChannelRegionBytes(shape) bytes.
  ResidencyView(void* region, const ResidencyShape& shape);

  // Nothing published, no pins (the daemon, before the worker maps it).
  void Init();

  // The daemon's side. REQUIRES: key < keys, slot < slots.
  void Publish(uint32_t slot, uint32_t key);
  // held[slot] = 0, then whether the worker holds it.
  bool HideAndCheckPinned(uint32_t slot);
  // Undoes HideAndCheckPinned when some worker held the slot.
  void Show(uint32_t slot, uint32_t key);
  // After a successful take-back: the key no longer points at the slot.
  void Forget(uint32_t slot, uint32_t key);
  bool Pinned(uint32_t slot) const;

  // The worker's side: the slot holding `key` ready, pinned; -1 when none
  // (nothing pinned then). REQUIRES: key < keys.
  int32_t TryPin(uint32_t key);
  // REQUIRES: slot < slots, pinned by TryPin.
  void Unpin(uint32_t slot);

  const ResidencyShape& shape() const { return shape_; }

 private:
  ResidencyShape shape_;
  std::atomic<int32_t>* slot_of_;
  std::atomic<uint32_t>* held_;
  std::atomic<uint32_t>* pins_;
};

}  // namespace moe::channel

#endif  // MOECACHE_SERVICES_CHANNEL_RESIDENCY_VIEW_H_
