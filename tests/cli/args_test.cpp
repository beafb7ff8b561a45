// The command line's conventions, through the built binary and the helpers of cli/args.hpp: one flag
// name per meaning (--overwrite; --force a deprecated alias), command-line paths relative to the
// working directory, a suggestion for an unknown command, --progress, --fail-on-oom, error lines
// without a doubled subcommand prefix.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "../../cli/args.hpp"
#include "../scenarios/test_support.hpp"

namespace threewalls::cli {
namespace {

namespace fs = std::filesystem;
namespace st = threewalls::scenarios::testing;

const std::string kCli = THREEWALLS_CLI_PATH;
const fs::path kSource = THREEWALLS_SOURCE_DIR;

std::string example(const std::string& name) {
  return st::shell_quote((kSource / "scenarios/examples" / name).string());
}

// stdout and stderr together.
st::CommandResult run_all(const std::string& args) {
  return st::run_command("(" + kCli + " " + args + " 2>&1)", false);
}

TEST(CliArgs, UnknownCommandSuggestsTheNearestAndListsAll) {
  auto r = run_all("bogus");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("threewalls: unknown command 'bogus'; commands: validate, describe, graph, sim, plan"),
            std::string::npos)
      << r.out;
  r = run_all("simm x.toml");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("unknown command 'simm'; did you mean 'sim'? commands:"), std::string::npos) << r.out;
  EXPECT_NE(unknown_command_message("plan-merg", {"plan", "plan-merge"}).find("did you mean 'plan-merge'?"),
            std::string::npos);
  EXPECT_NE(unknown_command_message("exprot", {"export", "import"}).find("did you mean 'export'?"), std::string::npos);
  // Options before a command are CLI11's (--help, --version), not commands.
  EXPECT_EQ(run_all("--version").exit_code, 0);
}

TEST(CliArgs, ErrorLineDoesNotRepeatTheSubcommand) {
  EXPECT_EQ(error_line("run", "run: no usable CUDA device: none visible"),
            "threewalls run: no usable CUDA device: none visible");
  EXPECT_EQ(error_line("run", "rank 1: no usable CUDA device"), "threewalls run: rank 1: no usable CUDA device");
  EXPECT_EQ(error_line("sim", "simulation failed"), "threewalls sim: simulation failed");
  const auto r = run_all("sim " + example("small_moe_1gpu.toml") + " --out x --no-run-dir");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("threewalls sim: --out and --no-run-dir contradict"), std::string::npos) << r.out;
}

// run writes a run directory unless --no-profiler (which times the loop and writes nothing): --out is
// required only then. Checked before any device is opened.
TEST(CliArgs, RunNeedsOutUnlessNoProfiler) {
  auto r = run_all("run --help");
  if (r.exit_code != 0) GTEST_SKIP() << "no run command in this build (the GPU parts are not built)";
  r = run_all("run " + st::shell_quote((kSource / "scenarios/validation/fidelity/f01_dense_1gpu.toml").string()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("threewalls run: --out DIR is required (the run directory to write), unless --no-profiler"),
            std::string::npos)
      << r.out;
  r = run_all("run " + st::shell_quote((kSource / "scenarios/validation/fidelity/f01_dense_1gpu.toml").string()) +
              " --no-profiler --devices 99");
  EXPECT_EQ(r.out.find("--out"), std::string::npos) << r.out;  // past the check: the device is what fails
}

TEST(CliArgs, ForceIsADeprecatedAliasOfOverwrite) {
  st::TempDir tmp;
  const std::string out = st::shell_quote((tmp.path() / "run").string());
  const std::string sim = "sim " + example("small_moe_1gpu.toml") + " --steps 1 --fidelity analytic --out " + out;
  ASSERT_EQ(run_all(sim).exit_code, 0);
  auto r = run_all(sim);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("pass --overwrite"), std::string::npos) << r.out;
  r = run_all(sim + " --force");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("threewalls sim: --force is deprecated; use --overwrite (same meaning)"), std::string::npos)
      << r.out;
  // export: the same flag name; its refusal names it.
  const std::string csv = "export " + out + " --format csv --out " + st::shell_quote((tmp.path() / "csv").string());
  ASSERT_EQ(run_all(csv).exit_code, 0);
  r = run_all(csv);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("pass --overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(run_all(csv + " --overwrite").exit_code, 0);
  // --force is not listed in --help; --overwrite is.
  r = run_all("export --help");
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--force"), std::string::npos) << r.out;
}

TEST(CliArgs, CalibrationPathIsRelativeToTheWorkingDirectory) {
  st::TempDir tmp;
  fs::copy_file(kSource / "calibration/profiles/h100.toml", tmp.path() / "mine.toml");
  // The scenario lives elsewhere; a profile of that name exists only in the working directory.
  const std::string cmd = "(cd " + st::shell_quote(tmp.path().string()) + " && " + kCli + " sim " +
                          example("small_moe_1gpu.toml") + " --steps 1 --fidelity analytic --no-run-dir --calibration ";
  auto r = st::run_command(cmd + "mine.toml 2>&1)", false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = st::run_command(cmd + "./nothing_here.toml 2>&1)", false);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find((tmp.path() / "nothing_here.toml").string()), std::string::npos) << r.out;
  // --help says so.
  r = run_all("sim --help");
  EXPECT_NE(r.out.find("a relative path is taken from the working directory"), std::string::npos) << r.out;
  // A scenario's own profile stays relative to the scenario's folder.
  fs::create_directories(tmp.path() / "sub");
  fs::copy_file(kSource / "calibration/profiles/h100.toml", tmp.path() / "sub/prof.toml");
  std::ifstream in(kSource / "scenarios/examples/small_moe_1gpu.toml");
  std::stringstream text;
  text << in.rdbuf() << "\n[calibration]\nprofile = \"prof.toml\"\n";
  tmp.write("sub/s.toml", text.str());
  r = run_all("sim " + st::shell_quote((tmp.path() / "sub/s.toml").string()) +
              " --steps 1 --fidelity analytic --no-run-dir");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(CliArgs, FailOnOomExitsNonZeroWithAClearLine) {
  st::TempDir tmp;
  std::ifstream in(kSource / "scenarios/examples/small_moe_1gpu.toml");
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  const auto at = s.find("num_layers = 4");
  ASSERT_NE(at, std::string::npos);
  s.replace(at, 14, "num_layers = 16");  // optimizer state alone outgrows one 80 GB GPU
  tmp.write("big.toml", s);
  const std::string sim =
      "sim " + st::shell_quote((tmp.path() / "big.toml").string()) + " --steps 1 --fidelity analytic --no-run-dir";
  auto r = run_all(sim);
  EXPECT_EQ(r.exit_code, 0) << r.out;  // the verdict alone does not fail the command
  EXPECT_NE(r.out.find("OUT OF MEMORY"), std::string::npos) << r.out;
  r = run_all(sim + " --fail-on-oom");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("threewalls sim: out of memory (--fail-on-oom)"), std::string::npos) << r.out;
  EXPECT_EQ(run_all("sim " + example("small_moe_1gpu.toml") +
                    " --steps 1 --fidelity analytic --no-run-dir "
                    "--fail-on-oom")
                .exit_code,
            0);
}

TEST(CliArgs, PlanProgressAlwaysNeverAndAuto) {
  const std::string plan = kCli + " plan " + example("mixtral_8x7b_64gpu.toml") +
                           " --gpus 64 --search 'tp=1,2;pp=1,2;ep=8;mbs=1;recompute=none' --resim 1";
  // stderr alone (a pipe, not a terminal).
  auto r = st::run_command(plan + " --progress always", true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("configs/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plan: flow re-simulation 1/1: #1 (tp"), std::string::npos) << r.out;
  for (const char* quiet : {" --progress never", " --progress auto", "", " --quiet"}) {
    r = st::run_command(plan + quiet, true);
    EXPECT_EQ(r.exit_code, 0) << quiet << r.out;
    EXPECT_EQ(r.out.find("plan:"), std::string::npos) << quiet << r.out;
  }
  r = st::run_command(plan + " --progress sometimes", true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

TEST(CliArgs, AScenarioNameNeverPlacesTheRunOutsideOutSim) {
  st::TempDir tmp;
  const fs::path cwd = tmp.path() / "w1" / "w2";
  fs::create_directories(cwd);
  std::ifstream in(kSource / "scenarios/examples/small_moe_1gpu.toml");
  std::stringstream text;
  text << in.rdbuf();
  std::string scenario = text.str();
  const std::string name_line = "name = \"small_moe_1gpu\"";
  ASSERT_NE(scenario.find(name_line), std::string::npos);
  scenario.replace(scenario.find(name_line), name_line.size(), "name = \"../../../../escaped\"");
  std::ofstream(cwd / "s.toml") << scenario;
  const std::string sim =
      "cd " + st::shell_quote(cwd.string()) + " && " + kCli + " sim s.toml --steps 1 --fidelity analytic";
  auto r = st::run_command("(" + sim + " 2>&1)", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(cwd / "out" / "sim" / "_.._.._.._escaped" / "run.json")) << r.out;
  EXPECT_FALSE(fs::exists(tmp.path() / "escaped"));
  // --overwrite of a directory that is not a run directory removes nothing.
  fs::create_directories(cwd / "mine");
  std::ofstream(cwd / "mine" / "summary.json") << "{\"keep\": true}";
  r = st::run_command("(" + sim + " --out mine --overwrite 2>&1)", false);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("mine: is not empty and is not a run directory"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(cwd / "mine" / "summary.json"));
  // Paths the system refuses: clear errors, not "internal error".
  r = st::run_command("(" + sim + " --out /dev/null --overwrite 2>&1)", false);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("/dev/null: exists and is not a directory"), std::string::npos) << r.out;
  r = st::run_command("(" + sim + " --out " + std::string(100000, 'n') + " 2>&1)", false);
  EXPECT_EQ(r.exit_code, 2) << r.out.substr(0, 400);
  EXPECT_NE(r.out.find("File name too long"), std::string::npos) << r.out.substr(0, 400);
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out.substr(0, 400);
}

TEST(CliArgs, ALargeRunDirectoryIsReportedWithTheKeysThatRecordLess) {
  st::TempDir tmp;
  std::ofstream(tmp.path() / "phases_rank_0.jsonl") << std::string(600, 'x');
  std::ofstream(tmp.path() / "phases_rank_1.jsonl") << std::string(600, 'x');
  EXPECT_EQ(run_dir_size_warning(tmp.path().string(), 1200), "");
  const std::string w = run_dir_size_warning(tmp.path().string(), 1199);
  EXPECT_NE(w.find("holds 1.12e-06 GiB in 2 files"), std::string::npos) << w;
  EXPECT_NE(w.find("run.profiler.ranks = \"representatives\""), std::string::npos) << w;
  EXPECT_EQ(run_dir_size_warning((tmp.path() / "absent").string(), 0), "");
}

}  // namespace
}  // namespace threewalls::cli
