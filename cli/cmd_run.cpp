// threewalls run SCENARIO --out DIR [--steps N] [--devices LIST] ...
// Executes the scenario's steps for real on this machine's GPUs (one thread per GPU), or as one rank
// of `mpirun -np N threewalls run ...`, and writes a run directory (source "real") in the schema the
// simulator writes (docs/backend.md). Registered only in builds with the GPU parts.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/backend/launch.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::cli {

namespace {

struct RunArgs {
  std::string scenario;
  std::string out;
  int steps = -1;
  int warmup = -1;
  std::string devices;
  std::string timeout = "300s";
  int record_every = 0;
  bool no_profiler = false;
  bool overwrite = false;
  std::string inject_fault;
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::vector<int> parse_devices(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const int d = std::stoi(item, &used);
      if (used != item.size() || d < 0) throw std::invalid_argument(item);
      out.push_back(d);
    } catch (const std::exception&) {
      throw InputError("run: --devices '" + text + "': '" + item +
                       "' is not a device ordinal; allowed: a comma-separated list of CUDA device numbers, e.g. 0,1,2,3");
    }
  }
  if (out.empty()) throw InputError("run: --devices is empty; allowed: a comma-separated list such as 0,1");
  return out;
}

void print_summary(const scenarios::Scenario& s, const backend::RunResult& r) {
  std::cout << "scenario " << s.name << ": " << s.world_size() << " x " << r.device << ", " << r.steps
            << " measured steps after " << r.warmup_steps << " warm-up\n";
  const auto& steps = r.summary.steps;
  if (!steps.empty()) {
    const auto& agg = r.summary.step_time_us;
    const auto& last = steps.back();
    std::cout << "step time      " << format_duration(microseconds(agg.median)) << " (median of " << steps.size()
              << " recorded step" << (steps.size() > 1 ? "s" : "") << ", p95 " << format_duration(microseconds(agg.p95))
              << "; critical rank " << last.critical_rank << ")\n";
    std::cout << "throughput     " << fixed(last.tokens_per_s, 0) << " tokens/s, " << fixed(last.tflops_per_gpu, 1)
              << " TFLOP/s per GPU, MFU " << fixed(100.0 * last.mfu, 1) << "%\n";
    if (r.summary.walls_mean) {
      const auto& w = *r.summary.walls_mean;
      const double total = w.total_us() > 0.0 ? w.total_us() : 1.0;
      std::cout << "walls (critical rank, mean over recorded steps)\n";
      for (int i = 0; i < 5; ++i) {
        const double v = profiler::wall_value(w, i);
        const std::string name = profiler::kWallNames[i];
        std::cout << "  " << name << std::string(15 - name.size(), ' ') << format_duration(microseconds(v)) << "  "
                  << fixed(100.0 * v / total, 1) << "%\n";
      }
      std::cout << "communication  exposed " << format_duration(microseconds(w.exposed_comm_us)) << ", overlapped "
                << format_duration(microseconds(w.overlapped_comm_us)) << "\n";
    }
  } else {
    // Nothing recorded (profiler disabled): the host clock still timed the loop.
    const double step_s = r.mean_step_us * 1e-6;
    std::cout << "step time      " << format_duration(microseconds(r.mean_step_us))
              << " (host clock, mean over the measured steps; profiler disabled: no run directory)\n";
    if (step_s > 0.0) {
      std::cout << "throughput     " << fixed(r.tokens_per_step / step_s, 0) << " tokens/s, "
                << fixed(r.model_flops_per_step / s.world_size() / step_s / 1e12, 1) << " TFLOP/s per GPU\n";
    }
  }
  std::cout << "host loop      " << format_duration(microseconds(r.mean_step_us)) << " per step (all measured steps)\n";
  std::cout << "peak memory    ";
  for (std::size_t i = 0; i < r.ranks.size(); ++i) {
    std::cout << (i ? ", " : "") << "rank " << r.ranks[i].rank << " "
              << format_bytes(Bytes(static_cast<double>(r.ranks[i].peak_bytes)));
  }
  std::cout << "\n";
  if (!r.run_dir.empty()) {
    std::cout << "run directory  " << r.run_dir.string() << " (" << r.phase_records << " phase records)\n";
    if (auto w = run_dir_size_warning(r.run_dir.string()); !w.empty()) std::cout << "warning: " << w << "\n";
  }
}

}  // namespace

void register_run(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("run", kRunSummary);
  static RunArgs a;
  sub->add_option("scenario", a.scenario, "Scenario file (TOML)")->required();
  sub->add_option("--out", a.out,
                  "Run directory to write (refused when it exists and is not empty); required unless --no-profiler");
  sub->add_option("--steps", a.steps, "Measured steps (default: the scenario's run.steps)")->check(CLI::Range(1, 1000000));
  sub->add_option("--warmup", a.warmup, "Unrecorded warm-up steps (default: the scenario's run.warmup_steps)")
      ->check(CLI::Range(0, 1000000));
  sub->add_option("--devices", a.devices,
                  "CUDA devices, comma-separated: rank r runs on the r-th (default: every visible device)");
  sub->add_option("--timeout", a.timeout,
                  "No progress for this long (a hung collective, a dead peer): abort the communicators and fail "
                  "(a duration with a unit, e.g. 30s, 300s; default 300s)");
  sub->add_option("--record-every-n-steps", a.record_every,
                  "Override the scenario's run.profiler.record_every_n_steps")
      ->check(CLI::Range(1, 1000000));
  sub->add_flag("--no-profiler", a.no_profiler, "Record nothing and write no run directory (the loop is still timed)");
  add_overwrite_flag(sub, a.overwrite, "Replace an existing run directory");
  sub->add_option("--inject-fault", a.inject_fault,
                  "Testing aid: KIND:RANK:STEP with KIND fail (the rank raises an error) or hang (the rank stops "
                  "issuing work, as a stuck process); halfway through measured step STEP. Shows that the other "
                  "ranks stop with a clear error instead of hanging");
  cmds.add(sub, [] {
    scenarios::Scenario s = scenarios::load_scenario(a.scenario);
    backend::LaunchOptions lo;
    backend::ExecutorOptions& eo = lo.executor;
    eo.steps = a.steps;
    eo.warmup_steps = a.warmup;
    eo.out_dir = a.out;
    eo.overwrite = a.overwrite;
    Seconds timeout;
    try {
      timeout = parse_duration(a.timeout);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("run: --timeout '") + a.timeout + "': " + e.what());
    }
    if (timeout.value <= 0.0) throw InputError("run: --timeout must be positive (got '" + a.timeout + "')");
    eo.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout.value * 1e3));
    if (!a.devices.empty()) lo.devices = parse_devices(a.devices);
    if (!a.inject_fault.empty()) {
      const auto bad = [] {
        return InputError("run: --inject-fault '" + a.inject_fault +
                          "': expected KIND:RANK:STEP with KIND fail or hang, RANK a rank of the scenario and STEP a "
                          "measured step, e.g. fail:1:3");
      };
      const auto c1 = a.inject_fault.find(':');
      const auto c2 = c1 == std::string::npos ? std::string::npos : a.inject_fault.find(':', c1 + 1);
      if (c2 == std::string::npos) throw bad();
      const std::string kind = a.inject_fault.substr(0, c1);
      if (kind != "fail" && kind != "hang") throw bad();
      try {
        eo.fault_rank = std::stoi(a.inject_fault.substr(c1 + 1, c2 - c1 - 1));
        eo.fault_step = std::stoi(a.inject_fault.substr(c2 + 1));
      } catch (const std::exception&) {
        throw bad();
      }
      if (eo.fault_rank < 0 || eo.fault_rank >= s.world_size() || eo.fault_step < 0) throw bad();
      eo.fault = kind == "fail" ? backend::ExecutorOptions::Fault::fail : backend::ExecutorOptions::Fault::hang;
    }
    if (a.out.empty() && !a.no_profiler) {
      throw InputError("run: --out DIR is required (the run directory to write), unless --no-profiler");
    }
    if (a.no_profiler && a.record_every > 0) {
      throw InputError("run: --no-profiler and --record-every-n-steps contradict each other");
    }
    // The overrides are the scenario's run.profiler knobs (the run header shows what was recorded).
    if (a.record_every > 0) s.run.profiler.record_every_n_steps = a.record_every;
    if (a.no_profiler) s.run.profiler.enabled = false;
    eo.argv = {"threewalls", "run", a.scenario};
    if (!a.out.empty()) eo.argv.insert(eo.argv.end(), {"--out", a.out});
    if (a.steps > 0) eo.argv.insert(eo.argv.end(), {"--steps", std::to_string(a.steps)});
    if (a.warmup >= 0) eo.argv.insert(eo.argv.end(), {"--warmup", std::to_string(a.warmup)});
    if (!a.devices.empty()) eo.argv.insert(eo.argv.end(), {"--devices", a.devices});
    eo.argv.insert(eo.argv.end(), {"--timeout", a.timeout});
    if (a.record_every > 0) eo.argv.insert(eo.argv.end(), {"--record-every-n-steps", std::to_string(a.record_every)});
    if (a.no_profiler) eo.argv.push_back("--no-profiler");
    if (a.overwrite) eo.argv.push_back("--overwrite");
    if (!a.inject_fault.empty()) eo.argv.insert(eo.argv.end(), {"--inject-fault", a.inject_fault});
    const bool mpi = backend::started_by_mpi();
    backend::RunResult r;
    try {
      r = backend::run_real(s, lo);
    } catch (const Error& e) {
      if (backend::rank_threads_abandoned()) {
        // A rank thread is stuck in a device call: report and end now (a normal exit would wait on it).
        std::cerr << error_line("run", e.what()) << "\n";
        std::cout.flush();
        std::cerr.flush();
        if (mpi)
          backend::abort_mpi_job(dynamic_cast<const InputError*>(&e) != nullptr ? kExitInputError : kExitSystemError);
        std::_Exit(dynamic_cast<const InputError*>(&e) != nullptr ? kExitInputError : kExitSystemError);
      }
      if (mpi) {
        // Every process of the job must stop, not wait for this one.
        std::cerr << error_line("run", e.what()) << "\n";
        backend::abort_mpi_job(dynamic_cast<const InputError*>(&e) != nullptr ? kExitInputError : kExitSystemError);
      }
      throw;
    }
    if (!mpi || r.recorded) print_summary(s, r);  // under MPI, rank 0 has the summary
    return kExitOk;
  });
}

}  // namespace threewalls::cli
