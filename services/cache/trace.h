// `moe-trace/1`: routing traces as JSON Lines.
//
// Line 1 is a header:
//   {"format":"moe-trace/1","model":"...","num_layers":L,"num_experts":E,"top_k":k}
// (L counts MoE layers only), and optionally "expert_params":N, the weights
// of one routed expert (moe-worker --record-trace writes it; moectl
// simulate sizes experts from it). Every further line is one request, in arrival
// order:
//   {"id":"...","phase":["prefill",...,"decode",...],
//    "experts":[[[e,...k],...L],...T],
//    "weights":[[[w,...k],...L],...T],      (optional, same shape as experts)
//    "hints":[[[e,...],...L],...T]}         (optional: experts predicted for a
//                                            layer before it ran; see below)
// hints[t][l] are the experts pre-gating predicted for layer l in the
// iteration of token t (stored at that iteration's last token), from the
// output of an earlier layer: one layer earlier with moe-worker's default
// --pregate-distance 1, D layers earlier with --pregate-distance D. A trace
// does not say which distance produced them; where one layer got predictions
// from several distances, their union.
// All prefill tokens of a request form one iteration; each decode token is one
// iteration. Prefill tokens must precede decode tokens.
//
// Reading is strict about what it uses (shapes, ranges, duplicates; every
// error names the line) and tolerant of fields it does not know.
//
// Thread-safety: plain values; TraceWriter is not thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_TRACE_H_
#define MOECACHE_SERVICES_CACHE_TRACE_H_

#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/exchange/expert_exchange.h"

namespace moe::trace {

inline constexpr char kTraceFormat[] = "moe-trace/1";

enum class Phase : uint8_t { kPrefill = 0, kDecode = 1 };

const char* PhaseName(Phase phase);

struct TraceHeader {
  std::string model;
  int num_layers = 0;   // MoE layers only
  int num_experts = 0;  // routed experts per layer
  int top_k = 0;        // experts chosen per token per layer
  int64_t expert_params = 0;  // weights of one routed expert; 0: not said
};

// The largest "expert_params" a header may carry (2^40: far above any
// published expert, small enough that bytes of any format fit an int64).
inline constexpr int64_t kMaxExpertParams = int64_t{1} << 40;

// Per-token, per-layer lists: [token][layer][i].
template <typename T>
using TokenLayerLists = std::vector<std::vector<std::vector<T>>>;

struct TraceRequest {
  std::string id;
  std::vector<Phase> phase;               // [token]
  TokenLayerLists<int32_t> experts;       // [token][layer][top_k]
  TokenLayerLists<float> weights;         // empty, or the shape of experts
  TokenLayerLists<int32_t> hints;         // empty, or [token][layer][any]

  int num_tokens() const { return static_cast<int>(phase.size()); }
  int num_prefill_tokens() const;
  int num_decode_tokens() const { return num_tokens() - num_prefill_tokens(); }
};

struct Trace {
  TraceHeader header;
  std::vector<TraceRequest> requests;
};

// What a worker asks for in one forward pass: every prefill token together,
// then one iteration per decode token.
struct Iteration {
  Phase phase = Phase::kDecode;
  int token = 0;  // first token of the iteration in the request
  std::vector<std::vector<ExpertDemand>> layers;  // [layer], ascending expert
};

// REQUIRES: `r` valid for a header with `num_layers` (prefill before decode).
std::vector<Iteration> SplitIterations(const TraceRequest& r, int num_layers);

// Checks a header's numbers (positive, top_k <= num_experts, sane bounds).
absl::Status ValidateHeader(const TraceHeader& header);

// Checks a request against a header: shapes, expert ranges, no duplicate
// expert within a token's layer, prefill before decode, at least one token.
absl::Status ValidateRequest(const TraceHeader& header,
                             const TraceRequest& request);

// Parses one header / request line. Errors say what is wrong; callers add the
// line number.
absl::StatusOr<TraceHeader> ParseHeaderLine(const std::string& line);
absl::StatusOr<TraceRequest> ParseRequestLine(const TraceHeader& header,
                                              const std::string& line);

// Serialises without a trailing newline.
std::string SerializeHeader(const TraceHeader& header);
std::string SerializeRequest(const TraceRequest& request);

// Reads a whole trace. Blank lines are skipped. Errors carry
// "<name>:<line>: ...".
absl::StatusOr<Trace> ReadTrace(std::istream& in, const std::string& name);
absl::StatusOr<Trace> ReadTraceFile(const std::string& path);

// Streams a trace request by request (for the worker's --record-trace).
class TraceWriter {
 public:
  // Creates/truncates `path` and writes the header line.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Open(
      const std::string& path, const TraceHeader& header);
  // Writes to a caller-owned stream (which must outlive the writer).
  TraceWriter(std::ostream* out, const TraceHeader& header);

  // Validates and appends one request line; flushes.
  absl::Status Write(const TraceRequest& request);
  absl::Status Close();

 private:
  TraceWriter(std::unique_ptr<std::ofstream> file, const TraceHeader& header);

  std::unique_ptr<std::ofstream> file_;
  std::ostream* out_;
  TraceHeader header_;
};

absl::Status WriteTraceFile(const std::string& path, const Trace& trace);

}  // namespace moe::trace

#endif  // MOECACHE_SERVICES_CACHE_TRACE_H_
