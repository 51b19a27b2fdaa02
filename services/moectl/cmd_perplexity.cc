// moectl perplexity --model DIR (--text FILE | --token-ids FILE)
// [--expert-format F]: teacher-forced quality of an expert format against
// the checkpoint's own experts.
//
// --token-ids scores token ids as given (comma- or whitespace-separated,
// each in [0, vocab)), for checkpoints without a vocabulary (a GGUF whose
// tokenizer.ggml.model is "none") and for comparing with another engine on
// exactly the same tokens; no BOS is added.
//
// Both runs feed the text's tokens one at a time (Session::Forward, decode
// steps) through the same model; at every position the next token's negative
// log-likelihood is taken from each run's logits, and the KL divergence
// KL(reference || format) of the two next-token distributions. Prints the
// mean NLL per token and the perplexity exp(mean NLL) of each run and the
// mean KL. On the random weights of `moectl make-model` the numbers mean
// nothing beyond "the format changes the distributions this much".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "services/engine/tokenizer.h"
#include "services/moectl/commands.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/flags.h"

namespace moe::moectl {
namespace {

// log-softmax of `logits` in double.
std::vector<double> LogSoftmax(absl::Span<const float> logits) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
  return out;
}

struct Totals {
  double nll_ref = 0, nll_fmt = 0, kl = 0;
  int64_t n = 0;
};

absl::StatusOr<Totals> Measure(const MoeModel& model, const std::vector<int32_t>& ids,
                               DType format) {
  // No kernel reads F8 or MXFP4 experts: "as stored" holds them
  // dequantized to f32, which is exact.
  const DType dtype = model.description().expert_dtype();
  const std::optional<DType> stored = dtype == DType::kF8E4M3 || dtype == DType::kMxfp4
                                          ? std::optional<DType>(DType::kF32)
                                          : std::nullopt;
  ASSIGN_OR_RETURN(std::unique_ptr<InMemoryExpertProvider> ref,
                   InMemoryExpertProvider::Create(model, stored));
  ASSIGN_OR_RETURN(std::unique_ptr<InMemoryExpertProvider> fmt,
                   InMemoryExpertProvider::Create(model, format));
  Session a(model, ref.get(), static_cast<int64_t>(ids.size()));
  Session b(model, fmt.get(), static_cast<int64_t>(ids.size()));
  Totals t;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    absl::Span<const int32_t> tok(&ids[i], 1);
    ASSIGN_OR_RETURN(absl::Span<const float> la, a.Forward(tok, i == 0));
    std::vector<double> pa = LogSoftmax(la);
    ASSIGN_OR_RETURN(absl::Span<const float> lb, b.Forward(tok, i == 0));
    std::vector<double> pb = LogSoftmax(lb);
    const int32_t next = ids[i + 1];
    t.nll_ref -= pa[next];
    t.nll_fmt -= pb[next];
    double kl = 0;
    for (size_t v = 0; v < pa.size(); ++v) kl += std::exp(pa[v]) * (pa[v] - pb[v]);
    t.kl += kl;
    ++t.n;
  }
  return t;
}

// The ids of a --token-ids file: integers separated by commas and white
// space, each in [0, vocab).
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& path,
                                                   int64_t vocab) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find_first_of(", \t\r\n", at);
    const absl::string_view part =
        absl::string_view(text).substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (part.empty()) continue;
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": '", part.substr(0, 32), "' (token ", ids.size(), ") is not an integer"));
    }
    if (v < 0 || v >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token ", ids.size(), " is ", v, ", outside the vocabulary [0, ", vocab, ")"));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

absl::Status Run(const FlagSet& f) {
  const std::string& dir = f.GetString("model");
  if (dir.empty() || f.IsSet("text") == f.IsSet("token-ids")) {
    return absl::InvalidArgumentError(
        "--model and exactly one of --text and --token-ids are required");
  }
  ASSIGN_OR_RETURN(DType format, ParseExpertFormat(f.GetString("expert-format")));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(f.GetString("device")));
  ASSIGN_OR_RETURN(std::unique_ptr<MoeModel> model, MoeModel::Load(dir, backend.get()));
  std::vector<int32_t> ids;
  if (f.IsSet("token-ids")) {
    ASSIGN_OR_RETURN(ids, ParseTokenIds(f.GetString("token-ids"), model->config().vocab_size));
  } else {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.GetString("text")));
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::ForModel(dir));
    ids = tok->Encode(text, /*add_special=*/true);
  }
  const int64_t limit = std::min<int64_t>(f.GetInt("max-tokens"), model->max_context());
  if (static_cast<int64_t>(ids.size()) > limit) ids.resize(static_cast<size_t>(limit));
  if (ids.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.IsSet("text") ? "--text" : "--token-ids", " gives fewer than 2 tokens"));
  }
  ASSIGN_OR_RETURN(Totals t, Measure(*model, ids, format));
  const double n = static_cast<double>(t.n);
  std::printf("tokens scored: %lld (teacher-forced, next-token)\n", static_cast<long long>(t.n));
  const ModelDescription& desc = model->description();
  const DType stored = desc.expert_dtype();
  std::printf("as stored (%s%s): NLL %.6f per token, perplexity %.4f\n",
              desc.mixed_expert_dtypes() ? ExpertFormatsName(desc.all_expert_dtypes()).c_str()
                                         : std::string(DTypeName(stored)).c_str(),
              stored == DType::kF8E4M3 || stored == DType::kMxfp4 ? ", dequantized to F32" : "",
              t.nll_ref / n, std::exp(t.nll_ref / n));
  std::printf("%s: NLL %.6f per token, perplexity %.4f\n", ExpertFormatName(format).c_str(),
              t.nll_fmt / n, std::exp(t.nll_fmt / n));
  std::printf("KL(as stored || %s): %.6g nats per token (mean)\n",
              ExpertFormatName(format).c_str(), t.kl / n);
  std::printf("note: on random weights (moectl make-model) these numbers mean nothing\n");
  return absl::OkStatus();
}

int RunPerplexity(const Args& args) {
  FlagSet flags("perplexity",
                "--model DIR (--text FILE | --token-ids FILE) [--expert-format bf16|q8|q4]");
  flag_groups::DeclareModel(flags, /*repeatable=*/false);  // required here
  flag_groups::DeclareExpertFormat(flags, "q8");  // compared with the checkpoint's experts
  flag_groups::DeclareDevice(flags, "cpu", /*backend_alias=*/true);
  flags.Group("");
  flags.String("text", "", "UTF-8 text file to score (this or --token-ids)");
  flags.String("token-ids", "",
               "file of token ids to score as given (comma- or space-separated; no BOS added)");
  flags.Int("max-tokens", 512, "score at most this many tokens of the text");
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  absl::Status s = parsed.ok() ? Run(flags) : parsed;
  if (s.ok()) return 0;
  std::fprintf(stderr, "moectl perplexity: %s\n", std::string(s.message()).c_str());
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

const bool kRegistered = RegisterCommand(
    {"perplexity", "teacher-forced NLL, perplexity and KL of an expert format vs the checkpoint",
     &RunPerplexity});

}  // namespace
}  // namespace moe::moectl
