// The broken-scenario corpus (tests/scenarios/broken/*.toml): every file is a small scenario broken
// in exactly one way. Its first line "# expect: <substring>" names a substring the error must
// contain; files that cannot carry that line (empty, whitespace-only, binary) are in kNoHeader below.
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/rules.hpp"

namespace threewalls::scenarios {
namespace {

using testing::read_file;
using testing::source_dir;

std::filesystem::path corpus_dir() { return source_dir() / "tests/scenarios/broken"; }

// Expectations for corpus files whose first line cannot be "# expect: ...".
// garbage_binary.toml: 512 random bytes, Python `random.Random(20261101)`, byte i = randrange(256);
// the first NUL is at offset 15, i.e. line 1, column 16.
const std::map<std::string, std::string> kNoHeader = {
    {"empty.toml", "the file is empty"},
    {"whitespace_only.toml", "the file is empty"},
    {"garbage_binary.toml", ":1:16: not a TOML text file (contains a NUL byte)"},
};

std::string expectation(const std::filesystem::path& file) {
  if (auto it = kNoHeader.find(file.filename().string()); it != kNoHeader.end()) return it->second;
  const std::string text = read_file(file);
  const std::string tag = "# expect: ";
  if (text.compare(0, tag.size(), tag) != 0) return {};
  const auto eol = text.find('\n');
  return text.substr(tag.size(), eol == std::string::npos ? std::string::npos : eol - tag.size());
}

// "<path>:<line>" at the start of `message`, line >= 1; returns the line or 0.
int leading_line(const std::string& message, const std::string& path) {
  if (message.compare(0, path.size() + 1, path + ":") != 0) return 0;
  int line = 0;
  for (std::size_t i = path.size() + 1; i < message.size() && std::isdigit(static_cast<unsigned char>(message[i])) &&
                                        line < 1000000;
       ++i) {
    line = line * 10 + (message[i] - '0');
  }
  return line;
}

std::vector<std::filesystem::path> corpus() { return testing::toml_files(corpus_dir()); }

class BrokenCorpus : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(BrokenCorpus, FailsWithExpectedLocatedError) {
  const auto& file = GetParam();
  const std::string expect = expectation(file);
  ASSERT_FALSE(expect.empty()) << file << " has no '# expect: <substring>' first line and no entry in kNoHeader";
  try {
    (void)load_scenario_file(file);
    FAIL() << file << " loaded without error; expected: " << expect;
  } catch (const ScenarioError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(expect), std::string::npos) << "expected: " << expect << "\ngot:\n" << what;
    ASSERT_FALSE(e.messages().empty());
    for (const auto& m : e.messages()) {
      EXPECT_GE(leading_line(m, file.string()), 1) << "message does not start with <path>:<line>: " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BrokenCorpus, ::testing::ValuesIn(corpus()),
                         testing::FileParamName());

TEST(BrokenCorpusFolder, HasAtLeastFortyFilesAndEveryOneHasAnExpectation) {
  const auto files = corpus();
  EXPECT_GE(files.size(), 40U);
  for (const auto& f : files) EXPECT_FALSE(expectation(f).empty()) << f;
  for (const auto& [name, expect] : kNoHeader) {
    EXPECT_TRUE(std::filesystem::exists(corpus_dir() / name)) << name << " is listed in kNoHeader but missing";
  }
}

TEST(BrokenCorpusFolder, EveryConsistencyRuleHasAFileAndEveryRuleTagExists) {
  std::set<std::string> ids;
  for (const auto& r : consistency_rules()) ids.insert(r.id);
  std::set<std::string> covered;
  for (const auto& f : corpus()) {
    const std::string e = expectation(f);
    const std::string tag = "[rule ";
    if (auto pos = e.find(tag); pos != std::string::npos) {
      const auto end = e.find(']', pos);
      const std::string id = e.substr(pos + tag.size(), end - pos - tag.size());
      EXPECT_TRUE(ids.count(id)) << f << " expects unknown rule '" << id << "'";
      covered.insert(id);
    }
  }
  for (const auto& id : ids) EXPECT_TRUE(covered.count(id)) << "no corpus file exercises [rule " << id << "]";
}

TEST(BrokenCorpusFolder, BinaryGarbageReallyContainsNulAndHighBytes) {
  const std::string bytes = read_file(corpus_dir() / "garbage_binary.toml");
  EXPECT_EQ(bytes.size(), 512U);
  EXPECT_NE(bytes.find('\0'), std::string::npos);
  EXPECT_TRUE(std::any_of(bytes.begin(), bytes.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }));
}

// ---- the same through the command line: threewalls validate FILE ----

std::string cli() { return THREEWALLS_CLI_PATH; }

// One process for the whole corpus keeps this fast (the CLI links every library, and ~120 process
// starts cost seconds on a loaded 2-core machine): every file must be counted invalid, and the lines
// that start with its path must carry its expectation.
TEST(ValidateCommand, EveryBrokenFileIsInvalidWithItsMessageOnStderr) {
  const auto files = corpus();
  std::string cmd = testing::shell_quote(cli()) + " validate";
  for (const auto& f : files) cmd += " " + testing::shell_quote(f.string());
  const auto r = testing::run_command(cmd, /*capture_stderr=*/true);
  EXPECT_EQ(r.exit_code, 2);
  const std::string n = std::to_string(files.size());
  EXPECT_NE(r.out.find(n + " of " + n + " scenario file(s) invalid"), std::string::npos) << r.out;
  for (const auto& f : files) {
    std::string mine;
    const std::string prefix = f.string() + ":";
    std::size_t start = 0;
    while (start < r.out.size()) {
      const auto end = r.out.find('\n', start);
      const std::string line = r.out.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (line.rfind(prefix, 0) == 0) mine += line + "\n";
      if (end == std::string::npos) break;
      start = end + 1;
    }
    EXPECT_FALSE(mine.empty()) << f << ": no stderr line starts with its path";
    EXPECT_NE(mine.find(expectation(f)), std::string::npos) << f << "\nexpected: " << expectation(f) << "\ngot:\n"
                                                             << mine;
  }
}

// A few files on their own: one file, exit code 2, its message first on stderr.
class ValidateCommandOnBrokenFile : public ::testing::TestWithParam<std::string> {};

TEST_P(ValidateCommandOnBrokenFile, ExitsTwoWithTheMessageOnStderr) {
  const auto file = corpus_dir() / GetParam();
  const std::string expect = expectation(file);
  ASSERT_FALSE(expect.empty()) << file;
  const auto r = testing::run_command(testing::shell_quote(cli()) + " validate " + testing::shell_quote(file.string()),
                                      /*capture_stderr=*/true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(expect), std::string::npos) << "expected: " << expect << "\nstderr:\n" << r.out;
  EXPECT_EQ(r.out.rfind(file.string() + ":", 0), 0U) << "stderr does not start with the file location:\n" << r.out;
  EXPECT_NE(r.out.find("1 of 1 scenario file(s) invalid"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Files, ValidateCommandOnBrokenFile,
                         ::testing::Values("empty.toml", "garbage_binary.toml", "toml_unclosed_string.toml",
                                           "unknown_key_suggestion.toml", "rule_world_size.toml",
                                           "rule_calibration_profile.toml"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return testing::param_name(param.param);
                         });

TEST(ValidateCommand, AllExamplesAreValidAndExitZero) {
  const auto examples = testing::toml_files(source_dir() / "scenarios/examples");
  ASSERT_FALSE(examples.empty());
  std::string cmd = testing::shell_quote(cli()) + " validate";
  for (const auto& f : examples) cmd += " " + testing::shell_quote(f.string());
  const auto r = testing::run_command(cmd, /*capture_stderr=*/false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const auto& f : examples) EXPECT_NE(r.out.find(f.string() + ": valid"), std::string::npos) << r.out;
}

TEST(ValidateCommand, OneBadFileAmongGoodOnesExitsTwo) {
  const std::string good = (source_dir() / "scenarios/examples/small_moe_1gpu.toml").string();
  const std::string bad = (corpus_dir() / "rule_world_size.toml").string();
  const auto r = testing::run_command(testing::shell_quote(cli()) + " validate " + testing::shell_quote(good) + " " +
                                          testing::shell_quote(bad),
                                      /*capture_stderr=*/true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("1 of 2 scenario file(s) invalid"), std::string::npos) << r.out;
}

TEST(ValidateCommand, MissingFileExitsTwo) {
  const auto r = testing::run_command(testing::shell_quote(cli()) + " validate /nonexistent/threewalls/none.toml",
                                      /*capture_stderr=*/true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("/nonexistent/threewalls/none.toml: cannot open scenario file (no such file)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace threewalls::scenarios
