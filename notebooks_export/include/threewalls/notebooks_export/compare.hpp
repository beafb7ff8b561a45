#pragma once
// `threewalls compare A B`: how far run B is from run A (the reference), record for record.
//
// Records are matched by their key (step, rank, phase, layer, microbatch, expert), which is identical
// between a simulated and a real run of the same scenario (run_dir.md). Statistics use matched
// records only (apples to apples); records on one side only are listed by key, never dropped.
//
// Error of B against A, for any statistic x (median, p95, step time, a wall, peak memory):
//   signed_pct = 100 (x_B - x_A) / x_A,  abs_pct = |signed_pct|   (null when x_A = 0)
#include <optional>
#include <string>
#include <vector>

#include "threewalls/core/host_probe.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

struct SideStats {
  std::size_t count = 0;
  double median_us = 0.0;
  double p95_us = 0.0;
  double total_us = 0.0;
};

// Error of b against the reference a, in percent; nullopt when a is 0 (or not finite).
std::optional<double> signed_error_pct(double a, double b);

struct CompareRow {
  std::string phase;
  std::optional<int> layer;       // set in the per-layer table
  std::optional<int> microbatch;  // set in the per-micro-batch table
  profiler::Wall wall = profiler::Wall::compute;
  SideStats a;
  SideStats b;
  std::optional<double> median_error_pct;
  std::optional<double> p95_error_pct;
  double share_of_a = 0.0;  // this row's matched time in A / all matched time in A
};

// A record key present on one side only.
struct UnmatchedKey {
  int step = 0;
  int rank = 0;
  std::string phase;
  int layer = profiler::kAbsent;
  int microbatch = profiler::kAbsent;
  int expert = profiler::kAbsent;
  [[nodiscard]] std::string str() const;  // "step 10 rank 3 attn_qkv_fwd layer 2 mb 1"
};

struct CompareOptions {
  // --fail-above PCT: the verdict fails when any checked error exceeds this (see CompareResult::checks).
  std::optional<double> fail_above_pct;
  // Phases whose share of A's matched time is at least this are "major": their median error is checked.
  double major_phase_share = 0.05;
};

// One quantity that --fail-above checks.
struct Check {
  std::string what;  // "step time (median)", "phase moe_experts_fwd (median)", "peak memory"
  double a = 0.0;
  double b = 0.0;
  std::optional<double> error_pct;
  bool failed = false;
};

// The measured run's host against the simulated run's profile: the real run's host probe
// over what the profile charges for the same calls (calibration::host_probe_scale). Filled by
// `threewalls compare` when one side is a real run with a host probe and the other a simulation
// whose profile file it can read; compare_runs leaves it empty.
struct HostProbeLine {
  char real_side = 'A';              // the side of the real run
  host_probe::Scale probe;           // its probe (in its own process, before step 0) against the profile
  double sim_host_scale = 1.0;       // the simulation's --host-scale (the charges include it)
  std::string profile;               // the simulation's profile path
};

// A real run beside a simulation: the real run's host probe and the simulation's profile and host
// scale, ready to be scored against that profile (calibration::host_probe_scale_from_profile).
struct HostProbePair {
  char real_side = 'A';
  OrderedJson probe;            // the real run's settings.executor.device.host_probe
  std::string profile;          // the simulation's calibration profile path (a regular file)
  double sim_host_scale = 1.0;  // the simulation's settings.simulator.host_scale, else 1
};

// The pair when one run is real with a host probe and the other simulated with a profile file that is
// still there to read; nullopt otherwise.
std::optional<HostProbePair> find_host_probe_pair(const profiler::RunData& a, const profiler::RunData& b);

struct CompareResult {
  std::string label_a;
  std::string label_b;
  // How A and B are not runs of one scenario (its name, its file's hash, the world size); empty when
  // they are. The text starts with a warning banner listing them, the JSON has them as
  // "different_scenarios", and the command line prints them on stderr.
  std::vector<std::string> different_scenarios;
  // A run without summary.json ("B (DIR) has no summary.json: ..."): the figures only it holds (peak
  // memory, saved activations) show as n/a. Listed after the banner, in the JSON as "missing_summary",
  // and on stderr.
  std::vector<std::string> missing_summary;
  profiler::Aggregate step_time_a;  // critical-rank step time over the matched steps
  profiler::Aggregate step_time_b;
  std::optional<double> step_time_error_pct;  // of the medians
  std::optional<profiler::WallBreakdown> walls_a;  // mean over matched steps
  std::optional<profiler::WallBreakdown> walls_b;
  std::optional<double> peak_memory_a;  // bytes: measured peak (real) or model peak (sim), from summary.json
  std::optional<double> peak_memory_b;
  std::string peak_memory_kind_a;       // "measured" or "model"
  std::string peak_memory_kind_b;
  // bytes: the peak of the saved activations, as allocated by a real run's caching allocator
  // (summary.json peak_allocated_bytes_by_rank, the largest rank) or as the memory model's
  // `activations` (largest class); kind "allocated" or "model".
  std::optional<double> activation_memory_a;
  std::optional<double> activation_memory_b;
  std::string activation_memory_kind_a;
  std::string activation_memory_kind_b;
  std::size_t matched = 0;
  std::vector<int> matched_steps;
  std::vector<CompareRow> by_phase;             // one row per phase
  std::vector<CompareRow> by_phase_layer;       // (phase, layer) where both sides have a layer
  std::vector<CompareRow> by_phase_microbatch;  // (phase, microbatch) where both sides have one
  std::vector<UnmatchedKey> only_in_a;
  std::vector<UnmatchedKey> only_in_b;
  std::optional<HostProbeLine> host_probe;
  std::vector<Check> checks;  // what --fail-above looks at, with verdicts
  std::optional<double> fail_above_pct;
  // One run is Megatron-LM timers (settings.import.format "megatron-log", python/threewalls/importers):
  // both runs were compared as timers on rank 0, the other run's records rolled up into them.
  bool timer_view = false;
  [[nodiscard]] bool failed() const;
};

// Compares two runs. When one of them holds Megatron-LM timers (an imported training log), both are
// compared as those timers (docs/compare_analyze_export.md, "Megatron-LM timers"). Throws InputError when a run holds a
// duplicate record key (naming the run and key) or when the two runs share no record at all.
CompareResult compare_runs(const profiler::RunData& a, const profiler::RunData& b, const CompareOptions& options = {});

// Text report: summary lines, walls side by side, the per-phase table, the largest per-layer and
// per-micro-batch errors (`top` rows each), and the one-sided keys (first `top` of each side).
std::string format_compare_text(const CompareResult& r, std::size_t top = 15);
// Everything, every row and every one-sided key.
OrderedJson compare_json(const CompareResult& r);

}  // namespace threewalls::notebooks_export
