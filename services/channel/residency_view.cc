#include "services/channel/residency_view.h"

#include "services/channel/shm_channel.h"

namespace moe::channel {
namespace {

constexpr size_t kAlign = 64;

size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

static_assert(std::atomic<int32_t>::is_always_lock_free &&
              std::atomic<uint32_t>::is_always_lock_free);

}  // namespace

size_t ResidencyBytes(const ResidencyShape& shape) {
  return RoundUp(4 * size_t{shape.keys()}) + RoundUp(4 * size_t{shape.slots}) +
         RoundUp(4 * size_t{shape.slots});
}

size_t ResidencyOffset() { return RoundUp(ChannelBytes()); }

size_t ChannelRegionBytes(const ResidencyShape& shape) {
  return ResidencyOffset() + ResidencyBytes(shape);
}

ResidencyView::ResidencyView(void* region, const ResidencyShape& shape) : shape_(shape) {
  char* base = static_cast<char*>(region) + ResidencyOffset();
  slot_of_ = reinterpret_cast<std::atomic<int32_t>*>(base);
  base += RoundUp(4 * size_t{shape.keys()});
  held_ = reinterpret_cast<std::atomic<uint32_t>*>(base);
  base += RoundUp(4 * size_t{shape.slots});
  pins_ = reinterpret_cast<std::atomic<uint32_t>*>(base);
}

void ResidencyView::Init() {
  for (uint32_t k = 0; k < shape_.keys(); ++k) slot_of_[k].store(-1, std::memory_order_relaxed);
  for (uint32_t s = 0; s < shape_.slots; ++s) {
    held_[s].store(0, std::memory_order_relaxed);
    pins_[s].store(0, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ResidencyView::Publish(uint32_t slot, uint32_t key) {
  held_[slot].store(key + 1, std::memory_order_seq_cst);
  slot_of_[key].store(static_cast<int32_t>(slot), std::memory_order_release);
}

bool ResidencyView::HideAndCheckPinned(uint32_t slot) {
  held_[slot].store(0, std::memory_order_seq_cst);
  return pins_[slot].load(std::memory_order_seq_cst) != 0;
}

void ResidencyView::Show(uint32_t slot, uint32_t key) {
  held_[slot].store(key + 1, std::memory_order_seq_cst);
}

void ResidencyView::Forget(uint32_t slot, uint32_t key) {
  int32_t expected = static_cast<int32_t>(slot);
  slot_of_[key].compare_exchange_strong(expected, -1, std::memory_order_release,
                                        std::memory_order_relaxed);
}

bool ResidencyView::Pinned(uint32_t slot) const {
  return pins_[slot].load(std::memory_order_seq_cst) != 0;
}

int32_t ResidencyView::TryPin(uint32_t key) {
  const int32_t slot = slot_of_[key].load(std::memory_order_acquire);
  if (slot < 0 || static_cast<uint32_t>(slot) >= shape_.slots) return -1;
  pins_[slot].fetch_add(1, std::memory_order_seq_cst);
  if (held_[slot].load(std::memory_order_seq_cst) == key + 1) return slot;
  pins_[slot].fetch_sub(1, std::memory_order_seq_cst);
  return -1;
}

void ResidencyView::Unpin(uint32_t slot) { pins_[slot].fetch_sub(1, std::memory_order_release); }

}  // namespace moe::channel
