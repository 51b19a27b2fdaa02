// GGUF checkpoints through the one loader (issue 30): Mixtral, Qwen2-MoE,
// Qwen3-MoE, OLMoE, GLM-4.5, DeepSeek-V2/V3 and gpt-oss models, float types,
// and gpt-oss with its checkpoint's MXFP4 experts, converted to GGUF by our
// own reference converter (tests/reference/hf_to_gguf.py: llama.cpp's names,
// stacked experts, llama's permuted q/k rows, gpt-oss's MXFP4 blocks in
// ggml's nibble order) load through ModelDescription::Open and give the
// folder's logits bit for bit and the same greedy tokens; what is not loaded
// yet is refused naming the tensor or the architecture. (Quantized tensors:
// gguf_quant_test.cc.)
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fp8.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/mxfp4.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "services/engine/tokenizer.h"
#include "tests/common/test_util.h"
#include "tests/engine/gguf_run_util.h"

namespace moe {
namespace {

using gguf_test::ExpectSameKeyedConfig;
using gguf_test::ModelRun;
using gguf_test::RunModel;

// Runs a shell command; its exit code (-1 when it did not exit).
int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const std::string kConverter = std::string(MOE_SOURCE_DIR) + "/tests/reference/hf_to_gguf.py";

struct Case {
  const char* name;
  ModelFamily family;
  DType dtype;
  bool mxfp4 = false;  // gpt_oss's experts as MXFP4 (MakeModelOptions::mxfp4)
};

class GgufLoadTest : public ::testing::TestWithParam<Case> {
 protected:
  // The folder and its GGUF.
  // `edit`, a Python script, runs on the folder (its path is argv[1])
  // before it is converted.
  void Make(const Case& c, const std::string& edit = "") {
    MakeModelOptions o = TinyPreset(c.family);
    o.dtype = c.dtype;
    o.mxfp4 = c.mxfp4;
    o.mlp_only_layers.clear();  // llama.cpp's qwen3moe has no dense layers
    o.seed = 5;
    folder_ = dir_.Sub("hf");
    gguf_ = dir_.Sub("model.gguf");
    ASSERT_TRUE(MakeModel(o, folder_).ok());
    if (!edit.empty()) {
      moe::testing::WriteText(dir_.Sub("edit.py"), edit);
      ASSERT_EQ(Shell("/usr/bin/python3 " + dir_.Sub("edit.py") + " " + folder_), 0);
    }
    ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " " + folder_ + " " + gguf_), 0);
  }

  // Tensor `name` of `a` has the shape and bytes of `b`'s.
  static void ExpectSameTensor(const ModelDescription& a, const ModelDescription& b,
                               const std::string& name) {
    auto x = a.checkpoint().Get(name);
    auto y = b.checkpoint().Get(name);
    ASSERT_TRUE(x.ok() && y.ok()) << name;
    EXPECT_EQ(x->shape, y->shape) << name;
    ASSERT_EQ(x->nbytes, y->nbytes) << name;
    EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes), 0) << name;
  }

  moe::testing::TempDir dir_;
  std::string folder_, gguf_;
};

TEST_P(GgufLoadTest, GivesTheFoldersLogitsAndTokens) {
  Make(GetParam());
  auto desc = ModelDescription::Open(gguf_);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto folder_desc = ModelDescription::Open(folder_);
  ASSERT_TRUE(folder_desc.ok());
  EXPECT_EQ(desc->config().family, GetParam().family);
  EXPECT_EQ(desc->config().num_experts, folder_desc->config().num_experts);
  EXPECT_EQ(desc->config().num_hidden_layers, folder_desc->config().num_hidden_layers);
  // gpt_oss's fused experts come split per expert and projection
  // (BiasedExperts::kPerExpert); every other name is the folder's.
  if (!desc->config().has_expert_biases()) {
    EXPECT_EQ(desc->checkpoint().names(), folder_desc->checkpoint().names());
  }
  // What the keys carry (and the tensors decide): the same model.
  ExpectSameKeyedConfig(desc->config(), folder_desc->config());
  // The same weights, the same arithmetic (RunModel's reference
  // arithmetic): MXFP4 experts are held as q8 from the folder and as
  // kMxfp4 from the file, whose kernel forms q8's integer products
  // (common/mxfp4.h, docs/architecture.md "GPT-OSS") in row-major q8's
  // order.
  const ModelRun a = RunModel(folder_), b = RunModel(gguf_);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  EXPECT_EQ(a.logits, b.logits);
  ASSERT_EQ(a.tokens.size(), 16u);
  EXPECT_EQ(a.tokens, b.tokens);
}

// The vocabulary goes into the file (tokenizer.ggml.*) and comes back as
// the same tokenizer: the same ids for text with special tokens, with and
// without the bos, the same text back, the same eos.
TEST_P(GgufLoadTest, CarriesTheFoldersTokenizer) {
  Make(GetParam());
  auto a = Tokenizer::ForModel(folder_);
  auto b = Tokenizer::ForModel(gguf_);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->vocab_size(), (*b)->vocab_size());
  // The file always names the model's bos (the folder's tokenizer only when
  // its tokenizer_config.json does).
  if ((*a)->bos_id().has_value()) {
    EXPECT_EQ((*a)->bos_id(), (*b)->bos_id());
  }
  EXPECT_EQ((*a)->eos_id(), (*b)->eos_id());
  for (const std::string text :
       {"In the beginning God created the heaven and the earth.", "  two spaces, digits 12345",
        "caf\xc3\xa9 \xe2\x82\xac\ttab\nnewline", "</s> and <s> inside"}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*a)->Encode(text, special);
      EXPECT_EQ((*b)->Encode(text, special), ids) << text;
      EXPECT_EQ((*b)->Decode(ids), (*a)->Decode(ids));
    }
  }
}

TEST(GgufTokenizerTest, TheTrainedModelsVocabularyRoundTrips) {
  moe::testing::TempDir dir;
  const std::string folder = std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe";
  const std::string gguf = dir.Sub("kjv.gguf");
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " " + folder + " " + gguf), 0);
  auto a = Tokenizer::ForModel(folder);
  auto b = Tokenizer::ForModel(gguf);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string text =
      "And God said, Let there be light: and there was light. 1:3 And God saw the light.";
  EXPECT_EQ((*b)->Encode(text, true), (*a)->Encode(text, true));
  EXPECT_EQ((*b)->eos_id(), (*a)->eos_id());
  // A file without a vocabulary: NOT_FOUND (prompts as ids only).
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  ASSERT_TRUE(MakeModel(o, dir.Sub("hf")).ok());
  ASSERT_EQ(Shell("rm " + dir.Sub("hf") + "/tokenizer.json && /usr/bin/python3 " + kConverter +
                  " " + dir.Sub("hf") + " " + dir.Sub("none.gguf")),
            0);
  EXPECT_TRUE(absl::IsNotFound(Tokenizer::ForModel(dir.Sub("none.gguf")).status()));
}

INSTANTIATE_TEST_SUITE_P(
    Families, GgufLoadTest,
    ::testing::Values(Case{"MixtralBf16", ModelFamily::kMixtral, DType::kBF16},
                      Case{"MixtralF32", ModelFamily::kMixtral, DType::kF32},
                      Case{"Qwen3MoeBf16", ModelFamily::kQwen3Moe, DType::kBF16},
                      Case{"Qwen3MoeF16", ModelFamily::kQwen3Moe, DType::kF16},
                      Case{"Qwen2MoeBf16", ModelFamily::kQwen2Moe, DType::kBF16},
                      Case{"Qwen2MoeF32", ModelFamily::kQwen2Moe, DType::kF32},
                      Case{"OlmoeBf16", ModelFamily::kOlmoe, DType::kBF16},
                      Case{"OlmoeF16", ModelFamily::kOlmoe, DType::kF16},
                      Case{"Glm4MoeBf16", ModelFamily::kGlm4Moe, DType::kBF16},
                      Case{"Glm4MoeF32", ModelFamily::kGlm4Moe, DType::kF32},
                      Case{"DeepseekV2Bf16", ModelFamily::kDeepseekV2, DType::kBF16},
                      Case{"DeepseekV2F32", ModelFamily::kDeepseekV2, DType::kF32},
                      Case{"DeepseekV3Bf16", ModelFamily::kDeepseekV3, DType::kBF16},
                      Case{"DeepseekV3F16", ModelFamily::kDeepseekV3, DType::kF16},
                      Case{"GptOssBf16", ModelFamily::kGptOss, DType::kBF16},
                      Case{"GptOssF32", ModelFamily::kGptOss, DType::kF32},
                      Case{"GptOssMxfp4Bf16", ModelFamily::kGptOss, DType::kBF16, true},
                      Case{"GptOssMxfp4F32", ModelFamily::kGptOss, DType::kF32, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// llama.cpp's glm4moe keeps the nextn (MTP) layer after the decoder's and
// counts it in block_count: the file loads without it, as the folder does.
using GgufNextnTest = GgufLoadTest;
TEST_F(GgufNextnTest, Glm4MoeSkipsTheMtpLayer) {
  // Appends layer 4 (a copy of layer 3 plus the nextn tensors) to the
  // folder and says so in config.json.
  const std::string edit = absl::StrCat(
      "import json, os, struct, sys\n", "sys.path.insert(0, '", MOE_SOURCE_DIR,
      "/tests/reference')\n", "import hf_to_gguf as h\n", "d = sys.argv[1]\n",
      "cfg = json.load(open(os.path.join(d, 'config.json')))\n",
      "n, hid = cfg['num_hidden_layers'], cfg['hidden_size']\n",
      "t = h.read_safetensors(os.path.join(d, 'model.safetensors'))\n",
      "last = 'model.layers.%d.' % (n - 1)\n",
      "for k in [k for k in t if k.startswith(last)]:\n",
      "    t['model.layers.%d.' % n + k[len(last):]] = t[k]\n",
      "dt, _, norm = t[last + 'input_layernorm.weight']\n",
      "for k in ('enorm', 'hnorm', 'shared_head.norm'):\n",
      "    t['model.layers.%d.%s.weight' % (n, k)] = (dt, [hid], norm)\n",
      "t['model.layers.%d.eh_proj.weight' % n] = (dt, [hid, 2 * hid], norm * 2 * hid)\n",
      "header, blobs, off = {}, [], 0\n", "for k in sorted(t):\n",
      "    dtype, shape, b = t[k]\n",
      "    header[k] = {'dtype': dtype, 'shape': shape, 'data_offsets': [off, off + len(b)]}\n",
      "    blobs.append(b)\n", "    off += len(b)\n", "j = json.dumps(header).encode()\n",
      "j += b' ' * (-len(j) % 8)\n",
      "open(os.path.join(d, 'model.safetensors'), 'wb').write(\n",
      "    struct.pack('<Q', len(j)) + j + b''.join(blobs))\n",
      "cfg['num_nextn_predict_layers'] = 1\n",
      "json.dump(cfg, open(os.path.join(d, 'config.json'), 'w'))\n");
  Make(Case{"Glm4MoeMtp", ModelFamily::kGlm4Moe, DType::kBF16}, edit);
  auto desc = ModelDescription::Open(gguf_);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto folder_desc = ModelDescription::Open(folder_);
  ASSERT_TRUE(folder_desc.ok()) << folder_desc.status();
  EXPECT_EQ(desc->config().num_hidden_layers, folder_desc->config().num_hidden_layers);
  EXPECT_EQ(desc->config().num_nextn_predict_layers, 1);
  const std::string mtp = absl::StrCat("model.layers.", desc->config().num_hidden_layers, ".");
  for (const std::string& name : desc->checkpoint().names()) {
    EXPECT_EQ(name.rfind(mtp, 0), std::string::npos) << name;
  }
  const ModelRun a = RunModel(folder_), b = RunModel(gguf_);
  ASSERT_FALSE(a.logits.empty());
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.tokens, b.tokens);
}

// Newer llama.cpp converters split DeepSeek's kv_b into attn_k_b (each
// head's part for k transposed) and attn_v_b, and write no attn_kv_b: the
// halves are joined back, exactly (the folder's logits and tokens, bit for
// bit); a layer with one half only is refused naming it.
TEST_F(GgufLoadTest, SplitKvBIsJoinedBack) {
  for (const ModelFamily family : {ModelFamily::kDeepseekV3, ModelFamily::kDeepseekV2}) {
    SCOPED_TRACE(ModelFamilyName(family));
    Make(Case{"DeepseekSplitKvB", family, DType::kF32});
    const std::string split = dir_.Sub("split.gguf");
    ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --split-kv-b " + folder_ + " " + split),
              0);
    auto desc = ModelDescription::Open(split);
    ASSERT_TRUE(desc.ok()) << desc.status();
    for (const std::string& name : desc->checkpoint().names()) {
      EXPECT_EQ(name.find("k_b"), std::string::npos) << name;
    }
    auto folder_desc = ModelDescription::Open(folder_);
    ASSERT_TRUE(folder_desc.ok());
    ExpectSameTensor(*desc, *folder_desc, "model.layers.0.self_attn.kv_b_proj.weight");
    const ModelRun a = RunModel(folder_), b = RunModel(split);
    ASSERT_FALSE(a.logits.empty());
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.tokens, b.tokens);
  }
  const std::string half = dir_.Sub("half.gguf");
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --split-kv-b --drop blk.1.attn_v_b.weight " +
                  folder_ + " " + half),
            0);
  auto refused = ModelDescription::Open(half);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("blk.1.attn_k_b.weight"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("needs both attn_k_b and attn_v_b"),
            std::string::npos)
      << refused.status();
}

// gpt_oss's MXFP4 experts as llama.cpp's GptOssModel writes them (ggml
// MXFP4 stacks, gate and up from the even and odd rows of gate_up_proj,
// F32 biases) load as kMxfp4 holding the folder's own codes and exponents:
// each expert weight is byte for byte what the folder's gives converted to
// kMxfp4 (no requantization anywhere), and an expert has the bytes of the
// folder's held as mxfp4 with F32 biases. (Logits and tokens: the
// GptOssMxfp4 cases above.)
TEST_F(GgufLoadTest, GptOssMxfp4ExpertsKeepTheirCodes) {
  Make(Case{"GptOssMxfp4", ModelFamily::kGptOss, DType::kBF16, /*mxfp4=*/true});
  auto desc = ModelDescription::Open(gguf_);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto folder_desc = ModelDescription::Open(folder_);
  ASSERT_TRUE(folder_desc.ok()) << folder_desc.status();
  ASSERT_TRUE(folder_desc->config().mxfp4.has_value());
  EXPECT_EQ(desc->expert_dtype(), DType::kMxfp4);
  EXPECT_FALSE(desc->mixed_expert_dtypes());
  const ModelConfig& c = desc->config();
  const TensorRole weights[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                                 TensorRole::kExpertDown};
  const TensorRole biases[3] = {TensorRole::kExpertGateBias, TensorRole::kExpertUpBias,
                                TensorRole::kExpertDownBias};
  for (int l = 0; l < c.num_moe_layers(); ++l) {
    for (int e = 0; e < c.num_experts; ++e) {
      SCOPED_TRACE(absl::StrCat("MoE layer ", l, ", expert ", e));
      for (const TensorRole role : weights) {
        auto g = desc->Expert(l, e, role);
        auto f = folder_desc->Expert(l, e, role);
        ASSERT_TRUE(g.ok() && f.ok());
        EXPECT_EQ(g->dtype, DType::kMxfp4);
        EXPECT_EQ(DefaultHeldFormat(*g), DType::kMxfp4);  // held as stored
        ASSERT_EQ(g->shape, f->shape);
        const int64_t bytes = WeightBytes(DType::kMxfp4, f->shape[0], f->shape[1]);
        ASSERT_EQ(g->nbytes, static_cast<size_t>(bytes));
        EXPECT_EQ(g->nbytes, f->nbytes + f->scales.nbytes);  // 17 bytes per 32 weights
        std::vector<uint8_t> ours(static_cast<size_t>(bytes));
        ASSERT_TRUE(ConvertWeightView(*f, DType::kMxfp4, ours.data()).ok());
        EXPECT_EQ(std::memcmp(g->data, ours.data(), ours.size()), 0) << TensorRoleName(role);
      }
      for (const TensorRole role : biases) {
        auto g = desc->Expert(l, e, role);
        auto f = folder_desc->Expert(l, e, role);
        ASSERT_TRUE(g.ok() && f.ok());
        EXPECT_EQ(g->dtype, DType::kF32);
        ASSERT_EQ(g->numel(), f->numel());
        std::vector<float> want(static_cast<size_t>(f->numel()));
        ASSERT_TRUE(ConvertVectorView(*f, want.data()).ok());
        EXPECT_EQ(std::memcmp(g->data, want.data(), sizeof(float) * want.size()), 0)
            << TensorRoleName(role);
      }
    }
  }
  // The folder's experts held as mxfp4 (as moe-cached --expert-format
  // mxfp4 holds them): its codes and scales, and its bf16 biases as F32.
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  const uint64_t bias_values = static_cast<uint64_t>(2 * inter + h);
  const uint64_t held = static_cast<uint64_t>(2 * WeightBytes(DType::kMxfp4, inter, h) +
                                              WeightBytes(DType::kMxfp4, h, inter)) +
                        sizeof(float) * bias_values;
  EXPECT_EQ(desc->bytes_per_expert(), held);
  EXPECT_EQ(folder_desc->bytes_per_expert() + 2 * bias_values, held);
}

// llama.cpp's --fuse-gate-up-exps writes one ffn_gate_up_exps per layer
// (each expert's gate rows, then its up rows): each expert's gate and up are
// views of it, the folder's bytes, logits and tokens bit for bit; with Q4_0
// experts, the bits of the unfused file.
TEST_F(GgufLoadTest, FusedGateUpExpertsLoadAsTwoViews) {
  Make(Case{"Qwen3MoeFused", ModelFamily::kQwen3Moe, DType::kF32});
  const std::string fused = dir_.Sub("fused.gguf");
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --fuse-gate-up-exps " + folder_ + " " +
                  fused),
            0);
  auto desc = ModelDescription::Open(fused);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto folder_desc = ModelDescription::Open(folder_);
  ASSERT_TRUE(folder_desc.ok());
  EXPECT_EQ(desc->checkpoint().names(), folder_desc->checkpoint().names());
  for (const char* proj : {"gate_proj", "up_proj"}) {
    ExpectSameTensor(*desc, *folder_desc,
                     absl::StrCat("model.layers.1.mlp.experts.3.", proj, ".weight"));
  }
  const ModelRun want = RunModel(folder_), got = RunModel(fused);
  ASSERT_FALSE(want.logits.empty());
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.tokens, want.tokens);

  const std::string plain_q4 = dir_.Sub("q4.gguf"), fused_q4 = dir_.Sub("fused_q4.gguf");
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --experts Q4_0 " + folder_ + " " + plain_q4),
            0);
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --experts Q4_0 --fuse-gate-up-exps " +
                  folder_ + " " + fused_q4),
            0);
  const ModelRun a = RunModel(plain_q4), b = RunModel(fused_q4);
  ASSERT_FALSE(a.logits.empty());
  EXPECT_EQ(b.logits, a.logits);
  EXPECT_EQ(b.tokens, a.tokens);
}

// llama.cpp's --fuse-qkv writes one attn_qkv per layer (q's rows, k's,
// v's; llama's q and k rope-permuted first) and attn_qkv.bias where there
// are biases: q, k and v come back as the folder's, bytes, logits and
// tokens bit for bit (Mixtral: the permutation undone; Qwen2-MoE and
// gpt-oss: biases, which also say the config has them).
TEST_F(GgufLoadTest, FusedQkvLoadsAsThreeTensors) {
  for (const ModelFamily family :
       {ModelFamily::kMixtral, ModelFamily::kQwen2Moe, ModelFamily::kGptOss}) {
    SCOPED_TRACE(ModelFamilyName(family));
    Make(Case{"FusedQkv", family, DType::kF32});
    const std::string fused = dir_.Sub("fused_qkv.gguf");
    ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " --fuse-qkv " + folder_ + " " + fused), 0);
    auto desc = ModelDescription::Open(fused);
    ASSERT_TRUE(desc.ok()) << desc.status();
    auto folder_desc = ModelDescription::Open(folder_);
    ASSERT_TRUE(folder_desc.ok());
    if (!desc->config().has_expert_biases()) {  // gpt-oss's experts come split
      EXPECT_EQ(desc->checkpoint().names(), folder_desc->checkpoint().names());
    }
    EXPECT_EQ(desc->config().qkv_bias, folder_desc->config().qkv_bias);
    for (const char* part : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias",
                             "k_proj.bias", "v_proj.bias"}) {
      const std::string name = absl::StrCat("model.layers.1.self_attn.", part);
      if (folder_desc->checkpoint().Has(name)) ExpectSameTensor(*desc, *folder_desc, name);
    }
    const ModelRun want = RunModel(folder_), got = RunModel(fused);
    ASSERT_FALSE(want.logits.empty());
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.tokens, want.tokens);
  }
}

TEST(GgufRefusalTest, WhatIsNotLoadedYetIsNamed) {
  moe::testing::TempDir dir;
  // A dense llama, then a quantized expert tensor: written with the
  // reference writer.
  const std::string script = absl::StrCat(
      "import sys; sys.path.insert(0, '", MOE_SOURCE_DIR, "/tests/reference')\n",
      "import gguf_writer as g\n",
      "w = g.GGUFWriter(); w.add('general.architecture', g.STRING, 'llama')\n",
      "w.add('llama.embedding_length', g.UINT32, 64); w.write('", dir.Sub("dense.gguf"), "')\n");
  moe::testing::WriteText(dir.Sub("dense.py"), script);
  ASSERT_EQ(Shell("/usr/bin/python3 " + dir.Sub("dense.py")), 0);
  auto dense = ModelDescription::Open(dir.Sub("dense.gguf"));
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("dense model"), std::string::npos) << dense.status();

  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  ASSERT_TRUE(MakeModel(o, dir.Sub("hf")).ok());
  const std::string gguf = dir.Sub("m.gguf");
  ASSERT_EQ(Shell("/usr/bin/python3 " + kConverter + " " + dir.Sub("hf") + " " + gguf), 0);
  // Retype blk.0.ffn_down_exps as IQ4_NL in place, a block type that is
  // not loaded (its byte count differs, but the type is checked first).
  const std::string retype = absl::StrCat(
      "import sys; sys.path.insert(0, '", MOE_SOURCE_DIR, "/tests/reference')\n",
      "b = bytearray(open('", gguf, "', 'rb').read())\n",
      "name = b'blk.0.ffn_down_exps.weight'\n",
      "i = b.index(name) + len(name)\n",
      "nd = int.from_bytes(b[i:i + 4], 'little')\n",
      "t = i + 4 + 8 * nd\n",
      "b[t:t + 4] = (20).to_bytes(4, 'little')\n",
      "open('", gguf, "', 'wb').write(b)\n");
  moe::testing::WriteText(dir.Sub("retype.py"), retype);
  ASSERT_EQ(Shell("/usr/bin/python3 " + dir.Sub("retype.py")), 0);
  auto quantized = ModelDescription::Open(gguf);
  ASSERT_FALSE(quantized.ok());
  EXPECT_EQ(quantized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(quantized.status().message().find("blk.0.ffn_down_exps.weight"), std::string::npos)
      << quantized.status();
  EXPECT_NE(quantized.status().message().find("IQ4_NL"), std::string::npos)
      << quantized.status();
}

}  // namespace
}  // namespace moe
