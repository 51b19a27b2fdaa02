// What `--version` prints for every binary: the program, the git revision it
// was built from, and whether the CUDA module loads on this machine.
#ifndef MOECACHE_SERVICES_RPC_BUILD_INFO_H_
#define MOECACHE_SERVICES_RPC_BUILD_INFO_H_

#include <string>

namespace moe {

// "0.1.0": the release this tree is.
const char* Version();

// "3c51dde1a2b3" (12 hex digits), with "-dirty" when built from a tree with
// uncommitted changes; "unknown" when built outside git.
const char* GitRevision();

// Two lines, e.g.
//   moe-worker 0.1.0 (git 3c51dde1a2b3)
//   cuda module: not loaded (NOT_FOUND: no libmoe_cuda.so ...)
// or "cuda module: loaded from PATH, 1 device(s) (NVIDIA H200)". Probing may
// initialise the CUDA runtime: call it for --version, not on every start.
std::string VersionText(const std::string& program);

// The first line only (no CUDA probe): for the start-up log.
std::string VersionLine(const std::string& program);

}  // namespace moe

#endif  // MOECACHE_SERVICES_RPC_BUILD_INFO_H_
