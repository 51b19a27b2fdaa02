// A standalone driver for the LLVMFuzzerTestOneInput targets, used when the
// build has no libFuzzer (g++). It runs every seed file once, then mutates
// seeds with a seeded RNG (bit flips, interesting bytes, JSON-aware number
// and string swaps, header-length edits, splices, truncation) and reports
// how many inputs it tried.
//
//   fuzz_config --runs 20000 [--seed N] [--long-seconds 120]
//               [--max-len BYTES] CORPUS_DIR...
//   fuzz_config --seconds 60 [--seed N] CORPUS_DIR...
//
// --runs N tries exactly N mutated inputs: with the same seed, the same
// inputs on every machine however slow or busy it is (the default suite).
// With MOE_LONG_TESTS=1 in the environment, --long-seconds M fuzzes for M
// seconds instead, from a fresh seed (printed first; MOE_FUZZ_SEED=S fixes
// it). --seconds N is a time budget with the given seed.
//
// On a crash the input is written to fuzz-crash-<pid> in the current
// directory (or $MOE_FUZZ_ARTIFACT_DIR) and the seed and input number are
// printed, before the process dies; rerun with --seed S --runs K+1 to get
// the same input again.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/splitmix64.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, its number and the seed, for the crash handler.
const std::string* g_current = nullptr;
char g_crash_path[512];
char g_crash_note[128];

void OnCrash(int sig) {
  if (g_current != nullptr) {
    int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t unused = ::write(fd, g_current->data(), g_current->size());
      (void)unused;
      ::close(fd);
    }
    const char msg[] = "fuzz_driver: crash; input saved to ";
    ssize_t u1 = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ssize_t u2 =
        ::write(STDERR_FILENO, g_crash_path, std::strlen(g_crash_path));
    ssize_t u3 = ::write(STDERR_FILENO, "\n", 1);
    ssize_t u4 = ::write(STDERR_FILENO, g_crash_note, std::strlen(g_crash_note));
    (void)u1, (void)u2, (void)u3, (void)u4;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return moe::SplitMix64(state_); }
  size_t Below(size_t n) {
    return n == 0 ? 0 : static_cast<size_t>(Next() % n);
  }

 private:
  uint64_t state_;
};

const char* const kNumbers[] = {"0",
                                "-1",
                                "1",
                                "2",
                                "7",
                                "8",
                                "65536",
                                "4294967296",
                                "9223372036854775807",
                                "18446744073709551615",
                                "99999999999999999999",
                                "1e308",
                                "-0",
                                "0.5",
                                "1e-7",
                                "null",
                                "true",
                                "[]",
                                "{}",
                                "\"x\""};
const char* const kStrings[] = {"\"F32\"",          "\"BF16\"",
                                "\"F16\"",          "\"I64\"",
                                "\"BOOL\"",         "\"F8_E4M3\"",
                                "\"__metadata__\"", "\"dtype\"",
                                "\"shape\"",        "\"data_offsets\"",
                                "\"mixtral\"",      "\"qwen2_moe\"",
                                "\"qwen3_moe\"",    "\"olmoe\"",
                                "\"model_type\"",   "\"num_experts\"",
                                "\"hidden_size\"",  "\"head_dim\"",
                                "\"eos_token_id\"", "\"\""};
const uint8_t kBytes[] = {0,   0xff, 0x7f, 0x80, '"', '{', '}',  '[', ']',
                          ',', ':',  '-',  '0',  '9', ' ', '\\', 'e', '.'};

// Replaces the run of characters around `pos` that satisfies `in_token`.
void ReplaceToken(std::string& s, size_t pos, bool (*in_token)(char),
                  const std::string& with) {
  size_t b = pos, e = pos;
  while (b > 0 && in_token(s[b - 1])) --b;
  while (e < s.size() && in_token(s[e])) ++e;
  s.replace(b, e - b, with);
}

bool IsNumberChar(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e';
}

void Mutate(std::string& s, const std::vector<std::string>& seeds, Rng& rng,
            size_t max_len) {
  const size_t n = s.size();
  switch (rng.Below(10)) {
    case 0:  // flip a bit
      if (n > 0) s[rng.Below(n)] ^= static_cast<char>(1u << rng.Below(8));
      break;
    case 1:  // an interesting byte
      if (n > 0)
        s[rng.Below(n)] = static_cast<char>(kBytes[rng.Below(sizeof(kBytes))]);
      break;
    case 2: {  // delete a range
      if (n == 0) break;
      size_t at = rng.Below(n);
      s.erase(at, 1 + rng.Below(std::min<size_t>(n - at, 32)));
      break;
    }
    case 3: {  // duplicate a range
      if (n == 0) break;
      size_t at = rng.Below(n),
             len = 1 + rng.Below(std::min<size_t>(n - at, 64));
      s.insert(rng.Below(n + 1), s.substr(at, len));
      break;
    }
    case 4: {  // a JSON number (or what stands where one was)
      size_t pos = n == 0 ? 0 : rng.Below(n);
      for (size_t k = 0; k < n && !(s[pos] >= '0' && s[pos] <= '9'); ++k)
        pos = (pos + 1) % n;
      if (n > 0 && s[pos] >= '0' && s[pos] <= '9') {
        ReplaceToken(s, pos, IsNumberChar,
                     kNumbers[rng.Below(std::size(kNumbers))]);
      }
      break;
    }
    case 5: {  // a JSON string
      size_t q = s.find('"', n == 0 ? 0 : rng.Below(n));
      size_t end = q == std::string::npos ? q : s.find('"', q + 1);
      if (end != std::string::npos) {
        s.replace(q, end - q + 1, kStrings[rng.Below(std::size(kStrings))]);
      }
      break;
    }
    case 6: {  // safetensors header length
      if (n < 8) break;
      uint64_t len = 0;
      std::memcpy(&len, s.data(), 8);
      const uint64_t choices[] = {
          len + 1,  len - 1,  len + 8,    len - 8,      0,
          n - 8ull, n - 7ull, rng.Next(), 100ull << 20, (100ull << 20) + 1};
      len = choices[rng.Below(std::size(choices))];
      std::memcpy(s.data(), &len, 8);
      break;
    }
    case 7:  // truncate
      s.resize(rng.Below(n + 1));
      break;
    case 8: {  // splice with another seed
      const std::string& other = seeds[rng.Below(seeds.size())];
      s = s.substr(0, rng.Below(n + 1)) +
          other.substr(rng.Below(other.size() + 1));
      break;
    }
    default: {  // random bytes
      std::string r(1 + rng.Below(8), '\0');
      for (char& c : r) c = static_cast<char>(rng.Next());
      s.insert(rng.Below(n + 1), r);
      break;
    }
  }
  if (s.size() > max_len) s.resize(max_len);
}

std::vector<std::string> LoadSeeds(const std::vector<std::string>& dirs) {
  std::vector<std::filesystem::path> files;
  for (const auto& d : dirs) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(d)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> seeds;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in),
                       std::istreambuf_iterator<char>());
  }
  return seeds;
}

void RunOne(const std::string& input) {
  g_current = &input;
  // Copy into an exact-size heap buffer so ASan sees reads past the end.
  std::vector<uint8_t> buf(input.begin(), input.end());
  LLVMFuzzerTestOneInput(buf.empty() ? nullptr : buf.data(), buf.size());
  g_current = nullptr;
}

int Usage() {
  std::fprintf(stderr,
               "usage: fuzz_driver (--runs N | --seconds S) [--long-seconds M] "
               "[--seed S] [--max-len B] CORPUS_DIR...\n");
  return 2;
}

struct Options {
  uint64_t runs = 0;     // > 0: exactly this many mutated inputs
  double seconds = 0;    // > 0 and runs == 0: a time budget
  double long_seconds = 0;
  uint64_t seed = 1;
  size_t max_len = 1 << 16;
  std::vector<std::string> dirs;
};

bool ParseArgs(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--runs" && v) {
      o.runs = std::strtoull(v, nullptr, 10);
    } else if (a == "--seconds" && v) {
      o.seconds = std::atof(v);
    } else if (a == "--long-seconds" && v) {
      o.long_seconds = std::atof(v);
    } else if (a == "--seed" && v) {
      o.seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--max-len" && v) {
      o.max_len = std::strtoull(v, nullptr, 10);
    } else if (!a.empty() && a[0] != '-') {
      o.dirs.push_back(a);
      continue;
    } else {
      return false;
    }
    ++i;
  }
  // MOE_LONG_TESTS: a time budget from a fresh seed instead of fixed runs.
  const char* long_env = std::getenv("MOE_LONG_TESTS");
  if (long_env != nullptr && std::strcmp(long_env, "1") == 0 &&
      o.long_seconds > 0) {
    o.runs = 0;
    o.seconds = o.long_seconds;
    const char* fixed = std::getenv("MOE_FUZZ_SEED");
    o.seed = fixed != nullptr
                 ? std::strtoull(fixed, nullptr, 10)
                 : static_cast<uint64_t>(
                       std::chrono::system_clock::now().time_since_epoch()
                           .count()) ^
                       (static_cast<uint64_t>(::getpid()) << 32);
  }
  return !o.dirs.empty() && (o.runs > 0 || o.seconds > 0);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, o)) return Usage();
  const char* art = std::getenv("MOE_FUZZ_ARTIFACT_DIR");
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/fuzz-crash-%d",
                art ? art : ".", static_cast<int>(::getpid()));
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL})
    ::signal(sig, OnCrash);

  std::vector<std::string> seeds = LoadSeeds(o.dirs);
  if (seeds.empty()) {
    std::fprintf(stderr,
                 "fuzz_driver: no seed files under the given directories\n");
    return 2;
  }
  std::printf("fuzz_driver: seed %llu, %s\n",
              static_cast<unsigned long long>(o.seed),
              o.runs > 0 ? "fixed runs" : "time budget");
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  for (size_t k = 0; k < seeds.size(); ++k) {
    std::snprintf(g_crash_note, sizeof(g_crash_note),
                  "fuzz_driver: crashed on seed file %zu (sorted)\n", k);
    RunOne(seeds[k]);
  }
  Rng rng(o.seed);
  uint64_t tried = 0;
  std::string input;
  while (o.runs > 0 ? tried < o.runs
                    // Check the clock every 64 inputs; they are small.
                    : (tried % 64 != 0 ||
                       std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                               .count() < o.seconds)) {
    input = seeds[rng.Below(seeds.size())];
    for (size_t k = 1 + rng.Below(4); k > 0; --k)
      Mutate(input, seeds, rng, o.max_len);
    ++tried;
    std::snprintf(g_crash_note, sizeof(g_crash_note),
                  "fuzz_driver: seed %llu, input %llu (rerun with --seed %llu "
                  "--runs %llu)\n",
                  static_cast<unsigned long long>(o.seed),
                  static_cast<unsigned long long>(tried),
                  static_cast<unsigned long long>(o.seed),
                  static_cast<unsigned long long>(tried));
    RunOne(input);
  }
  double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("fuzz_driver: %llu inputs (+%zu seeds) in %.1f s, seed %llu\n",
              static_cast<unsigned long long>(tried), seeds.size(), took,
              static_cast<unsigned long long>(o.seed));
  return 0;
}
