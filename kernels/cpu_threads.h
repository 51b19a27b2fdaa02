// How many threads a CPU backend gets (kernels/backend.h CreateBackend).
//
// The default is $MOE_CPU_THREADS when set, else UsableCpus()
// (common/cpu_budget.h: the affinity mask and the cgroup CPU quota), not
// std::thread::hardware_concurrency(), which sees neither. The operator's
// --cpu-threads (services/flags/flag_groups.h) overrides both.
//
// Thread-safe.
#ifndef MOECACHE_KERNELS_CPU_THREADS_H_
#define MOECACHE_KERNELS_CPU_THREADS_H_

namespace moe {

// The thread count of CPU backends created from now on: n > 0, or 0 to
// restore the default.
void SetCpuThreads(int n);

// The thread count a CPU backend created now gets (at least 1).
int CpuThreads();

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_THREADS_H_
