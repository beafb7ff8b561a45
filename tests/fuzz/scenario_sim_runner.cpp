// Runs scenario files through the loader (what `threewalls validate` checks) and, when accepted,
// through expansion and simulation (what `threewalls sim` does), each file in a forked child under
// a wall-clock limit (alarm) and an address-space limit, and prints one verdict line per file:
//
//   FILE: rejected        the loader refused it with an InputError (the expected outcome for bad input)
//   FILE: ok              loaded, expanded and simulated; every number of the summary is finite
//   FILE: sim-rejected    loaded, but the simulation refused it (validate accepted what sim rejects)
//   FILE: nan             a NaN or infinity in the summary or a null duration in the run directory
//   FILE: crash           another exception, or a signal
//   FILE: hang            past the time limit
//   FILE: memory          past the memory limit (std::bad_alloc)
//
// Usage: scenario_sim_runner [--timeout S] [--mem-mb M] [--steps N] FILE...   (exit 1 on any finding)
// The mutation campaign (scripts/mutate_scenarios.py) and the property test drive it; docs/fuzzing.md.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
#include <string>
#include <vector>

#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"
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

int run_one(const fs::path& file, int steps, const fs::path& run_dir) {
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
    const auto r = threewalls::sim::simulate(s, "", opt);
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
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--timeout" && i + 1 < argc)
      timeout_s = std::atoi(argv[++i]);
    else if (a == "--mem-mb" && i + 1 < argc)
      mem_mb = std::atol(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else
      files.emplace_back(a);
  }
  const fs::path scratch = fs::temp_directory_path() / ("threewalls_runner_" + std::to_string(::getpid()));
  int findings = 0;
  for (const auto& file : files) {
    std::cout.flush();
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      const rlimit mem{static_cast<rlim_t>(mem_mb) << 20, static_cast<rlim_t>(mem_mb) << 20};
      ::setrlimit(RLIMIT_AS, &mem);
      ::alarm(static_cast<unsigned>(timeout_s));
      const int v = run_one(file, steps, scratch);
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
    std::cout << file.string() << ": " << verdict
              << (WIFSIGNALED(status) ? " (signal " + std::to_string(WTERMSIG(status)) + ")" : "") << "\n";
    std::error_code ec;
    fs::remove_all(scratch, ec);
  }
  return findings == 0 ? 0 : 1;
}
