#include "services/moe_cached/cached_model.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/cache/eamc_store.h"
#include "services/cache/policy.h"

namespace moe::cached {

namespace {

// The emulated link's chunk. A demand waits behind at most one chunk of a
// prefetch, which the prefetch gate charges (C = chunk / link), and the
// default 4 MiB is more than a whole expert of a small model (C = X: no
// prefetch can pay). So a small share of one expert: expert / 16 within
// [64 KiB, 4 MiB] (docs/benchmarks.md, "Prefetch gate in the daemon").
uint64_t CpuChunkBytes(uint64_t expert_bytes) {
  return std::clamp<uint64_t>(expert_bytes / 16, 64 << 10, 4 << 20);
}

}  // namespace

std::string UnguessableShmName(const std::string& prefix) {
  char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    MOE_CHECK(n > 0) << "getrandom failed";
    got += static_cast<size_t>(n);
  }
  return absl::StrCat("/", prefix, "-", ::getpid(), "-",
                      absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes))));
}

absl::StatusOr<std::unique_ptr<CachedModel>> CachedModel::Create(
    std::unique_ptr<ExpertStore> store, const CachedModelOptions& options,
    prometheus::Registry& registry) {
  std::unique_ptr<CachedModel> m(new CachedModel());
  m->options_ = options;
  const uint64_t block = store->slot_bytes();
  // A cache of 0 slots (every miss on the host) still maps an arena: one
  // page, so that the attach protocol and the workers' mappings stay the same.
  constexpr uint64_t kMinArenaBytes = 4096;
  RETURN_IF_ERROR(m->CreateArenaAndEngine(
      std::max<uint64_t>(block * static_cast<uint64_t>(options.cache.capacity), kMinArenaBytes)));

  cache::CacheShape shape;
  shape.num_layers = store->num_layers();
  shape.num_experts = store->num_experts();
  shape.top_k = store->top_k();
  shape.expert_bytes = block;
  shape.expert_flops_per_token = store->expert_flops_per_token();
  bool sizes_differ = false;
  for (int l = 0; l < store->num_layers(); ++l) {
    sizes_differ |= store->layer(l).block_bytes != block;
  }
  if (sizes_differ) {
    for (int l = 0; l < store->num_layers(); ++l) {
      shape.layer_bytes.push_back(store->layer(l).block_bytes);
    }
  }
  RETURN_IF_ERROR(cache::ValidateCacheConfig(shape, options.cache));
  ASSIGN_OR_RETURN(auto policy, cache::MakePolicy(options.cache.policy,
                                                  cache::MakePolicyConfig(
                                                      shape, options.cache)));
  // The same cache as the simulator's: the gate's C from the copy engine's
  // chunk, T (layer_seconds 0) estimated online from the sessions' acquires.
  const cache::ExpertCacheOptions co = cache::MakeCacheOptions(
      shape, options.cache, *m->engine_, /*clock=*/nullptr);
  const ExpertStore* raw_store = store.get();
  ASSIGN_OR_RETURN(m->cache_,
                   cache::ExpertCache::Create(co, std::move(policy), m->engine_,
                                              [raw_store](const ExpertKey& k) {
                                                return static_cast<const void*>(
                                                    raw_store->Block(k.layer, k.expert));
                                              }));
  m->residency_ = std::make_unique<ResidencyBoard>(raw_store->num_layers(),
                                                   raw_store->num_experts(),
                                                   m->cache_->capacity());
  m->cache_->SetResidencyListener(m->residency_.get());
  m->store_ = std::move(store);
  m->metrics_ = std::make_unique<CacheMetrics>(registry, options.name,
                                               options.cache.capacity);
  return m;
}

absl::Status CachedModel::CreateArenaAndEngine(uint64_t bytes) {
  if (options_.cuda != nullptr) {
    ASSIGN_OR_RETURN(cuda_arena_, CudaArena::Create(options_.cuda, bytes));
    cache::CudaCopyEngineOptions eo;
    eo.memory = options_.cuda;
    eo.arena = cuda_arena_->device_ptr();
    eo.arena_bytes = cuda_arena_->size();
    cuda_engine_ = std::make_unique<cache::CudaCopyEngine>(eo);
    engine_ = cuda_engine_.get();
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(arena_, cache::ShmRegion::Create(
                               options_.anonymous_arena ? "" : UnguessableShmName("moecache-arena"),
                               bytes));
  if (const std::string thp = cache::ShmemHugePageMode(); thp == "never" || thp == "deny") {
    MOE_LOG(INFO) << "model " << name() << ": the arena and host copy are allocated on 4 KiB "
                  << "pages (shmem_enabled is '" << thp << "'), "
                  << (thp == "never" ? "moved onto 2 MiB pages in the background after start"
                                     : "and stay there (served decode measured 5-17% slower)")
                  << "; deploy/systemd/moecache-hugepages.conf sets 'advise', which gives them "
                  << "at once (docs/operations.md, 'Huge pages for host memory')";
  }
  cache::CpuCopyEngineOptions eo;
  eo.arena = arena_.mutable_data();
  eo.arena_bytes = arena_.size();
  eo.link_bytes_per_sec =
      static_cast<uint64_t>(options_.cache.link_bytes_per_sec);
  eo.chunk_bytes = CpuChunkBytes(bytes / std::max(1, options_.cache.capacity));
  cpu_engine_ = std::make_unique<cache::CpuCopyEngine>(eo);
  engine_ = cpu_engine_.get();
  return absl::OkStatus();
}

uint64_t CachedModel::arena_bytes() const {
  return cuda_arena_ != nullptr ? cuda_arena_->size() : arena_.size();
}

CachedModel::~CachedModel() { Stop(); }

absl::Status CachedModel::Start() {
  if (!options_.state_path.empty()) {
    absl::Status loaded = cache_->LoadState(options_.state_path);
    if (!loaded.ok()) {
      // A bad file must not keep the daemon down: start cold, say why. A
      // corrupt or mismatched file is kept aside for diagnosis (the next save
      // would overwrite it); an older .corrupt is replaced.
      MOE_LOG(WARNING) << "model " << name() << ": starting without learned state: " << loaded;
      if (absl::IsDataLoss(loaded) || absl::IsFailedPrecondition(loaded)) {
        const std::string kept = options_.state_path + ".corrupt";
        if (::rename(options_.state_path.c_str(), kept.c_str()) == 0) {
          MOE_LOG(WARNING) << "model " << name() << ": kept the unreadable state file as "
                           << kept;
        } else {
          MOE_LOG(WARNING) << "model " << name() << ": could not keep " << options_.state_path
                           << " as " << kept << ": " << std::strerror(errno)
                           << " (the next save replaces it)";
        }
      }
    } else {
      MOE_LOG(INFO) << "model " << name() << ": loaded " << cache_->GetGauges().eamc_entries
                    << " EAMC entries from " << options_.state_path;
    }
  }
  RETURN_IF_ERROR(cuda_engine_ != nullptr ? cuda_engine_->Start() : cpu_engine_->Start());
  started_ = true;
  if (const int warm = cache_->WarmUp(); warm > 0) {
    MOE_LOG(INFO) << "model " << name() << ": placing " << warm << " experts of policy "
                  << cache_->policy_name() << "'s warm set before the first request";
  }
  MOE_LOG(INFO) << "model " << name() << ": " << options_.cache.capacity
                << " slots of " << store_->slot_bytes() << " bytes "
                << (cuda_arena_ != nullptr ? "in CUDA device memory"
                                           : "in host shared memory")
                << ", policy " << cache_->policy_name() << ", prefetch "
                << (options_.cache.prefetch ? "on" : "off");
  return absl::OkStatus();
}

void CachedModel::Stop() {
  if (stopped_.exchange(true)) return;
  if (started_) {
    absl::Status s = Persist();
    if (!s.ok()) MOE_LOG(ERROR) << "model " << name() << ": " << s;
  }
  if (cpu_engine_ != nullptr) cpu_engine_->Stop();
  if (cuda_engine_ != nullptr) cuda_engine_->Stop();
}

absl::Status CachedModel::Persist() {
  if (options_.state_path.empty()) return absl::OkStatus();
  return cache_->SaveState(options_.state_path);
}

int CachedModel::ResidentExperts() const { return cache_->GetGauges().resident; }

int CachedModel::eamc_entries() const { return cache_->GetGauges().eamc_entries; }

double CachedModel::prefetch_stride() const { return cache_->GetGauges().prefetch_stride; }

void CachedModel::SyncMetrics() { metrics_->Sync(TotalStats(*cache_), cache_->GetGauges()); }

}  // namespace moe::cached
