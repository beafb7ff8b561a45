#pragma once
// The run records of a StepGraph (docs/formats/run_dir.md), owned here once: both executors (the
// simulator and the real backend) and any other producer of run directories from a scenario write
// through these functions, so their records agree field for field by construction.
//
//  * run_header: the header basics (source, world, scenario id, seed, rank classes); the executor
//    adds its device, argv, start time and settings.
//  * sampling_config: which steps and ranks are recorded, from the scenario's run.profiler keys.
//  * OpRecords: the op -> record template (interned names, peer, group and group id, wall, coarse
//    view); the executor adds the step and the times.
//  * summary_inputs / inference_step: what the summary needs from the scenario and the StepGraph.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/record_sink.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/sampling.hpp"
#include "threewalls/profiler/summary.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::records {

// The header of a run of `s` whose first StepGraph is `g`: profiler::make_header(source, world,
// content_key) with the scenario's name, path and hash, its seed and the rank classes of `g`. A real
// run passes no key (a random run id); a simulation passes the key naming its inputs.
profiler::RunHeader run_header(std::string_view source, const scenarios::Scenario& s, const scenarios::StepGraph& g,
                               std::optional<std::string_view> content_key = std::nullopt);

// The sampling config of `s`'s run.profiler; representatives (asked, or chosen by "auto") resolve to
// one rank per class of `g` (sorted). `g` is the run's first StepGraph (an empty one where `s` lists
// its ranks or records all).
profiler::SamplingConfig sampling_config(const scenarios::Scenario& s, const scenarios::StepGraph& g);
// run.profiler.ranks of `s` with "auto" decided (scenarios::auto_records_every_rank, a rank running
// the most ops of a class of `g`): all, representatives or listed.
scenarios::RecordedRanks recorded_ranks(const scenarios::Scenario& s, const scenarios::StepGraph& g);

// The coarse view an op belongs to (run_dir.md, `coarse`): the data loading copies and the
// training-metrics reduction with its host read, by the op's flags.
profiler::CoarseView coarse_view(const scenarios::Op& op);

// The record template of every op of one StepGraph: its phase, stream and group names interned in
// the run's name tables, and per rank the fields the op fixes.
class OpRecords {
 public:
  // Interns the graph's phases and streams (in graph order) and every group name.
  OpRecords(const scenarios::StepGraph& g, profiler::Names& names);
  // The same through a sink's thread-safe name tables; a disabled sink interns nothing (ids 0).
  OpRecords(const scenarios::StepGraph& g, profiler::RecordSink& sink);

  // The records of `rank`'s ops (the ops of its class, in issue order) with every field but `step`,
  // `start_us`, `dur_us` and `launch_wait_us`: rank, phase, stream, layer, micro-batch, bytes, FLOPs,
  // expert, peer (send/recv: Layout::peer_of), group (communication ops), group_id (collectives: the
  // lowest global rank of the group instance), tokens, wall and coarse view.
  [[nodiscard]] std::vector<profiler::PhaseRecord> of_rank(int rank) const;
  // The same records appended to `out` (its earlier records stay).
  void append_rank(int rank, std::vector<profiler::PhaseRecord>& out) const;
  // The records of the ops `ops` (indices into the class's ops) only, in that order, appended to `out`.
  void append_ops(int rank, std::span<const std::uint32_t> ops, std::vector<profiler::PhaseRecord>& out) const;

 private:
  // Appends the records of the class's ops op_index(0), ..., op_index(n - 1).
  template <typename OpIndex>
  void append(int rank, std::size_t n, const OpIndex& op_index, std::vector<profiler::PhaseRecord>& out) const;

  const scenarios::StepGraph* g_;
  std::vector<std::uint32_t> phase_, stream_;
  std::vector<std::uint32_t> group_;  // by Group value; Group::none: kNoName
};

// What the summary needs from the scenario and its first StepGraph: model FLOPs and tokens per step,
// the GPU kind and its dense bf16 peak (the MFU's denominator).
profiler::SummaryInputs summary_inputs(const scenarios::Scenario& s, const scenarios::StepGraph& g);

// An inference step's summary input (kind, tokens, FLOPs, expert activations and cache hits of every
// rank); nullopt for a training graph.
std::optional<profiler::InferenceStepInput> inference_step(const scenarios::StepGraph& g);

}  // namespace threewalls::records
