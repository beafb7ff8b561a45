#pragma once
// Which steps and ranks the profiler records, and when it writes to disk (docs/architecture.md, "Profiler knobs";
// scenario keys run.profiler.*). The policy is pure arithmetic on step and rank numbers, so an
// executor can ask it in its hot loop and a disabled profiler costs one branch.
#include <cstdint>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/record.hpp"

namespace threewalls::profiler {

// Granularity (core vocabulary): layer = one phase record per op (phase, layer, micro-batch, expert);
// coarse = only ops of the coarse view (PhaseRecord::coarse != none), plus step records.
using threewalls::Granularity;

struct SamplingConfig {
  bool enabled = true;            // false: no files at all, nothing recorded
  int start_step = 0;             // first step that may be recorded (0 = first measured step)
  int end_step = -1;              // last step that may be recorded, inclusive; -1 = no end
  int record_every_n_steps = 10;  // record steps start_step, start_step + n, ...
  int flush_every_n_steps = 10;   // write buffered records after every n-th step counted from start_step
  std::vector<int> ranks;         // recording ranks; empty = every rank. "representatives" is resolved
                                  // by the caller (one rank per rank class) into this list.
  Granularity granularity = Granularity::layer;
};

class SamplingPolicy {
 public:
  SamplingPolicy() = default;
  // Validates `config` against the world: throws InputError naming the knob (`profiler.ranks`,
  // `profiler.record_every_n_steps`, ...) and the allowed range.
  SamplingPolicy(SamplingConfig config, int world_size);

  [[nodiscard]] bool enabled() const { return config_.enabled; }
  // Whether step `step` is recorded: enabled, start_step <= step <= end_step (when end_step >= 0) and
  // (step - start_step) % record_every_n_steps == 0.
  [[nodiscard]] bool records(int step) const {
    if (!config_.enabled || step < config_.start_step) return false;
    if (config_.end_step >= 0 && step > config_.end_step) return false;
    return (step - config_.start_step) % config_.record_every_n_steps == 0;
  }
  // Whether rank `rank` writes a phases file.
  [[nodiscard]] bool records_rank(int rank) const {
    return config_.enabled && rank >= 0 && static_cast<std::size_t>(rank) < rank_mask_.size() &&
           rank_mask_[static_cast<std::size_t>(rank)] != 0;
  }
  // Whether an op of coarse-view membership `view` is recorded at this granularity.
  [[nodiscard]] bool records_phase(CoarseView view) const {
    return config_.granularity == Granularity::layer || view != CoarseView::none;
  }
  // Whether buffered records are written out after step `step` ends: enabled, step >= start_step and
  // (step - start_step + 1) % flush_every_n_steps == 0, or step == end_step.
  [[nodiscard]] bool flush_after(int step) const {
    if (!config_.enabled || step < config_.start_step) return false;
    if (step == config_.end_step) return true;
    return (step - config_.start_step + 1) % config_.flush_every_n_steps == 0;
  }
  [[nodiscard]] const std::vector<int>& recording_ranks() const { return ranks_; }
  [[nodiscard]] const SamplingConfig& config() const { return config_; }
  [[nodiscard]] int world_size() const { return world_size_; }
  // The effective knobs as written into the run header's settings.profiler; the recording ranks
  // appear there as their count (`recorded_ranks`), the list only in run.json's `ranks`.
  [[nodiscard]] OrderedJson to_json() const;

 private:
  SamplingConfig config_ = disabled_config();
  static SamplingConfig disabled_config() {
    SamplingConfig c;
    c.enabled = false;
    return c;
  }
  int world_size_ = 0;
  std::vector<int> ranks_;                 // ascending
  std::vector<std::uint8_t> rank_mask_;    // world-sized
};

}  // namespace threewalls::profiler
