// Fuzz target: the EAMC state file reader (services/cache/eamc_store.h).
// Any input must give a status, never a crash or a huge allocation; an
// accepted state must encode, and decoding that encoding must give the same
// bytes again (Encode o Decode is idempotent).
//
// The shape passed to the decoder is the one the input's header claims, so
// that the fuzzer explores shapes too. A checksum mismatch stops the decoder
// early, so each input that starts with the magic is also tried with its
// payload size and checksum fixed up, to reach the section readers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "services/cache/eamc_store.h"

namespace {

constexpr size_t kHeaderBytes = 40;

uint32_t ReadU32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

void PutU64(std::string* b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*b)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void Check(const std::string& bytes) {
  if (bytes.size() < kHeaderBytes) {
    MOE_CHECK(!moe::cache::DecodeLearnedState(bytes, 4, 8).ok());
    return;
  }
  // The header's layers and experts, as ints (a value above INT32_MAX becomes
  // negative: the decoder must refuse it, not compute with it).
  const int layers = static_cast<int>(ReadU32(bytes, 12));
  const int experts = static_cast<int>(ReadU32(bytes, 16));
  auto state = moe::cache::DecodeLearnedState(bytes, layers, experts);
  if (!state.ok()) return;
  auto encoded = moe::cache::EncodeLearnedState(*state);
  MOE_CHECK(encoded.ok()) << encoded.status();
  auto again = moe::cache::DecodeLearnedState(*encoded, layers, experts);
  MOE_CHECK(again.ok()) << again.status();
  auto encoded_again = moe::cache::EncodeLearnedState(*again);
  MOE_CHECK(encoded_again.ok() && *encoded_again == *encoded);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  if (size >= kHeaderBytes && std::memcmp(data, "MOEEAMC", 8) == 0) {
    std::string fixed = bytes;
    const absl::string_view payload = absl::string_view(fixed).substr(kHeaderBytes);
    PutU64(&fixed, 24, payload.size());
    PutU64(&fixed, 32, moe::cache::Fnv1a64(payload));
    Check(fixed);
  }
  return 0;
}
