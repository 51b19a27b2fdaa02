// The hit path's shared-memory protocol under a race (residency_view.h,
// residency_board.h): workers pin slots through their own views while the
// daemon takes slots back and rewrites them; a worker never reads a slot
// that changes under its pin, the daemon never rewrites a pinned slot, and
// both sides make progress.
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/channel/residency_view.h"
#include "services/channel/shm_channel.h"
#include "services/moe_cached/residency_board.h"

namespace moe::cached {
namespace {

constexpr int kLayers = 2;
constexpr int kExperts = 8;
constexpr int kSlots = 6;
constexpr uint64_t kRewriting = ~uint64_t{0};

struct Region {
  explicit Region(const channel::ResidencyShape& shape)
      : mem(new char[channel::ChannelRegionBytes(shape)]()) {
    channel::InitChannel(mem.get());
  }
  std::unique_ptr<char[]> mem;
};

TEST(ResidencyBoardTest, NoSlotChangesUnderAPin) {
  ResidencyBoard board(kLayers, kExperts, kSlots);
  const channel::ResidencyShape shape = board.shape();
  ASSERT_EQ(shape.keys(), static_cast<uint32_t>(kLayers * kExperts));
  // The "arena": what each slot holds (a key index), rewritten by the daemon.
  std::vector<std::atomic<uint64_t>> content(kSlots);
  std::vector<int> key_of(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    key_of[s] = s;
    content[s].store(static_cast<uint64_t>(s));
    board.Publish(s, ExpertKey{s / kExperts, s % kExperts});
  }
  std::vector<Region> regions;
  for (int w = 0; w < 2; ++w) regions.emplace_back(shape);
  for (int w = 0; w < 2; ++w) board.AddView(static_cast<uint64_t>(w + 1), regions[w].mem.get());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> violations{0}, pins{0}, retracted{0}, refused{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      channel::ResidencyView view(regions[w].mem.get(), shape);
      std::mt19937 rng(w + 1);
      while (!stop.load(std::memory_order_relaxed)) {
        const uint32_t key = rng() % shape.keys();
        const int32_t slot = view.TryPin(key);
        if (slot < 0) continue;
        ++pins;
        for (int i = 0; i < 50; ++i) {
          if (content[slot].load(std::memory_order_relaxed) != key) ++violations;
        }
        view.Unpin(static_cast<uint32_t>(slot));
      }
    });
  }
  // The daemon: takes a slot back, rewrites it with another key, publishes.
  std::thread daemon([&] {
    std::mt19937 rng(99);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) {
      const int s = static_cast<int>(rng() % kSlots);
      if (!board.TryRetract(s)) {
        ++refused;
        continue;
      }
      ++retracted;
      // A key no slot holds now.
      int key;
      do {
        key = static_cast<int>(rng() % shape.keys());
      } while (std::find(key_of.begin(), key_of.end(), key) != key_of.end());
      content[s].store(kRewriting, std::memory_order_relaxed);
      content[s].store(static_cast<uint64_t>(key), std::memory_order_relaxed);
      key_of[s] = key;
      board.Publish(s, ExpertKey{key / kExperts, key % kExperts});
    }
    stop = true;
  });
  daemon.join();
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(pins.load(), 1000);
  EXPECT_GT(retracted.load(), 100);
  EXPECT_GT(refused.load(), 0);  // pins held slots back
  // A worker gone: its pins no longer hold slots.
  channel::ResidencyView view(regions[0].mem.get(), shape);
  const int32_t held = view.TryPin(static_cast<uint32_t>(key_of[0]));
  ASSERT_EQ(held, 0);
  EXPECT_TRUE(board.Pinned(0));
  EXPECT_FALSE(board.TryRetract(0));
  board.RemoveView(1);
  EXPECT_FALSE(board.Pinned(0));
  EXPECT_TRUE(board.TryRetract(0));
  // A slot taken back is no worker's to pin.
  channel::ResidencyView other(regions[1].mem.get(), shape);
  EXPECT_EQ(other.TryPin(static_cast<uint32_t>(key_of[0])), -1);
}

// A worker may write anything into its region: the daemon reads only the
// pins (nonzero: pinned) and never indexes by what it reads.
TEST(ResidencyBoardTest, AScribblingWorkerOnlyPinsItsOwnWay) {
  ResidencyBoard board(kLayers, kExperts, kSlots);
  Region region(board.shape());
  board.Publish(2, ExpertKey{1, 3});
  board.AddView(7, region.mem.get());
  // Garbage over the whole view.
  char* view = region.mem.get() + channel::ResidencyOffset();
  for (size_t i = 0; i < channel::ResidencyBytes(board.shape()); ++i) view[i] = '\xa5';
  EXPECT_TRUE(board.Pinned(2));  // nonzero pins
  EXPECT_FALSE(board.TryRetract(2));
  board.Publish(4, ExpertKey{0, 1});  // writes within its own bounds
  board.RemoveView(7);
  EXPECT_TRUE(board.TryRetract(2));
  EXPECT_TRUE(board.TryRetract(4));
}

}  // namespace
}  // namespace moe::cached
