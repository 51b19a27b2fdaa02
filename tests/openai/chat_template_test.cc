// --chat-template resolution (ChatTemplate::Resolve): built-ins by name,
// files (Jinja or a tokenizer_config.json), the model's own, the ChatML
// fallback, and the errors that stop a worker at start.
#include "services/openai/chat_template.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe::openai {
namespace {

using Json = nlohmann::ordered_json;

const Json& Conversation() {
  static const Json m = Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hi"}},
                                     {{"role", "assistant"}, {"content", "Hello."}},
                                     {{"role", "user"}, {"content", "Bye"}}});
  return m;
}

class ResolveTest : public ::testing::Test {
 protected:
  void SetUp() override { WriteConfig({{"bos_token", "<s>"}, {"eos_token", "</s>"}}); }
  void WriteConfig(const Json& config) {
    moe::testing::WriteText(dir_.Sub("tokenizer_config.json"), config.dump());
  }
  absl::StatusOr<std::string> Render(const std::string& choice) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
        ChatTemplate::Resolve(choice, dir_.path(), &fallback_, &origin_);
    if (!t.ok()) return t.status();
    return (*t)->Apply(Conversation(), true);
  }

  moe::testing::TempDir dir_;
  bool fallback_ = false;
  std::string origin_;
};

TEST_F(ResolveTest, WithoutAModelTemplateFallsBackToChatMl) {
  absl::StatusOr<std::string> text = Render("");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE(fallback_);
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Render("chatml").value(), *text);
  EXPECT_FALSE(fallback_);
  EXPECT_EQ(origin_, "built-in chatml");
}

TEST_F(ResolveTest, TheModelsOwnTemplateWinsOverTheFallback) {
  WriteConfig({{"bos_token", "<s>"},
               {"chat_template", "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]"
                                 "{% endfor %}"}});
  EXPECT_EQ(Render("").value(), "<s>[Be brief.][Hi][Hello.][Bye]");
  EXPECT_FALSE(fallback_);
  // The flag wins over the model's.
  EXPECT_EQ(Render("plain").value(),
            "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:");
}

TEST_F(ResolveTest, Llama3UsesTheModelsBosToken) {
  EXPECT_EQ(Render("llama3").value(),
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_F(ResolveTest, FilesAreJinjaOrATokenizerConfig) {
  moe::testing::WriteText(dir_.Sub("t.jinja"),
                          "{% for m in messages %}{{ m['role'][0] }}{% endfor %}{{ eos_token }}");
  EXPECT_EQ(Render(dir_.Sub("t.jinja")).value(), "suau</s>");
  EXPECT_EQ(origin_, dir_.Sub("t.jinja"));
  moe::testing::WriteText(dir_.Sub("other.json"),
                          Json{{"chat_template", "{{ messages | length }}"}}.dump());
  EXPECT_EQ(Render(dir_.Sub("other.json")).value(), "4");
}

TEST_F(ResolveTest, ErrorsNameTheFlag) {
  absl::Status s = Render("nonesuch").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--chat-template nonesuch"), std::string::npos) << s;
  EXPECT_NE(s.message().find("chatml, llama3, plain"), std::string::npos) << s;
  moe::testing::WriteText(dir_.Sub("bad.jinja"), "{% for %}");
  s = Render(dir_.Sub("bad.jinja")).status();
  EXPECT_NE(s.message().find("--chat-template " + dir_.Sub("bad.jinja")), std::string::npos) << s;
  moe::testing::WriteText(dir_.Sub("empty.json"), "{}");
  EXPECT_FALSE(Render(dir_.Sub("empty.json")).ok());
}

TEST(BuiltinChatTemplatesTest, EachRendersTheProbeConversation) {
  for (const std::string& name : BuiltinChatTemplateNames()) {
    moe::testing::TempDir dir;
    bool fallback = true;
    std::string origin;
    auto t = ChatTemplate::Resolve(name, dir.path(), &fallback, &origin);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_FALSE(fallback);
    auto text = (*t)->Apply(Conversation(), true);
    ASSERT_TRUE(text.ok()) << name;
    for (const char* part : {"Be brief.", "Hi", "Hello.", "Bye"}) {
      EXPECT_NE(text->find(part), std::string::npos) << name << ": " << *text;
    }
  }
}

TEST(TrainedModelTemplateTest, WritesTheConversationAsVerses) {
  auto t = ChatTemplate::FromModelDir(std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->Apply(Conversation(), true).value(),
            "Be brief.\nAnd he said unto him, Hi\nAnd he answered and said, Hello.\n"
            "And he said unto him, Bye\nAnd he answered and said,");
}

}  // namespace
// A GGUF file's tokenizer.chat_template is the model's own template (the
// trained model converted by tests/reference/hf_to_gguf.py).
TEST(GgufChatTemplateTest, TheFilesTemplateIsTheModelsOwn) {
  moe::testing::TempDir dir;
  const std::string folder = std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe";
  const std::string gguf = dir.Sub("kjv.gguf");
  const std::string cmd = "/usr/bin/python3 " + std::string(MOE_SOURCE_DIR) +
                          "/tests/reference/hf_to_gguf.py " + folder + " " + gguf;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  bool fallback = true;
  std::string origin;
  auto from_file = ChatTemplate::Resolve("", gguf, &fallback, &origin);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_FALSE(fallback);
  EXPECT_EQ(origin, gguf + " (tokenizer.chat_template)");
  auto from_folder = ChatTemplate::FromModelDir(folder);
  ASSERT_TRUE(from_folder.ok() && *from_folder != nullptr);
  const Json messages = Json::array({{{"role", "user"}, {"content", "Who made the earth?"}},
                                     {{"role", "assistant"}, {"content", "God."}},
                                     {{"role", "user"}, {"content", "When?"}}});
  EXPECT_EQ((*from_file)->Apply(messages, true).value(),
            (*from_folder)->Apply(messages, true).value());
}

}  // namespace moe::openai
