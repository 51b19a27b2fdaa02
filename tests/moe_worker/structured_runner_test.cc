// Structured output through the serving path every transport shares
// (GenerationRunner, as gRPC Generate and the HTTP API submit): a request's
// json_schema constrains what the engine samples, greedy or seeded, alone or
// batched (the same tokens either way); the value ends the sequence when
// complete, eos is allowed only then; bad schemas are refused naming the
// field; and TokenBytes spells each token as it reads mid-text (issue 27).
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/in_memory_provider.h"
#include "services/engine/tokenizer.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/worker_metrics.h"
#include "services/serving/structured_output.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::RecordingSink;
using Json = nlohmann::json;

constexpr char kPerson[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", 7]}, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age", "tags", "ok"],
  "additionalProperties": false
})";

// kPerson checked by hand on the parsed value (independent of the grammar).
bool IsPerson(const std::string& text) {
  const Json v = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!v.is_object() || v.size() != 4) return false;
  for (const char* k : {"name", "age", "tags", "ok"}) {
    if (!v.contains(k)) return false;
  }
  if (!v["name"].is_string()) return false;
  const std::string name = v["name"].get<std::string>();
  size_t code_points = 0;
  for (unsigned char c : name) code_points += (c & 0xC0) != 0x80;
  if (code_points < 1 || code_points > 8) return false;
  if (!v["age"].is_number_integer() || v["age"].get<int64_t>() < 0 ||
      v["age"].get<int64_t>() > 120) {
    return false;
  }
  if (!v["tags"].is_array() || v["tags"].size() > 3) return false;
  for (const Json& t : v["tags"]) {
    if (t != "red" && t != "green" && t != 7) return false;
  }
  return v["ok"].is_boolean();
}

class StructuredRunnerTest : public testing::TinyRunnerTest {
 protected:
  static v1::GenerateRequest Request(const std::string& schema, int n = 400) {
    v1::GenerateRequest r;
    for (int32_t id : {5, 17, 300, 42, 5, 17}) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    r.set_json_schema(schema);
    return r;
  }

  std::string Text(RecordingSink& sink) {
    std::string text;
    for (const auto& r : sink.responses()) text += r.text();
    return text;
  }
};

TEST_F(StructuredRunnerTest, GreedyAndSampledOutputsMatchTheSchemaAndEndThemselves) {
  auto runner = MakeRunner();
  // Unconstrained, the model writes no JSON at all.
  v1::GenerateRequest free = Request("", 40);
  EXPECT_FALSE(IsPerson(Text(*Run(*runner, {free})[0])));
  for (uint64_t seed : {0, 1, 2, 3, 4, 5}) {
    v1::GenerateRequest r = Request(kPerson);
    if (seed > 0) {
      r.set_temperature(1.0f);
      r.set_seed(seed);
    }
    auto sink = Run(*runner, {r})[0];
    const std::string text = Text(*sink);
    EXPECT_TRUE(IsPerson(text)) << "seed " << seed << ": " << text;
    // Ended by the constraint (eos is ignored here), not by the length.
    EXPECT_EQ(sink->responses().back().finish_reason(), "stop") << text;
    EXPECT_LT(sink->responses().size(), 400u);
  }
}

TEST_F(StructuredRunnerTest, EosIsAllowedOnlyOnceTheValueIsComplete) {
  ASSERT_FALSE(model_->config().eos_token_ids.empty());
  const int32_t eos = static_cast<int32_t>(model_->config().eos_token_ids[0]);
  v1::GenerateRequest r = Request(R"({"type": "integer"})", 30);
  r.set_ignore_eos(false);
  (*r.mutable_logit_bias())[eos] = 100.0f;  // eos whenever it may come
  auto runner = MakeRunner();
  auto sink = Run(*runner, {r})[0];
  auto out = sink->responses();
  ASSERT_GE(out.size(), 2u);
  EXPECT_EQ(out.back().token_id(), eos);
  EXPECT_EQ(out.back().finish_reason(), "stop");
  const std::string text = Text(*sink);
  const Json v = Json::parse(text, nullptr, false);
  EXPECT_TRUE(v.is_number_integer()) << text;
  for (size_t i = 0; i + 1 < out.size(); ++i) EXPECT_NE(out[i].token_id(), eos) << i;
}

TEST_F(StructuredRunnerTest, BatchedEqualsAlone) {
  std::vector<v1::GenerateRequest> rs;
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest r = Request(i % 2 == 0 ? kPerson : R"({"type": "array",
        "items": {"type": "number"}, "minItems": 2, "maxItems": 4})");
    r.set_temperature(0.9f);
    r.set_top_k(40);
    r.set_seed(500 + i);
    rs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  {
    auto runner = MakeRunner();
    for (const auto& r : rs) alone.push_back(Run(*runner, {r})[0]->tokens());
  }
  auto runner = MakeRunner(/*max_batch=*/4);
  auto batched = Run(*runner, rs);
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(batched[i]->tokens(), alone[i]) << i;
    if (i % 2 == 0) {
      EXPECT_TRUE(IsPerson(Text(*batched[i]))) << Text(*batched[i]);
    }
  }
}

TEST_F(StructuredRunnerTest, BadSchemasAreRefusedNamingTheField) {
  auto runner = MakeRunner();
  auto sink = std::make_shared<RecordingSink>();
  for (const char* bad : {R"({"type": "string", "pattern": "a+"})", "{not json",
                          R"({"type": "integer", "minimum": 5, "maximum": 1})"}) {
    absl::Status s = runner->Submit(Request(bad), absl::InfiniteFuture(), sink);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(serving::FieldOf(s), "json_schema") << bad;
  }
  absl::Status s = runner->Submit(Request(R"({"pattern": "x", "type": "string"})"),
                                  absl::InfiniteFuture(), sink);
  EXPECT_NE(s.message().find("pattern"), std::string::npos) << s;
  EXPECT_EQ(sink->finishes(), 0);
}

TEST_F(StructuredRunnerTest, TokenBytesSpellTheTextTheTokensEncode) {
  const std::vector<std::string> bytes = serving::TokenBytes(*tokenizer_);
  ASSERT_EQ(bytes.size(), static_cast<size_t>(tokenizer_->vocab_size()));
  for (const std::string text :
       {"{\"a\": [1, 2.5e3, true, null]}", " leading space", "caf\xc3\xa9 \xe2\x82\xac 42",
        "tabs\tand\nnewlines"}) {
    std::string spelled;
    for (int32_t id : tokenizer_->Encode(text)) spelled += bytes[id];
    EXPECT_EQ(spelled, text);
  }
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (tokenizer_->IsSpecial(id)) {
      EXPECT_TRUE(bytes[id].empty()) << id;
    }
  }
}

}  // namespace
}  // namespace moe::worker
