#pragma once
// Helpers for the notebooks_export tests: fresh temporary directories and synthetic runs with a known
// answer (notebooks_export/synthetic.hpp), read back through the run-directory reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "threewalls/notebooks_export/synthetic.hpp"
#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::notebooks_export::testing {

// A fresh, empty path named after the running test (removed first; kept afterwards for debugging).
inline std::filesystem::path fresh_dir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("twx_" + std::string(info->test_suite_name()) + "_" + info->name() + suffix + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

inline profiler::RunData synthetic(const SyntheticSpec& spec, const std::string& suffix) {
  auto dir = fresh_dir(suffix);
  write_synthetic_run(dir, spec);
  return profiler::RunDirReader::read(dir);
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace threewalls::notebooks_export::testing
