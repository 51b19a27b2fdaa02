// Checkpoints we did not write: tests/common/hf_checkpoint.py writes
// Hugging Face-layout models with numpy, and ModelDescription and
// `moectl inspect` must read them. The same script reads what MakeModel
// writes, without our code.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/mxfp4.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::ReadText;
using ::moe::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kScript =
    std::string(MOE_SOURCE_DIR) + "/tests/common/hf_checkpoint.py";
const std::string kMoectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";

struct RunResult {
  int code = -1;
  std::string out, err;
};

// Runs a shell command, capturing stdout and stderr.
RunResult RunCommand(const std::string& cmd, const TempDir& scratch) {
  std::string out = scratch.Sub("stdout"), err = scratch.Sub("stderr");
  int status = std::system((cmd + " >" + out + " 2>" + err).c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadText(out);
  r.err = ReadText(err);
  return r;
}

nlohmann::json WritePython(const std::string& family, const std::string& dir,
                           const TempDir& scratch,
                           const std::string& breakage = "") {
  std::string cmd = std::string(kPython) + " " + kScript + " write --family " +
                    family + " --out " + dir +
                    (breakage.empty() ? "" : " --break " + breakage);
  RunResult r = RunCommand(cmd, scratch);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// The script's value formula (see hf_checkpoint.py).
float Expected(const std::string& name, int64_t i) {
  int seed = 0;
  for (unsigned char c : name) seed += c;
  seed %= 101;
  return static_cast<float>((7 * i + seed) % 13 - 6) / 8.0f;
}

void CheckValues(const ModelDescription& d, const std::string& name) {
  auto v = d.checkpoint().Get(name);
  ASSERT_TRUE(v.ok()) << name;
  std::vector<float> f(static_cast<size_t>(v->numel()));
  ASSERT_TRUE(ConvertToFloat(v->data, v->dtype, f.size(), f.data()).ok());
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(f[i], Expected(name, static_cast<int64_t>(i)))
        << name << "[" << i << "]";
  }
}

class PythonCheckpointTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PythonCheckpointTest, ModelDescriptionAndInspectReadIt) {
  const std::string family = GetParam();
  TempDir dir, scratch;
  nlohmann::json expect = WritePython(family, dir.path(), scratch);
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(ModelFamilyName(d->config().family), family);
  EXPECT_EQ(d->config().num_moe_layers(), expect["moe_layers"].get<int>());
  EXPECT_EQ(d->bytes_per_expert(), expect["bytes_per_expert"].get<uint64_t>());
  EXPECT_EQ(d->dense_bytes(), expect["dense_bytes"].get<uint64_t>());
  EXPECT_EQ(d->total_bytes(), expect["total_bytes"].get<uint64_t>());
  EXPECT_EQ(d->checkpoint().files().size(), expect["files"].get<size_t>());
  CheckValues(*d, "model.embed_tokens.weight");
  CheckValues(*d, "model.layers.1.self_attn.o_proj.weight");
  auto up =
      d->Expert(d->config().num_moe_layers() - 1, 2, TensorRole::kExpertUp);
  ASSERT_TRUE(up.ok());
  std::vector<float> f(static_cast<size_t>(up->numel()));
  ASSERT_TRUE(ConvertToFloat(up->data, up->dtype, f.size(), f.data()).ok());
  int layer = d->config().LayerOfMoeLayer(d->config().num_moe_layers() - 1);
  std::string up_name =
      "model.layers." + std::to_string(layer) +
      (family == "mixtral" ? ".block_sparse_moe.experts.2.w3.weight"
                           : ".mlp.experts.2.up_proj.weight");
  EXPECT_EQ(f[5], Expected(up_name, 5));

  RunResult json =
      RunCommand(kMoectl + " inspect --json " + dir.path(), scratch);
  ASSERT_EQ(json.code, 0) << json.err;
  auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["family"], family);
  EXPECT_EQ(j["bytes_per_expert"], expect["bytes_per_expert"]);
  EXPECT_EQ(j["dense_bytes"], expect["dense_bytes"]);
  EXPECT_EQ(j["total_bytes"], expect["total_bytes"]);
  RunResult text = RunCommand(kMoectl + " inspect " + dir.path(), scratch);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("family: " + family + "\n"));
  EXPECT_THAT(text.out,
              HasSubstr("total bytes: " + expect["total_bytes"].dump() + " ("));
}

INSTANTIATE_TEST_SUITE_P(Families, PythonCheckpointTest,
                         ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe",
                                           "olmoe"));

// A gpt-oss-layout MXFP4 checkpoint written without our code: the byte
// counts are the writer's, and every expert weight and bias view equals the
// writer's formula (hf_checkpoint.py) dequantized here by hand: gate rows
// are the even rows of gate_up_proj_blocks, up the odd ones.
TEST(PythonCheckpointTest, GptOssMxfp4CheckpointDequantizesExactly) {
  TempDir dir, scratch;
  nlohmann::json expect = WritePython("gpt_oss_mxfp4", dir.path(), scratch);
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->config().mxfp4.has_value());
  EXPECT_EQ(d->expert_dtype(), DType::kMxfp4);
  EXPECT_EQ(d->bytes_per_expert(), expect["bytes_per_expert"].get<uint64_t>());
  EXPECT_EQ(d->dense_bytes(), expect["dense_bytes"].get<uint64_t>());
  EXPECT_EQ(d->total_bytes(), expect["total_bytes"].get<uint64_t>());
  const float kFp4[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0.0f, -.5, -1, -1.5, -2, -3, -4, -6};
  const int64_t h = 64, inter = 32, experts = 4;
  // Weight (row, col) of expert e of a [E, rows, cols] MXFP4 tensor.
  auto weight = [&](int64_t e, int64_t rows, int64_t cols, int64_t row, int64_t col) {
    const int64_t g = (e * rows + row) * (cols / 32) + col / 32;
    const int64_t byte = (37 * (g * 16 + (col % 32) / 2) + 11) % 256;
    const int code = col % 2 == 0 ? (byte & 15) : (byte >> 4);
    return std::ldexp(kFp4[code], static_cast<int>(118 + g % 5) - 127);
  };
  for (int layer = 0; layer < 2; ++layer) {
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<float> gate(inter * h), up(inter * h), down(h * inter);
      ASSERT_TRUE(ConvertWeightView(*d->Expert(layer, e, TensorRole::kExpertGate), DType::kF32,
                                    gate.data()).ok());
      ASSERT_TRUE(ConvertWeightView(*d->Expert(layer, e, TensorRole::kExpertUp), DType::kF32,
                                    up.data()).ok());
      ASSERT_TRUE(ConvertWeightView(*d->Expert(layer, e, TensorRole::kExpertDown), DType::kF32,
                                    down.data()).ok());
      for (int64_t r = 0; r < inter; ++r) {
        for (int64_t c = 0; c < h; ++c) {
          ASSERT_EQ(gate[r * h + c], weight(e, 2 * inter, h, 2 * r, c)) << e << " " << r;
          ASSERT_EQ(up[r * h + c], weight(e, 2 * inter, h, 2 * r + 1, c)) << e << " " << r;
          ASSERT_EQ(down[c * inter + r], weight(e, h, inter, c, r)) << e << " " << c;
        }
      }
      const std::string bias =
          "model.layers." + std::to_string(layer) + ".mlp.experts.gate_up_proj_bias";
      std::vector<float> ub(inter);
      ASSERT_TRUE(
          ConvertVectorView(*d->Expert(layer, e, TensorRole::kExpertUpBias), ub.data()).ok());
      for (int64_t r = 0; r < inter; ++r) {
        ASSERT_EQ(ub[r], Expected(bias, e * 2 * inter + 2 * r + 1)) << e << " " << r;
      }
    }
  }
  RunResult text = RunCommand(kMoectl + " inspect " + dir.path(), scratch);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("expert dtype: MXFP4"));
  EXPECT_THAT(text.out, HasSubstr("experts held as (no --expert-format): q8"));
}

// An FP8 checkpoint written without our code (Qwen3-FP8 layout, 16 x 16
// blocks, partial ones at width 24, two shards): the byte counts are the
// writer's, and every dequantized weight is exactly the writer's value times
// its block's scale (powers of two, see hf_checkpoint.py).
TEST(PythonCheckpointTest, Fp8CheckpointDequantizesExactly) {
  TempDir dir, scratch;
  nlohmann::json expect = WritePython("qwen3_moe_fp8", dir.path(), scratch);
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->config().fp8.has_value());
  EXPECT_EQ(d->expert_dtype(), DType::kF8E4M3);
  EXPECT_EQ(d->bytes_per_expert(), expect["bytes_per_expert"].get<uint64_t>());
  EXPECT_EQ(d->dense_bytes(), expect["dense_bytes"].get<uint64_t>());
  EXPECT_EQ(d->total_bytes(), expect["total_bytes"].get<uint64_t>());
  auto scale = [](int64_t bi, int64_t bj) {
    return static_cast<float>(1 << ((bi + 2 * bj) % 3));
  };
  struct Checked {
    std::string name;
    absl::StatusOr<TensorView> view;
  };
  const Checked checked[] = {
      {"model.layers.0.mlp.experts.3.down_proj.weight",
       d->Expert(0, 3, TensorRole::kExpertDown)},
      {"model.layers.0.mlp.experts.1.gate_proj.weight",
       d->Expert(0, 1, TensorRole::kExpertGate)},
      {"model.layers.1.self_attn.q_proj.weight", d->Dense(TensorRole::kQProj, 1)},
      {"model.layers.1.mlp.down_proj.weight", d->Dense(TensorRole::kMlpDown, 1)}};
  for (const Checked& c : checked) {
    ASSERT_TRUE(c.view.ok()) << c.name;
    ASSERT_EQ(c.view->dtype, DType::kF8E4M3) << c.name;
    const int64_t rows = c.view->shape[0], cols = c.view->shape[1];
    std::vector<float> got(static_cast<size_t>(rows * cols));
    ASSERT_TRUE(ConvertWeightView(*c.view, DType::kF32, got.data()).ok()) << c.name;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        ASSERT_EQ(got[r * cols + k], Expected(c.name, r * cols + k) * scale(r / 16, k / 16))
            << c.name << "[" << r << ", " << k << "]";
      }
    }
  }
  // The router stays BF16, as published.
  EXPECT_EQ(d->Dense(TensorRole::kRouter, 0)->dtype, DType::kBF16);

  // And the other way: make-model's FP8 output reads without our code.
  TempDir made;
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen3Moe);
  o.fp8 = Fp8BlockScheme{32, 32};
  o.shards = 2;
  ASSERT_TRUE(MakeModel(o, made.path()).ok());
  auto md = ModelDescription::Open(made.path());
  ASSERT_TRUE(md.ok()) << md.status();
  RunResult r = RunCommand(std::string(kPython) + " " + kScript + " check " + made.path(),
                           scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensors"].get<size_t>(), md->checkpoint().names().size());
  EXPECT_EQ(j["total_bytes"].get<uint64_t>(), md->total_bytes());
}

struct Broken {
  const char* family;
  const char* breakage;
  const char* message;
};

TEST(PythonCheckpointTest, InspectRefusesBrokenModelsInOneLine) {
  for (const Broken& b :
       {Broken{"mixtral", "missing-expert", "experts.1.w3.weight"},
        Broken{"qwen3_moe", "bad-shape",
               "q_proj.weight' has shape [32, 64], expected [64, 32]"},
        Broken{"olmoe", "bad-config", "num_experts_per_tok (5) exceeds"}}) {
    TempDir dir, scratch;
    WritePython(b.family, dir.path(), scratch, b.breakage);
    EXPECT_FALSE(ModelDescription::Open(dir.path()).ok()) << b.breakage;
    RunResult r = RunCommand(kMoectl + " inspect " + dir.path(), scratch);
    EXPECT_EQ(r.code, 1) << b.breakage;
    EXPECT_EQ(r.out, "");
    EXPECT_THAT(r.err, HasSubstr(b.message)) << b.breakage;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  TempDir empty, scratch;
  RunResult r = RunCommand(kMoectl + " inspect " + empty.path(), scratch);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("config.json"));
  EXPECT_EQ(RunCommand(kMoectl + " inspect", scratch).code, 2);
}

TEST(PythonCheckpointTest, OurOutputReadsWithoutOurCode) {
  for (ModelFamily f : {ModelFamily::kMixtral, ModelFamily::kQwen2Moe,
                        ModelFamily::kQwen3Moe, ModelFamily::kOlmoe}) {
    for (int shards : {1, 2}) {
      TempDir dir, scratch;
      MakeModelOptions o = TinyPreset(f);
      o.shards = shards;
      ASSERT_TRUE(MakeModel(o, dir.path()).ok());
      auto d = ModelDescription::Open(dir.path());
      ASSERT_TRUE(d.ok());
      RunResult r = RunCommand(
          std::string(kPython) + " " + kScript + " check " + dir.path(),
          scratch);
      ASSERT_EQ(r.code, 0) << ModelFamilyName(f) << " shards=" << shards << "\n"
                           << r.err;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["tensors"].get<size_t>(), d->checkpoint().names().size());
      EXPECT_EQ(j["total_bytes"].get<uint64_t>(), d->total_bytes());
      EXPECT_EQ(j["files"].get<int>(), shards);
      EXPECT_GT(j["merges"].get<int>(), 200);
    }
  }
}

TEST(MoectlMakeModelTest, WritesAndDescribesEachFamily) {
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}) {
    TempDir dir, scratch;
    RunResult r = RunCommand(kMoectl + " make-model --preset tiny --arch " +
                                 arch + " --seed 5 --out " + dir.path() + "/m",
                             scratch);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(std::string(arch) + ", "));
    auto d = ModelDescription::Open(dir.path() + "/m");
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(ModelFamilyName(d->config().family), arch);
  }
  TempDir dir, scratch;
  RunResult r = RunCommand(
      kMoectl +
          " make-model --arch qwen2_moe --layers 3 --hidden 32 --heads 4 " +
          "--kv-heads 1 --experts 6 --top-k 3 --moe-intermediate 16 " +
          "--shared-intermediate 24 --intermediate 40 --vocab 300 --dtype "
          "f32 " +
          "--shards 2 --mlp-only-layers 1 --norm-topk-prob --out " + dir.path(),
      scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelConfig& c = d->config();
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.num_experts, 6);
  EXPECT_EQ(c.top_k, 3);
  EXPECT_EQ(c.shared_expert_intermediate_size, 24);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(d->expert_dtype(), DType::kF32);
  EXPECT_EQ(d->bytes_per_expert(), 3u * 16 * 32 * 4);
  EXPECT_EQ(d->checkpoint().files().size(), 2u);

  EXPECT_EQ(RunCommand(kMoectl + " make-model --arch llama --out " + dir.path(),
                       scratch)
                .code,
            1);
  RunResult bad = RunCommand(
      kMoectl + " make-model --out " + dir.path() + " --bogus 1", scratch);
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("unknown flag --bogus"));
  EXPECT_EQ(RunCommand(kMoectl + " make-model --arch mixtral", scratch).code,
            2);  // no --out
  RunResult help = RunCommand(kMoectl + " make-model --help", scratch);
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("--moe-intermediate"));
}

}  // namespace
}  // namespace moe
