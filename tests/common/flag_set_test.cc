// Tests common/flags.{h,cc}: the parser behind every binary's flags.
#include "common/flags.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::flags {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

FlagSet MakeFlags() {
  FlagSet f("prog", "--out FILE [flags] ARG...");
  f.String("out", "", "output file");
  f.StringList("listen", "address to serve on");
  f.Group("numbers");
  f.Int("count", 4, "how many", {.min = 1, .max = 64});
  f.Int("free", -2, "any integer");
  f.Double("rate", 0.5, "a fraction", {.min = 0, .max = 1, .min_exclusive = true});
  f.Double("gflops", 100, "kernel speed", {.min = 0});
  f.Group("other");
  f.Bool("json", false, "print JSON");
  f.Size("budget", 512 * kMiB, "memory to use", {.min = 1});
  f.Size("kv-mb", 0, "KV cache", {.unit = kMiB, .min = 1, .max = kTiB});
  f.Choice("device", "auto", {"cpu", "cuda", "auto"}, "where to compute");
  f.Alias("backend", "device");
  return f;
}

std::string Error(const std::vector<std::string>& args) {
  FlagSet f = MakeFlags();
  absl::Status s = f.Parse(args);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << testing::PrintToString(args);
  return std::string(s.message());
}

TEST(FlagSetTest, DefaultsWhenAbsent) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({}).ok());
  EXPECT_EQ(f.GetString("out"), "");
  EXPECT_THAT(f.GetList("listen"), IsEmpty());
  EXPECT_EQ(f.GetInt("count"), 4);
  EXPECT_EQ(f.GetInt("free"), -2);
  EXPECT_EQ(f.GetDouble("rate"), 0.5);
  EXPECT_FALSE(f.GetBool("json"));
  EXPECT_EQ(f.GetSize("budget"), 512 * kMiB);
  EXPECT_EQ(f.GetString("device"), "auto");
  EXPECT_FALSE(f.IsSet("count"));
  EXPECT_EQ(f.Spelling("device"), "--device");
  EXPECT_THAT(std::string(f.Require("out").message()), HasSubstr("--out is required"));
  EXPECT_THAT(f.warnings(), IsEmpty());
}

TEST(FlagSetTest, BothSpellingsEveryTypeAndPositionals) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"a", "--out", "-", "--count=64", "--free", "-9", "--rate", "1",
                       "--gflops=0", "--json", "--budget", "24G", "--kv-mb=0.25",
                       "--device", "CUDA", "-7", "--listen", "x", "--listen=", "--", "--json"})
                  .ok());
  EXPECT_EQ(f.GetString("out"), "-");  // a value is taken as is
  EXPECT_EQ(f.GetInt("count"), 64);
  EXPECT_EQ(f.GetInt("free"), -9);
  EXPECT_EQ(f.GetDouble("rate"), 1.0);
  EXPECT_EQ(f.GetDouble("gflops"), 0.0);
  EXPECT_TRUE(f.GetBool("json"));
  EXPECT_EQ(f.GetSize("budget"), 24 * kGiB);
  EXPECT_EQ(f.GetSize("kv-mb"), 256 * kKiB);
  EXPECT_EQ(f.GetString("device"), "cuda");  // canonical spelling
  EXPECT_THAT(f.GetList("listen"), ElementsAre("x", ""));
  EXPECT_THAT(f.positional(), ElementsAre("a", "-7", "--json"));
}

TEST(FlagSetTest, BoolValuesNeverEatTheNextArgument) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--json=false", "file"}).ok());
  EXPECT_FALSE(f.GetBool("json"));
  EXPECT_TRUE(f.IsSet("json"));
  EXPECT_THAT(f.positional(), ElementsAre("file"));
  EXPECT_THAT(Error({"--json=maybe"}), HasSubstr("--json expects true or false, got 'maybe'"));
}

TEST(FlagSetTest, IntBounds) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--count", "1"}).ok());
  EXPECT_EQ(f.GetInt("count"), 1);
  EXPECT_THAT(Error({"--count", "0"}),
              HasSubstr("--count expects an integer in [1, 64], got '0'"));
  EXPECT_THAT(Error({"--count=65"}), HasSubstr("in [1, 64]"));
  EXPECT_THAT(Error({"--count=2.5"}), HasSubstr("--count expects an integer"));
  EXPECT_THAT(Error({"--count="}), HasSubstr("got ''"));
  EXPECT_THAT(Error({"--free=99999999999999999999"}), HasSubstr("--free expects an integer"));
}

TEST(FlagSetTest, DoubleBounds) {
  EXPECT_THAT(Error({"--rate", "0"}), HasSubstr("--rate expects a number in (0, 1], got '0'"));
  EXPECT_THAT(Error({"--rate", "1.01"}), HasSubstr("(0, 1]"));
  EXPECT_THAT(Error({"--rate", "nan"}), HasSubstr("--rate"));
  EXPECT_THAT(Error({"--gflops", "inf"}), HasSubstr("--gflops expects a number >= 0"));
  EXPECT_THAT(Error({"--gflops", "-1"}), HasSubstr("--gflops expects a number >= 0"));
  EXPECT_THAT(Error({"--gflops", "fast"}), HasSubstr("got 'fast'"));
}

TEST(FlagSetTest, SizeSuffixesAreBinary) {
  EXPECT_EQ(*ParseSize("0"), 0);
  EXPECT_EQ(*ParseSize("4096"), 4096);
  EXPECT_EQ(*ParseSize("512K"), 512 * kKiB);
  EXPECT_EQ(*ParseSize("512k"), 512 * kKiB);
  EXPECT_EQ(*ParseSize("512M"), 512 * kMiB);
  EXPECT_EQ(*ParseSize("24G"), 24 * kGiB);
  EXPECT_EQ(*ParseSize("24GiB"), 24 * kGiB);
  EXPECT_EQ(*ParseSize("24gib"), 24 * kGiB);
  EXPECT_EQ(*ParseSize("2T"), 2 * kTiB);
  EXPECT_EQ(*ParseSize("3TiB"), 3 * kTiB);
  EXPECT_EQ(*ParseSize("1.5G"), 3 * (kGiB / 2));
  EXPECT_EQ(*ParseSize("0.5K"), 512);
  EXPECT_EQ(*ParseSize("3", kMiB), 3 * kMiB);
  EXPECT_EQ(*ParseSize("3K", kMiB), 3 * kKiB);  // a suffix overrides the unit
  for (const char* bad : {"", "G", "-1", "-1G", "1.2.3", ".", "12X", "1 G", "0x10", "1e3"}) {
    EXPECT_FALSE(ParseSize(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseSize("24GB").status().message()), HasSubstr("ambiguous"));
  EXPECT_THAT(std::string(ParseSize("24mb").status().message()), HasSubstr("ambiguous"));
}

TEST(FlagSetTest, SizeOverflowIsAnError) {
  EXPECT_EQ(*ParseSize("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(ParseSize("9223372036854775808").ok());
  EXPECT_FALSE(ParseSize("99999999999999999999999").ok());
  EXPECT_EQ(*ParseSize("8388607T"), 8388607 * kTiB);
  EXPECT_FALSE(ParseSize("8388608T").ok());  // 2^63
  EXPECT_FALSE(ParseSize("8388608.0T").ok());
  EXPECT_FALSE(ParseSize("9007199254740993", kTiB).ok());
  EXPECT_THAT(std::string(ParseSize("8388608T").status().message()), HasSubstr("too large"));
}

TEST(FlagSetTest, SizeFlagBoundsAndFormat) {
  EXPECT_THAT(Error({"--budget", "0"}), HasSubstr("--budget expects a size"));
  EXPECT_THAT(Error({"--budget", "10GB"}), HasSubstr("got '10GB'"));
  EXPECT_THAT(Error({"--kv-mb", "2T"}), HasSubstr("<= 1TiB"));
  EXPECT_EQ(FormatSize(512 * kMiB), "512MiB");
  EXPECT_EQ(FormatSize(24 * kGiB), "24GiB");
  EXPECT_EQ(FormatSize(3 * kKiB), "3KiB");
  EXPECT_EQ(FormatSize(1536), "1536");
  EXPECT_EQ(FormatSize(0), "0");
  EXPECT_EQ(FormatSize(1000), "1000");
}

TEST(FlagSetTest, ChoicesIgnoreCaseAndListTheOptions) {
  EXPECT_THAT(Error({"--device", "tpu"}),
              HasSubstr("--device expects cpu, cuda or auto, got 'tpu'"));
}

TEST(FlagSetTest, EveryFlagOnceOnlyListsRepeat) {
  EXPECT_THAT(Error({"--out", "a", "--out=b"}), HasSubstr("--out given more than once"));
  EXPECT_THAT(Error({"--json", "--json"}), HasSubstr("--json given more than once"));
  EXPECT_THAT(Error({"--count=1", "--count", "1"}), HasSubstr("--count given more than once"));
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--listen=a", "--listen", "b", "--listen", "a"}).ok());
  EXPECT_THAT(f.GetList("listen"), ElementsAre("a", "b", "a"));
}

TEST(FlagSetTest, AliasesWorkAndWarn) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({"--backend", "cpu"}).ok());
  EXPECT_EQ(f.GetString("device"), "cpu");
  EXPECT_TRUE(f.IsSet("device"));
  EXPECT_EQ(f.Spelling("device"), "--backend");
  EXPECT_THAT(f.warnings(), ElementsAre("--backend is deprecated; use --device"));
  // Errors name the spelling the user gave.
  EXPECT_THAT(Error({"--backend=tpu"}), HasSubstr("--backend expects cpu, cuda or auto"));
  // The alias and the name are one flag.
  EXPECT_THAT(Error({"--backend", "cpu", "--device", "cpu"}),
              HasSubstr("--device given more than once (as --backend and --device)"));
}

TEST(FlagSetTest, SynonymsWorkWithoutWarningAndCollectIntoOneList) {
  FlagSet f("prog", "");
  f.StringList("served-model-name", "model ids");
  f.Synonym("alias", "served-model-name");
  ASSERT_TRUE(f.Parse({"--served-model-name", "a", "--alias", "b", "--alias=c"}).ok());
  EXPECT_THAT(f.GetList("served-model-name"), ElementsAre("a", "b", "c"));
  EXPECT_TRUE(f.warnings().empty());
  EXPECT_THAT(f.Usage(), HasSubstr("(also --alias)"));
  EXPECT_THAT(f.Usage(), Not(HasSubstr("old spelling")));
}

TEST(FlagSetTest, UnknownFlagsSuggestTheClosestName) {
  EXPECT_THAT(Error({"--cont", "3"}),
              HasSubstr("unknown flag --cont; did you mean --count? (see 'prog --help')"));
  EXPECT_THAT(Error({"--devise=cpu"}), HasSubstr("did you mean --device?"));
  std::string far = Error({"--zzzzzzzz"});
  EXPECT_THAT(far, HasSubstr("unknown flag --zzzzzzzz"));
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
  EXPECT_THAT(Error({"-x"}), HasSubstr("unknown flag '-x'"));
  EXPECT_THAT(Error({"--count"}), HasSubstr("--count needs a value"));
}

TEST(FlagSetTest, NoPositionalAndStopAtFirstPositional) {
  FlagSet f = MakeFlags();
  f.NoPositional();
  EXPECT_THAT(std::string(f.Parse({"--json", "stray"}).message()),
              HasSubstr("unexpected argument 'stray'"));
  FlagSet g = MakeFlags();
  g.StopAtFirstPositional();
  ASSERT_TRUE(g.Parse({"--json", "cmd", "--count", "9", "--bogus"}).ok());
  EXPECT_TRUE(g.GetBool("json"));
  EXPECT_EQ(g.GetInt("count"), 4);
  EXPECT_THAT(g.positional(), ElementsAre("cmd", "--count", "9", "--bogus"));
}

TEST(FlagSetTest, StringValidator) {
  FlagSet f("prog", "");
  f.String("level", "info", "log level", [](const std::string& v) {
    return v == "info" || v == "debug" ? absl::OkStatus()
                                       : absl::InvalidArgumentError("not a level");
  });
  ASSERT_TRUE(f.Parse({"--level=debug"}).ok());
  EXPECT_EQ(f.GetString("level"), "debug");
  FlagSet g("prog", "");
  g.String("level", "info", "log level", [](const std::string& v) {
    return v == "info" ? absl::OkStatus() : absl::InvalidArgumentError("not a level");
  });
  EXPECT_EQ(g.Parse({"--level", "loud"}).message(), "--level: not a level");
  FlagSet h("prog", "");
  h.String("level", "", "", [](const std::string&) { return absl::InvalidArgumentError("no"); });
  EXPECT_EQ(h.Parse({"--level=x"}).message(), "--level: no");
}

TEST(FlagSetTest, HelpIsGeneratedFromTheDeclarations) {
  FlagSet f = MakeFlags();
  f.Notes("Sizes take K, M, G, T.\n");
  ASSERT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.help());
  const std::string u = f.Usage();
  EXPECT_THAT(u, HasSubstr("usage: prog --out FILE [flags] ARG...\n"));
  EXPECT_THAT(u, HasSubstr("\nflags:\n  --out V"));
  EXPECT_THAT(u, HasSubstr("output file\n"));  // an empty default is not shown
  EXPECT_THAT(u, HasSubstr("address to serve on (repeatable)"));
  EXPECT_THAT(u, HasSubstr("\nnumbers:\n  --count V"));
  EXPECT_THAT(u, HasSubstr("how many (default 4)"));
  EXPECT_THAT(u, HasSubstr("\nother:\n  --json "));
  EXPECT_THAT(u, HasSubstr("--budget SIZE"));
  EXPECT_THAT(u, HasSubstr("(default 512MiB)"));
  EXPECT_THAT(u, HasSubstr("KV cache\n"));                // 0 < min: "unset", no default
  EXPECT_THAT(u, HasSubstr("print JSON\n"));              // false: no default
  EXPECT_THAT(u, HasSubstr("a fraction (default 0.5)"));
  EXPECT_THAT(u, HasSubstr("--device cpu|cuda|auto"));
  EXPECT_THAT(u, HasSubstr("where to compute (default auto) (old spelling\n"
                           "                             --backend)\n"));  // wrapped at 80
  EXPECT_THAT(u, HasSubstr("\nSizes take K, M, G, T.\n"));
  for (absl::string_view line : absl::StrSplit(u, '\n')) EXPECT_LE(line.size(), 80u) << line;
  EXPECT_EQ(f.Names().front(), "out");
  EXPECT_EQ(f.TypeOf("budget"), FlagType::kSize);
  FlagSet g = MakeFlags();
  ASSERT_TRUE(g.Parse({"-h"}).ok());
  EXPECT_TRUE(g.help());
}

TEST(FlagSetDeathTest, DeclarationAndReadMistakesAreProgrammingErrors) {
  FlagSet f = MakeFlags();
  ASSERT_TRUE(f.Parse({}).ok());
  EXPECT_DEATH(f.GetInt("missing"), "undeclared flag --missing");
  EXPECT_DEATH(f.GetInt("out"), "wrong type");
  EXPECT_DEATH(f.String("out", "", ""), "declared twice");
  EXPECT_DEATH(f.Bool("backend", false, ""), "declared twice");
  EXPECT_DEATH(f.Alias("old", "missing"), "undeclared flag --missing");
  EXPECT_DEATH(f.Choice("c", "x", {"a", "b"}, ""), "not a choice");
}

}  // namespace
}  // namespace moe::flags
