// Fuzz target: the routing-trace reader (services/cache/trace.h). Any input
// must give a status, never a crash; an accepted trace must survive
// TraceWriter -> ReadTrace unchanged.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/logging.h"
#include "services/cache/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto trace = moe::trace::ReadTrace(in, "fuzz");
  if (!trace.ok()) return 0;
  std::ostringstream out;
  {
    moe::trace::TraceWriter writer(&out, trace->header);
    for (const auto& r : trace->requests) {
      absl::Status s = writer.Write(r);
      MOE_CHECK(s.ok()) << s;
    }
  }
  std::istringstream again_in(out.str());
  auto again = moe::trace::ReadTrace(again_in, "fuzz (written back)");
  MOE_CHECK(again.ok()) << again.status() << "\n" << out.str();
  MOE_CHECK(again->header.num_layers == trace->header.num_layers &&
            again->header.num_experts == trace->header.num_experts &&
            again->header.top_k == trace->header.top_k &&
            again->header.model == trace->header.model);
  MOE_CHECK(again->requests.size() == trace->requests.size());
  for (size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& a = trace->requests[i];
    const auto& b = again->requests[i];
    MOE_CHECK(a.id == b.id && a.phase == b.phase && a.experts == b.experts &&
              a.weights == b.weights && a.hints == b.hints)
        << "request " << i;
  }
  return 0;
}
