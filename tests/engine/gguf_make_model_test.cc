// moectl make-model --gguf (common/model_maker_gguf.h): the random model
// as one GGUF file in llama.cpp's layout, checked three ways.
//  - Against the folder of the same options and seed: for every family, F32
//    and BF16 files (and gpt_oss's MXFP4 experts) load with the folder's
//    configuration, tokenizer, logits and greedy tokens, bit for bit.
//  - Against our independent reference converter (tests/reference/
//    hf_to_gguf.py with the numpy quantizers of gguf_quants.py) run on that
//    folder: every tensor it writes has our name, type, dims and bytes
//    (quantized blocks included: the quantizers are the same schemes,
//    computed alike), and every key it writes has our value.
//  - Quantized files load, and every block tensor decodes (gguf_blocks.h)
//    within its scheme's bound of the folder's weights; the vectors and
//    routers are the folder's F32 weights exactly.
// gpt_oss's split experts, which the reference converter does not quantize,
// and random rows of every type, are compared block by block with
// gguf_quants.quantize (MXFP4: equal, or as near where gguf_quantize.h
// says they differ). moectl's refusals come with a message and exit 1.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/fp8.h"
#include "common/gguf.h"
#include "common/gguf_blocks.h"
#include "common/gguf_quantize.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/model_maker_gguf.h"
#include "common/mxfp4.h"
#include "common/safetensors.h"
#include "common/splitmix64.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "services/engine/tokenizer.h"
#include "tests/common/test_util.h"
#include "tests/engine/gguf_run_util.h"

namespace moe {
namespace {

using gguf_test::ModelRun;
using gguf_test::RunModel;

int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// stdout and stderr of `cmd`, and its exit code.
std::string Capture(const std::string& cmd, int* code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

const std::string kReference = std::string(MOE_SOURCE_DIR) + "/tests/reference";
const std::string kMoectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";


// What the keys carry (and the tensors decide): the same model.
void ExpectSameConfig(const ModelConfig& g, const ModelConfig& f) {
  gguf_test::ExpectSameKeyedConfig(g, f);
  EXPECT_EQ(g.family, f.family);
  EXPECT_EQ(g.num_hidden_layers, f.num_hidden_layers);
  EXPECT_EQ(g.hidden_size, f.hidden_size);
  EXPECT_EQ(g.num_experts, f.num_experts);
  EXPECT_EQ(g.top_k, f.top_k);
  EXPECT_EQ(g.tie_word_embeddings, f.tie_word_embeddings);
  EXPECT_EQ(g.rope_theta, f.rope_theta);
  EXPECT_EQ(g.bos_token_id, f.bos_token_id);
  EXPECT_EQ(g.eos_token_ids, f.eos_token_ids);
}

bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.u != b.u || a.i != b.i || a.f != b.f || a.str != b.str) return false;
  if (a.array_type != b.array_type || a.array_size != b.array_size ||
      a.array_strings != b.array_strings || a.array_bytes.size() != b.array_bytes.size()) {
    return false;
  }
  // std::equal, not memcmp: an empty array's data() may be null.
  return std::equal(a.array_bytes.begin(), a.array_bytes.end(), b.array_bytes.begin());
}

// Every key of `ref` is in `ours` with the same type and value.
void ExpectReferenceKeys(const GgufFile& ours, const GgufFile& ref) {
  for (const GgufKeyValue& kv : ref.metadata().entries()) {
    const GgufValue* v = ours.metadata().Find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key << " is missing";
    EXPECT_TRUE(SameValue(*v, kv.value)) << kv.key;
  }
}

// Tensor `name` has the same type, dims and bytes in both files.
void ExpectSameTensor(const GgufFile& ours, const GgufFile& ref, const GgufTensorInfo& t) {
  const GgufTensorInfo* r = ref.Find(t.name);
  ASSERT_NE(r, nullptr) << t.name << " is not in the reference's file";
  EXPECT_EQ(GgufTypeName(static_cast<uint32_t>(t.type)),
            GgufTypeName(static_cast<uint32_t>(r->type)))
      << t.name;
  EXPECT_EQ(t.dims, r->dims) << t.name;
  if (t.type != r->type || t.nbytes != r->nbytes) return;
  auto a = ours.Data(t), b = ref.Data(*r);
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  EXPECT_EQ(differing, 0) << t.name << ": bytes differ from the reference's";
}

std::set<std::string> Names(const GgufFile& f) {
  std::set<std::string> out;
  for (const GgufTensorInfo& t : f.tensors()) out.insert(t.name);
  return out;
}

// ------------------------------------------------------------- floats

struct FloatCase {
  const char* name;
  ModelFamily family;
  DType dtype;  // the folder's
  GgufFileType type;
};

void PrintTo(const FloatCase& c, std::ostream* os) { *os << c.name; }

MakeModelOptions Tiny(ModelFamily family, DType dtype) {
  MakeModelOptions o = TinyPreset(family);
  o.dtype = dtype;
  o.mlp_only_layers.clear();  // llama.cpp's qwen3moe has no dense layers
  o.seed = 5;
  return o;
}

class GgufMakeModelFloatTest : public ::testing::TestWithParam<FloatCase> {
 protected:
  void SetUp() override {
    const FloatCase& c = GetParam();
    options_ = Tiny(c.family, c.dtype);
    if (c.type == GgufFileType::kMxfp4) options_.mxfp4 = true;  // the folder's experts too
    folder_ = dir_.Sub("hf");
    gguf_ = dir_.Sub(GgufModelFileName(c.type));
    ASSERT_TRUE(MakeModel(options_, folder_).ok());
    absl::Status s = MakeGgufModel(options_, c.type, gguf_);
    ASSERT_TRUE(s.ok()) << s;
  }

  moe::testing::TempDir dir_;
  MakeModelOptions options_;
  std::string folder_, gguf_;
};

TEST_P(GgufMakeModelFloatTest, GivesTheFoldersLogitsTokensAndTokenizer) {
  auto g = ModelDescription::Open(gguf_);
  ASSERT_TRUE(g.ok()) << g.status();
  auto f = ModelDescription::Open(folder_);
  ASSERT_TRUE(f.ok()) << f.status();
  ExpectSameConfig(g->config(), f->config());
  if (!g->config().has_expert_biases()) {  // gpt_oss's experts come split
    EXPECT_EQ(g->checkpoint().names(), f->checkpoint().names());
  }
  // In the reference arithmetic (RunModel), the same bits (gpt-oss: the
  // folder's MXFP4 held as q8, the file's as kMxfp4, the same integer
  // products in the same order).
  const ModelRun a = RunModel(folder_), b = RunModel(gguf_);
  ASSERT_FALSE(a.logits.empty());
  EXPECT_EQ(a.logits, b.logits);
  ASSERT_EQ(a.tokens.size(), 16u);
  EXPECT_EQ(a.tokens, b.tokens);
  auto ta = Tokenizer::ForModel(folder_);
  auto tb = Tokenizer::ForModel(gguf_);
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ((*ta)->vocab_size(), (*tb)->vocab_size());
  EXPECT_EQ((*ta)->eos_id(), (*tb)->eos_id());
  const std::string text = "In the beginning <|im_start|> caf\xc3\xa9 12345\n";
  EXPECT_EQ((*tb)->Encode(text, true), (*ta)->Encode(text, true));
}

// The reference converter on the folder writes what we write: for F32 and
// MXFP4 files every tensor's bytes; for BF16 ones (where it keeps vectors
// and routers BF16, we F32, as llama.cpp's converter) names and dims.
TEST_P(GgufMakeModelFloatTest, IsWhatTheReferenceConverterWrites) {
  const std::string ref_path = dir_.Sub("ref.gguf");
  ASSERT_EQ(Shell(absl::StrCat("/usr/bin/python3 ", kReference, "/hf_to_gguf.py ", folder_, " ",
                               ref_path)),
            0);
  auto ours = GgufFile::Open(gguf_);
  auto ref = GgufFile::Open(ref_path);
  ASSERT_TRUE(ours.ok() && ref.ok());
  EXPECT_EQ(Names(**ours), Names(**ref));
  ExpectReferenceKeys(**ours, **ref);
  for (const GgufTensorInfo& t : (*ours)->tensors()) {
    if (GetParam().dtype == DType::kF32) {
      ExpectSameTensor(**ours, **ref, t);
    } else if (const GgufTensorInfo* r = (*ref)->Find(t.name)) {
      EXPECT_EQ(t.dims, r->dims) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, GgufMakeModelFloatTest,
    ::testing::Values(
        FloatCase{"MixtralF32", ModelFamily::kMixtral, DType::kF32, GgufFileType::kF32},
        FloatCase{"MixtralBf16", ModelFamily::kMixtral, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"Qwen2MoeF32", ModelFamily::kQwen2Moe, DType::kF32, GgufFileType::kF32},
        FloatCase{"Qwen2MoeBf16", ModelFamily::kQwen2Moe, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"Qwen3MoeF32", ModelFamily::kQwen3Moe, DType::kF32, GgufFileType::kF32},
        FloatCase{"Qwen3MoeBf16", ModelFamily::kQwen3Moe, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"OlmoeF32", ModelFamily::kOlmoe, DType::kF32, GgufFileType::kF32},
        FloatCase{"OlmoeBf16", ModelFamily::kOlmoe, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"Glm4MoeF32", ModelFamily::kGlm4Moe, DType::kF32, GgufFileType::kF32},
        FloatCase{"Glm4MoeBf16", ModelFamily::kGlm4Moe, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"DeepseekV2F32", ModelFamily::kDeepseekV2, DType::kF32, GgufFileType::kF32},
        FloatCase{"DeepseekV2Bf16", ModelFamily::kDeepseekV2, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"DeepseekV3F32", ModelFamily::kDeepseekV3, DType::kF32, GgufFileType::kF32},
        FloatCase{"DeepseekV3Bf16", ModelFamily::kDeepseekV3, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"GptOssF32", ModelFamily::kGptOss, DType::kF32, GgufFileType::kF32},
        FloatCase{"GptOssBf16", ModelFamily::kGptOss, DType::kBF16, GgufFileType::kBF16},
        FloatCase{"GptOssMxfp4", ModelFamily::kGptOss, DType::kF32, GgufFileType::kMxfp4}),
    [](const ::testing::TestParamInfo<FloatCase>& i) { return std::string(i.param.name); });

// The keys we write beyond the reference converter's: qwen3moe's
// expert_weights_norm (make-model's qwen3_moe default does not
// renormalise, llama.cpp's graph does unless told) and llama's key_length /
// value_length for heads not hidden / heads wide.
TEST(GgufMakeModelKeysTest, SayWhatTheReferenceConvertersKeysCannot) {
  MakeModelOptions qwen3 = Tiny(ModelFamily::kQwen3Moe, DType::kF32);
  qwen3.norm_topk_prob = false;
  MakeModelOptions mixtral = Tiny(ModelFamily::kMixtral, DType::kF32);
  mixtral.head_dim = 32;  // heads of 4 x 32 in a hidden size of 64
  for (const MakeModelOptions& o : {qwen3, mixtral}) {
    SCOPED_TRACE(ModelFamilyName(o.arch));
    moe::testing::TempDir dir;
    ASSERT_TRUE(MakeModel(o, dir.Sub("hf")).ok());
    ASSERT_TRUE(MakeGgufModel(o, GgufFileType::kF32, dir.Sub("m.gguf")).ok());
    auto g = ModelDescription::Open(dir.Sub("m.gguf"));
    auto f = ModelDescription::Open(dir.Sub("hf"));
    ASSERT_TRUE(g.ok() && f.ok()) << g.status() << f.status();
    ExpectSameConfig(g->config(), f->config());
    const ModelRun a = RunModel(dir.Sub("hf")), b = RunModel(dir.Sub("m.gguf"));
    ASSERT_FALSE(a.logits.empty());
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.tokens, b.tokens);
  }
}

// ------------------------------------------------------------ blocks

// One tensor's rows as our quantizer got them and the blocks it wrote.
struct Segment {
  std::string label;
  GgufType type;
  std::vector<float> rows;
  std::vector<uint8_t> blocks;
};

// gguf_quants.quantize on each segment's rows against our blocks:
// {label: [equal, as_near, different]} per block (as_near: MXFP4 blocks
// that differ but decode as near to the input, weight by weight: exact
// ties, all-zero groups' exponent bytes; gguf_quantize.h).
nlohmann::json CompareWithGgufQuants(const std::vector<Segment>& segments,
                                     const moe::testing::TempDir& dir) {
  SafetensorsWriter w;
  for (size_t k = 0; k < segments.size(); ++k) {
    const Segment& s = segments[k];
    const std::string base = absl::StrCat(k, "|", GgufTypeName(static_cast<uint32_t>(s.type)));
    EXPECT_TRUE(w.Add(base + "|input", DType::kF32, {static_cast<int64_t>(s.rows.size())},
                      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.rows.data()),
                                                4 * s.rows.size()))
                    .ok());
    EXPECT_TRUE(w.Add(base + "|ours", DType::kU8, {static_cast<int64_t>(s.blocks.size())},
                      s.blocks)
                    .ok());
  }
  EXPECT_TRUE(w.Write(dir.Sub("segments.safetensors")).ok());
  const std::string script = absl::StrCat(
      "import json, sys\n", "import numpy as np\n", "sys.path.insert(0, '", kReference, "')\n",
      "import gguf_quants as q, gguf_writer as g, hf_to_gguf as h\n",
      "types = {v: k for k, v in g.TYPE_NAMES.items()}\n",
      "t = h.read_safetensors(sys.argv[1])\n", "out = {}\n",
      "for name in sorted(n for n in t if n.endswith('|input')):\n",
      "    base = name[:-len('|input')]\n", "    ty = types[base.split('|')[1]]\n",
      "    x = np.frombuffer(t[name][2], dtype='<f4').astype(np.float64)\n",
      "    ours, ref = t[base + '|ours'][2], q.quantize(ty, x)\n",
      "    per, size = g.BLOCK[ty]\n", "    n = [0, 0, 0]\n",
      "    for k in range(len(ref) // size):\n",
      "        a, b = ours[k * size:(k + 1) * size], ref[k * size:(k + 1) * size]\n",
      "        xs = x[k * per:(k + 1) * per]\n", "        if a == b:\n", "            n[0] += 1\n",
      "        elif ty == g.MXFP4 and np.array_equal(np.abs(q.dequantize(ty, a) - xs),\n",
      "                                             np.abs(q.dequantize(ty, b) - xs)):\n",
      "            n[1] += 1\n", "        else:\n", "            n[2] += 1\n",
      "    out[base] = n\n", "print(json.dumps(out))\n");
  moe::testing::WriteText(dir.Sub("compare.py"), script);
  int code = -1;
  const std::string out = Capture(
      absl::StrCat("/usr/bin/python3 ", dir.Sub("compare.py"), " ", dir.Sub("segments.safetensors")),
      &code);
  EXPECT_EQ(code, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

// Every block equal to the reference's, or (MXFP4) as near.
void ExpectReferenceBlocks(const std::vector<Segment>& segments, const nlohmann::json& j) {
  for (size_t k = 0; k < segments.size(); ++k) {
    const std::string base =
        absl::StrCat(k, "|", GgufTypeName(static_cast<uint32_t>(segments[k].type)));
    ASSERT_TRUE(j.contains(base)) << base;
    const auto n = j[base].get<std::vector<int64_t>>();
    std::printf("%s (%s): %lld blocks equal to gguf_quants.py's, %lld as near\n",
                segments[k].label.c_str(), base.c_str(), static_cast<long long>(n[0]),
                static_cast<long long>(n[1]));
    EXPECT_GT(n[0], 0) << segments[k].label;
    EXPECT_EQ(n[2], 0) << segments[k].label << ": " << n[2] << " blocks differ from gguf_quants.py";
    if (segments[k].type != GgufType::kMXFP4) {
      EXPECT_EQ(n[1], 0) << segments[k].label;
    }
  }
}

// Rows of every type from QuantizeGguf: random, lopsided, tiny, an
// outlier, zeros (the blocks gguf_quants.py's self-test uses, and more).
TEST(GgufQuantizeReferenceTest, EveryTypeIsTheReferenceSchemeByteForByte) {
  moe::testing::TempDir dir;
  std::vector<Segment> segments;
  const float scales[] = {1.0f, 0.01f, 30.0f, 3e-5f};
  uint64_t state = 17;
  for (const GgufType type : {GgufType::kQ8_0, GgufType::kQ4_0, GgufType::kQ4_1, GgufType::kQ5_0,
                              GgufType::kQ5_1, GgufType::kQ4_K, GgufType::kQ5_K, GgufType::kQ6_K,
                              GgufType::kMXFP4}) {
    Segment s{std::string(GgufTypeInfoOf(type).name), type, {}, {}};
    for (int row = 0; row < 64; ++row) {
      for (int i = 0; i < 256; ++i) {
        const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
        float v = static_cast<float>((u - 0.5) * scales[row % 4]);
        if (row % 8 == 5) v = std::fabs(v);  // lopsided
        if (row % 8 == 6 && i == 9) v = 40.0f;  // an outlier
        if (row % 8 == 7) v = 0.0f;
        s.rows.push_back(v);
      }
    }
    const GgufTypeInfo& info = GgufTypeInfoOf(type);
    s.blocks.resize(s.rows.size() / info.block_elems * info.block_bytes);
    ASSERT_TRUE(QuantizeGguf(type, s.rows.data(), static_cast<int64_t>(s.rows.size()),
                             s.blocks.data())
                    .ok());
    segments.push_back(std::move(s));
  }
  const nlohmann::json j = CompareWithGgufQuants(segments, dir);
  ExpectReferenceBlocks(segments, j);
  // MXFP4's only differences here: the 8 zero rows' 64 groups' exponents.
  EXPECT_EQ(j["8|MXFP4"][1].get<int64_t>(), 64);
}

// ---------------------------------------------------------- quantized

struct QuantCase {
  const char* name;
  ModelFamily family;
  GgufFileType type;
};

void PrintTo(const QuantCase& c, std::ostream* os) { *os << c.name; }

// `family`'s tiny preset with every weight row 256 wide (K-quant blocks
// fit; the fallbacks are GgufQuantizeTest's), F32, 2 layers of 4 experts
// (deepseek: 8).
MakeModelOptions Quantable(ModelFamily family) {
  MakeModelOptions o = TinyPreset(family);
  const bool mla = family == ModelFamily::kDeepseekV2 || family == ModelFamily::kDeepseekV3;
  o.dtype = DType::kF32;
  o.layers = 2;
  o.hidden = 256;
  o.heads = 4;
  o.kv_heads = mla ? 4 : 2;
  o.head_dim = 64;
  o.experts = mla ? 8 : 4;  // deepseek's 4 groups of 2 (noaux_tc takes 2 a group)
  o.top_k = 2;
  o.intermediate = o.moe_intermediate = o.shared_intermediate = 256;
  if (mla) o.mla = {family == ModelFamily::kDeepseekV3 ? 256 : 0, 256, 32, 32, 64};
  o.mlp_only_layers.clear();
  o.seed = 9;
  return o;
}

// Per weight, relative to its row's max |w|: common/gguf_quantize.h's
// schemes (gguf_writer_test.cc derives them).
double BoundOf(GgufType t) {
  switch (t) {
    case GgufType::kQ8_0: return 1.0 / 127;
    case GgufType::kQ4_0: return 1.0 / 8 + 1e-3;
    case GgufType::kQ5_0: return 1.0 / 16 + 1e-3;
    case GgufType::kQ4_1: return 1.0 / 15 + 1e-3;
    case GgufType::kQ5_1: return 1.0 / 31 + 1e-3;
    case GgufType::kQ4_K: return 0.1;
    case GgufType::kQ5_K: return 0.06;
    case GgufType::kQ6_K: return 0.05;
    default: return 0;
  }
}

// A view's weights as floats (its GGUF blocks through gguf_blocks.h).
std::vector<float> Floats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  if (std::optional<GgufType> t = GgufTypeOfDType(v.dtype); t.has_value()) {
    EXPECT_TRUE(DequantizeGguf(*t, v.data, v.numel(), out.data()).ok());
  } else if (v.shape.size() == 1) {
    EXPECT_TRUE(ConvertVectorView(v, out.data()).ok());
  } else {
    EXPECT_TRUE(ConvertWeightView(v, DType::kF32, out.data()).ok());
  }
  return out;
}

class GgufMakeModelQuantTest : public ::testing::TestWithParam<QuantCase> {
 protected:
  void SetUp() override {
    options_ = Quantable(GetParam().family);
    folder_ = dir_.Sub("hf");
    gguf_ = dir_.Sub(GgufModelFileName(GetParam().type));
    const absl::Status made = MakeModel(options_, folder_);
    ASSERT_TRUE(made.ok()) << made;
    absl::Status s = MakeGgufModel(options_, GetParam().type, gguf_);
    ASSERT_TRUE(s.ok()) << s;
  }

  moe::testing::TempDir dir_;
  MakeModelOptions options_;
  std::string folder_, gguf_;
};

// Every tensor is the folder's: blocks within the scheme's bound, F32 ones
// exactly; the experts and matrices are in the file type's blocks; the
// model runs.
TEST_P(GgufMakeModelQuantTest, LoadsAndDecodesToTheFoldersWeights) {
  auto g = ModelDescription::Open(gguf_);
  ASSERT_TRUE(g.ok()) << g.status();
  auto f = ModelDescription::Open(folder_);
  ASSERT_TRUE(f.ok()) << f.status();
  const ModelConfig& c = g->config();
  ExpectSameConfig(c, f->config());
  std::map<std::string, double> worst;  // per ggml type
  for (const TensorSpec& spec : g->specs()) {
    SCOPED_TRACE(spec.name);
    absl::StatusOr<TensorView> gv, fv;
    if (IsExpertRole(spec.role)) {
      const int ml = c.MoeLayerIndex(spec.layer);
      gv = g->Expert(ml, spec.expert, spec.role);
      fv = f->Expert(ml, spec.expert, spec.role);
    } else {
      gv = g->Dense(spec.role, spec.layer);
      fv = f->Dense(spec.role, spec.layer);
    }
    ASSERT_TRUE(gv.ok() && fv.ok());
    const std::vector<float> got = Floats(*gv), want = Floats(*fv);
    ASSERT_EQ(got.size(), want.size());
    const std::optional<GgufType> type = GgufTypeOfDType(gv->dtype);
    if (!type.has_value()) {
      EXPECT_EQ(gv->dtype, DType::kF32);
      EXPECT_EQ(got, want);
      continue;
    }
    const int64_t cols = gv->shape.back();
    double& w = worst[GgufTypeName(static_cast<uint32_t>(*type))];
    for (size_t r = 0; r < got.size() / cols; ++r) {
      double row_max = 0, err = 0;
      for (int64_t i = 0; i < cols; ++i) {
        row_max = std::max(row_max, std::fabs(double{want[r * cols + i]}));
        err = std::max(err, std::fabs(double{got[r * cols + i]} - want[r * cols + i]));
      }
      w = std::max(w, err / row_max);
      ASSERT_LE(err, BoundOf(*type) * row_max) << "row " << r;
    }
  }
  for (const auto& [t, w] : worst) std::printf("[%s] %s: max error %.4f of the row's max\n",
                                               GetParam().name, t.c_str(), w);
  // The experts and the matrices are in the file type's blocks.
  const GgufType want = GgufTensorTypeFor(GetParam().type, GgufTensorKind::kExperts,
                                          "blk.0.ffn_gate_exps.weight", 256);
  EXPECT_EQ(g->expert_dtypes(0).gate, *HeldDTypeOfGguf(want));
  auto o = g->Dense(TensorRole::kOProj, 1);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->dtype, *HeldDTypeOfGguf(GgufTensorTypeFor(GetParam().type, GgufTensorKind::kMatrix,
                                                         "blk.1.attn_output.weight", 256)));
  const ModelRun run = RunModel(gguf_, 4);
  ASSERT_EQ(run.tokens.size(), 4u);
  for (float l : run.logits) ASSERT_TRUE(std::isfinite(l));
}

// The reference converter, given the types we chose (--experts, --dense,
// --tensor-type), writes our file: names, types, dims, bytes, keys. It
// quantizes the dense matrices to one type a run, so a file of several
// (q4_k_m) is compared over several runs. gpt_oss's experts, which it
// leaves as they are, are compared with gguf_quants.py block by block.
TEST_P(GgufMakeModelQuantTest, IsWhatTheReferenceConverterWrites) {
  auto ours = GgufFile::Open(gguf_);
  ASSERT_TRUE(ours.ok()) << ours.status();
  const bool gpt_oss = GetParam().family == ModelFamily::kGptOss;
  auto is_expert = [](const GgufTensorInfo& t) { return absl::EndsWith(t.name, "_exps.weight"); };
  std::string experts_args;
  std::set<GgufType> dense;
  GgufType base = GgufType::kF32;
  for (const GgufTensorInfo& t : (*ours)->tensors()) {
    if (is_expert(t) && base == GgufType::kF32) base = t.type;
    if (!is_expert(t) && t.type != GgufType::kF32) dense.insert(t.type);
  }
  const auto name = [](GgufType t) { return GgufTypeName(static_cast<uint32_t>(t)); };
  if (!gpt_oss) {
    experts_args = " --experts " + name(base);
    for (const GgufTensorInfo& t : (*ours)->tensors()) {
      if (is_expert(t) && t.type != base) absl::StrAppend(&experts_args, " --tensor-type ", t.name, "=", name(t.type));
    }
  }
  std::set<std::string> compared;
  for (const GgufType d : dense) {
    SCOPED_TRACE(name(d));
    const std::string ref_path = dir_.Sub("ref_" + name(d) + ".gguf");
    ASSERT_EQ(Shell(absl::StrCat("/usr/bin/python3 ", kReference, "/hf_to_gguf.py ", folder_, " ",
                                 ref_path, experts_args, " --dense ", name(d))),
              0);
    auto ref = GgufFile::Open(ref_path);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(Names(**ours), Names(**ref));
    ExpectReferenceKeys(**ours, **ref);
    for (const GgufTensorInfo& t : (*ours)->tensors()) {
      if (is_expert(t) ? gpt_oss : (t.type != d && t.type != GgufType::kF32)) continue;
      ExpectSameTensor(**ours, **ref, t);
      compared.insert(t.name);
    }
  }
  std::vector<Segment> segments;
  auto f = ModelDescription::Open(folder_);
  ASSERT_TRUE(f.ok());
  for (const GgufTensorInfo& t : (*ours)->tensors()) {
    if (compared.count(t.name) != 0) continue;
    // Only gpt_oss's experts are left: layer 0's go to gguf_quants.py.
    ASSERT_TRUE(gpt_oss && is_expert(t)) << t.name << " was not compared";
    if (!absl::StartsWith(t.name, "blk.0.")) continue;
    const TensorRole role = absl::StrContains(t.name, "gate") ? TensorRole::kExpertGate
                            : absl::StrContains(t.name, "up") ? TensorRole::kExpertUp
                                                              : TensorRole::kExpertDown;
    Segment s{t.name, t.type, {}, {}};
    for (int e = 0; e < f->config().num_experts; ++e) {
      auto v = f->Expert(0, e, role);
      ASSERT_TRUE(v.ok());
      const std::vector<float> rows = Floats(*v);
      s.rows.insert(s.rows.end(), rows.begin(), rows.end());
    }
    auto bytes = (*ours)->Data(t);
    s.blocks.assign(bytes.begin(), bytes.end());
    segments.push_back(std::move(s));
  }
  EXPECT_EQ(segments.size(), gpt_oss ? 3u : 0u);
  if (!segments.empty()) ExpectReferenceBlocks(segments, CompareWithGgufQuants(segments, dir_));
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgufMakeModelQuantTest,
    ::testing::Values(QuantCase{"MixtralQ8_0", ModelFamily::kMixtral, GgufFileType::kQ8_0},
                      QuantCase{"Qwen2MoeQ4_0", ModelFamily::kQwen2Moe, GgufFileType::kQ4_0},
                      QuantCase{"Qwen3MoeQ4_1", ModelFamily::kQwen3Moe, GgufFileType::kQ4_1},
                      QuantCase{"OlmoeQ5_0", ModelFamily::kOlmoe, GgufFileType::kQ5_0},
                      QuantCase{"Glm4MoeQ5_1", ModelFamily::kGlm4Moe, GgufFileType::kQ5_1},
                      QuantCase{"DeepseekV3Q4_K", ModelFamily::kDeepseekV3, GgufFileType::kQ4_K},
                      QuantCase{"DeepseekV2Q5_K", ModelFamily::kDeepseekV2, GgufFileType::kQ5_K},
                      QuantCase{"MixtralQ6_K", ModelFamily::kMixtral, GgufFileType::kQ6_K},
                      QuantCase{"MixtralQ4_K_M", ModelFamily::kMixtral, GgufFileType::kQ4_K_M},
                      QuantCase{"Qwen2MoeQ4_K_M", ModelFamily::kQwen2Moe, GgufFileType::kQ4_K_M},
                      QuantCase{"GptOssQ8_0", ModelFamily::kGptOss, GgufFileType::kQ8_0},
                      QuantCase{"GptOssQ4_K", ModelFamily::kGptOss, GgufFileType::kQ4_K}),
    [](const ::testing::TestParamInfo<QuantCase>& i) { return std::string(i.param.name); });

// Tiny models' rows of 64: the K-quants fall back to llama.cpp's 32-weight
// types, the file loads.
TEST(GgufMakeModelFallbackTest, NarrowRowsTakeTheFallbackTypes) {
  moe::testing::TempDir dir;
  const MakeModelOptions o = Tiny(ModelFamily::kQwen3Moe, DType::kF32);
  ASSERT_TRUE(MakeGgufModel(o, GgufFileType::kQ4_K_M, dir.Sub("m.gguf")).ok());
  auto d = ModelDescription::Open(dir.Sub("m.gguf"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->expert_dtypes(0), (ExpertDTypes{DType::kQ5_0, DType::kQ5_0, DType::kQ8}));
  auto file = GgufFile::Open(dir.Sub("m.gguf"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find("output.weight")->type, GgufType::kQ8_0);
  EXPECT_EQ((*file)->Find("blk.0.ffn_gate_inp.weight")->type, GgufType::kF32);
  EXPECT_EQ((*file)->Find("blk.0.attn_q_norm.weight")->type, GgufType::kF32);
  EXPECT_EQ(RunModel(dir.Sub("m.gguf"), 2).tokens.size(), 2u);
}

// ---------------------------------------------------------------- moectl

TEST(MoectlMakeModelGgufTest, WritesWhatTheLibraryWrites) {
  moe::testing::TempDir dir;
  int code = -1;
  const std::string out = Capture(
      absl::StrCat(kMoectl, " make-model --arch gpt_oss --seed 5 --gguf MXFP4 --out ", dir.Sub("m")),
      &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("wrote ", dir.Sub("m/model-mxfp4.gguf"), ": gpt_oss")),
            std::string::npos)
      << out;
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);  // make-model's bf16 default
  o.seed = 5;
  ASSERT_TRUE(MakeGgufModel(o, GgufFileType::kMxfp4, dir.Sub("lib.gguf")).ok());
  auto a = ReadFileToString(dir.Sub("m/model-mxfp4.gguf"));
  auto b = ReadFileToString(dir.Sub("lib.gguf"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b) << "the CLI's file differs from the library's";
  // And again: the same bytes (a pure function of the options).
  ASSERT_TRUE(MakeGgufModel(o, GgufFileType::kMxfp4, dir.Sub("again.gguf")).ok());
  EXPECT_TRUE(*ReadFileToString(dir.Sub("again.gguf")) == *b);
}

TEST(MoectlMakeModelGgufTest, RefusalsSayWhy) {
  struct Refusal {
    const char* args;
    const char* says;
  };
  const Refusal refusals[] = {
      {"--gguf q3_k", "--gguf must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, "
                      "q5_k, q6_k, q4_k_m, mxfp4, got 'q3_k'"},
      {"--arch mixtral --gguf mxfp4", "--gguf mxfp4 applies to gpt_oss's experts only"},
      {"--arch gpt_oss --expert-format mxfp4 --gguf q8_0",
       "--gguf q8_0 quantizes float experts; MXFP4 experts are written by --gguf mxfp4"},
      {"--arch qwen3_moe --mlp-only-layers 1 --gguf q8_0", "--gguf: dense qwen layers"},
      {"--arch qwen2_moe --norm-topk-prob --gguf f32",
       "--gguf: renormalised top-k weights (norm_topk_prob) (no form in llama.cpp's qwen2moe"},
      {"--expert-format fp8 --gguf q8_0", "--gguf: FP8 weights"},
      {"--gguf f32 --shards 2", "--shards applies to the folder"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.args);
    moe::testing::TempDir dir;
    int code = -1;
    const std::string out = Capture(
        absl::StrCat(kMoectl, " make-model ", r.args, " --out ", dir.Sub("m")), &code);
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find(absl::StrCat("moectl make-model: ", r.says)), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir.Sub("m"))) << "nothing is written";
  }
}

}  // namespace
}  // namespace moe
