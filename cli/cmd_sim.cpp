// threewalls sim SCENARIO [--calibration PROFILE] [--out DIR] [--fidelity flow|analytic] [--steps N]
// Predicts the scenario's steps on SimGrid and writes a run directory (docs/simulator.md).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/heap.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/summary_lines.hpp"
#include "threewalls/sim/memory_model.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::cli {

namespace {

struct SimArgs {
  std::string scenario;
  std::string calibration;
  std::string out;
  std::string fidelity = "flow";
  std::string allreduce = "auto";
  int steps = -1;
  double host_scale = 1.0;
  double disk_scale = 1.0;
  bool overwrite = false;
  bool no_run_dir = false;
  bool fail_on_oom = false;
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Wall names as the summary prints them: the time wall "memory" is memory-bound time, which the
// capacity lines below must not be confused with.
std::string wall_label(int i) {
  const std::string name = profiler::kWallNames[i];
  return name == "memory" ? "memory-bound" : name;
}

// The largest wall of a breakdown: "communication 51.9%".
std::string dominant_wall(const profiler::WallBreakdown& w) {
  int best = 0;
  for (int i = 1; i < 5; ++i) {
    if (profiler::wall_value(w, i) > profiler::wall_value(w, best)) best = i;
  }
  const double total = w.total_us() > 0.0 ? w.total_us() : 1.0;
  return wall_label(best) + " " + fixed(100.0 * profiler::wall_value(w, best) / total, 1) + "%";
}

std::string pad(const std::string& s, std::size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

void print_line(std::string line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
  std::cout << line << "\n";
}

// Wall breakdowns side by side: one column per (title, breakdown).
void print_walls(const std::vector<std::pair<std::string, profiler::WallBreakdown>>& cols) {
  std::string line = "walls (critical path, mean per step)";
  if (cols.size() > 1) {
    line += "  ";
    for (const auto& [title, w] : cols) line += pad(title, 20);
  }
  print_line(line);
  for (int i = 0; i < 5; ++i) {
    line = "  " + pad(wall_label(i), 36);
    for (const auto& [title, w] : cols) {
      const double total = w.total_us() > 0.0 ? w.total_us() : 1.0;
      const double v = profiler::wall_value(w, i);
      line += pad(format_duration(microseconds(v)) + "  " + fixed(100.0 * v / total, 1) + "%", 20);
    }
    print_line(line);
  }
  line = "  " + pad("communication exposed / overlapped", 36);
  for (const auto& [title, w] : cols) {
    line += pad(
        format_duration(microseconds(w.exposed_comm_us)) + " / " + format_duration(microseconds(w.overlapped_comm_us)),
        20);
  }
  print_line(line);
  std::cout << "dominant wall  ";
  for (std::size_t c = 0; c < cols.size(); ++c) {
    std::cout << (c ? "; " : "") << (cols.size() > 1 ? cols[c].first + ": " : "") << dominant_wall(cols[c].second);
  }
  std::cout << "\n";
}

std::string throughput_text(const profiler::StepSummary& st, double tokens_per_s, int gpus) {
  return fixed(tokens_per_s, tokens_per_s >= 100.0 ? 0 : 1) + " tokens/s (" +
         fixed(tokens_per_s / gpus, tokens_per_s / gpus >= 100.0 ? 0 : 1) + " per GPU), " +
         fixed(st.tflops_per_gpu, 1) + " TFLOP/s per GPU, MFU " + fixed(100.0 * st.mfu, 1) + "%";
}

void print_training_steps(const scenarios::Scenario& s, const sim::SimResult& r) {
  const auto& steps = r.summary.steps;
  const auto& agg = r.summary.step_time_us;
  const auto& last = steps.back();
  std::cout << "step time      " << format_duration(microseconds(agg.median)) << " (median of " << steps.size()
            << " step" << (steps.size() > 1 ? "s" : "") << "; critical rank " << last.critical_rank << ")\n";
  std::cout << "throughput     " << throughput_text(last, last.tokens_per_s, s.world_size()) << "\n";
  if (r.summary.walls_mean) print_walls({{"", *r.summary.walls_mean}});
}

// Inference: prefill and decode steps differ by orders of magnitude, so each kind has its own step
// time, throughput and walls (means over the steps of that kind).
void print_inference_steps(const scenarios::Scenario& s, const sim::SimResult& r) {
  std::vector<std::pair<std::string, profiler::WallBreakdown>> cols;
  for (const auto& [kind, a] : r.summary.inference) {
    if (kind == "all") continue;
    std::vector<double> times;
    const profiler::StepSummary* last = nullptr;
    for (const auto& st : r.summary.steps) {
      if (st.inference && st.inference->kind == kind) {
        times.push_back(st.step_time_us);
        last = &st;
      }
    }
    if (!last) continue;
    const profiler::Aggregate t = profiler::aggregate(times);
    std::cout << pad(kind, 15) << format_duration(microseconds(t.median)) << " per step ("
              << (t.count > 1 ? "median of " : "") << t.count << " step" << (t.count > 1 ? "s" : "")
              << "; critical rank " << last->critical_rank << "), "
              << throughput_text(*last, a.tokens_per_s, s.world_size()) << "\n";
    if (auto w = profiler::mean_walls(r.summary.steps, kind)) cols.emplace_back(kind, *w);
  }
  if (!cols.empty()) print_walls(cols);
}

void print_summary(const scenarios::Scenario& s, const sim::SimResult& r, double wall_s) {
  std::cout << "scenario " << s.name << ": " << s.world_size() << " x simulated " << scenarios::to_string(s.cluster.gpu)
            << ", " << r.classes.size() << " rank classes, " << r.ops_per_step << " ops per step\n";
  for (const auto& w : r.warnings) std::cout << "warning: " << w << "\n";
  std::cout << "model          " << scenarios::model_line(s) << "\n";
  std::cout << "layout         " << scenarios::layout_line(s) << "\n";
  if (!r.summary.steps.empty()) {
    if (r.summary.inference.empty()) {
      print_training_steps(s, r);
    } else {
      print_inference_steps(s, r);
    }
  }
  std::cout << "memory capacity (peak per rank class, GPU " << format_bytes(r.memory.gpu_memory) << ")\n";
  const sim::ClassMemory* largest = nullptr;
  for (const auto& c : r.memory.classes) {
    const auto& b = c.breakdown;
    if (!largest || c.peak() > largest->peak()) largest = &c;
    std::cout << "  class " << c.id << " (" << c.label << ", " << c.ranks << " rank" << (c.ranks == 1 ? "" : "s")
              << "): " << format_bytes(c.peak()) << (c.peak() > r.memory.gpu_memory ? "  OOM" : "") << "  [weights "
              << format_bytes(b.weights) << ", gradients " << format_bytes(b.gradients) << ", optimizer "
              << format_bytes(b.optimizer) << ", activations " << format_bytes(b.activations) << ", buffers "
              << format_bytes(b.buffers) << ", graph pools " << format_bytes(b.graph_pools) << "]\n";
  }
  if (largest) {
    std::cout << "max memory     " << format_bytes(largest->peak()) << " per GPU of "
              << format_bytes(r.memory.gpu_memory) << " ("
              << fixed(100.0 * largest->peak().value / r.memory.gpu_memory.value, 1) << "%; class " << largest->id
              << ", " << largest->label << ")\n";
  }
  std::cout << "verdict        " << (r.memory.oom() ? "OUT OF MEMORY" : "fits in memory") << "\n";
  if (!r.run_dir.empty()) {
    std::cout << "run directory  " << r.run_dir.string() << "\n";
    if (auto w = run_dir_size_warning(r.run_dir.string()); !w.empty()) std::cout << "warning: " << w << "\n";
  }
  std::cout << "simulated in   " << fixed(wall_s, 2) << " s (" << r.collectives << " communication instances, "
            << r.flows << " flows)\n";
}

}  // namespace

void register_sim(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("sim", "Predict a scenario's steps (SimGrid discrete-event simulation) and write a run "
                                        "directory in the schema of a real run.");
  static SimArgs a;
  sub->add_option("scenario", a.scenario, "Scenario file (TOML)")->required();
  sub->add_option("--calibration", a.calibration,
                  "Calibration profile: a path, or \"auto\" for the shipped profile of the cluster's GPU "
                  "(default: the scenario's [calibration] profile); " +
                      std::string(kProfilePathHelp));
  sub->add_option("--out", a.out,
                  "Run directory to write (default: out/sim/<scenario name>, the name reduced to letters, digits, '.', "
                  "'-' and '_')");
  add_overwrite_flag(sub, a.overwrite, "Replace an existing run directory");
  sub->add_flag("--no-run-dir", a.no_run_dir, "Print the summary only; write no files");
  sub->add_flag("--fail-on-oom", a.fail_on_oom,
                "Exit 1 (after the summary) when the verdict is out of memory: a rank class's peak exceeds the GPU's "
                "memory");
  sub->add_option("--fidelity", a.fidelity, "flow: SimGrid flows with link sharing; analytic: closed forms (sweeps)")
      ->check(CLI::IsMember({"flow", "analytic"}));
  sub->add_option("--allreduce", a.allreduce, "All-reduce algorithm: auto (NCCL's rule of thumb), ring or tree")
      ->check(CLI::IsMember({"auto", "ring", "tree"}));
  sub->add_option("--steps", a.steps, "Steps to simulate (default: the scenario's run.steps)")->check(CLI::Range(1, 1000000));
  sub->add_option("--host-scale", a.host_scale,
                  "Multiply the profile's host-side costs (launches, library calls, syncs, event records) by this "
                  "factor: a host slower (> 1) or faster than the one calibrated, e.g. from a real run's host probe "
                  "(run.json settings.executor.device.host_probe; scripts/validate_suite.py). Default 1")
      ->check(CLI::Range(0.01, 100.0));
  sub->add_option("--disk-scale", a.disk_scale,
                  "Multiply the profile's disk read times (copy.disk_read, the NVMe tier of expert offloading) by this "
                  "factor: a disk slower (> 1) or faster than the one calibrated, e.g. the rate a real run's disk reads "
                  "achieved (scripts/validate_suite.py). Default 1")
      ->check(CLI::Range(0.01, 100.0));
  cmds.add(sub, [] {
    const scenarios::Scenario s = scenarios::load_scenario(a.scenario);
    sim::SimOptions opt;
    opt.fidelity = a.fidelity == "analytic" ? sim::Fidelity::analytic : sim::Fidelity::flow;
    opt.allreduce = a.allreduce == "ring"   ? sim::AllReduceChoice::ring
                    : a.allreduce == "tree" ? sim::AllReduceChoice::tree
                                            : sim::AllReduceChoice::automatic;
    opt.steps = a.steps;
    opt.host_scale = a.host_scale;
    opt.disk_scale = a.disk_scale;
    opt.overwrite = a.overwrite;
    if (!a.no_run_dir)
      opt.out_dir = a.out.empty() ? std::filesystem::path("out") / "sim" / profiler::run_dir_name(s.name)
                                  : std::filesystem::path(a.out);
    if (a.no_run_dir && !a.out.empty()) throw InputError("sim: --out and --no-run-dir contradict each other");
    opt.argv = {"threewalls", "sim", a.scenario, "--fidelity", a.fidelity, "--allreduce", a.allreduce};
    if (!a.calibration.empty()) opt.argv.insert(opt.argv.end(), {"--calibration", a.calibration});
    if (a.steps > 0) opt.argv.insert(opt.argv.end(), {"--steps", std::to_string(a.steps)});
    if (a.host_scale != 1.0) opt.argv.insert(opt.argv.end(), {"--host-scale", fixed(a.host_scale, 4)});
    if (a.disk_scale != 1.0) opt.argv.insert(opt.argv.end(), {"--disk-scale", fixed(a.disk_scale, 4)});
    if (!opt.out_dir.empty()) opt.argv.insert(opt.argv.end(), {"--out", opt.out_dir.string()});
    if (a.overwrite) opt.argv.push_back("--overwrite");
    // Refused before the simulation rather than after it (the writer checks again, under its lock).
    if (!opt.out_dir.empty()) {
      profiler::check_run_dir_target(opt.out_dir, a.overwrite,
                                     "pass --overwrite to replace it, or --out to choose another");
    }
    // A simulation frees its executor's state before it builds the records: reused, not faulted in again.
    keep_freed_heap();
    const auto t0 = std::chrono::steady_clock::now();
    const sim::SimResult r = sim::simulate(s, profile_arg_from_cwd(a.calibration), opt);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    print_summary(s, r, wall);
    if (a.fail_on_oom && r.memory.oom()) {
      std::cerr << "threewalls sim: out of memory (--fail-on-oom): a rank class's peak exceeds the GPU's "
                << format_bytes(r.memory.gpu_memory) << " (see the memory lines above)\n";
      return kExitFailure;
    }
    return kExitOk;
  });
}

}  // namespace threewalls::cli
