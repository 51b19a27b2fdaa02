// The worker's check of the expert layout moe-cached reports at Attach: any
// format whose byte size fits this model's shape is learnt; anything else is
// a clear FAILED_PRECONDITION, never a slot read as garbage.
#include "services/moe_worker/daemon_provider.h"

#include <string>

#include "gtest/gtest.h"

namespace moe::worker {
namespace {

TEST(CheckSlotTensorTest, LearnsEveryFormatWhoseSizeFitsTheShape) {
  TensorView mine;  // bf16 [128, 64], as the checkpoint has it
  mine.dtype = DType::kBF16;
  mine.shape = {128, 64};
  mine.nbytes = 128 * 64 * 2;
  for (DType d : {DType::kBF16, DType::kF32, DType::kQ8, DType::kQ4}) {
    client::SlotTensor t{"gate", d, {128, 64}, 256,
                         static_cast<uint64_t>(WeightBytes(d, 128, 64))};
    EXPECT_TRUE(CheckSlotTensor(t, mine, "gate", 1 << 20).ok()) << DTypeName(d);
  }
}

// Both backends run every format the daemon can hold (the CUDA module has
// q8/q4 kernels since ABI v4); a backend without them is refused at Attach
// with what to change.
TEST(CheckBackendRunsFormatTest, RefusesOnlyAFormatWithoutKernels) {
  BackendInfo cpu;
  cpu.name = "cpu";
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8, DType::kQ4,
                 DType::kMxfp4}) {
    EXPECT_TRUE(CheckBackendRunsFormat(cpu, d).ok()) << DTypeName(d);
  }
  // A backend without mxfp4 kernels refuses a daemon holding it.
  BackendInfo gpu;
  gpu.name = "cuda";
  gpu.is_device = true;
  gpu.supports_mxfp4 = false;
  EXPECT_TRUE(CheckBackendRunsFormat(gpu, DType::kQ8).ok());
  EXPECT_EQ(CheckBackendRunsFormat(gpu, DType::kMxfp4).code(),
            absl::StatusCode::kFailedPrecondition);
  auto cpu_backend = CreateBackend("cpu");
  ASSERT_TRUE(cpu_backend.ok());
  EXPECT_TRUE((*cpu_backend)->Info().supports_q8);
  EXPECT_TRUE((*cpu_backend)->Info().supports_q4);
  BackendInfo old_gpu;
  old_gpu.name = "cuda";
  old_gpu.supports_q4 = false;
  EXPECT_TRUE(CheckBackendRunsFormat(old_gpu, DType::kQ8).ok());
  absl::Status s = CheckBackendRunsFormat(old_gpu, DType::kQ4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("holds the experts as q4 but this worker's cuda backend has no "
                             "q4 kernels; restart moe-cached with --expert-format bf16"),
            std::string::npos)
      << s;
}

TEST(CheckSlotTensorTest, MismatchesAreClearErrors) {
  TensorView mine;
  mine.dtype = DType::kBF16;
  mine.shape = {128, 64};
  mine.nbytes = 128 * 64 * 2;
  const uint64_t q8 = WeightBytes(DType::kQ8, 128, 64);
  const client::SlotTensor bad[] = {
      {"gate", DType::kQ8, {128, 64}, 0, q8 + 2},          // size of another format
      {"gate", DType::kQ4, {128, 64}, 0, q8},              // q8 bytes labelled q4
      {"gate", DType::kQ8, {64, 128}, 0, q8},              // another shape
      {"gate", DType::kI32, {128, 64}, 0, 128 * 64 * 4},   // not a weight format
      {"gate", DType::kQ8, {128, 64}, 4096, q8},           // past the slot
  };
  for (const client::SlotTensor& t : bad) {
    absl::Status s = CheckSlotTensor(t, mine, "gate", 4096 + 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << DTypeName(t.dtype);
    EXPECT_NE(s.message().find("does not match this model for the gate tensor"),
              std::string::npos)
        << s;
  }
}

// An offset from the daemon near 2^64 must not wrap past the slot check
// (offset + nbytes would be small and pass, and the worker would read far
// outside the arena).
TEST(CheckSlotTensorTest, AnOffsetThatWrapsIsRefused) {
  TensorView mine;
  mine.dtype = DType::kBF16;
  mine.shape = {128, 64};
  mine.nbytes = 128 * 64 * 2;
  const uint64_t q8 = WeightBytes(DType::kQ8, 128, 64);
  for (uint64_t offset : {~uint64_t{0} - q8 + 1, ~uint64_t{0}, uint64_t{1} << 63}) {
    const client::SlotTensor t{"gate", DType::kQ8, {128, 64}, offset, q8};
    EXPECT_EQ(CheckSlotTensor(t, mine, "gate", 1 << 20).code(),
              absl::StatusCode::kFailedPrecondition)
        << offset;
  }
}

// The arena geometry the daemon reports at Attach: slot_bytes * slot_count
// and the host copy's L * E blocks must fit their regions without wrapping.
TEST(CheckArenaGeometryTest, ProductsThatWrapAreRefused) {
  using client::CheckArenaGeometry;
  const std::vector<uint64_t> two = {1024, 1024};
  EXPECT_TRUE(CheckArenaGeometry({4096, 1024, 4, 0, 2, 3, two}).ok());
  EXPECT_TRUE(CheckArenaGeometry({4096, 1024, 4, 6 * 1024, 2, 3, two}).ok());
  // Layers of different block sizes (mixed types): the host copy holds each
  // layer's own blocks.
  EXPECT_TRUE(CheckArenaGeometry({4096, 1024, 4, 3 * (512 + 1024), 2, 3, {512, 1024}}).ok());
  const uint64_t huge = uint64_t{1} << 62;
  const client::ArenaGeometry bad[] = {
      {4096, 0, 4, 0, 2, 3, {0, 0}},                       // empty slots
      {4096, 1024, 5, 0, 2, 3, two},                       // more slots than the arena holds
      {4096, uint64_t{1} << 63, 2, 0, 2, 3, two},          // 2^64 wraps to 0
      {4096, 1024, 4, 5 * 1024, 2, 3, two},                // host copy short of L x E blocks
      {4096, 1024, 4, 3 * 1536 - 1, 2, 3, {512, 1024}},    // ... of mixed blocks
      {4096, 1, 1, 4096, 2, 65536, {1, 1}},                // 2^17 blocks of 1 byte
      {~uint64_t{0}, huge, 1, 1024, 2, 65536, {huge, huge}},  // 2^16 x 2^62 wraps
      {~uint64_t{0}, huge, 1, ~uint64_t{0}, 2, 3, {huge, huge}},  // the sum wraps
      {4096, 1024, 4, 6 * 1024, -1, 3, two},               // a negative shape
      {4096, 1024, 4, 0, 3, 3, two},                       // a layer without a block size
      {4096, 1024, 4, 0, 2, 3, {1024, 2048}},              // a block larger than a slot
      {4096, 1024, 4, 0, 2, 3, {1024, 0}},                 // an empty block
  };
  for (const client::ArenaGeometry& g : bad) {
    absl::Status s = CheckArenaGeometry(g);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
        << g.slot_bytes << " x " << g.slot_count << ", " << g.store_bytes;
  }
}

}  // namespace
}  // namespace moe::worker
