#pragma once
// `threewalls analyze RUN`: which rank is slow, in which phase, who waits in collectives, and whether
// the slowness persists or is bounded to a step range. Works on any run directory (one rank, no
// collectives, coarse granularity: the parts that need more say so).
//
// Definitions (docs/compare_analyze_export.md):
//  * arrival(rank, op) = epoch_us(rank, step) + start_us. A collective instance is the set of records of
//    one (step, phase, layer, microbatch, expert, group, group_id) key; without group_id (older writers)
//    instances are told apart by their end times (members of one instance finish together).
//  * wait(rank, op) = max over members of arrival - arrival(rank, op), clipped to [0, dur_us].
//    Pipeline and other point-to-point ops (records with a peer) are not collectives.
//  * own(rank, step) = dur_us(rank, step) - sum of the rank's waits in that step: the time the rank
//    itself needed. Collectives make every member's step time equal to the slowest member's, so a slow
//    rank shows in its own time, not in its step time.
//  * peers of a rank: the recorded ranks of the same pipeline stage (run.json rank_classes; all ranks
//    when the run has no classes). When every stage has exactly one recorded rank and there are two
//    or more stages (a simulation records one representative per rank class), the table's "own vs
//    peers" and robust z compare each stage's rank with the other stages' ranks instead: pipeline
//    balance, not a slow GPU; slow-rank detection still needs two recorded ranks of one stage.
//  * slow in step s: own(r, s) > (1 + min_excess) m and, when the peers spread, 0.6745 (own - m) / MAD >
//    outlier_z, where m and MAD are the median and the median absolute deviation of own(p, s) over the
//    peers p != r (the robust z-score of Iglewicz and Hoaglin).
//  * a slow rank is persistently slow when slow in >= persistent_share of its recorded steps, else its
//    slowness is bounded to [first, last] slow step.
#include <optional>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

struct AnalyzeOptions {
  double outlier_z = 3.5;
  double min_excess = 0.05;
  double persistent_share = 0.8;
  std::size_t top_phases = 5;
};

struct RankStat {
  int rank = 0;
  int stage = 0;  // pipeline stage: the peer group
  std::size_t steps = 0;
  double median_step_us = 0.0;
  double median_own_us = 0.0;
  double median_wait_us = 0.0;
  double mean_own_us = 0.0;   // means show a slowness bounded to a few steps, which medians hide
  double mean_wait_us = 0.0;
  std::optional<double> own_vs_peers_pct;  // median own vs the peers' median own (null without peers)
  std::optional<double> robust_z;          // of the median own among the peers (null when they do not spread)
  std::size_t slow_steps = 0;
};

struct PhaseExcess {
  std::string phase;
  profiler::Wall wall = profiler::Wall::compute;
  double rank_us = 0.0;   // the slow rank's time in this phase per slow step (median)
  double peers_us = 0.0;  // the peers' median of the same
  double excess_us = 0.0;
  std::optional<double> excess_pct;
};

struct SlowRank {
  int rank = 0;
  int stage = 0;
  std::vector<int> slow_steps;
  std::size_t recorded_steps = 0;
  int first_slow_step = 0;
  int last_slow_step = 0;
  bool persistent = false;
  double own_excess_pct = 0.0;  // median over its slow steps of own vs the peers' median
  std::vector<PhaseExcess> phases;  // largest excess first, positive excess only
};

struct RankWait {
  int rank = 0;
  std::size_t collectives = 0;  // collective instances and pipeline transfers it took part in
  double total_wait_us = 0.0;
  double mean_wait_us = 0.0;
  std::size_t last_arrivals = 0;  // instances where this rank arrived last (the others waited for it)
};

struct GroupWait {
  std::string group;
  std::size_t instances = 0;
  double total_wait_us = 0.0;
  std::vector<RankWait> ranks;  // most waiting first
  std::optional<int> most_waited_for;  // the rank most often last to arrive
};

// An inference run's metrics per step kind ("all", "prefill", "decode"), as summary.json's top-level
// `inference` block has them (docs/formats/run_dir.md): expert wait, bubble ratio, sync overhead,
// bytes fetched, cache hit rate, tokens/s.
struct InferenceKind {
  std::string kind;
  profiler::InferenceAggregate metrics;
};

struct Analysis {
  std::string label;
  std::size_t ranks_recorded = 0;
  std::vector<int> steps;  // recorded steps
  std::string collective_pairing;  // "group_id", "end time", "none" (no collectives recorded)
  // What "own vs peers" compares a rank with: "same stage" or "other stages" (one rank per stage).
  std::string peers = "same stage";
  std::vector<RankStat> ranks;
  // own(rank, step) against its peers' median in percent: [index in `ranks`][index in `steps`];
  // NaN where the rank recorded no such step or has no peers.
  std::vector<std::vector<double>> own_excess_pct;
  std::vector<SlowRank> slow_ranks;  // most slow steps first
  std::vector<RankWait> waits;       // per rank, all groups, most waiting first
  std::vector<GroupWait> groups;
  std::vector<std::string> notes;    // what could not be analysed and why
  std::vector<InferenceKind> inference;  // inference runs with a summary.json; empty otherwise
};

// Analyses one run. Deterministic; throws nothing for well-formed RunData.
Analysis analyze_run(const profiler::RunData& run, const AnalyzeOptions& options = {});

// The finding for `rank`, or nullptr when analyze did not find it slow. For tests that inject a
// slowdown (the scenario's [[cluster.slowdown]]) and check that analyze finds rank, phase and steps.
const SlowRank* find_slow_rank(const Analysis& a, int rank);

std::string format_analysis_text(const Analysis& a);
OrderedJson analysis_json(const Analysis& a);

}  // namespace threewalls::notebooks_export
