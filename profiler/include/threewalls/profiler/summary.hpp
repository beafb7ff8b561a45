#pragma once
// summary.json (docs/formats/run_dir.md): per-step and per-phase aggregates, the wall breakdown on
// the critical rank, throughput, memory. Both executors call SummaryBuilder with their records plus
// what only they know (model FLOPs and tokens per step, GPU peak, memory model or measured peaks).
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

// The coarse view of one step (docs/formats/run_dir.md), milliseconds as in the file.
struct CoarseStep {
  double host_to_device_ms = 0.0;    // max over ranks of the summed input-copy ops (coarse host_to_device)
  double training_step_ms = 0.0;     // the step time
  double training_metrics_ms = 0.0;  // max over ranks of the summed loss-reduction / host-read ops
};

// Inference and expert-offload metrics of one step on its critical rank (docs/formats/run_dir.md,
// summary.json `steps[].inference`). Present when the run's records hold inference phases
// (`sampled_token_read` or `expert_fetch_h2d`) at layer granularity.
//
//  * expert_wait_us: the measure of the instants t in the step at which no device op other than an
//    expert fetch runs on the rank and t lies in [R_l, F_l) for some MoE layer l, where R_l is the end
//    of the layer's `router_topk_fwd` record (the earliest start of its fetches when absent) and F_l
//    the end of its last `expert_fetch_h2d` record: the GPU sat idle between the routing decision and
//    the arrival of the layer's experts. The same definition covers both sync modes: in "barrier"
//    mode the compute waits behind the host's `expert_wait` barrier, in "per_expert" mode the compute
//    stream waits for the copy events of the experts it needs next. (Host sync records start when the
//    awaited work is done, so the wait is not inside any record's duration: run_dir.md.)
//  * bubble_ratio = expert_wait_us / step_time_us.
//  * sync_overhead_us: the summed durations of the host sync records (kSyncPhases below): the host's
//    own cost of each sync once its work was done; sync_overhead_share = that / step_time_us.
//  * bytes_fetched_disk / _h2d: summed `bytes` of `expert_fetch_disk` / `expert_fetch_h2d` records;
//    experts_fetched: the number of `expert_fetch_h2d` records.
//  * experts_activated, cache_hits, cache_hit_rate = cache_hits / experts_activated: from the
//    executor (SummaryInputs::inference_steps; records cannot carry them), null without it.
inline constexpr const char* kSyncPhases[] = {"expert_fetch_sync", "expert_wait", "moe_routing_stats_read_fwd",
                                              "host_to_device_sync", "sampled_token_read"};

struct InferenceStep {
  std::string kind;  // "prefill", "decode" (from SummaryInputs), or "" when the executor did not say
  double tokens = 0.0;
  double expert_wait_us = 0.0;
  double bubble_ratio = 0.0;
  double sync_overhead_us = 0.0;
  double sync_overhead_share = 0.0;
  double bytes_fetched_disk = 0.0;
  double bytes_fetched_h2d = 0.0;
  std::int64_t experts_fetched = 0;
  std::optional<std::int64_t> experts_activated;
  std::optional<std::int64_t> cache_hits;
  std::optional<double> cache_hit_rate;
};

// Inference metrics over a set of recorded steps (all, or one kind): sums over the steps, ratios of sums.
struct InferenceAggregate {
  std::size_t steps = 0;
  double step_time_us_mean = 0.0;
  double expert_wait_us_mean = 0.0;
  double bubble_ratio = 0.0;           // sum of expert waits / sum of step times
  double sync_overhead_share = 0.0;    // sum of sync overheads / sum of step times
  double bytes_fetched_disk_mean = 0.0;
  double bytes_fetched_h2d_mean = 0.0;
  double experts_fetched_mean = 0.0;
  std::optional<double> cache_hit_rate;  // sum of hits / sum of activations (steps that have them)
  double tokens_per_s = 0.0;           // sum of tokens / sum of step times
};

struct StepSummary {
  int step = 0;
  double step_time_us = 0.0;  // the critical rank's step time
  int critical_rank = 0;      // the rank with the longest step (lowest rank on ties)
  double tokens_per_s = 0.0;
  double tflops_per_gpu = 0.0;
  double mfu = 0.0;
  std::optional<WallBreakdown> walls;  // null when the records hold only the coarse view
  // With wall marks (summarize): the critical rank's walls from the step's start to each mark (µs
  // from the step's start, clipped to the step), by the sweep of `walls`; empty without walls.
  std::vector<WallBreakdown> walls_until;
  CoarseStep coarse;
  std::optional<InferenceStep> inference;  // inference runs only (above)
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

// Per-step facts of an inference run that records cannot carry: the executor takes them from the
// step's StepGraph (scenarios::StepGraph: step_kind, tokens, model_flops, RankClass::experts_*).
struct ExpertActivations {
  std::int64_t activated = 0;   // local experts activated in the step, summed over MoE layers
  std::int64_t cache_hits = 0;  // of those, found in the GPU expert cache (not fetched)
};
struct InferenceStepInput {
  std::string kind;           // "prefill" or "decode"
  double tokens = 0.0;        // tokens processed in the step, all ranks (replaces tokens_per_step)
  double model_flops = -1.0;  // model FLOPs of the step, all ranks (replaces model_flops_per_step when >= 0)
  std::map<int, ExpertActivations> by_rank;  // by global rank (the simulator: class representatives)
};

// What only the executor knows.
struct SummaryInputs {
  Flops model_flops_per_step;              // Megatron-LM's formula, all ranks, no recomputation
  double tokens_per_step = 0.0;
  std::string gpu;                         // "h100", "h200", or the device name
  FlopsPerSecond gpu_peak = gpu_spec(GpuKind::h100).peak_bf16;  // dense bf16 peak of one GPU
  std::optional<Bytes> gpu_memory;         // memory of one GPU
  std::vector<MemoryClass> memory_classes; // simulator's memory model per rank class
  bool oom = false;
  std::map<int, Bytes> measured_peak_by_rank;  // real runs: device-wide peak per rank (cudaMemGetInfo)
  // Real runs: the peaks of the backend's caching allocator per rank (saved activations; written
  // only when given).
  std::map<int, Bytes> peak_allocated_by_rank;
  std::map<int, Bytes> peak_reserved_by_rank;
  // Inference runs: per recorded step (by step index); empty for training.
  std::map<int, InferenceStepInput> inference_steps;
  // Instants (µs from a step's start) at which every step also reports its walls so far
  // (StepSummary::walls_until): the walls of a part of the step are the difference of two.
  std::vector<double> wall_marks_us;
};

struct Summary {
  std::vector<StepSummary> steps;
  Aggregate step_time_us;
  std::optional<WallBreakdown> walls_mean;  // mean over recorded steps
  std::vector<PhaseSummary> phases;         // in order of first appearance
  // Inference runs: over all recorded steps and per step kind ("prefill", "decode"), in that order.
  std::vector<std::pair<std::string, InferenceAggregate>> inference;
};

// The mean wall breakdown of the steps whose inference kind is `kind` ("prefill", "decode"; empty:
// every step), summed in step order then scaled by 1 / count. Null when no step matches or one of
// them has no walls (coarse records).
std::optional<WallBreakdown> mean_walls(std::span<const StepSummary> steps, std::string_view kind = {});

// Per-step walls and step times from records (shared by SummaryBuilder, compare and analyze).
// tflops/mfu/tokens are left 0; SummaryBuilder fills them (and the inference fields that come from
// SummaryInputs). `phase_stats` false skips Summary::phases; it then reads, of `phases`, every record
// of each step's critical rank, the communication and coarse-view records of the other ranks and
// whether some record is detailed (CoarseView::none): leaving out their other records gives the same
// Summary.
//
// Collective waits (walls.hpp): the members of a collective instance are the records of one
// (step, phase, layer, microbatch, expert, group, group_id) with no `peer`; without group_id (older
// writers) the records of that key whose end lies within max(1 us, 2% of the duration) of each
// other's (members of an instance finish together). A pipeline send and its receive pair by rank and
// peer, step, micro-batch and order of start among the same (phase, peer), with phases that differ by
// "send" <-> "recv" (`pp_send_fwd` <-> `pp_recv_fwd`). wait = last arrival among the members whose
// records are present - own arrival, clipped to [0, dur_us]; arrival = the member's step epoch_us +
// start_us. Fallback when no other member's record is present (unrecorded ranks, a simulator class
// whose partner class is not in the same group instance): the wait is unknown and the op keeps the
// pre-refinement accounting (collective: communication; pipeline send/recv: bubble). When only
// some members are present, the wait is measured against those (a lower bound).
// `wall_marks_us`: StepSummary::walls_until's instants.
Summary summarize(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases, const Names& names,
                  bool phase_stats = true, std::span<const double> wall_marks_us = {});

// A posted receive: a point-to-point phase whose name says "recv" before any "send" (`pp_recv_fwd`).
// It is posted before its data can arrive, so most of its duration is a wait for the peer, not work:
// reports rank it apart from phase time.
bool is_receive_phase(std::string_view phase);

// A pipeline send and the receive it delivers to: indices into the records given to p2p_pairs.
struct P2pPair {
  std::size_t send = 0;
  std::size_t recv = 0;
};
// Every send whose receive is among `phases`, paired by summarize's rule (above): rank and peer
// swapped, step, micro-batch, phases that differ by "send" <-> "recv", k-th by arrival with k-th.
// In send order of `phases`' ranks, then arrival.
std::vector<P2pPair> p2p_pairs(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                               const Names& names);

class SummaryBuilder {
 public:
  SummaryBuilder(const RunHeader& header, SummaryInputs inputs);
  // Aggregates and throughput from the records (all ranks, all recorded steps). `phase_stats` false
  // leaves Summary::phases empty (summarize).
  [[nodiscard]] Summary build(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                              const Names& names, bool phase_stats = true) const;
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
// summary.json's `steps[].inference` and `inference.<kind>` objects (docs/formats/run_dir.md).
OrderedJson inference_step_json(const InferenceStep& m);
OrderedJson inference_aggregate_json(const InferenceAggregate& a);

}  // namespace threewalls::profiler
