// Process- and thread-wide settings of our binaries' threads.
//
// Thread-safe.
#ifndef MOECACHE_COMMON_THREADS_H_
#define MOECACHE_COMMON_THREADS_H_

namespace moe {

// Names the calling thread, as `top -H`, `ps -L`, perf and gdb show it.
// Our long-lived threads carry a "moe-" name so a profile or a stuck
// process tells which is which: the engine's step loop (moe-engine), its
// pool (moe-pool), the stream starter (moe-streams), moe-cached's session
// and copy threads. Threads that gRPC or cpp-httplib start keep their own.
// REQUIRES: strlen(name) <= 15 (the kernel keeps 15 bytes; a longer name
// leaves the thread's name as it was).
void NameThisThread(const char* name);

// Abseil's lock-order (deadlock) detection off for the whole process.
// Debian's abseil is built without NDEBUG, so it is on by default
// (OnDeadlockCycle::kAbort): every absl::Mutex acquire, ours and gRPC's
// (grpc_core::Mutex is an absl::Mutex), records lock-order edges in one
// process-wide graph under a global spin lock, 65 ns of an uncontended
// nested lock pair's 100 ns on the Sapphire Rapids VM, and a shared lock
// between the engine, its pool and gRPC's threads. The services and
// benchmarks call this first thing in main(); the tests do not, so they
// keep checking the lock order. MOE_MUTEX_CHECKS=1 in the environment
// keeps the checks on (a diagnostic).
void SkipLockOrderChecks();

}  // namespace moe

#endif  // MOECACHE_COMMON_THREADS_H_
