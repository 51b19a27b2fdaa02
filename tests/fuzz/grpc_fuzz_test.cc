// Bad input from outside, against the real services: one moe-cached and one
// moe-worker attached to it, both as child processes on the tiny model.
//
//  - Wire fuzzing with grpc::GenericStub (raw bytes, so malformed protobuf
//    really reaches the servers) of every method of both services, listed
//    from the descriptor pool: mutated valid requests, random bytes, and
//    well-formed requests with hostile field values. Every call must end
//    within its deadline with OK or a clear error code and message.
//  - Oversized messages, prompts beyond the context window, absurd
//    max_new_tokens.
//  - Garbage written into a session's shared-memory ring.
// After every few inputs both processes must be alive and a known-good
// greedy Generate (compared with the in-process tokens) and an
// Acquire/Release round must still work. Fixed seeds; MOE_LONG_TESTS=1 runs
// ten times the inputs.
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "moe/v1/inference.grpc.pb.h"
#include "tests/fuzz/service_fuzz_env.h"

namespace moe::fuzz {
namespace {

namespace pb = ::google::protobuf;

// A hang detector, not a latency bound. The slowest calls here are the
// longest prompt that fits (a 4094-token prefill) and tokenizing a 3 MiB
// prompt: beside a busy loop per core on a loaded 2-core machine they took
// 8.0-8.1 s and 1.3-1.9 s plain, 8.7-15.1 s and 6.7-14.7 s under ASan, where
// 15 s failed 1 run in 4 (DEADLINE_EXCEEDED). Four times the worst.
constexpr absl::Duration kCallDeadline = absl::Seconds(60);
constexpr int kCheckEvery = 100;  // inputs between known-good checks
constexpr int kMaxReportedFailures = 25;

std::string Hex(const std::string& s, size_t max = 48) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(s[i]));
  }
  if (s.size() > max) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

// ---------------------------------------------------------------------------
// Raw calls: one request message, then every response until the server
// finishes (or we cancel after `cancel_after` responses).

struct RawResult {
  grpc::Status status;
  int responses = 0;
  std::string first_response;
  bool cancelled_by_us = false;
  bool client_stuck = false;  // no completion even past the deadline
};

void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }

class RawCaller {
 public:
  explicit RawCaller(std::shared_ptr<grpc::Channel> channel) : stub_(std::move(channel)) {}

  RawResult Call(const std::string& method, const std::string& request, int cancel_after) {
    RawResult r;
    grpc::ClientContext ctx;
    const absl::Time end = absl::Now() + kCallDeadline;
    ctx.set_deadline(absl::ToChronoTime(end));
    grpc::CompletionQueue cq;
    // Waits for the one outstanding operation. Past the deadline (plus
    // slack) the call is cancelled, which always completes it.
    auto await = [&]() {
      void* tag = nullptr;
      bool ok = false;
      if (cq.AsyncNext(&tag, &ok, absl::ToChronoTime(end + absl::Seconds(5))) !=
          grpc::CompletionQueue::GOT_EVENT) {
        r.client_stuck = true;
        ctx.TryCancel();
        cq.Next(&tag, &ok);
      }
      return ok;
    };
    auto call = stub_.PrepareCall(&ctx, method, &cq);
    call->StartCall(Tag(1));
    if (await()) {
      grpc::Slice slice(request);
      grpc::ByteBuffer buffer(&slice, 1);
      call->WriteLast(buffer, grpc::WriteOptions(), Tag(2));
      await();  // a failed write shows in the status
      while (true) {
        grpc::ByteBuffer in;
        call->Read(&in, Tag(3));
        if (!await()) break;
        if (++r.responses == 1) r.first_response = Dump(in);
        if (cancel_after > 0 && r.responses >= cancel_after && !r.cancelled_by_us) {
          r.cancelled_by_us = true;
          ctx.TryCancel();
        }
      }
    }
    call->Finish(&r.status, Tag(4));
    await();
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return r;
  }

 private:
  static std::string Dump(grpc::ByteBuffer& buffer) {
    std::vector<grpc::Slice> slices;
    std::string out;
    if (buffer.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        out.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return out;
  }

  grpc::GenericStub stub_;
};

// ---------------------------------------------------------------------------
// What the fuzzer knows about the system under test.

enum class Target { kDaemon, kWorker };

struct Method {
  std::string path;  // "/moe.v1.ExpertCache/Acquire"
  const pb::MethodDescriptor* desc;
  Target target;
};

// Every method of every service in the two proto files (moe-cached serves
// expert_cache.proto, moe-worker inference.proto), from the descriptors
// compiled into this test: a method added later is fuzzed too.
std::vector<Method> ListMethods() {
  std::vector<Method> out;
  const std::pair<const pb::FileDescriptor*, Target> files[] = {
      {moe::v1::AttachRequest::descriptor()->file(), Target::kDaemon},
      {moe::v1::GenerateRequest::descriptor()->file(), Target::kWorker}};
  for (const auto& [file, target] : files) {
    for (int s = 0; s < file->service_count(); ++s) {
      const pb::ServiceDescriptor* svc = file->service(s);
      for (int i = 0; i < svc->method_count(); ++i) {
        const pb::MethodDescriptor* m = svc->method(i);
        out.push_back({absl::StrCat("/", svc->full_name(), "/", m->name()), m, target});
      }
    }
  }
  return out;
}


// ---------------------------------------------------------------------------
// Inputs.

class InputGen {
 public:
  InputGen(uint64_t seed, const World* world) : rng_(seed), world_(*world) {}

  uint64_t Next() { return rng_(); }
  bool OneIn(int n) { return rng_() % static_cast<uint64_t>(n) == 0; }
  template <typename T>
  T Pick(const std::vector<T>& v) {
    return v[rng_() % v.size()];
  }

  // A request the server should accept, for the methods we know; a random
  // well-formed one for any method added later.
  std::string Valid(const Method& m) {
    const std::string& name = m.desc->name();
    std::unique_ptr<pb::Message> msg(NewMessage(m.desc->input_type()));
    if (name == "Attach") {
      moe::v1::AttachRequest r;
      r.set_model(world_.model);
      r.set_worker_id("fuzz");
      r.set_pid(world_.pid);
      return r.SerializeAsString();
    } else if (name == "Acquire") {
      moe::v1::AcquireRequest r;
      r.set_session_id(world_.session_id);
      r.set_layer(1);
      auto* d = r.add_experts();
      d->set_expert(2);
      d->set_tokens(1);
      d = r.add_experts();
      d->set_expert(5);
      d->set_tokens(3);
      auto* h = r.add_hints();
      h->set_layer(2);
      h->set_expert(3);
      h->set_probability(0.5f);
      return r.SerializeAsString();
    } else if (name == "Release") {
      moe::v1::ReleaseRequest r;
      r.set_session_id(world_.session_id);
      auto* l = r.add_leases();
      l->set_expert(2);
      l->set_slot(0);
      l->set_generation(1);
      return r.SerializeAsString();
    } else if (name == "Generate") {
      moe::v1::GenerateRequest r;
      for (int id : {11, 22, 33}) r.add_prompt_token_ids(id);
      r.set_max_new_tokens(2);
      r.set_ignore_eos(true);
      return r.SerializeAsString();
    }
    // Detach, BeginRequest, EndRequest, GetStats and unknown methods:
    // session_id / request_id / model as far as the message has them.
    const pb::Descriptor* d = m.desc->input_type();
    const pb::Reflection* refl = msg->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->name() == "session_id") refl->SetUInt64(msg.get(), f, world_.session_id);
      if (f->name() == "model") refl->SetString(msg.get(), f, world_.model);
      if (f->name() == "request_id") refl->SetString(msg.get(), f, "req-1");
    }
    return msg->SerializeAsString();
  }

  // A well-formed message with hostile values, chosen by field name and
  // type.
  std::string Semantic(const pb::Descriptor* d) {
    std::unique_ptr<pb::Message> msg(NewMessage(d));
    Fill(msg.get(), 0);
    return msg->SerializeAsString();
  }

  std::string RandomBytes() {
    const size_t n = OneIn(20) ? rng_() % 4096 : rng_() % 64;
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

  // Mostly printable ASCII (a proto3 string with invalid UTF-8 does not
  // parse, so it never reaches the service), sometimes raw bytes.
  std::string RandomText() {
    if (OneIn(5)) return RandomBytes();
    std::string s(rng_() % 48, ' ');
    for (char& c : s) c = static_cast<char>(' ' + rng_() % 95);
    return s;
  }

  // 1-3 wire-level mutations of `s` (fields of `d` are the targets of the
  // field-aware ones).
  std::string Mutate(std::string s, const pb::Descriptor* d) {
    const int n = 1 + static_cast<int>(rng_() % 3);
    for (int i = 0; i < n; ++i) s = MutateOnce(std::move(s), d);
    return s;
  }

 private:
  static pb::Message* NewMessage(const pb::Descriptor* d) {
    return pb::MessageFactory::generated_factory()->GetPrototype(d)->New();
  }

  static void AppendVarint(std::string* s, uint64_t v) {
    while (v >= 0x80) {
      s->push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    s->push_back(static_cast<char>(v));
  }

  int FieldNumber(const pb::Descriptor* d) {
    if (d->field_count() == 0 || OneIn(8)) return 1 + static_cast<int>(rng_() % 2000);
    return d->field(static_cast<int>(rng_() % d->field_count()))->number();
  }

  std::string MutateOnce(std::string s, const pb::Descriptor* d) {
    const size_t pos = s.empty() ? 0 : rng_() % (s.size() + 1);
    std::string tail;
    switch (rng_() % 9) {
      case 0:  // bit flips
        for (int i = 0; i < 4 && !s.empty(); ++i) s[rng_() % s.size()] ^= 1 << (rng_() % 8);
        return s;
      case 1:  // truncation
        return s.substr(0, pos);
      case 2:  // inserted bytes
        for (int i = 1 + rng_() % 8; i > 0; --i) tail.push_back(static_cast<char>(rng_()));
        return s.insert(pos, tail);
      case 3: {  // varint overflow: 11 continuation bytes, or 10 valid ones
        AppendVarint(&tail, static_cast<uint64_t>(FieldNumber(d)) << 3);
        tail.append(OneIn(2) ? 11 : 9, '\xff');
        tail.push_back(OneIn(2) ? '\x01' : '\x7f');
        return OneIn(2) ? s + tail : s.insert(pos, tail);
      }
      case 4: {  // a known field number with the wrong (or an invalid) wire type
        const uint64_t wt = Pick<uint64_t>({0, 1, 2, 3, 4, 5, 6, 7});
        AppendVarint(&tail, (static_cast<uint64_t>(FieldNumber(d)) << 3) | wt);
        for (int i = 0; i < 8; ++i) tail.push_back(static_cast<char>(rng_() % 4));
        return s + tail;
      }
      case 5:  // duplicated fields (proto merge: last wins, repeated grow)
        return OneIn(2) ? s + s : s + s.substr(pos);
      case 6: {  // huge length prefix
        AppendVarint(&tail, (static_cast<uint64_t>(FieldNumber(d)) << 3) | 2);
        AppendVarint(&tail, Pick<uint64_t>({0xffffffffull, 1ull << 31, 1ull << 62,
                                            UINT64_MAX, s.size() + 1}));
        tail += "abc";
        return OneIn(2) ? s + tail : s.insert(pos, tail);
      }
      case 7:  // an interesting byte
        if (!s.empty()) s[rng_() % s.size()] = Pick<char>({'\0', '\xff', '\x7f', '\x80'});
        return s;
      default:  // random bytes glued on
        return s + RandomBytes();
    }
  }

  void Fill(pb::Message* msg, int depth) {
    const pb::Descriptor* d = msg->GetDescriptor();
    const pb::Reflection* refl = msg->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (OneIn(4)) continue;  // left unset
      if (!f->is_repeated()) {
        SetOne(msg, refl, f, depth);
        continue;
      }
      for (int n = RepeatCount(f); n > 0; --n) SetOne(msg, refl, f, depth);
    }
  }

  int RepeatCount(const pb::FieldDescriptor* f) {
    if (f->name() == "prompt_token_ids") {
      const int64_t c = world_.context;
      if (OneIn(25)) return static_cast<int>(Pick<int64_t>({c - 2, c, c + 1, 3 * c}));
      return static_cast<int>(rng_() % 10);
    }
    // Strings can be 100 KB each: a few hundred already pass the receive
    // limit, thousands would only make messages of gigabytes.
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && OneIn(30)) {
      return Pick<int>({5, 41, 300});
    }
    if (OneIn(30)) return Pick<int>({300, 4096, 4097, 20000});
    return static_cast<int>(rng_() % 6);
  }

  void SetOne(pb::Message* msg, const pb::Reflection* refl, const pb::FieldDescriptor* f,
              int depth) {
    using F = pb::FieldDescriptor;
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case F::CPPTYPE_MESSAGE: {
        if (depth >= 3) return;
        pb::Message* sub = rep ? refl->AddMessage(msg, f) : refl->MutableMessage(msg, f);
        Fill(sub, depth + 1);
        return;
      }
      case F::CPPTYPE_INT32: {
        const int32_t v = Int32For(f->name());
        rep ? refl->AddInt32(msg, f, v) : refl->SetInt32(msg, f, v);
        return;
      }
      case F::CPPTYPE_UINT32: {
        const uint32_t v = Pick<uint32_t>({0, 1, world_.slot_count - 1, world_.slot_count,
                                           0x7fffffffu, 0x80000000u, UINT32_MAX,
                                           static_cast<uint32_t>(rng_())});
        rep ? refl->AddUInt32(msg, f, v) : refl->SetUInt32(msg, f, v);
        return;
      }
      case F::CPPTYPE_INT64: {
        const int64_t v = Pick<int64_t>({0, 1, -1, INT64_MAX, INT64_MIN,
                                         static_cast<int64_t>(rng_())});
        rep ? refl->AddInt64(msg, f, v) : refl->SetInt64(msg, f, v);
        return;
      }
      case F::CPPTYPE_UINT64: {
        uint64_t v = Pick<uint64_t>({0, 1, 2, UINT64_MAX, rng_()});
        if (f->name() == "session_id" && !OneIn(3)) v = world_.session_id;
        rep ? refl->AddUInt64(msg, f, v) : refl->SetUInt64(msg, f, v);
        return;
      }
      case F::CPPTYPE_FLOAT:
      case F::CPPTYPE_DOUBLE: {
        const double v = Pick<double>({std::nan(""), INFINITY, -INFINITY, -0.0, 0.0, 0.5, 1.0,
                                       1.0000001, 2.0, -0.5, 1e30, 1e-45, 0.9});
        if (f->cpp_type() == F::CPPTYPE_FLOAT) {
          rep ? refl->AddFloat(msg, f, static_cast<float>(v))
              : refl->SetFloat(msg, f, static_cast<float>(v));
        } else {
          rep ? refl->AddDouble(msg, f, v) : refl->SetDouble(msg, f, v);
        }
        return;
      }
      case F::CPPTYPE_BOOL:
        rep ? refl->AddBool(msg, f, OneIn(2)) : refl->SetBool(msg, f, OneIn(2));
        return;
      case F::CPPTYPE_ENUM: {  // proto3 enums are open: unknown numbers too
        const int v = Pick<int>({0, 1, 2, 3, -1, 1000, INT_MAX});
        rep ? refl->AddEnumValue(msg, f, v) : refl->SetEnumValue(msg, f, v);
        return;
      }
      case F::CPPTYPE_STRING: {
        const std::string v = StringFor(f->name());
        rep ? refl->AddString(msg, f, v) : refl->SetString(msg, f, v);
        return;
      }
    }
  }

  int32_t Int32For(const std::string& name) {
    const int32_t L = world_.num_layers, E = world_.num_experts;
    const int32_t V = static_cast<int32_t>(world_.vocab);
    const int32_t C = static_cast<int32_t>(world_.context);
    const int32_t any = static_cast<int32_t>(rng_());
    if (name == "layer") return Pick<int32_t>({0, 1, L - 1, L, -1, 1000, INT_MIN, INT_MAX});
    if (name == "expert") return Pick<int32_t>({0, 1, 3, E - 1, E, -1, INT_MIN, INT_MAX});
    if (name == "tokens") return Pick<int32_t>({1, 2, 0, -5, 1 << 24, (1 << 24) + 1, INT_MAX});
    if (name == "pid") return Pick<int32_t>({world_.pid, world_.pid, 0, -1, 1, INT_MAX, any});
    if (name == "max_new_tokens") {
      return Pick<int32_t>({1, 2, 3, 0, -1, C, C + 1, 65536, 65537, INT_MAX, INT_MIN});
    }
    if (name == "top_logprobs") return Pick<int32_t>({0, 1, 20, 21, -1, INT_MAX});
    if (name.find("token_id") != std::string::npos) {
      if (!OneIn(8)) return static_cast<int32_t>(rng_() % static_cast<uint64_t>(V));
      return Pick<int32_t>({0, V - 1, V, -1, INT_MAX, INT_MIN});
    }
    return Pick<int32_t>({0, 1, -1, 2, 7, INT_MAX, INT_MIN, any});
  }

  std::string StringFor(const std::string& name) {
    std::string random = RandomText();
    if (name == "model") {
      return Pick<std::string>({world_.model, world_.model, "", "no-such-model",
                                std::string("tiny\0x", 6), "../../etc/passwd",
                                std::string(100000, 'm'), random});
    }
    if (name == "prompt") {
      return Pick<std::string>({"the cache", "", "\xff\xfe\xc0\x80 not utf-8", random,
                                std::string(20000, 'a'), "<s></s><unk>"});
    }
    return Pick<std::string>({"", "x", random, std::string(100000, 'z')});
  }

  std::mt19937_64 rng_;
  const World& world_;
};

// ---------------------------------------------------------------------------
// Judging outcomes.

const char* CodeName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "?";
}

// The clear refusals a client can act on.
bool AllowedError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return true;
    default:
      return false;
  }
}

enum class Kind { kMutated, kRandomBytes, kSemantic };
const char* KindName(Kind k) {
  return k == Kind::kMutated ? "mutated" : k == Kind::kRandomBytes ? "random" : "semantic";
}

struct Tally {
  int inputs = 0;
  std::map<int, int> codes;  // grpc::StatusCode -> count
};

// Empty when the outcome is acceptable, else what is wrong with it.
// `parses`: the input is a valid serialization of the request type. gRPC
// C++ itself answers a request it cannot parse before any service code runs
// (an empty INTERNAL on a synchronous service, an empty UNIMPLEMENTED on a
// callback service); rpc::Server's interceptor turns that into
// INVALID_ARGUMENT "malformed request: ...". Unparseable inputs must get
// exactly that; they are counted.
std::string Judge(const RawResult& r, bool parses, size_t input_bytes,
                  int* library_parse_errors) {
  const grpc::StatusCode code = r.status.error_code();
  if (r.client_stuck) return "no completion within the deadline (hang)";
  if (code == grpc::StatusCode::OK) return "";
  if (code == grpc::StatusCode::CANCELLED && r.cancelled_by_us) return "";
  // Beyond the receive limit gRPC refuses before anything parses.
  if (input_bytes > (4u << 20) && code == grpc::StatusCode::RESOURCE_EXHAUSTED) return "";
  if (!parses) {
    if (code != grpc::StatusCode::INVALID_ARGUMENT ||
        r.status.error_message().find("malformed request") == std::string::npos) {
      return "an unparseable request did not get INVALID_ARGUMENT \"malformed request\"";
    }
    ++*library_parse_errors;
    return "";
  }
  if (!AllowedError(code)) return absl::StrCat("status ", CodeName(code), " is not allowed");
  if (r.status.error_message().empty()) return "error without a message";
  return "";
}

void PrintTable(const std::map<std::string, Tally>& tally) {
  std::map<int, bool> seen;
  for (const auto& [m, t] : tally) {
    for (const auto& [code, n] : t.codes) seen[code] = true;
  }
  std::string line = absl::StrFormat("%-32s %7s", "method", "inputs");
  for (const auto& [code, b] : seen) absl::StrAppendFormat(&line, " %19s", CodeName(code));
  std::printf("%s\n", line.c_str());
  int total = 0;
  for (const auto& [m, t] : tally) {
    line = absl::StrFormat("%-32s %7d", m, t.inputs);
    total += t.inputs;
    for (const auto& [code, b] : seen) {
      auto it = t.codes.find(code);
      absl::StrAppendFormat(&line, " %19d", it == t.codes.end() ? 0 : it->second);
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("total wire inputs: %d\n", total);
}

class GrpcFuzzTest : public ServiceFuzzTest {
 protected:
  // Leaves no state behind an accepted input: sessions it attached are
  // detached, leases it got are released, and the fuzzer's own session is
  // replaced when an input detached it.
  void CleanUpAfter(const Method& m, const std::string& input, const RawResult& r) {
    if (m.target != Target::kDaemon || !r.status.ok()) return;
    const std::string& name = m.desc->name();
    if (name == "Attach") {
      moe::v1::AttachResponse a;
      ASSERT_TRUE(a.ParseFromString(r.first_response));
      Detach(a.session_id());
    } else if (name == "Acquire") {
      moe::v1::AcquireRequest req;
      moe::v1::AcquireResponse resp;
      ASSERT_TRUE(req.ParseFromString(input));
      ASSERT_TRUE(resp.ParseFromString(r.first_response));
      moe::v1::ReleaseRequest rel;
      rel.set_session_id(req.session_id());
      *rel.mutable_leases() = resp.leases();
      moe::v1::ReleaseResponse out;
      grpc::ClientContext ctx;
      grpc::Status s = cache_stub_->Release(&ctx, rel, &out);
      ASSERT_TRUE(s.ok()) << s.error_message();
    } else if (name == "Detach") {
      moe::v1::DetachRequest req;
      ASSERT_TRUE(req.ParseFromString(input));
      if (req.session_id() == world_.session_id) AttachFuzzSession();
    }
  }

  std::string MakeInput(InputGen& gen, const Method& m, Kind kind) {
    const pb::Descriptor* d = m.desc->input_type();
    switch (kind) {
      case Kind::kMutated:
        return gen.Mutate(gen.OneIn(3) ? gen.Semantic(d) : gen.Valid(m), d);
      case Kind::kRandomBytes:
        return gen.RandomBytes();
      case Kind::kSemantic:
        return gen.Semantic(d);
    }
    return "";
  }
};

TEST_F(GrpcFuzzTest, EveryMethodOfBothServicesSurvivesWireFuzzing) {
  pb::LogSilencer quiet;  // this side parses invalid UTF-8 on purpose
  const std::vector<Method> methods = ListMethods();
  ASSERT_GE(methods.size(), 8u);  // 7 ExpertCache + 1 Inference at least
  InputGen gen(/*seed=*/20261129, &world_);
  RawCaller daemon_raw(daemon_channel_), worker_raw(worker_channel_);
  std::map<std::string, Tally> tally;
  const int rounds = Scaled(300);
  int total = 0, failures = 0, library_parse_errors = 0;
  for (int round = 0; round < rounds; ++round) {
    for (const Method& m : methods) {
      const uint64_t roll = gen.Next() % 20;
      const Kind kind = roll < 8   ? Kind::kMutated
                        : roll < 10 ? Kind::kRandomBytes
                                    : Kind::kSemantic;
      const std::string input = MakeInput(gen, m, kind);
      RawCaller& caller = m.target == Target::kDaemon ? daemon_raw : worker_raw;
      // Streams are cancelled after their first message: the fuzzer checks
      // acceptance, not long generations.
      const RawResult r = caller.Call(m.path, input, m.desc->server_streaming() ? 1 : 0);
      Tally& t = tally[m.path];
      ++t.inputs;
      ++t.codes[r.status.error_code()];
      std::unique_ptr<pb::Message> parsed(pb::MessageFactory::generated_factory()
                                              ->GetPrototype(m.desc->input_type())
                                              ->New());
      const bool parses = parsed->ParseFromString(input);
      const std::string problem = Judge(r, parses, input.size(), &library_parse_errors);
      if (!problem.empty()) {
        ADD_FAILURE() << m.path << " " << KindName(kind) << " input " << Hex(input) << ": "
                      << problem << " (" << CodeName(r.status.error_code()) << ": "
                      << r.status.error_message() << ")";
        if (++failures >= kMaxReportedFailures) return;
      }
      CleanUpAfter(m, input, r);
      if (HasFatalFailure()) return;
      if (++total % kCheckEvery == 0) {
        ExpectStillServing(absl::StrCat(total, " wire inputs"));
        if (HasFatalFailure()) return;
      }
    }
  }
  ExpectStillServing("the last wire input");
  PrintTable(tally);
  std::printf("unparseable inputs refused as malformed (INVALID_ARGUMENT): %d\n",
              library_parse_errors);
  std::printf("known-good checks passed: %d\n", known_good_checks_);
  for (const Method& m : methods) EXPECT_EQ(tally[m.path].inputs, rounds) << m.path;
}

// Generate through the generated stub; the status and the tokens received.
grpc::Status Generate(moe::v1::Inference::Stub& stub, const moe::v1::GenerateRequest& r,
                      int* tokens) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
  auto reader = stub.Generate(&ctx, r);
  moe::v1::GenerateResponse resp;
  *tokens = 0;
  while (reader->Read(&resp)) ++*tokens;
  return reader->Finish();
}

TEST_F(GrpcFuzzTest, OversizedAndAbsurdRequestsGetClearStatuses) {
  constexpr size_t kOverLimit = (4 << 20) + 1000;  // rpc::RpcLimits::max_receive_bytes
  int tokens = 0;
  {  // Larger than the server's receive limit: refused by gRPC itself.
    moe::v1::GenerateRequest r;
    r.set_prompt(std::string(kOverLimit, 'a'));
    r.set_max_new_tokens(1);
    grpc::Status s = Generate(*infer_stub_, r, &tokens);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_FALSE(s.error_message().empty());
    moe::v1::AcquireRequest a;
    a.set_session_id(world_.session_id);
    a.mutable_hints()->Reserve(700000);
    for (int i = 0; i < 700000; ++i) a.add_hints()->set_probability(0.5f);
    ASSERT_GT(a.ByteSizeLong(), kOverLimit);
    moe::v1::AcquireResponse out;
    grpc::ClientContext ctx;
    s = cache_stub_->Acquire(&ctx, a, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  ExpectStillServing("oversized messages");
  {  // Just under the limit, and echoed in the refusal: a clear NOT_FOUND.
    for (const char* method : {"GetStats", "Attach"}) {
      grpc::ClientContext ctx;
      grpc::Status s;
      const std::string name((4 << 20) - 1000, 'm');
      if (std::string(method) == "GetStats") {
        moe::v1::GetStatsRequest r;
        r.set_model(name);
        moe::v1::GetStatsResponse out;
        s = cache_stub_->GetStats(&ctx, r, &out);
      } else {
        moe::v1::AttachRequest r;
        r.set_model(name);
        r.set_pid(world_.pid);
        moe::v1::AttachResponse out;
        s = cache_stub_->Attach(&ctx, r, &out);
      }
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << method << ": " << s.error_message();
      EXPECT_LT(s.error_message().size(), 4096u) << method;
    }
  }
  const int64_t ctx_tokens = world_.context;
  auto ids = [](int64_t n) {
    moe::v1::GenerateRequest r;
    for (int64_t i = 0; i < n; ++i) r.add_prompt_token_ids(static_cast<int32_t>(1 + i % 50));
    r.set_ignore_eos(true);
    return r;
  };
  struct Case {
    const char* what;
    moe::v1::GenerateRequest request;
    const char* says;  // in the message
  };
  std::vector<Case> cases;
  cases.push_back({"prompt one token longer than the context", ids(ctx_tokens + 1), "context"});
  cases.back().request.set_max_new_tokens(1);
  cases.push_back({"prompt that fills the context", ids(ctx_tokens), "context"});
  cases.back().request.set_max_new_tokens(1);
  cases.push_back({"max_new_tokens 2^31-1", ids(5), "max_new_tokens"});
  cases.back().request.set_max_new_tokens(INT_MAX);
  cases.push_back({"max_new_tokens -2^31", ids(5), "max_new_tokens"});
  cases.back().request.set_max_new_tokens(INT_MIN);
  cases.push_back({"max_new_tokens of the whole context", ids(5), "context"});
  cases.back().request.set_max_new_tokens(static_cast<int32_t>(ctx_tokens));
  moe::v1::GenerateRequest text;
  std::string words;
  while (words.size() < (3u << 20)) words += "the expert cache ";
  text.set_prompt(words);  // 3 MiB of text: far beyond the context once tokenized
  text.set_max_new_tokens(1);
  cases.push_back({"3 MiB text prompt", text, "context"});
  for (const Case& c : cases) {
    const absl::Time start = absl::Now();
    grpc::Status s = Generate(*infer_stub_, c.request, &tokens);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what << ": "
                                                                  << s.error_message();
    EXPECT_NE(s.error_message().find(c.says), std::string::npos) << c.what << ": "
                                                                 << s.error_message();
    EXPECT_EQ(tokens, 0) << c.what;
    std::printf("%-40s -> %s (%.0f ms): %s\n", c.what, CodeName(s.error_code()),
                absl::ToDoubleMilliseconds(absl::Now() - start), s.error_message().c_str());
  }
  // The longest request that fits is served.
  moe::v1::GenerateRequest fits = ids(ctx_tokens - 2);
  fits.set_max_new_tokens(2);
  const absl::Time start = absl::Now();
  grpc::Status s = Generate(*infer_stub_, fits, &tokens);
  std::printf("%-40s -> %s (%.0f ms)\n", "the longest prompt that fits",
              CodeName(s.error_code()), absl::ToDoubleMilliseconds(absl::Now() - start));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 2);
  ExpectStillServing("absurd requests");
}

}  // namespace
}  // namespace moe::fuzz
