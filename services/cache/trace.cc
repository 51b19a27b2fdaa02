#include "services/cache/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe::trace {
namespace {

using json = nlohmann::json;

constexpr int kMaxLayers = 4096;
constexpr int kMaxExperts = 65536;

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(what);
}

// A JSON integer in [lo, hi]; an unsigned value above INT64_MAX is compared
// as such, not wrapped through int64. The message shows the number as written.
bool IntInRange(const json& x, int64_t lo, int64_t hi, int64_t* out) {
  if (x.is_number_unsigned()) {
    const uint64_t u = x.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(u);
  } else {
    *out = x.get<int64_t>();
  }
  return *out >= lo && *out <= hi;
}

absl::StatusOr<int> GetPositiveInt(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return Invalid(absl::StrCat("missing \"", key, "\""));
  if (!it->is_number_integer()) {
    return Invalid(absl::StrCat("\"", key, "\" must be an integer"));
  }
  int64_t v;
  if (!IntInRange(*it, 1, kMaxExperts, &v)) {
    return Invalid(absl::StrCat("\"", key, "\" out of range: ", it->dump()));
  }
  return static_cast<int>(v);
}

// Parses [[[x,...],...L],...T] where each x passes `elem`. `exact_k` < 0 means
// any length per layer.
template <typename T, typename ElemFn>
absl::Status ParseTokenLayerLists(const json& arr, const char* key, int tokens,
                                  int layers, int exact_k, ElemFn elem,
                                  TokenLayerLists<T>* out) {
  if (!arr.is_array()) return Invalid(absl::StrCat("\"", key, "\" must be an array"));
  if (static_cast<int>(arr.size()) != tokens) {
    return Invalid(absl::StrCat("\"", key, "\" has ", arr.size(),
                                " tokens, \"phase\" has ", tokens));
  }
  out->assign(tokens, {});
  for (int t = 0; t < tokens; ++t) {
    const json& tok = arr[t];
    if (!tok.is_array() || static_cast<int>(tok.size()) != layers) {
      return Invalid(absl::StrCat("\"", key, "\"[", t, "] must list ", layers,
                                  " layers"));
    }
    (*out)[t].resize(layers);
    for (int l = 0; l < layers; ++l) {
      const json& lay = tok[l];
      if (!lay.is_array()) {
        return Invalid(absl::StrCat("\"", key, "\"[", t, "][", l, "] must be an array"));
      }
      if (exact_k >= 0 && static_cast<int>(lay.size()) != exact_k) {
        return Invalid(absl::StrCat("\"", key, "\"[", t, "][", l, "] has ",
                                    lay.size(), " entries, expected ", exact_k));
      }
      auto& dst = (*out)[t][l];
      dst.reserve(lay.size());
      for (const json& x : lay) {
        auto v = elem(x);
        if (!v.ok()) {
          return Invalid(absl::StrCat("\"", key, "\"[", t, "][", l, "]: ",
                                      v.status().message()));
        }
        dst.push_back(*v);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> ParseExpertId(const json& x) {
  if (!x.is_number_integer()) return Invalid("expert ids must be integers");
  int64_t v;
  if (!IntInRange(x, 0, kMaxExperts, &v)) {
    return Invalid(absl::StrCat("bad expert id ", x.dump()));
  }
  return static_cast<int32_t>(v);
}

absl::StatusOr<float> ParseWeight(const json& x) {
  if (!x.is_number()) return Invalid("weights must be numbers");
  const double v = x.get<double>();
  // Converting a double beyond float's range is undefined, not infinity.
  if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
    return Invalid(absl::StrCat("weights must be finite floats, got ", x.dump()));
  }
  return static_cast<float>(v);
}

}  // namespace

const char* PhaseName(Phase phase) {
  return phase == Phase::kPrefill ? "prefill" : "decode";
}

int TraceRequest::num_prefill_tokens() const {
  int n = 0;
  for (Phase p : phase) n += p == Phase::kPrefill;
  return n;
}

std::vector<Iteration> SplitIterations(const TraceRequest& r, int num_layers) {
  std::vector<Iteration> out;
  const int prefill = r.num_prefill_tokens();
  if (prefill > 0) {
    Iteration it{Phase::kPrefill, 0, std::vector<std::vector<ExpertDemand>>(num_layers)};
    for (int l = 0; l < num_layers; ++l) {
      std::map<int32_t, int32_t> counts;
      for (int t = 0; t < prefill; ++t) {
        for (int32_t e : r.experts[t][l]) ++counts[e];
      }
      for (auto [e, n] : counts) it.layers[l].push_back({e, n});
    }
    out.push_back(std::move(it));
  }
  for (int t = prefill; t < r.num_tokens(); ++t) {
    Iteration it{Phase::kDecode, t, std::vector<std::vector<ExpertDemand>>(num_layers)};
    for (int l = 0; l < num_layers; ++l) {
      for (int32_t e : r.experts[t][l]) it.layers[l].push_back({e, 1});
      std::sort(it.layers[l].begin(), it.layers[l].end(),
                [](const ExpertDemand& a, const ExpertDemand& b) { return a.expert < b.expert; });
    }
    out.push_back(std::move(it));
  }
  return out;
}

absl::Status ValidateHeader(const TraceHeader& h) {
  if (h.num_layers <= 0 || h.num_layers > kMaxLayers) {
    return Invalid(absl::StrCat("num_layers out of range: ", h.num_layers));
  }
  if (h.num_experts <= 0 || h.num_experts > kMaxExperts) {
    return Invalid(absl::StrCat("num_experts out of range: ", h.num_experts));
  }
  if (h.top_k <= 0 || h.top_k > h.num_experts) {
    return Invalid(absl::StrCat("top_k must be in [1, num_experts], got ", h.top_k));
  }
  if (h.expert_params < 0 || h.expert_params > kMaxExpertParams) {
    return Invalid(absl::StrCat("expert_params out of range: ", h.expert_params));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const TraceHeader& h, const TraceRequest& r) {
  const int tokens = r.num_tokens();
  if (tokens == 0) return Invalid("request has no tokens");
  for (int t = 1; t < tokens; ++t) {
    if (r.phase[t - 1] == Phase::kDecode && r.phase[t] == Phase::kPrefill) {
      return Invalid(absl::StrCat("prefill token ", t, " after a decode token"));
    }
  }
  if (static_cast<int>(r.experts.size()) != tokens) {
    return Invalid(absl::StrCat("\"experts\" has ", r.experts.size(),
                                " tokens, \"phase\" has ", tokens));
  }
  for (int t = 0; t < tokens; ++t) {
    if (static_cast<int>(r.experts[t].size()) != h.num_layers) {
      return Invalid(absl::StrCat("\"experts\"[", t, "] must list ", h.num_layers, " layers"));
    }
    for (int l = 0; l < h.num_layers; ++l) {
      const auto& ids = r.experts[t][l];
      if (static_cast<int>(ids.size()) != h.top_k) {
        return Invalid(absl::StrCat("\"experts\"[", t, "][", l, "] has ", ids.size(),
                                    " entries, expected top_k=", h.top_k));
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= h.num_experts) {
          return Invalid(absl::StrCat("\"experts\"[", t, "][", l, "]: expert ", ids[i],
                                      " not in [0, ", h.num_experts, ")"));
        }
        for (size_t j = 0; j < i; ++j) {
          if (ids[j] == ids[i]) {
            return Invalid(absl::StrCat("\"experts\"[", t, "][", l,
                                        "]: duplicate expert ", ids[i]));
          }
        }
      }
    }
  }
  if (!r.weights.empty()) {
    if (r.weights.size() != r.experts.size()) return Invalid("\"weights\" shape differs from \"experts\"");
    for (int t = 0; t < tokens; ++t) {
      if (r.weights[t].size() != r.experts[t].size()) return Invalid("\"weights\" shape differs from \"experts\"");
      for (int l = 0; l < h.num_layers; ++l) {
        if (r.weights[t][l].size() != r.experts[t][l].size()) {
          return Invalid(absl::StrCat("\"weights\"[", t, "][", l, "] shape differs from \"experts\""));
        }
      }
    }
  }
  if (!r.hints.empty()) {
    if (static_cast<int>(r.hints.size()) != tokens) return Invalid("\"hints\" must list every token");
    for (int t = 0; t < tokens; ++t) {
      if (static_cast<int>(r.hints[t].size()) != h.num_layers) {
        return Invalid(absl::StrCat("\"hints\"[", t, "] must list ", h.num_layers, " layers"));
      }
      for (int l = 0; l < h.num_layers; ++l) {
        for (int32_t e : r.hints[t][l]) {
          if (e < 0 || e >= h.num_experts) {
            return Invalid(absl::StrCat("\"hints\"[", t, "][", l, "]: expert ", e,
                                        " not in [0, ", h.num_experts, ")"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TraceHeader> ParseHeaderLine(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Invalid("header is not a JSON object");
  auto f = j.find("format");
  if (f == j.end() || !f->is_string()) return Invalid("header has no \"format\"");
  if (f->get<std::string>() != kTraceFormat) {
    return Invalid(absl::StrCat("unsupported format \"", f->get<std::string>(),
                                "\", expected \"", kTraceFormat, "\""));
  }
  TraceHeader h;
  auto m = j.find("model");
  if (m != j.end()) {
    if (!m->is_string()) return Invalid("\"model\" must be a string");
    h.model = m->get<std::string>();
  }
  ASSIGN_OR_RETURN(h.num_layers, GetPositiveInt(j, "num_layers"));
  ASSIGN_OR_RETURN(h.num_experts, GetPositiveInt(j, "num_experts"));
  ASSIGN_OR_RETURN(h.top_k, GetPositiveInt(j, "top_k"));
  if (auto p = j.find("expert_params"); p != j.end()) {
    if (!p->is_number_integer() || !IntInRange(*p, 1, kMaxExpertParams, &h.expert_params)) {
      return Invalid(absl::StrCat("\"expert_params\" must be an integer in [1, 2^40], got ",
                                  p->dump()));
    }
  }
  RETURN_IF_ERROR(ValidateHeader(h));
  return h;
}

absl::StatusOr<TraceRequest> ParseRequestLine(const TraceHeader& h,
                                              const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid("not valid JSON");
  if (!j.is_object()) return Invalid("request is not a JSON object");
  TraceRequest r;
  auto id = j.find("id");
  if (id != j.end()) {
    if (id->is_string()) {
      r.id = id->get<std::string>();
    } else if (id->is_number_integer()) {
      r.id = id->dump();  // as written: an unsigned id may exceed int64
    } else {
      return Invalid("\"id\" must be a string or an integer");
    }
  }
  auto ph = j.find("phase");
  if (ph == j.end() || !ph->is_array()) return Invalid("missing \"phase\" array");
  for (const json& p : *ph) {
    if (!p.is_string()) return Invalid("\"phase\" entries must be strings");
    const std::string s = p.get<std::string>();
    if (s == "prefill") {
      r.phase.push_back(Phase::kPrefill);
    } else if (s == "decode") {
      r.phase.push_back(Phase::kDecode);
    } else {
      return Invalid(absl::StrCat("unknown phase \"", s, "\""));
    }
  }
  const int tokens = r.num_tokens();
  auto ex = j.find("experts");
  if (ex == j.end()) return Invalid("missing \"experts\"");
  RETURN_IF_ERROR(ParseTokenLayerLists<int32_t>(*ex, "experts", tokens, h.num_layers,
                                                h.top_k, ParseExpertId, &r.experts));
  auto w = j.find("weights");
  if (w != j.end() && !w->is_null()) {
    RETURN_IF_ERROR(ParseTokenLayerLists<float>(*w, "weights", tokens, h.num_layers,
                                                h.top_k, ParseWeight, &r.weights));
  }
  auto hi = j.find("hints");
  if (hi != j.end() && !hi->is_null()) {
    RETURN_IF_ERROR(ParseTokenLayerLists<int32_t>(*hi, "hints", tokens, h.num_layers,
                                                  -1, ParseExpertId, &r.hints));
  }
  RETURN_IF_ERROR(ValidateRequest(h, r));
  return r;
}

std::string SerializeHeader(const TraceHeader& h) {
  json j;
  j["format"] = kTraceFormat;
  j["model"] = h.model;
  j["num_layers"] = h.num_layers;
  j["num_experts"] = h.num_experts;
  j["top_k"] = h.top_k;
  if (h.expert_params > 0) j["expert_params"] = h.expert_params;
  return j.dump();
}

std::string SerializeRequest(const TraceRequest& r) {
  json j;
  j["id"] = r.id;
  json phase = json::array();
  for (Phase p : r.phase) phase.push_back(PhaseName(p));
  j["phase"] = std::move(phase);
  j["experts"] = r.experts;
  if (!r.weights.empty()) j["weights"] = r.weights;
  if (!r.hints.empty()) j["hints"] = r.hints;
  return j.dump();
}

absl::StatusOr<Trace> ReadTrace(std::istream& in, const std::string& name) {
  Trace trace;
  std::string line;
  int lineno = 0;
  bool have_header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!have_header) {
      auto h = ParseHeaderLine(line);
      if (!h.ok()) {
        return Invalid(absl::StrCat(name, ":", lineno, ": ", h.status().message()));
      }
      trace.header = *h;
      have_header = true;
      continue;
    }
    auto r = ParseRequestLine(trace.header, line);
    if (!r.ok()) {
      return Invalid(absl::StrCat(name, ":", lineno, ": ", r.status().message()));
    }
    trace.requests.push_back(std::move(*r));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(name, ": read error"));
  if (!have_header) return Invalid(absl::StrCat(name, ": empty trace (no header line)"));
  return trace;
}

absl::StatusOr<Trace> ReadTraceFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  return ReadTrace(in, path);
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(
    const std::string& path, const TraceHeader& header) {
  RETURN_IF_ERROR(ValidateHeader(header));
  auto file = std::make_unique<std::ofstream>(path, std::ios::trunc);
  if (!*file) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(file), header));
}

TraceWriter::TraceWriter(std::unique_ptr<std::ofstream> file, const TraceHeader& header)
    : file_(std::move(file)), out_(file_.get()), header_(header) {
  *out_ << SerializeHeader(header_) << '\n';
}

TraceWriter::TraceWriter(std::ostream* out, const TraceHeader& header)
    : out_(out), header_(header) {
  *out_ << SerializeHeader(header_) << '\n';
}

absl::Status TraceWriter::Write(const TraceRequest& request) {
  RETURN_IF_ERROR(ValidateRequest(header_, request));
  *out_ << SerializeRequest(request) << '\n';
  out_->flush();
  if (!*out_) return absl::DataLossError("trace write failed");
  return absl::OkStatus();
}

absl::Status TraceWriter::Close() {
  if (file_) {
    file_->close();
    if (file_->fail()) return absl::DataLossError("trace close failed");
  }
  return absl::OkStatus();
}

absl::Status WriteTraceFile(const std::string& path, const Trace& trace) {
  ASSIGN_OR_RETURN(auto writer, TraceWriter::Open(path, trace.header));
  for (const auto& r : trace.requests) RETURN_IF_ERROR(writer->Write(r));
  return writer->Close();
}

}  // namespace moe::trace
