// Runs inputs of one surface through the code that reads them, each input in a forked child under a
// wall-clock limit (alarm) and an address-space limit, and prints one verdict line per input:
//
//   INPUT: rejected        refused with an InputError (the expected outcome for bad input)
//   INPUT: ok              accepted, and everything made from it checks out (below)
//   INPUT: sim-rejected    scenario surface: loaded, but the simulation refused it (validate accepted
//                          what sim rejects)
//   INPUT: nan             a NaN or infinity in the summary or a null duration in the run directory
//   INPUT: crash           another exception, or a signal
//   INPUT: hang            past the time limit
//   INPUT: memory          past the memory limit (std::bad_alloc)
//
// Each line ends with the child's wall time, "[1.234 s]".
//
// Surfaces (--surface, default scenario):
//   scenario    a scenario file: load (what `threewalls validate` checks), then expand and simulate
//               (what `threewalls sim` does) with a run directory written
//   rundir      a run directory: read strictly and with --allow-incomplete (RunDirReader)
//   profile     a calibration profile file (Profile::load)
//   megatron    a Megatron launch script or YAML: imported, its [model] checked by the loader
//   hf          a Hugging Face config.json: imported, its [model] checked by the loader
//   plan-merge  a directory of plan.json shards: each read (plan_from_json), then merged
//
// Usage: scenario_sim_runner [--surface S] [--timeout S] [--mem-mb M] [--steps N] [--profile-dir D] INPUT...
// --profile-dir: where `calibration.profile = "auto"` finds the shipped profiles (default: the source tree
// this runner was built from, which does not exist where a carried runner runs).
// (exit 1 on any finding). The mutation campaigns (scripts/mutate_scenarios.py for scenarios,
// scripts/mutate_inputs.py for the other surfaces) and the robustness tests drive it; docs/fuzzing.md.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/resolve.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/scenarios/import.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/planner.hpp"
#include "threewalls/sim/simulator.hpp"

namespace {

namespace fs = std::filesystem;
using threewalls::OrderedJson;

enum Verdict : int { kOk = 0, kRejected = 10, kSimRejected = 11, kNan = 12, kCrash = 13, kMemory = 14 };

bool all_finite(const OrderedJson& j) {
  if (j.is_number_float()) return std::isfinite(j.get<double>());
  if (j.is_structured()) {
    for (const auto& e : j) {
      if (!all_finite(e)) return false;
    }
  }
  return true;
}

// A duration written as null (how a NaN reaches JSON) anywhere in the run directory's files.
bool null_duration_in(const fs::path& dir) {
  static const std::regex kNull(R"re("[a-z_]*(_us|_ns|_s)":null)re");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(":null") != std::string::npos && std::regex_search(line, kNull)) return true;
    }
  }
  return false;
}

// The surfaces other than scenario: reads `input`; returns normally when it was accepted.
void read_input(const std::string& surface, const fs::path& input) {
  namespace sc = threewalls::scenarios;
  // An imported draft's [model] goes through the loader like any scenario: accepted values are checked.
  auto check_model = [&](const sc::ScenarioDraft& d) {
    (void)sc::load_scenario_text(sc::ScenarioDraft::model_check_scenario(d.to_toml(true)), input.string() + ".toml");
  };
  if (surface == "rundir") {
    threewalls::profiler::ReadOptions strict;
    strict.threads = 1;
    try {
      (void)threewalls::profiler::RunDirReader::read(input, strict);
    } catch (const threewalls::InputError&) {
      threewalls::profiler::ReadOptions lenient = strict;
      lenient.allow_incomplete = true;
      (void)threewalls::profiler::RunDirReader::read(input, lenient);
    }
  } else if (surface == "profile") {
    (void)threewalls::calibration::Profile::load(input);
  } else if (surface == "megatron") {
    sc::MegatronImportOptions o;
    o.vocab_size = 32000;  // as --vocab-size: the sample launch names a tokenizer file, not a size
    check_model(sc::import_megatron_file(input, o));
  } else if (surface == "hf") {
    check_model(sc::import_hf_file(input));
  } else if (surface == "plan-merge") {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(input)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::vector<threewalls::sim::PlanResult> shards;
    for (const auto& f : files)
      shards.push_back(threewalls::sim::plan_from_json(threewalls::read_json_file(f), f.string()));
    const auto merged = threewalls::sim::merge_plans(shards);
    if (!all_finite(threewalls::sim::plan_to_json(merged)))
      throw std::runtime_error("a NaN or infinity in the merged plan");
    (void)threewalls::sim::plan_to_csv(merged);
    (void)threewalls::sim::plan_to_text(merged);
  } else {
    throw std::invalid_argument("unknown surface " + surface);
  }
}

int run_one(const std::string& surface, const fs::path& file, int steps, const fs::path& run_dir,
            const fs::path& profile_dir) {
  if (surface != "scenario") {
    try {
      read_input(surface, file);
      return kOk;
    } catch (const threewalls::InputError&) {
      return kRejected;
    } catch (const std::bad_alloc&) {
      return kMemory;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: crash: %s\n", file.c_str(), e.what());
      return kCrash;
    }
  }
  threewalls::scenarios::Scenario s;
  try {
    s = threewalls::scenarios::load_scenario(file);
  } catch (const threewalls::InputError&) {
    return kRejected;
  }
  try {
    threewalls::sim::SimOptions opt;
    opt.steps = steps;
    opt.out_dir = run_dir;
    opt.overwrite = true;
    std::string profile;  // empty: the scenario's own, resolved by simulate()
    if (!profile_dir.empty()) {
      const fs::path scenario_dir = fs::path(s.source_path).parent_path();
      profile = threewalls::calibration::resolve_profile(
                    s.calibration_profile, threewalls::scenarios::to_string(s.cluster.gpu), scenario_dir, profile_dir)
                    .path.string();
    }
    const auto r = threewalls::sim::simulate(s, profile, opt);
    if (!all_finite(r.summary_json) || null_duration_in(run_dir)) return kNan;
    return kOk;
  } catch (const threewalls::InputError& e) {
    std::fprintf(stderr, "%s: sim-rejected: %s\n", file.c_str(), e.what());
    return kSimRejected;
  } catch (const std::bad_alloc&) {
    return kMemory;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: crash: %s\n", file.c_str(), e.what());
    return kCrash;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int timeout_s = 60;
  long mem_mb = 4096;
  int steps = 2;
  std::string surface = "scenario";
  fs::path profile_dir;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--timeout" && i + 1 < argc)
      timeout_s = std::atoi(argv[++i]);
    else if (a == "--mem-mb" && i + 1 < argc)
      mem_mb = std::atol(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--surface" && i + 1 < argc)
      surface = argv[++i];
    else if (a == "--profile-dir" && i + 1 < argc)
      profile_dir = argv[++i];
    else
      files.emplace_back(a);
  }
  const fs::path scratch = fs::temp_directory_path() / ("threewalls_runner_" + std::to_string(::getpid()));
  int findings = 0;
  for (const auto& file : files) {
    std::cout.flush();
    const auto started = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      const rlimit mem{static_cast<rlim_t>(mem_mb) << 20, static_cast<rlim_t>(mem_mb) << 20};
      ::setrlimit(RLIMIT_AS, &mem);
      ::alarm(static_cast<unsigned>(timeout_s));
      const int v = run_one(surface, file, steps, scratch, profile_dir);
      std::fflush(nullptr);
      ::_exit(v);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::string verdict;
    if (WIFSIGNALED(status)) {
      verdict = WTERMSIG(status) == SIGALRM ? "hang" : (WTERMSIG(status) == SIGKILL ? "memory" : "crash");
    } else {
      switch (WEXITSTATUS(status)) {
        case kOk: verdict = "ok"; break;
        case kRejected: verdict = "rejected"; break;
        case kSimRejected: verdict = "sim-rejected"; break;
        case kNan: verdict = "nan"; break;
        case kMemory: verdict = "memory"; break;
        default: verdict = "crash"; break;
      }
    }
    if (verdict != "ok" && verdict != "rejected") ++findings;
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char took[32];
    std::snprintf(took, sizeof took, " [%.3f s]", wall_s);
    std::cout << file.string() << ": " << verdict
              << (WIFSIGNALED(status) ? " (signal " + std::to_string(WTERMSIG(status)) + ")" : "") << took << "\n";
    std::error_code ec;
    fs::remove_all(scratch, ec);
  }
  return findings == 0 ? 0 : 1;
}
