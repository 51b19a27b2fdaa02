// Persistence of what the cache learned (the EAMC and cheap statistics), so a
// daemon restart does not start cold (issue 4 item 3).
//
// File format `moe-eamc` version 1, all integers little-endian:
//   header (40 bytes)
//     magic      8  "MOEEAMC\0"
//     version    u32 (kEamcFormatVersion)
//     num_layers u32, num_experts u32   (the model shape it was learned on)
//     flags      u32 (0)
//     payload    u64 bytes following the header
//     checksum   u64 FNV-1a 64 of the payload
//   payload: sections, each u32 tag, u64 length, bytes; unknown tags skipped
//     1 EAMC:     u32 records; per record, prefill part then decode part:
//                 u32 n, n x (u32 cell = layer*E + expert, f32 count);
//                 cells strictly increasing, counts finite and > 0
//     2 reuse:    u32 L; L x (f64 hits, f64 total) (moe-infinity next-visit)
//     3 affinity: u32 lags; lags*L*E*E f32 pair counts, lags*L*E f32 counts
//                 (the prefetcher's inter-layer affinity)
//     4 popularity: u32 cells (= L*E); cells x f64 tokens routed to each
//                 (layer, expert) since the counts began, finite and >= 0
//                 (static-popular's placement)
//
// Saving is atomic: a temporary file "<path>.tmp.<pid>.<n>" in the same
// directory (mode 0600), written, fsynced, renamed over <path>, then the
// directory fsynced. A crash leaves either the old or the new file, plus at
// worst a stale temporary, which LoadLearnedState removes when its writer
// process is gone.
//
// Loading never trusts the file: a missing file is NOT_FOUND (callers treat
// that as "start empty"); a truncated, corrupt (bad magic, checksum, counts)
// file is DATA_LOSS; a wrong version or a model of another shape is
// FAILED_PRECONDITION. Nothing is applied unless the whole file is valid.
//
// Thread-safety: free functions on values.
#ifndef MOECACHE_SERVICES_CACHE_EAMC_STORE_H_
#define MOECACHE_SERVICES_CACHE_EAMC_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/cache/eamc.h"

namespace moe::cache {

inline constexpr uint32_t kEamcFormatVersion = 1;

// Everything a restart should keep. Empty vectors mean "not learned".
struct LearnedState {
  int num_layers = 0;
  int num_experts = 0;
  std::vector<EamcRecord> records;  // EAMC records, in slot order
  // Per layer (moe-infinity next-visit statistics); empty or L entries each.
  std::vector<double> reuse_hits;
  std::vector<double> reuse_total;
  // Prefetcher inter-layer affinity: [lag-1][layer][a][b] and
  // [lag-1][layer][a].
  int affinity_lags = 0;
  std::vector<float> affinity;
  std::vector<float> affinity_from;
  // Tokens routed to each cell, [layer * E + expert]; empty or L*E entries.
  std::vector<double> popularity;

  bool empty() const {
    return records.empty() && reuse_hits.empty() && affinity.empty() && popularity.empty();
  }
};

// FNV-1a 64 of `bytes`.
uint64_t Fnv1a64(absl::string_view bytes);

// Serialises `state` (header + payload). REQUIRES: vector sizes consistent
// with the shape (checked: INVALID_ARGUMENT otherwise).
absl::StatusOr<std::string> EncodeLearnedState(const LearnedState& state);

// Parses and validates a file's bytes against the expected shape.
// INVALID_ARGUMENT when the shape is outside [1, 65536] x [1, 65536] (as
// config.json allows); DATA_LOSS for a corrupt file; FAILED_PRECONDITION for
// another format version or shape.
absl::StatusOr<LearnedState> DecodeLearnedState(absl::string_view bytes,
                                                int num_layers,
                                                int num_experts);

// Writes `contents` to `path` atomically (see above), mode 0600.
absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents);

absl::Status SaveLearnedState(const std::string& path,
                              const LearnedState& state);
absl::StatusOr<LearnedState> LoadLearnedState(const std::string& path,
                                              int num_layers, int num_experts);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EAMC_STORE_H_
