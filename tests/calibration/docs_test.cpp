// The format document and the models page stay in step with the family registry.
#include <gtest/gtest.h>

#include "test_support.hpp"

using namespace threewalls::calibration;
using namespace threewalls::calibration::testing;

namespace {
std::string doc(const char* relative) { return read_text(std::filesystem::path(THREEWALLS_SOURCE_DIR) / relative); }
bool mentions(const std::string& text, const std::string& word) {
  return text.find("`" + word + "`") != std::string::npos;
}
}  // namespace

TEST(CalibrationDocs, FormatDocumentListsEveryFamilyModelAndKey) {
  const std::string text = doc("docs/formats/calibration_profile.md");
  ASSERT_FALSE(text.empty());
  for (const auto& s : family_specs()) {
    if (s.kind == ModelKind::collective) {
      EXPECT_TRUE(mentions(text, to_string(s.collective))) << s.name;
      EXPECT_TRUE(mentions(text, to_string(s.scope))) << s.name;
    } else {
      EXPECT_TRUE(mentions(text, s.name)) << s.name;
    }
    EXPECT_TRUE(mentions(text, s.model)) << s.model;
    for (const auto& in : s.inputs) EXPECT_TRUE(mentions(text, in.key)) << s.name << " input " << in.key;
    for (const auto& p : s.params) EXPECT_TRUE(mentions(text, p.key)) << s.name << " parameter " << p.key;
  }
  // The older models profiles still load, with their parameters.
  for (const auto& s : older_family_specs()) {
    EXPECT_TRUE(mentions(text, s.model)) << s.model;
    for (const auto& p : s.params) EXPECT_TRUE(mentions(text, p.key)) << s.model << " parameter " << p.key;
  }
}

TEST(CalibrationDocs, ModelsPageStatesEveryModel) {
  const std::string text = doc("docs/calibration.md");
  ASSERT_FALSE(text.empty());
  for (const auto& s : family_specs()) EXPECT_TRUE(mentions(text, s.model)) << s.model;
  for (const auto& s : older_family_specs()) EXPECT_TRUE(mentions(text, s.model)) << s.model;
}
