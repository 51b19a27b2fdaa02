// GGUF checkpoints with quantized tensors (issue 30, tensor types): tiny
// Mixtral and Qwen3-MoE models whose routed experts were quantized to ggml
// block types by our own numpy quantizers (tests/reference/gguf_quants.py,
// through hf_to_gguf.py --experts/--dense) load with their experts kept as
// blocks (kQ8, kQ4_0, kQ4K, kQ5K, kQ6K, kMxfp4; an expert's bytes are the
// GGUF blocks' bytes), dense block matrices kept as blocks too (read by the
// CPU MatMul where the engine only multiplies by them), and run:
// greedy tokens and logprobs agree with the float64 reference forward
// (tests/reference/moe_reference.py) of the dequantized weights. Malformed
// quantized tensors are refused naming the tensor.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/gguf_blocks.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"

namespace moe {
namespace {

int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd << "\n" << out;
  return out;
}

const std::string kReference = std::string(MOE_SOURCE_DIR) + "/tests/reference";

struct Case {
  const char* name;
  ModelFamily family;
  const char* experts;  // ggml type of the routed experts
  const char* dense;    // of the other 2-D weights, or "" to keep them F32
  DType held;           // what the experts load as
  int seed = 9;         // of the made model: tiny random models have near
                        // ties that int8 activations may flip; these don't
  // hf_to_gguf.py --tensor-type overrides, "blk.L.ffn_{gate,up,down}_exps.weight=TYPE"
  // separated by spaces: a file of mixed types (llama.cpp's Q4_K_M keeps
  // some layers' ffn_down_exps in Q6_K); `held` is then the widest.
  const char* overrides = "";
};

// Our dtype of a ggml type name (GGUF's Q8_0 is our q8, byte for byte).
DType HeldAs(absl::string_view ggml) {
  absl::StatusOr<DType> t = ParseWeightDType(ggml == "Q8_0" ? "Q8" : ggml);
  EXPECT_TRUE(t.ok()) << ggml;
  return t.value_or(DType::kF32);
}

// What the experts of `layer` should load as: `c.experts` (as `c.held`
// unless overridden), or the override naming that layer and projection.
ExpertDTypes ExpectedTypes(const Case& c, int layer) {
  const char* roles[3] = {"gate", "up", "down"};
  DType t[3];
  const DType base = *c.overrides == '\0' ? c.held : HeldAs(c.experts);
  for (int r = 0; r < 3; ++r) {
    t[r] = base;
    const std::string key = absl::StrCat("blk.", layer, ".ffn_", roles[r], "_exps.weight=");
    for (absl::string_view o : absl::StrSplit(c.overrides, ' ', absl::SkipEmpty())) {
      if (absl::StartsWith(o, key)) t[r] = HeldAs(o.substr(key.size()));
    }
  }
  return {t[0], t[1], t[2]};
}

int OverrideCount(const Case& c) {
  return static_cast<int>(
      std::vector<absl::string_view>(absl::StrSplit(c.overrides, ' ', absl::SkipEmpty())).size());
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GgufQuantTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    folder_ = dir_.Sub("hf");
    gguf_ = dir_.Sub("model.gguf");
    dequantized_ = dir_.Sub("dequantized");
    ASSERT_TRUE(MakeModel(moe::testing::KQuantableModel(c.family, c.seed), folder_).ok());
    std::string cmd = absl::StrCat(
        "/usr/bin/python3 ", kReference, "/hf_to_gguf.py ", folder_, " ", gguf_,
        " --experts ", c.experts, " --dequantized ", dequantized_);
    if (*c.dense != '\0') absl::StrAppend(&cmd, " --dense ", c.dense);
    for (absl::string_view o : absl::StrSplit(c.overrides, ' ', absl::SkipEmpty())) {
      absl::StrAppend(&cmd, " --tensor-type ", o);
    }
    ASSERT_EQ(Shell(cmd), 0) << cmd;
  }

  moe::testing::TempDir dir_;
  std::string folder_, gguf_, dequantized_;
};

TEST_P(GgufQuantTest, ExpertsAndDenseMatricesKeepTheirBlocks) {
  const Case& c = GetParam();
  auto d = ModelDescription::Open(gguf_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->expert_dtype(), c.held);
  const ModelConfig& cfg = d->config();
  const int64_t h = cfg.hidden_size, inter = cfg.moe_intermediate_size;
  // Bytes per expert: exactly the GGUF blocks of gate, up and down, per
  // layer (the largest is bytes_per_expert).
  int64_t want = 0, largest = 0;
  for (int l = 0; l < cfg.num_moe_layers(); ++l) {
    const ExpertDTypes t = ExpectedTypes(c, l);
    EXPECT_EQ(d->expert_dtypes(l), t) << "layer " << l;
    const int64_t bytes = WeightBytes(t.gate, inter, h) + WeightBytes(t.up, inter, h) +
                          WeightBytes(t.down, h, inter);
    EXPECT_EQ(d->expert_bytes(l), static_cast<uint64_t>(bytes)) << "layer " << l;
    want += bytes;
    largest = std::max(largest, bytes);
  }
  EXPECT_EQ(d->mixed_expert_dtypes(), *c.overrides != '\0');
  EXPECT_EQ(d->bytes_per_expert(), static_cast<uint64_t>(largest));
  const GgufCheckpoint* g = d->checkpoint().gguf();
  ASSERT_NE(g, nullptr);
  int64_t expert_file_bytes = 0;
  for (const GgufTensorInfo& t : g->tensors()) {
    if (t.name.find("_exps.") != std::string::npos) {
      expert_file_bytes += static_cast<int64_t>(t.nbytes);
    }
  }
  EXPECT_EQ(expert_file_bytes, want * cfg.num_experts);
  const DType up_type = ExpectedTypes(c, 1).up;
  auto up = d->Expert(1, 3, TensorRole::kExpertUp);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->dtype, up_type);
  EXPECT_EQ(up->nbytes, static_cast<size_t>(WeightBytes(up_type, inter, h)));
  // Dense matrices keep their blocks too (MoeModel decides per use).
  auto q = d->Dense(TensorRole::kQProj, 0);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->dtype, *c.dense == '\0' ? DType::kF32 : HeldAs(c.dense));
}

TEST_P(GgufQuantTest,
       TokensAndLogprobsMatchTheFloat64ReferenceOfTheDequantizedWeights) {
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = MoeModel::Load(gguf_, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  ASSERT_TRUE(experts.ok()) << experts.status();
  const std::vector<int32_t> prompt = {1, 7, 42, 99, 3, 250, 17};
  const int kNew = 10;
  GenerateOptions opts;
  opts.prompt = prompt;
  opts.max_new_tokens = kNew;
  opts.stop_at_eos = false;
  std::vector<SampledToken> got;
  ASSERT_TRUE(
      Generate(**model, experts->get(), opts, [&](const SampledToken& t) {
        got.push_back(t);
        return true;
      }).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(kNew));
  const std::string out = Capture(
      absl::StrCat("/usr/bin/python3 ", kReference,
                   "/moe_reference.py --model ", dequantized_, " --prompt-ids ",
                   absl::StrJoin(prompt, ","), " --max-new-tokens ", kNew));
  auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  double max_diff = 0;
  for (int i = 0; i < kNew; ++i) {
    ASSERT_EQ(got[i].token, ref["tokens"][i].get<int>()) << "token " << i;
    max_diff = std::max(
        max_diff, std::abs(got[i].logprob - ref["logprobs"][i].get<double>()));
  }
  std::printf("[%s] max |logprob - reference| = %.3g\n", GetParam().name,
              max_diff);
  // The weights are the same numbers on both sides (ggml's decoders = the
  // numpy ones); what differs is that the block kernels round their inputs
  // to int8 per 32 (QuantizeActivations, <= 1/254 of each group's max; the
  // K-quants per 256, KActivations), as for q8 experts, whose
  // forward-reference tolerance this is (forward_reference_test.cc:
  // kQ8Tolerance), plus f32 arithmetic.
  EXPECT_LE(max_diff, 8e-2);
}

// `moectl inspect` names the file's types, what each became, and the
// held format.
TEST_P(GgufQuantTest, InspectShowsTheTypes) {
  const Case& c = GetParam();
  const std::string out = Capture(
      absl::StrCat(MOE_BINARY_DIR, "/bin/moectl inspect --json ", gguf_));
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["expert_dtype"], std::string(DTypeName(c.held))) << out;
  EXPECT_EQ(j["expert_held_format"],
            ExpertFormatsName({ExpectedTypes(c, 0), ExpectedTypes(c, 1)}))
      << out;
  EXPECT_EQ(j["expert_dtypes_mixed"], *c.overrides != '\0') << out;
  // 2 layers x gate, up, down, less the overridden ones.
  EXPECT_EQ(j["gguf_tensor_types"][c.experts]["experts"], 6 - OverrideCount(c)) << out;
  if (*c.dense != '\0') {
    EXPECT_GT(j["gguf_tensor_types"][c.dense]["tensors"].get<int>(),
              j["gguf_tensor_types"][c.dense]["experts"].get<int>())
        << out;
  }
  // `moectl plan` holds and sizes the experts as stored too (MXFP4 as
  // MXFP4, mixed types at each layer's bytes).
  const std::string plan_out = Capture(
      absl::StrCat(MOE_BINARY_DIR, "/bin/moectl plan --json --model ", gguf_));
  auto p = nlohmann::json::parse(plan_out, nullptr, false);
  ASSERT_FALSE(p.is_discarded()) << plan_out;
  EXPECT_EQ(p["expert_format"], j["expert_held_format"]) << plan_out;
  EXPECT_EQ(p["expert_bytes"], j["bytes_per_expert"]) << plan_out;
  const std::string text =
      Capture(absl::StrCat(MOE_BINARY_DIR, "/bin/moectl inspect ", gguf_));
  EXPECT_NE(text.find(absl::StrCat("gguf tensors ", c.experts, ": ")),
            std::string::npos)
      << text;
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgufQuantTest,
    ::testing::Values(
        Case{"MixtralQ8_0", ModelFamily::kMixtral, "Q8_0", "", DType::kQ8, 11},
        Case{"Qwen3MoeQ4_0", ModelFamily::kQwen3Moe, "Q4_0", "", DType::kQ4_0},
        Case{"MixtralQ4_KDenseQ8_0", ModelFamily::kMixtral, "Q4_K", "Q8_0",
             DType::kQ4K},
        Case{"Qwen3MoeQ5_K", ModelFamily::kQwen3Moe, "Q5_K", "", DType::kQ5K},
        // Seed 11: seed 9's model has a near tie that the K-quants' per-256
        // activations flip (at every SIMD level alike).
        Case{"MixtralQ6_KDenseQ6_K", ModelFamily::kMixtral, "Q6_K", "Q6_K",
             DType::kQ6K, 11},
        Case{"Qwen3MoeMxfp4", ModelFamily::kQwen3Moe, "MXFP4", "Q4_K",
             DType::kMxfp4, 13},
        // As llama.cpp's Q4_K_M: a layer's down in Q6_K; and, to run gate
        // and up of different types, layer 0's up in Q5_K.
        Case{"MixtralQ4_K_M", ModelFamily::kMixtral, "Q4_K", "Q8_0", DType::kQ6K, 11,
             "blk.1.ffn_down_exps.weight=Q6_K blk.0.ffn_up_exps.weight=Q5_K"},
        Case{"Qwen3MoeQ4_KDownQ8_0", ModelFamily::kQwen3Moe, "Q4_K", "", DType::kQ8, 9,
             "blk.0.ffn_down_exps.weight=Q8_0"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.name);
    });

// A quantized tensor whose rows are not whole blocks, and a block type we
// do not load, are refused naming the tensor.
TEST(GgufQuantRefusalTest, MalformedOrUnloadedBlockTensorsAreNamed) {
  moe::testing::TempDir dir;
  ASSERT_TRUE(
      MakeModel(moe::testing::KQuantableModel(ModelFamily::kMixtral, 9), dir.Sub("hf")).ok());
  const std::string gguf = dir.Sub("m.gguf");
  ASSERT_EQ(
      Shell(absl::StrCat("/usr/bin/python3 ", kReference, "/hf_to_gguf.py ",
                         dir.Sub("hf"), " ", gguf, " --experts Q4_K")),
      0);
  // Rewrites blk.0.ffn_down_exps's type (and, with `row`, its row length) in
  // place.
  auto retype = [&](const std::string& out, int type, int row) {
    const std::string script = absl::StrCat(
        "b = bytearray(open('", gguf, "', 'rb').read())\n",
        "name = b'blk.0.ffn_down_exps.weight'\n",
        "i = b.index(name) + len(name)\n",
        "nd = int.from_bytes(b[i:i + 4], 'little')\n",
        row > 0 ? absl::StrCat("b[i + 4:i + 12] = (", row,
                               ").to_bytes(8, 'little')\n")
                : "",
        "t = i + 4 + 8 * nd\n", "b[t:t + 4] = (", type,
        ").to_bytes(4, 'little')\n", "open('", out, "', 'wb').write(b)\n");
    moe::testing::WriteText(out + ".py", script);
    ASSERT_EQ(Shell("/usr/bin/python3 " + out + ".py"), 0);
  };
  ASSERT_NO_FATAL_FAILURE(
      retype(dir.Sub("rows.gguf"), 12, 200));  // Q4_K rows of 200
  auto rows = ModelDescription::Open(dir.Sub("rows.gguf"));
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rows.status().message().find("blk.0.ffn_down_exps.weight"),
            std::string::npos)
      << rows.status();
  EXPECT_NE(rows.status().message().find("256"), std::string::npos)
      << rows.status();

  ASSERT_NO_FATAL_FAILURE(
      retype(dir.Sub("q2k.gguf"), 10, 0));  // Q2_K: same block size
  auto q2k = ModelDescription::Open(dir.Sub("q2k.gguf"));
  ASSERT_FALSE(q2k.ok());
  EXPECT_NE(q2k.status().message().find("blk.0.ffn_down_exps.weight"),
            std::string::npos)
      << q2k.status();
  EXPECT_NE(q2k.status().message().find("Q2_K"), std::string::npos)
      << q2k.status();
}

}  // namespace
}  // namespace moe
