// The generated references in docs/ must match what the registry and the rule table say now.
// Regenerate with scripts/gen_docs.sh after changing scenarios/src/registry.cpp or validate.cpp.
#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/rules.hpp"

namespace threewalls::scenarios {
namespace {

// Index and both lines of the first difference, for a failure message a human can act on.
std::string first_difference(const std::string& file, const std::string& now) {
  std::size_t line = 1;
  std::size_t start = 0;
  for (std::size_t i = 0; i < std::min(file.size(), now.size()); ++i) {
    if (file[i] != now[i]) break;
    if (file[i] == '\n') {
      ++line;
      start = i + 1;
    }
  }
  auto line_at = [&](const std::string& s) {
    if (start >= s.size()) return std::string("<end of text>");
    return s.substr(start, s.find('\n', start) - start);
  };
  return "first difference at line " + std::to_string(line) + ":\n  file: " + line_at(file) +
         "\n  now:  " + line_at(now);
}

void expect_up_to_date(const std::string& relative, const std::string& now) {
  const auto path = testing::source_dir() / relative;
  ASSERT_TRUE(std::filesystem::exists(path)) << relative << " is missing; run scripts/gen_docs.sh";
  const std::string file = testing::read_file(path);
  EXPECT_TRUE(file == now) << relative << " is stale: regenerate it with scripts/gen_docs.sh (runs `threewalls "
                           << "describe --markdown` and `--rules-markdown`) and commit the result.\n"
                           << first_difference(file, now);
}

TEST(ReferenceDocs, UpToDate) {
  expect_up_to_date("docs/scenario_reference.md", Registry::instance().markdown_reference());
  expect_up_to_date("docs/scenario_rules.md", rules_markdown());
}

TEST(ReferenceDocs, ReferenceMentionsEveryParamAndRulesEveryRule) {
  const std::string ref = Registry::instance().markdown_reference();
  for (const auto& p : Registry::instance().params()) {
    EXPECT_NE(ref.find("| `" + p.key() + "` |"), std::string::npos) << p.path;
  }
  const std::string rules = rules_markdown();
  for (const auto& r : consistency_rules()) EXPECT_NE(rules.find("| `" + r.id + "` |"), std::string::npos) << r.id;
}

}  // namespace
}  // namespace threewalls::scenarios
