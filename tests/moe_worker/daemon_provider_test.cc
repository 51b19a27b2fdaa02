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

}  // namespace
}  // namespace moe::worker
