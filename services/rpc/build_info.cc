#include "services/rpc/build_info.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda_module.h"

namespace moe {

extern const char* const kGitRevision;  // generated: git_revision.cc

namespace {
constexpr char kVersion[] = "0.1.0";
}  // namespace

const char* GitRevision() { return kGitRevision; }

const char* Version() { return kVersion; }

std::string VersionLine(const std::string& program) {
  return absl::StrCat(program, " ", kVersion, " (git ", GitRevision(), ")");
}

std::string VersionText(const std::string& program) {
  std::string cuda;
  absl::StatusOr<CudaModuleInfo> probe = ProbeCudaModule();
  if (!probe.ok()) {
    cuda = absl::StrCat("not loaded (", probe.status().ToString(), ")");
  } else {
    cuda = absl::StrCat("loaded from ", probe->path, ", ", probe->device_count, " device(s)",
                        probe->device_name.empty() ? "" : " (" + probe->device_name + ")");
  }
  return absl::StrCat(VersionLine(program), "\ncuda module: ", cuda, "\n");
}

}  // namespace moe
