#include "services/cache/eamc_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::cache {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'E', 'A', 'M', 'C', '\0'};
constexpr size_t kHeaderBytes = 40;
constexpr uint32_t kTagEamc = 1;
constexpr uint32_t kTagReuse = 2;
constexpr uint32_t kTagAffinity = 3;
constexpr uint32_t kTagPopularity = 4;
constexpr uint64_t kMaxFileBytes = 1ull << 30;
constexpr int kMaxShape = 1 << 16;  // layers or experts, as config.json allows

// --- little-endian writer / reader ---

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutF32(std::string* s, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(s, v);
}
void PutF64(std::string* s, double f) {
  uint64_t v;
  std::memcpy(&v, &f, 8);
  PutU64(s, v);
}

class Reader {
 public:
  explicit Reader(absl::string_view b) : b_(b) {}
  size_t left() const { return b_.size() - pos_; }
  bool U32(uint32_t* v) {
    if (left() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i)
      *v |= static_cast<uint32_t>(static_cast<uint8_t>(b_[pos_ + i]))
            << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (left() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i)
      *v |= static_cast<uint64_t>(static_cast<uint8_t>(b_[pos_ + i]))
            << (8 * i);
    pos_ += 8;
    return true;
  }
  bool F32(float* f) {
    uint32_t v;
    if (!U32(&v)) return false;
    std::memcpy(f, &v, 4);
    return true;
  }
  bool F64(double* f) {
    uint64_t v;
    if (!U64(&v)) return false;
    std::memcpy(f, &v, 8);
    return true;
  }
  bool Bytes(size_t n, absl::string_view* out) {
    if (left() < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  absl::string_view b_;
  size_t pos_ = 0;
};

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("EAMC state file is corrupt: ", what));
}

void PutPart(std::string* s, const SparseEam& part) {
  PutU32(s, static_cast<uint32_t>(part.entries().size()));
  for (const auto& e : part.entries()) {
    PutU32(s, e.index);
    PutF32(s, e.value);
  }
}

absl::StatusOr<SparseEam> ReadPart(Reader& r, int L, int E) {
  uint32_t n;
  if (!r.U32(&n)) return Corrupt("truncated record");
  const uint64_t cells = static_cast<uint64_t>(L) * E;
  if (n > cells || static_cast<uint64_t>(n) * 8 > r.left())
    return Corrupt("bad entry count");
  std::vector<SparseEntry> entries(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!r.U32(&entries[i].index) || !r.F32(&entries[i].value))
      return Corrupt("truncated entry");
    if (entries[i].index >= cells) return Corrupt("cell out of range");
    if (i > 0 && entries[i].index <= entries[i - 1].index)
      return Corrupt("cells not increasing");
    if (!std::isfinite(entries[i].value) || !(entries[i].value > 0)) {
      return Corrupt("count not finite and positive");
    }
  }
  return SparseEam::FromEntries(L, E, std::move(entries));
}

absl::Status ReadEamc(absl::string_view body, LearnedState* s) {
  Reader r(body);
  uint32_t count;
  if (!r.U32(&count)) return Corrupt("truncated EAMC section");
  if (static_cast<uint64_t>(count) * 8 > body.size())
    return Corrupt("bad record count");
  s->records.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    EamcRecord rec;
    ASSIGN_OR_RETURN(rec.prefill, ReadPart(r, s->num_layers, s->num_experts));
    ASSIGN_OR_RETURN(rec.decode, ReadPart(r, s->num_layers, s->num_experts));
    s->records.push_back(std::move(rec));
  }
  if (r.left() != 0) return Corrupt("trailing bytes in EAMC section");
  return absl::OkStatus();
}

absl::Status ReadReuse(absl::string_view body, LearnedState* s) {
  Reader r(body);
  uint32_t layers;
  if (!r.U32(&layers) || layers != static_cast<uint32_t>(s->num_layers) ||
      r.left() != static_cast<size_t>(layers) * 16) {
    return Corrupt("bad reuse section");
  }
  s->reuse_hits.resize(layers);
  s->reuse_total.resize(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    r.F64(&s->reuse_hits[l]);
    r.F64(&s->reuse_total[l]);
    const double h = s->reuse_hits[l], t = s->reuse_total[l];
    if (!std::isfinite(h) || !std::isfinite(t) || h < 0 || h > t) {
      return Corrupt("bad reuse statistics");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadAffinity(absl::string_view body, LearnedState* s) {
  Reader r(body);
  uint32_t lags;
  if (!r.U32(&lags) || lags == 0 ||
      lags > static_cast<uint32_t>(s->num_layers)) {
    return Corrupt("bad affinity lags");
  }
  // lags * L * E sources, each with E targets, 4 bytes a count: checked,
  // since a product that wraps could match a short section.
  const uint64_t E = static_cast<uint64_t>(s->num_experts);
  uint64_t from, pairs, cells, bytes;
  if (!CheckedMul(uint64_t{lags} * static_cast<uint64_t>(s->num_layers), E, &from) ||
      !CheckedMul(from, E, &pairs) || !CheckedAdd(pairs, from, &cells) ||
      !CheckedMul(cells, uint64_t{4}, &bytes) || r.left() != bytes) {
    return Corrupt("bad affinity section size");
  }
  s->affinity_lags = static_cast<int>(lags);
  s->affinity.resize(pairs);
  s->affinity_from.resize(from);
  for (float& f : s->affinity) r.F32(&f);
  for (float& f : s->affinity_from) r.F32(&f);
  for (const auto* v : {&s->affinity, &s->affinity_from}) {
    for (float f : *v) {
      if (!std::isfinite(f) || f < 0) return Corrupt("bad affinity count");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadPopularity(absl::string_view body, LearnedState* s) {
  Reader r(body);
  uint32_t cells;
  const uint64_t want = static_cast<uint64_t>(s->num_layers) * s->num_experts;
  if (!r.U32(&cells) || cells != want || r.left() != want * 8) {
    return Corrupt("bad popularity section");
  }
  s->popularity.resize(cells);
  for (double& d : s->popularity) {
    r.F64(&d);
    if (!std::isfinite(d) || d < 0) return Corrupt("bad popularity count");
  }
  return absl::OkStatus();
}

void AddSection(std::string* payload, uint32_t tag, const std::string& body) {
  PutU32(payload, tag);
  PutU64(payload, body.size());
  payload->append(body);
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open directory", dir);
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  return ok ? absl::OkStatus() : ErrnoToStatus(err, "fsync failed", dir);
}

std::pair<std::string, std::string> SplitDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Removes "<base>.tmp.<pid>.<n>" files whose writer process no longer exists.
void RemoveStaleTemps(const std::string& path) {
  auto [dir, base] = SplitDir(path);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = base + ".tmp.";
  while (const dirent* e = ::readdir(d)) {
    const absl::string_view name = e->d_name;
    if (!absl::StartsWith(name, prefix)) continue;
    absl::string_view rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    int pid = 0;
    if (dot == absl::string_view::npos ||
        !absl::SimpleAtoi(rest.substr(0, dot), &pid) || pid <= 0) {
      continue;
    }
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string full = JoinPath(dir, std::string(name));
    if (::unlink(full.c_str()) == 0) {
      MOE_LOG(INFO) << "removed stale temporary " << full
                    << " (a save was interrupted)";
    }
  }
  ::closedir(d);
}

}  // namespace

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::string> EncodeLearnedState(const LearnedState& s) {
  if (s.num_layers <= 0 || s.num_experts <= 0) {
    return absl::InvalidArgumentError("learned state needs a positive shape");
  }
  const size_t L = s.num_layers, E = s.num_experts;
  std::string payload;
  std::string body;
  PutU32(&body, static_cast<uint32_t>(s.records.size()));
  for (const EamcRecord& r : s.records) {
    for (const SparseEam* part : {&r.prefill, &r.decode}) {
      if (!part->empty() && (part->num_layers() != s.num_layers ||
                             part->num_experts() != s.num_experts)) {
        return absl::InvalidArgumentError("EAMC record of another shape");
      }
      PutPart(&body, *part);
    }
  }
  AddSection(&payload, kTagEamc, body);
  if (!s.reuse_hits.empty()) {
    if (s.reuse_hits.size() != L || s.reuse_total.size() != L) {
      return absl::InvalidArgumentError(
          "reuse statistics need one entry per layer");
    }
    body.clear();
    PutU32(&body, s.num_layers);
    for (size_t l = 0; l < L; ++l) {
      PutF64(&body, s.reuse_hits[l]);
      PutF64(&body, s.reuse_total[l]);
    }
    AddSection(&payload, kTagReuse, body);
  }
  if (!s.affinity.empty()) {
    const size_t from = static_cast<size_t>(s.affinity_lags) * L * E;
    if (s.affinity_lags <= 0 || s.affinity.size() != from * E ||
        s.affinity_from.size() != from) {
      return absl::InvalidArgumentError(
          "affinity arrays do not match their shape");
    }
    body.clear();
    PutU32(&body, s.affinity_lags);
    for (float f : s.affinity) PutF32(&body, f);
    for (float f : s.affinity_from) PutF32(&body, f);
    AddSection(&payload, kTagAffinity, body);
  }
  if (!s.popularity.empty()) {
    if (s.popularity.size() != L * E) {
      return absl::InvalidArgumentError("popularity needs one count per (layer, expert)");
    }
    body.clear();
    PutU32(&body, static_cast<uint32_t>(L * E));
    for (double d : s.popularity) PutF64(&body, d);
    AddSection(&payload, kTagPopularity, body);
  }
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, kEamcFormatVersion);
  PutU32(&out, s.num_layers);
  PutU32(&out, s.num_experts);
  PutU32(&out, 0);
  PutU64(&out, payload.size());
  PutU64(&out, Fnv1a64(payload));
  out += payload;
  return out;
}

absl::StatusOr<LearnedState> DecodeLearnedState(absl::string_view bytes,
                                                int num_layers,
                                                int num_experts) {
  if (num_layers < 1 || num_layers > kMaxShape || num_experts < 1 ||
      num_experts > kMaxShape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EAMC state: num_layers and num_experts must be in [1, ", kMaxShape,
        "], got ", num_layers, " and ", num_experts));
  }
  if (bytes.size() < kHeaderBytes) return Corrupt("shorter than its header");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt("bad magic (not an EAMC state file)");
  }
  Reader h(bytes.substr(sizeof(kMagic), kHeaderBytes - sizeof(kMagic)));
  uint32_t version, layers, experts, flags;
  uint64_t size, checksum;
  h.U32(&version), h.U32(&layers), h.U32(&experts), h.U32(&flags), h.U64(&size),
      h.U64(&checksum);
  if (version != kEamcFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("EAMC state file has format version ", version,
                     "; this build reads ", kEamcFormatVersion));
  }
  if (layers != static_cast<uint32_t>(num_layers) ||
      experts != static_cast<uint32_t>(num_experts)) {
    return absl::FailedPreconditionError(
        absl::StrCat("EAMC state file was learned on a ", layers, "x", experts,
                     " model; this model is ", num_layers, "x", num_experts));
  }
  if (flags != 0) return Corrupt("unknown flags");
  if (size != bytes.size() - kHeaderBytes)
    return Corrupt("payload size does not match the file");
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  if (Fnv1a64(payload) != checksum) return Corrupt("checksum mismatch");
  LearnedState s;
  s.num_layers = num_layers;
  s.num_experts = num_experts;
  Reader r(payload);
  while (r.left() > 0) {
    uint32_t tag;
    uint64_t len;
    absl::string_view body;
    if (!r.U32(&tag) || !r.U64(&len) || !r.Bytes(len, &body))
      return Corrupt("truncated section");
    if (tag == kTagEamc) {
      RETURN_IF_ERROR(ReadEamc(body, &s));
    } else if (tag == kTagReuse) {
      RETURN_IF_ERROR(ReadReuse(body, &s));
    } else if (tag == kTagAffinity) {
      RETURN_IF_ERROR(ReadAffinity(body, &s));
    } else if (tag == kTagPopularity) {
      RETURN_IF_ERROR(ReadPopularity(body, &s));
    }  // unknown sections: skipped
  }
  return s;
}

absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create", tmp);
  size_t done = 0;
  absl::Status status;
  while (done < contents.size()) {
    const ssize_t w =
        ::write(fd, contents.data() + done, contents.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      status = ErrnoToStatus(w < 0 ? errno : EIO, "write failed", tmp);
      break;
    }
    done += static_cast<size_t>(w);
  }
  if (status.ok() && ::fsync(fd) != 0)
    status = ErrnoToStatus(errno, "fsync failed", tmp);
  if (::close(fd) != 0 && status.ok())
    status = ErrnoToStatus(errno, "close failed", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoToStatus(errno, "cannot rename into place", path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return FsyncDir(SplitDir(path).first);
}

absl::Status SaveLearnedState(const std::string& path,
                              const LearnedState& state) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeLearnedState(state));
  return WriteFileDurably(path, bytes);
}

absl::StatusOr<LearnedState> LoadLearnedState(const std::string& path,
                                              int num_layers, int num_experts) {
  RemoveStaleTemps(path);
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path, kMaxFileBytes));
  auto s = DecodeLearnedState(bytes, num_layers, num_experts);
  if (!s.ok())
    return absl::Status(s.status().code(),
                        absl::StrCat(path, ": ", s.status().message()));
  return s;
}

}  // namespace moe::cache
