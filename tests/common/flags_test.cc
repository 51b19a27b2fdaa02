// Tests services/moectl/flags.{h,cc}, moectl's face of common/flags.h
// (compiled into this test directly: moectl is an executable, not a
// library).
#include "services/moectl/flags.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::moectl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

FlagSet MakeFlags() {
  FlagSet f("demo", "[flags] FILE...");
  f.String("out", "", "output");
  f.Int("layers", 4, "layers");
  f.Double("rate", 1.5, "rate");
  f.Bool("verbose", false, "chatty");
  return f;
}

std::string Error(const std::vector<std::string>& args) {
  FlagSet f = MakeFlags();
  absl::Status s = f.Parse(args);
  EXPECT_FALSE(s.ok());
  return std::string(s.message());
}

TEST(FlagsTest, DefaultsWhenAbsent) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({}).ok());
  EXPECT_EQ(f.GetString("out"), "");
  EXPECT_EQ(f.GetInt("layers"), 4);
  EXPECT_EQ(f.GetDouble("rate"), 1.5);
  EXPECT_FALSE(f.GetBool("verbose"));
  EXPECT_FALSE(f.IsSet("layers"));
  EXPECT_FALSE(f.help());
  EXPECT_THAT(std::string(f.Require("out").message()),
              HasSubstr("--out is required"));
}

TEST(FlagsTest, BothSpellingsAndPositionals) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"a.txt", "--out", "/tmp/x", "--layers=-3", "--rate",
                       "2e-3", "--verbose", "-", "-7", "--", "--not-a-flag"})
                  .ok());
  EXPECT_EQ(f.GetString("out"), "/tmp/x");
  EXPECT_EQ(f.GetInt("layers"), -3);
  EXPECT_DOUBLE_EQ(f.GetDouble("rate"), 2e-3);
  EXPECT_TRUE(f.GetBool("verbose"));
  EXPECT_TRUE(f.IsSet("out"));
  EXPECT_TRUE(f.Require("out").ok());
  EXPECT_THAT(f.positional(), ElementsAre("a.txt", "-", "-7", "--not-a-flag"));
}

TEST(FlagsTest, BoolValues) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--verbose=false", "file"}).ok());
  EXPECT_FALSE(f.GetBool("verbose"));
  EXPECT_TRUE(f.IsSet("verbose"));
  EXPECT_THAT(f.positional(), ElementsAre("file"));  // bools never eat a value
}

TEST(FlagsTest, Help) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.help());
  std::string u = f.Usage();
  EXPECT_THAT(u, HasSubstr("usage: moectl demo [flags] FILE..."));
  EXPECT_THAT(u, HasSubstr("--layers V"));
  EXPECT_THAT(u, HasSubstr("(default 4)"));
  FlagSet g = MakeFlags();
  ASSERT_TRUE(g.Parse({"-h"}).ok());
  EXPECT_TRUE(g.help());
}

TEST(FlagsTest, Errors) {
  EXPECT_THAT(Error({"--nope"}), HasSubstr("unknown flag --nope"));
  EXPECT_THAT(Error({"--nope=3"}), HasSubstr("unknown flag --nope"));
  EXPECT_THAT(Error({"-x"}), HasSubstr("unknown flag '-x'"));
  EXPECT_THAT(Error({"--layers"}), HasSubstr("--layers needs a value"));
  EXPECT_THAT(Error({"--layers", "four"}),
              HasSubstr("--layers expects an integer, got 'four'"));
  EXPECT_THAT(Error({"--layers=4.5"}), HasSubstr("expects an integer"));
  EXPECT_THAT(Error({"--rate=fast"}), HasSubstr("--rate expects a number"));
  EXPECT_THAT(Error({"--verbose=maybe"}), HasSubstr("true or false"));
  EXPECT_THAT(Error({"--out", "a", "--out=b"}), HasSubstr("--out given more than once"));
}

TEST(FlagsTest, IntLists) {
  auto l = ParseIntList("0,3,12");
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(*l, ElementsAre(0, 3, 12));
  EXPECT_TRUE(ParseIntList("")->empty());
  EXPECT_FALSE(ParseIntList("1,,2").ok());
  EXPECT_FALSE(ParseIntList("1,x").ok());
}

TEST(FlagsDeathTest, UndeclaredOrMistypedGetIsAProgrammingError) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({}).ok());
  EXPECT_DEATH(f.GetInt("missing"), "undeclared flag --missing");
  EXPECT_DEATH(f.GetInt("out"), "wrong type");
}

}  // namespace
}  // namespace moe::moectl
