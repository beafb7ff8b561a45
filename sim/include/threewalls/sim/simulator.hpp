#pragma once
// `threewalls sim`: predicts the steps of a scenario and writes a run directory (source "sim") in
// the schema a real run writes (docs/formats/run_dir.md, docs/simulator.md).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/summary.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/memory_model.hpp"
#include "threewalls/sim/op_coster.hpp"

namespace threewalls::sim {

struct SimOptions {
  Fidelity fidelity = Fidelity::flow;
  AllReduceChoice allreduce = AllReduceChoice::automatic;
  int steps = -1;                  // steps to simulate; -1 = the scenario's run.steps
  std::filesystem::path out_dir;   // run directory; empty = write none
  bool overwrite = false;          // replace an existing run directory
  std::vector<std::string> argv;   // the command line, for the run header
  // The header's start_time. A simulation has no wall clock: a fixed value keeps the output
  // byte-identical for the same inputs (docs/simulator.md, "Determinism").
  std::string start_time = "1970-01-01T00:00:00Z";
  MemoryOptions memory;
  // Multiplies the profile's host-side costs (CostModelCoster): a host measured slower (> 1) or
  // faster than the one calibrated, e.g. by the host probe of a real run (threewalls sim --host-scale).
  double host_scale = 1.0;
  // Multiplies the time of every disk read (CostModelCoster): a disk measured slower (> 1) or faster
  // than the one calibrated, e.g. the rate a real run's disk reads achieved (threewalls sim --disk-scale).
  double disk_scale = 1.0;
  // false: the summary leaves out the per-phase statistics (Summary::phases, summary.json's
  // `phases`), for a caller that reads only the steps and the walls (the planner's re-simulations).
  bool phase_stats = true;
  // false: the ops are not scanned for the warnings of ops priced with another kernel's fit
  // (OpCoster::substitution), for a caller that does not read SimResult::warnings.
  bool substitution_warnings = true;
  // > 0 (training): also measure the first step's steady-state period (SimResult::steady_round) of
  // rounds of this many micro-batches (pp with the interleaved schedule, whose micro-batches run in
  // rounds of pp; else 1), over its last `steady_rounds` rounds.
  int steady_round = 0;
  int steady_rounds = 1;
  // false: every flow is a SimGrid communication, none runs alone outside it (SimGridEngine; the
  // check of that shortcut).
  bool solo_flows = true;
};

// The steady state of a pipelined training step of m micro-batches, measured in the step (the
// planner's re-simulations, docs/planner.md): once the schedule is past its warm-up, each further
// round of `microbatches` adds one period to the step. Measured on the first pipeline stage, whose
// last forward ends the schedule's steady part: from the start of the last model chunk's forward of
// micro-batch m - 1 - rounds x microbatches to that of micro-batch m - 1 (the first compute or
// memory op of each; the stage's rank class where they are furthest apart), over `rounds`.
struct SteadyRound {
  int microbatches = 0;
  int rounds = 0;
  double period_us = 0.0;
  // The critical rank's walls over the period (the step's walls up to its end less those up to its
  // start); null when the step has no walls.
  std::optional<profiler::WallBreakdown> walls;
};

// Which calibration profile the costs come from (for the run header).
struct ProfileInfoForHeader {
  std::string id;
  std::string path;
  std::string gpu;
  std::string reason;  // why this profile (resolve_profile's sentence)
  // Empty for a measured profile; else why its figures are not a measurement (a synthetic profile's
  // [hardware] machine), which every summary of the run repeats as a warning.
  std::string not_measured;
};

struct SimResult {
  profiler::Summary summary;      // per step: step time, walls, throughput
  OrderedJson summary_json;       // summary.json's object
  MemoryReport memory;
  std::vector<profiler::RankClassInfo> classes;
  double model_flops_per_step = 0.0;
  double tokens_per_step = 0.0;
  std::size_t ops_per_step = 0;   // ops of all rank classes (one representative each)
  std::size_t collectives = 0;    // collective / p2p / copy instances, all steps
  std::size_t flows = 0;          // flows handed to SimGrid, all steps
  std::optional<SteadyRound> steady_round;  // with SimOptions::steady_round, when the step has one
  std::vector<std::string> warnings;
  std::filesystem::path run_dir;  // empty when none was written
};

// Simulates with costs from `coster`. Throws InputError for scenarios or graphs that cannot be
// simulated, SystemError for I/O failures.
SimResult simulate(const scenarios::Scenario& s, const OpCoster& coster, const ProfileInfoForHeader& profile,
                   const SimOptions& options);

// Resolves the calibration profile (`calibration` overrides the scenario's; "auto" picks the
// shipped profile of the cluster's GPU), loads it, and simulates with its CostModel.
SimResult simulate(const scenarios::Scenario& s, const std::string& calibration, const SimOptions& options);

}  // namespace threewalls::sim
