#pragma once
// summary.json (docs/formats/run_dir.md): per-step and per-phase aggregates, the wall breakdown on
// the critical rank, throughput, memory. Both executors call SummaryBuilder with their records plus
// what only they know (model FLOPs and tokens per step, GPU peak, memory model or measured peaks).
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/walls.hpp"

namespace threewalls::profiler {

// Order statistics of a sample. Percentiles interpolate linearly between closest ranks (numpy's
// default): p(q) = x[floor(h)] + (h - floor(h)) (x[floor(h)+1] - x[floor(h)]), h = q (n - 1).
struct Aggregate {
  std::size_t count = 0;
  double total = 0.0;
  double mean = 0.0;
  double median = 0.0;
  double p95 = 0.0;
  double min = 0.0;
  double max = 0.0;
};
// `values` is reordered. An empty sample gives count 0 and zeros.
Aggregate aggregate(std::vector<double>& values);
// Percentile q in [0, 1] of a sorted sample (linear interpolation, as above).
double percentile_sorted(std::span<const double> sorted, double q);

// The coarse view of one step (DESIGN.md), milliseconds as in the file.
struct CoarseStep {
  double host_to_device_ms = 0.0;    // max over ranks of the summed input-copy ops (coarse host_to_device)
  double training_step_ms = 0.0;     // the step time
  double training_metrics_ms = 0.0;  // max over ranks of the summed loss-reduction / host-read ops
};

struct StepSummary {
  int step = 0;
  double step_time_us = 0.0;  // the critical rank's step time
  int critical_rank = 0;      // the rank with the longest step (lowest rank on ties)
  double tokens_per_s = 0.0;
  double tflops_per_gpu = 0.0;
  double mfu = 0.0;
  std::optional<WallBreakdown> walls;  // null when the records hold only the coarse view
  CoarseStep coarse;
};

struct PhaseSummary {
  std::string phase;
  Wall wall = Wall::compute;
  Aggregate dur_us;
};

struct MemoryClass {
  int id = 0;
  std::string label;
  int ranks = 0;  // members of the class
  Bytes peak;
  std::vector<std::pair<std::string, Bytes>> breakdown;  // weights, gradients, optimizer, activations, ...
};

// What only the executor knows.
struct SummaryInputs {
  Flops model_flops_per_step;              // Megatron-LM's formula, all ranks, no recomputation
  double tokens_per_step = 0.0;
  std::string gpu;                         // "h100", "h200", or the device name
  FlopsPerSecond gpu_peak{989e12};         // dense bf16 peak of one GPU (989 TFLOP/s H100/H200 SXM)
  std::optional<Bytes> gpu_memory;         // memory of one GPU
  std::vector<MemoryClass> memory_classes; // simulator's memory model per rank class
  bool oom = false;
  std::map<int, Bytes> measured_peak_by_rank;  // real runs: the allocator's peak per rank
};

struct Summary {
  std::vector<StepSummary> steps;
  Aggregate step_time_us;
  std::optional<WallBreakdown> walls_mean;  // mean over recorded steps
  std::vector<PhaseSummary> phases;         // in order of first appearance
};

// Per-step walls and step times from records (shared by SummaryBuilder, compare and analyze).
// tflops/mfu/tokens are left 0; SummaryBuilder fills them. `phase_stats` false skips Summary::phases.
Summary summarize(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases, const Names& names,
                  bool phase_stats = true);

class SummaryBuilder {
 public:
  SummaryBuilder(const RunHeader& header, SummaryInputs inputs);
  // Aggregates and throughput from the records (all ranks, all recorded steps).
  [[nodiscard]] Summary build(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                              const Names& names) const;
  // summary.json's object.
  [[nodiscard]] OrderedJson to_json(const Summary& s) const;
  // build + to_json.
  [[nodiscard]] OrderedJson json(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                                 const Names& names) const {
    return to_json(build(steps, phases, names));
  }

 private:
  const RunHeader& header_;
  SummaryInputs inputs_;
};

OrderedJson walls_json(const WallBreakdown& w);

}  // namespace threewalls::profiler
