#pragma once
// Helpers shared by the scenarios tests: where the source tree is, reading files, running the CLI.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "../support/shell.hpp"

namespace threewalls::scenarios::testing {

inline std::filesystem::path source_dir() { return std::filesystem::path(THREEWALLS_SOURCE_DIR); }

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("test: cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The *.toml files of a folder, sorted (the same order on every machine).
inline std::vector<std::filesystem::path> toml_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".toml") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A GoogleTest parameter name from a file name: "rule_world_size.toml" -> "rule_world_size".
inline std::string param_name(const std::filesystem::path& p) {
  std::string s = p.stem().string();
  for (auto& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

// Name generator for INSTANTIATE_TEST_SUITE_P over files.
struct FileParamName {
  std::string operator()(const ::testing::TestParamInfo<std::filesystem::path>& param) const {
    return param_name(param.param);
  }
};

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout or stderr, as asked
};

// Runs `command` through the shell and returns its exit code and what it wrote to stderr
// (stdout discarded) or to stdout (stderr discarded).
inline CommandResult run_command(const std::string& command, bool capture_stderr) {
  CommandResult r;
  r.exit_code = threewalls::test::run_shell(command + (capture_stderr ? " 2>&1 1>/dev/null" : " 2>/dev/null"), r.out);
  return r;
}

// A fresh empty directory under the system temp folder, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("threewalls_scenarios_") + (info ? info->name() : "test") + "_" +
                       std::to_string(::getpid());
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  void write(const std::string& relative, const std::string& text) const {
    auto p = path_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace threewalls::scenarios::testing
