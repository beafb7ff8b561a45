#pragma once
// Synthetic run directories with a known answer, for tests, benchmarks and the docs' screenshots.
// Not a model of anything real: a data-parallel MoE-like step whose collectives synchronise every rank
// exactly (lockstep over a shared op list), so a slowdown injected on one rank, in one phase, for a step
// range, shows up where analyze must find it. Written through RunDirWriter like any executor's run.
#include <cstdint>
#include <filesystem>
#include <string>

namespace threewalls::notebooks_export {

struct SyntheticSpec {
  std::string source = "sim";       // "sim" or "real"
  std::string scenario = "synthetic_moe";
  int ranks = 8;
  int stages = 1;                   // pipeline stages for peer grouping (ranks split evenly, in order)
  int steps = 10;                   // all recorded (record_every_n_steps = 1)
  int layers = 4;
  int microbatches = 2;
  double noise = 0.0;               // relative sigma of a log-normal factor on every duration
  std::uint64_t seed = 1;
  double time_scale = 1.0;          // multiplies every duration (a "real" run can differ from a "sim" one)
  // One slowdown: compute ops of `slow_phase` (or every compute op when empty) on `slow_rank` take
  // `slow_factor` times longer in steps [slow_from, slow_to] (inclusive; -1 = until the end).
  int slow_rank = -1;
  std::string slow_phase;
  double slow_factor = 1.0;
  int slow_from = 0;
  int slow_to = -1;
  bool write_group_id = true;       // false: as a writer without group_id (analyze pairs by end time)
};

// Phase records one rank writes per step: microbatches * layers * 10 + 5.
long long synthetic_records_per_rank_step(const SyntheticSpec& s);

// Writes a complete run directory (run.json, phases files, summary.json) at `dir` (must not exist or be empty).
void write_synthetic_run(const std::filesystem::path& dir, const SyntheticSpec& spec);

}  // namespace threewalls::notebooks_export
