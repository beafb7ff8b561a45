// Golden predictions: every shipped example's simulated summary is stored beside it
// (scenarios/examples/<name>.golden.json), and this test fails when `threewalls sim` predicts
// something else. A change that moves a prediction on purpose regenerates the files in the same commit
// (scripts/update_goldens.sh, which runs this test with THREEWALLS_UPDATE_GOLDENS=1).
//
// The golden is the part of summary.json that a user reads as the prediction: step time statistics,
// the wall breakdown, exposed/overlapped communication, throughput, peak memory per rank class with its
// breakdown and the OOM verdict, inference aggregates, and the total time of every phase. Numbers must
// agree to a relative 1e-9 (printing round-off), names and counts exactly.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../scenarios/test_support.hpp"

namespace threewalls::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
namespace st = threewalls::scenarios::testing;

// The prediction part of a summary.json (see the file comment).
json golden_of(const json& summary) {
  json g;
  g["scenario"] = summary.at("scenario").at("name");
  g["world_size"] = summary.at("world_size");
  g["gpu"] = summary.at("gpu");
  g["model_flops_per_step"] = summary.at("model_flops_per_step");
  g["tokens_per_step"] = summary.at("tokens_per_step");
  g["steps"] = summary.at("steps").size();
  g["step_time_us"] = summary.at("step_time_us");
  g["walls_us"] = summary.at("walls_us");
  g["communication_us"] = summary.at("communication_us");
  const json& first = summary.at("steps").at(0);
  g["first_step"] = {{"tokens_per_s", first.at("tokens_per_s")},
                     {"tflops_per_gpu", first.at("tflops_per_gpu")},
                     {"mfu", first.at("mfu")}};
  json& mem = g["memory"];
  mem["gpu_memory_bytes"] = summary.at("memory").at("gpu_memory_bytes");
  mem["oom"] = summary.at("memory").at("oom");
  mem["classes"] = json::array();
  for (const json& c : summary.at("memory").at("classes")) {
    mem["classes"].push_back({{"label", c.at("label")},
                              {"ranks", c.at("ranks")},
                              {"peak_bytes", c.at("peak_bytes")},
                              {"breakdown_bytes", c.at("breakdown_bytes")}});
  }
  if (summary.contains("inference")) g["inference"] = summary.at("inference");
  json phases = json::object();
  for (const json& p : summary.at("phases")) {
    phases[p.at("phase").get<std::string>()] = {{"wall", p.at("wall")}, {"count", p.at("count")},
                                                {"total_us", p.at("total_us")}};
  }
  g["phase_total_us"] = phases;
  return g;
}

// Differences between two JSON values, numbers to a relative 1e-9; each line names the JSON path.
void diff(const json& want, const json& got, const std::string& path, std::string& out) {
  if (want.is_number() && got.is_number()) {
    const double a = want.get<double>();
    const double b = got.get<double>();
    const double scale = std::max({1.0, std::fabs(a), std::fabs(b)});
    if (!(std::fabs(a - b) <= 1e-9 * scale)) {
      std::ostringstream line;
      line.precision(17);
      line << path << ": golden " << a << ", now " << b << "\n";
      out += line.str();
    }
    return;
  }
  if (want.type() != got.type()) {
    out += path + ": golden " + want.dump() + ", now " + got.dump() + "\n";
    return;
  }
  if (want.is_object()) {
    for (const auto& [k, v] : want.items()) {
      if (!got.contains(k)) out += path + "/" + k + ": in the golden file, missing now\n";
      else diff(v, got.at(k), path + "/" + k, out);
    }
    for (const auto& [k, v] : got.items()) {
      if (!want.contains(k)) out += path + "/" + k + ": new, not in the golden file (" + v.dump() + ")\n";
    }
    return;
  }
  if (want.is_array()) {
    if (want.size() != got.size()) {
      out += path + ": golden has " + std::to_string(want.size()) + " entries, now " + std::to_string(got.size()) + "\n";
      return;
    }
    for (std::size_t i = 0; i < want.size(); ++i) diff(want[i], got[i], path + "/" + std::to_string(i), out);
    return;
  }
  if (want != got) out += path + ": golden " + want.dump() + ", now " + got.dump() + "\n";
}

class GoldenPrediction : public ::testing::TestWithParam<fs::path> {};

TEST_P(GoldenPrediction, SimulatedSummaryMatchesTheGoldenFile) {
  const fs::path scenario = GetParam();
  const fs::path golden_path = fs::path(scenario).replace_extension(".golden.json");
  st::TempDir tmp;
  const fs::path out = tmp.path() / "run";
  const std::string cmd = std::string(THREEWALLS_CLI_PATH) + " sim " + st::shell_quote(scenario.string()) +
                          " --out " + st::shell_quote(out.string());
  const auto r = st::run_command(cmd, /*capture_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
  const json got = golden_of(json::parse(st::read_file(out / "summary.json")));

  const char* update = std::getenv("THREEWALLS_UPDATE_GOLDENS");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden_path, std::ios::binary) << got.dump(1) << "\n";
    GTEST_SKIP() << "wrote " << golden_path.string();
  }
  ASSERT_TRUE(fs::exists(golden_path)) << golden_path.string()
                                       << " is missing: run scripts/update_goldens.sh and commit it";
  const json want = json::parse(st::read_file(golden_path));
  std::string differences;
  diff(want, got, "", differences);
  EXPECT_TRUE(differences.empty()) << "the prediction for " << scenario.filename().string()
                                   << " moved (if on purpose, run scripts/update_goldens.sh in the same commit):\n"
                                   << differences;
}

INSTANTIATE_TEST_SUITE_P(Examples, GoldenPrediction,
                         ::testing::ValuesIn(st::toml_files(st::source_dir() / "scenarios/examples")),
                         st::FileParamName());

// A golden file without its example is stale: the example was renamed or removed.
TEST(GoldenPredictions, EveryGoldenFileHasItsExample) {
  for (const auto& e : fs::directory_iterator(st::source_dir() / "scenarios/examples")) {
    const std::string name = e.path().filename().string();
    const std::string suffix = ".golden.json";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const fs::path toml = e.path().parent_path() / (name.substr(0, name.size() - suffix.size()) + ".toml");
    EXPECT_TRUE(fs::exists(toml)) << name << " has no example " << toml.filename().string();
  }
}

}  // namespace
}  // namespace threewalls::cli
