// Stop strings matched on the decoded text as it streams.
//
//   StopStringMatcher m({"\n\n", "END"});
//   std::string out = m.Push(piece);   // text that can be sent now
//   if (m.matched()) ...              // stop here; `out` ends before it
//   out += m.Flush();                 // at the end: what was held back
//
// Text that could still be the beginning of a stop string is held back
// until later text rules that out. Not thread-safe.
#ifndef MOECACHE_SERVICES_SERVING_STOP_STRINGS_H_
#define MOECACHE_SERVICES_SERVING_STOP_STRINGS_H_

#include <string>
#include <vector>

namespace moe::serving {

class StopStringMatcher {
 public:
  // REQUIRES: no empty string in `stops`.
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  std::string Push(const std::string& text);
  std::string Flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_STOP_STRINGS_H_
