#include "common/threads.h"

#include <pthread.h>

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace moe {

void NameThisThread(const char* name) {
  if (std::strlen(name) <= 15) pthread_setname_np(pthread_self(), name);
}

void SkipLockOrderChecks() {
  const char* keep = std::getenv("MOE_MUTEX_CHECKS");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace moe
