#pragma once
// Helpers shared by the profiler tests: a fresh temporary directory per test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace threewalls::profiler::testing {

// A fresh, empty directory named after the running test (removed at start, kept after for debugging).
inline std::filesystem::path fresh_dir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("tw_" + std::string(info->test_suite_name()) + "_" + info->name() + suffix + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace threewalls::profiler::testing
