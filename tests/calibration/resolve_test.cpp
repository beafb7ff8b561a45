#include "threewalls/calibration/resolve.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;
using namespace threewalls::calibration::testing;

TEST(ResolveProfile, AutoPrefersTheMeasuredProfile) {
  const auto dir = scratch_dir("resolve_measured");
  write_text(dir / "h200.toml", "x");
  write_text(dir / "default_h200.toml", "x");
  const auto r = resolve_profile("auto", "h200", "/scenarios", dir);
  EXPECT_EQ(r.path, dir / "h200.toml");
  EXPECT_TRUE(r.shipped);
  EXPECT_NE(r.reason.find("measured profile h200.toml"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("--profile-dir"), std::string::npos) << r.reason;
  std::filesystem::remove_all(dir);
}

TEST(ResolveProfile, AutoFallsBackToTheSyntheticDefault) {
  const auto dir = scratch_dir("resolve_default");
  write_text(dir / "default_h100.toml", "x");
  write_text(dir / "h200.toml", "x");  // another kind's measured profile is not taken
  const auto r = resolve_profile("auto", "h100", "", dir);
  EXPECT_EQ(r.path, dir / "default_h100.toml");
  EXPECT_NE(r.reason.find("no measured h100.toml"), std::string::npos) << r.reason;
  std::filesystem::remove_all(dir);
}

TEST(ResolveProfile, AutoWithoutAnyFileNamesWhatItTried) {
  const auto dir = scratch_dir("resolve_none");
  try {
    (void)resolve_profile("auto", "h200", "", dir);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "default_h200.toml").string()), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ResolveProfile, AutoForAnUnknownGpuKindListsTheKnownOnes) {
  try {
    (void)resolve_profile("auto", "h300", "", "");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("known: \"h100\", \"h200\""), std::string::npos) << e.what();
  }
}

TEST(ResolveProfile, AutoUsesTheSourceTreesShippedDefaults) {
  EXPECT_EQ(default_profile_dir(), shipped_profile_path("h100").parent_path());
  const auto r = resolve_profile("auto", "h100", "", "");
  EXPECT_TRUE(std::filesystem::is_regular_file(r.path));
  EXPECT_NE(r.reason.find("source tree"), std::string::npos) << r.reason;
}

TEST(ResolveProfile, ExplicitRelativePathIsTakenFromTheScenarioFolder) {
  const auto dir = scratch_dir("resolve_explicit");
  std::filesystem::create_directories(dir / "profiles");
  write_text(dir / "profiles" / "mine.toml", "x");
  const auto r = resolve_profile("profiles/mine.toml", "h200", dir);
  EXPECT_EQ(r.path, dir / "profiles" / "mine.toml");
  EXPECT_FALSE(r.shipped);
  EXPECT_NE(r.reason.find("\"profiles/mine.toml\""), std::string::npos) << r.reason;
  const auto abs = resolve_profile((dir / "profiles" / "mine.toml").string(), "h200", "/elsewhere");
  EXPECT_EQ(abs.path, dir / "profiles" / "mine.toml");
  std::filesystem::remove_all(dir);
}

TEST(ResolveProfile, MissingExplicitPathIsAnInputError) {
  try {
    (void)resolve_profile("nope.toml", "h200", "/tmp/no_such_scenario_dir");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(
        std::string(e.what()).find("/tmp/no_such_scenario_dir/nope.toml: calibration profile not found (no such file"),
        std::string::npos)
        << e.what();
  }
}
