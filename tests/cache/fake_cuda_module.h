// A fake CUDA module table for tests without a GPU: "device" memory is host
// memory, copies are memcpy, streams/events are tokens, and each call can be
// told to fail. Memory() is the CUDA DeviceMemory over it, so tests drive the
// real CUDA implementation of the interface. Header-only; one global fake per
// test binary.
#ifndef MOECACHE_TESTS_CACHE_FAKE_CUDA_MODULE_H_
#define MOECACHE_TESTS_CACHE_FAKE_CUDA_MODULE_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cuda/module_abi.h"
#include "kernels/cuda_device_memory.h"

namespace moe::testing {

struct FakeCuda {
  // Error codes the next calls return (0: succeed).
  std::atomic<int> malloc_error{0};
  std::atomic<int> host_register_error{0};
  std::atomic<int> copy_error{0};
  std::atomic<int> stream_error{0};
  std::atomic<int> ipc_open_error{0};
  // What happened.
  std::atomic<int> mallocs{0}, frees{0}, registers{0}, unregisters{0};
  std::atomic<int> copies{0}, syncs{0}, streams{0}, streams_destroyed{0};
  std::atomic<int> events{0}, events_destroyed{0}, last_priority{99};
  std::atomic<int> ipc_opens{0}, ipc_closes{0}, event_pending{0};

  static FakeCuda& Get() {
    static FakeCuda* fake = new FakeCuda();
    return *fake;
  }
  void Reset() {
    malloc_error = host_register_error = copy_error = stream_error = ipc_open_error = 0;
    ipc_opens = ipc_closes = event_pending = 0;
    mallocs = frees = registers = unregisters = copies = syncs = 0;
    streams = streams_destroyed = events = events_destroyed = 0;
    last_priority = 99;
  }

  static const MoeCudaModuleApi* Api() {
    static const MoeCudaModuleApi api = MakeApi();
    return &api;
  }
  // A new CUDA DeviceMemory on the fake table (device 0).
  static std::shared_ptr<DeviceMemory> Memory() { return NewCudaDeviceMemory(Api(), 0); }

 private:
  static MoeCudaModuleApi MakeApi() {
    MoeCudaModuleApi a{};
    a.abi_version = MOE_CUDA_MODULE_ABI_VERSION;
    a.device_count = [] { return 1; };
    a.set_device = [](int) { return 0; };
    a.device_name = [](int, char* buf, size_t len) {
      std::snprintf(buf, len, "fake");
      return 0;
    };
    a.error_string = [](int code) -> const char* {
      static thread_local std::string s;
      s = "fake cuda error " + std::to_string(code);
      return s.c_str();
    };
    a.mem_info = [](size_t* f, size_t* t) {
      *f = 1000;
      *t = 2000;
      return 0;
    };
    a.device_malloc = [](void** p, size_t n) {
      if (int e = Get().malloc_error.load()) return e;
      ++Get().mallocs;
      *p = std::calloc(n, 1);
      return 0;
    };
    a.device_free = [](void* p) {
      ++Get().frees;
      std::free(p);
      return 0;
    };
    a.memset_zero = [](void* p, size_t n, void*) {
      std::memset(p, 0, n);
      return 0;
    };
    a.stream_synchronize = [](void*) { return 0; };
    a.memcpy = [](void* d, const void* s, size_t n, int, void*) {
      if (int e = Get().copy_error.load()) return e;
      std::memcpy(d, s, n);
      return 0;
    };
    a.host_register = [](void*, size_t) {
      if (int e = Get().host_register_error.load()) return e;
      ++Get().registers;
      return 0;
    };
    a.host_unregister = [](void*) {
      ++Get().unregisters;
      return 0;
    };
    a.ipc_get_mem_handle = [](const void* p, void* h) {
      std::memset(h, 0, MOE_CUDA_IPC_HANDLE_BYTES);
      std::memcpy(h, &p, sizeof(p));  // the "handle" is the pointer
      return 0;
    };
    a.ipc_open_mem_handle = [](const void* h, void** p) {
      if (int e = Get().ipc_open_error.load()) return e;
      ++Get().ipc_opens;
      std::memcpy(p, h, sizeof(*p));  // the "handle" is the pointer
      return 0;
    };
    a.ipc_close_mem_handle = [](void*) {
      ++Get().ipc_closes;
      return 0;
    };
    a.memcpy_async_h2d = [](void* d, const void* s, size_t n, void*) {
      if (int e = Get().copy_error.load()) return e;
      ++Get().copies;
      std::memcpy(d, s, n);
      return 0;
    };
    a.stream_create_with_priority = [](void** s, int priority) {
      if (int e = Get().stream_error.load()) return e;
      ++Get().streams;
      Get().last_priority = priority;
      *s = reinterpret_cast<void*>(0x5);
      return 0;
    };
    a.stream_destroy = [](void*) {
      ++Get().streams_destroyed;
      return 0;
    };
    a.event_create = [](void** e) {
      ++Get().events;
      *e = reinterpret_cast<void*>(0xe);
      return 0;
    };
    a.event_destroy = [](void*) {
      ++Get().events_destroyed;
      return 0;
    };
    a.event_record = [](void*, void*) { return 0; };
    a.event_synchronize = [](void*) {
      ++Get().syncs;
      return 0;
    };
    // MOE_CUDA_NOT_READY while event_pending > 0 (one query uses one up).
    a.event_query = [](void*) {
      if (Get().event_pending.load() > 0) {
        --Get().event_pending;
        return MOE_CUDA_NOT_READY;
      }
      return 0;
    };
    return a;
  }
};

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_CACHE_FAKE_CUDA_MODULE_H_
