#pragma once
// The what-if planner (`threewalls plan`, docs/planner.md): Megatron-Core's loop of "fit memory,
// pick parallelism, look at the dominant wall, retune", run over a search space of layouts and
// options for one scenario on N GPUs.
//
// Pipeline of one candidate (a point of the search space):
//   1. the layout rules: the candidate is written into the scenario and checked by the scenario
//      loader's own rules (scenarios::recheck_scenario); a violation prunes it ("rule <id>");
//   2. memory first: the memory model (memory_model.hpp) on a skeleton StepGraph (rank classes,
//      stages and layers, no ops); a class over the GPU's memory prunes it ("oom");
//   3. step time by a closed form (PlanEstimator): per-layer forward and backward times come from the
//      analytic executor run on a reduced scenario (pipeline off, one micro-batch, a few layers of
//      each kind, the same tp/cp/ep/etp groups on the same nodes), cached per distinct
//      (tp, cp, ep, etp, mbs, recompute, dispatcher, CUDA graphs, precision); the pipeline, the
//      pipeline sends, the data-parallel gradient and parameter collectives and the optimizer are
//      composed in closed form around them.
// The sweep streams: a bounded top-k, counts per outcome and per dominant wall, and the best few
// losers per dominant wall are kept, so memory does not grow with the sweep.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/sim/memory_model.hpp"
#include "threewalls/sim/op_coster.hpp"

namespace threewalls::sim {

// The values tried for each knob. The search is the Cartesian product; the attention layout
// (tp, cp, pp, dp = gpus / (tp cp pp)) and the expert layout (etp, ep, edp = gpus / (etp ep pp))
// are folded independently.
struct SearchSpace {
  std::vector<int> tp, cp, pp, vpp, ep, etp, mbs;
  std::vector<scenarios::RecomputeGranularity> recompute;
  std::vector<scenarios::Dispatcher> dispatcher;
  // CUDA-graph scope sets, by name: "none", "attn", "moe_router", "attn+moe_router", ...
  std::vector<std::string> cuda_graphs;
  std::vector<scenarios::Precision> precision;

  [[nodiscard]] std::uint64_t size() const;
  // The canonical spec ("tp=1,2;cp=1;...") that parse_search reads back into this space.
  [[nodiscard]] std::string spec() const;
};

// The keys of --search, in enumeration order (outermost first), and what each accepts.
const std::vector<std::pair<std::string, std::string>>& search_keys();

// The default search for `base` on `gpus` GPUs: powers of two for tp (up to gpus_per_node), cp 1
// (2 too when seq_length >= 16384), pp and vpp that split the layers, ep up to num_experts, etp 1,
// the scenario's mbs and 1, 2, its recompute and "selective" and "full", its dispatcher, CUDA graphs
// none, its precision.
SearchSpace default_search(const scenarios::Scenario& base, int gpus);

// Parses "key=v1,v2;key=a..b;..." (a..b: the integers, or for tp/cp/pp/vpp/ep/etp/mbs the powers of
// two, in [a, b] — see docs/planner.md), each key replacing the default's values. Throws InputError
// naming the key or value and the allowed ones.
SearchSpace parse_search(std::string_view spec, SearchSpace defaults);

// One point of the search space.
struct Candidate {
  std::uint64_t index = 0;  // position in the enumeration (deterministic; shards split it)
  int tp = 1, cp = 1, pp = 1, vpp = 1, dp = 1, ep = 1, etp = 1, edp = 1, mbs = 1;
  scenarios::RecomputeGranularity recompute = scenarios::RecomputeGranularity::none;
  scenarios::Dispatcher dispatcher = scenarios::Dispatcher::alltoall;
  std::string cuda_graphs = "none";
  scenarios::Precision precision = scenarios::Precision::bf16;

  [[nodiscard]] std::string layout() const;   // "tp2 cp1 pp8 vpp4 dp64 | ep64 etp1 edp16"
  [[nodiscard]] std::string options() const;  // "mbs1 recompute=selective dispatcher=alltoall graphs=none bf16"
};

// Candidate `index` of `space` on `gpus` GPUs (dp and edp derived, 0 when they are not integers).
Candidate candidate_at(const SearchSpace& space, int gpus, std::uint64_t index);

// The walls of one predicted step, microseconds (they sum to step_time_us).
struct PlanWalls {
  double compute_us = 0.0;        // kernels (compute and memory bound) on the critical stage
  double exposed_comm_us = 0.0;   // communication not hidden behind compute (TP, CP, EP, PP, DP)
  double bubble_us = 0.0;         // pipeline fill and drain, and stages waiting for the slowest one
  double host_us = 0.0;           // the GPU waiting for launches (launch-bound) and other gaps
};

// Why a candidate lost (or its dominant overhead, for the counts).
enum class Outcome : std::uint8_t { rule, oom, estimated };

struct PlanRow {
  Candidate cand;
  Outcome outcome = Outcome::estimated;
  std::string rule;             // outcome rule: the violated rule ids
  double step_time_us = 0.0;
  double tokens_per_s = 0.0;
  double tflops_per_gpu = 0.0;
  double mfu = 0.0;
  double peak_bytes = 0.0;      // the largest rank class's peak (memory model)
  double capacity_bytes = 0.0;  // cluster.gpu_memory
  int microbatches = 0;
  PlanWalls walls;
  std::string dominant;         // the largest overhead: bubble, exposed_comm, host (launch-bound), compute
  std::string why;              // filled for shown rows: why it lost against the best
  // Flow-fidelity re-simulation of the row (top k only): step time, walls; absent when not run.
  std::optional<double> flow_step_time_us;
  std::optional<PlanWalls> flow_walls;
  std::optional<double> flow_peak_bytes;
  int flow_microbatches = 0;    // the micro-batches of the step simulated (0: not simulated)
  int flow_round = 0;           // > 0: extrapolated from its steady period of this many micro-batches
  std::string flow_error;       // why the re-simulation failed, when it did
};

struct PlanOptions {
  int gpus = 0;
  SearchSpace search;
  int top_k = 10;
  int losers_per_reason = 5;    // best losers kept per dominant wall / outcome
  int shard_index = 0;          // --shard i/N: blocks i, i + N, ... of pp x vpp candidates (run_plan)
  int shard_count = 1;
  MemoryOptions memory;
  std::size_t cache_entries = 4096;  // reduced-scenario results kept (bounded)
  // Called about every `progress_every` candidates with (done, total of this shard).
  std::function<void(std::uint64_t, std::uint64_t)> progress;
  // Called at the same points with the best rows so far, best first (the top rows, not yet explained).
  std::function<void(const std::vector<PlanRow>&)> best_so_far;
  std::uint64_t progress_every = 256;
};

struct PlanCounters {
  std::uint64_t total = 0;       // candidates of this shard
  std::uint64_t enumerated = 0;  // visited
  std::uint64_t estimated = 0;   // passed rules and memory, step time predicted
  std::uint64_t oom = 0;
  std::map<std::string, std::uint64_t> rule;      // by first violated rule id
  std::map<std::string, std::uint64_t> dominant;  // estimated candidates by dominant overhead
  std::uint64_t reduced_simulations = 0;          // reduced-scenario runs of the analytic executor
  double wall_s = 0.0;
};

struct PlanResult {
  std::string scenario_path;
  std::string scenario_name;
  std::string scenario_hash;
  std::string profile_id;
  std::string profile_path;
  int gpus = 0;
  std::string search;  // canonical spec
  int shard_index = 0, shard_count = 1;
  int top_k = 10;
  int losers_per_reason = 5;
  PlanCounters counters;
  std::vector<PlanRow> top;     // best first
  std::vector<PlanRow> losers;  // best per reason, by reason then step time
};

// The closed-form estimator of one candidate (steps 1-3 above). Not thread-safe (it caches).
class PlanEstimator {
 public:
  // `base` as loaded (with its key locations); `coster` must outlive the estimator.
  PlanEstimator(scenarios::LoadedScenario base, const OpCoster& coster, int gpus, MemoryOptions memory = {},
                std::size_t cache_entries = 4096);
  ~PlanEstimator();
  PlanEstimator(const PlanEstimator&) = delete;
  PlanEstimator& operator=(const PlanEstimator&) = delete;

  // The scenario of `c`: the base with the candidate's layout and options; checked by the rules.
  // Throws ScenarioError when a rule fails.
  [[nodiscard]] scenarios::Scenario scenario_of(const Candidate& c) const;
  // Evaluates one candidate. Never throws for a candidate the rules reject (outcome rule).
  PlanRow evaluate(const Candidate& c);
  // The memory verdict of `c` whose scenario is `s` (scenario_of(c)): one class per pipeline stage
  // (two with routing imbalance), as evaluate prunes by it.
  [[nodiscard]] MemoryReport memory(const scenarios::Scenario& s, const Candidate& c);
  [[nodiscard]] std::uint64_t reduced_simulations() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs the sweep (this shard of it). Throws InputError for a scenario the planner cannot plan
// (inference, no --gpus divisible by gpus_per_node, an empty search).
PlanResult run_plan(const scenarios::LoadedScenario& base, const OpCoster& coster, const PlanOptions& options);

// Ranks rows (step time, then peak memory, then index), fills `why` of every row but the best.
void explain_rows(PlanResult& r);

// Joins shard results (same scenario hash, profile, gpus, search, top_k). Throws InputError
// naming the mismatching field, a missing shard or a shard given twice.
PlanResult merge_plans(const std::vector<PlanResult>& shards);

// Output formats (docs/planner.md, "Output"). JSON carries everything merge needs.
OrderedJson plan_to_json(const PlanResult& r);
PlanResult plan_from_json(const Json& j, const std::string& source);
std::string plan_to_csv(const PlanResult& r);
std::string plan_to_text(const PlanResult& r);

// The scenario file of a row, written through the scenario registry (scenarios/writer.hpp): the base
// scenario with the candidate's [parallel] and [train], node count and `name`, `comment` on top.
std::string candidate_toml(const scenarios::Scenario& base, const scenarios::Scenario& candidate,
                           const std::string& name, const std::string& comment);

// How a row is re-simulated with flow fidelity (docs/planner.md, "Flow re-simulation").
//  steady_state: a training step of m micro-batches (per data-parallel rank) is simulated with b
//    micro-batches (resim_step: past the schedule's warm-up by three rounds of one micro-batch, or by
//    one round of pp with interleaving, whose micro-batches run in rounds of pp) when m > b, and
//    extrapolated to m by the steady period that step shows (SteadyRound): past the warm-up each
//    further round adds the same period, and the same walls, to the step (the fill, the drain, the
//    gradient reduction and the optimizer do not grow with m). Its peak memory is the b step's: no
//    more micro-batches are in flight at once past b. Other rows run whole.
//  full: every micro-batch of the row's step.
enum class ResimMethod : std::uint8_t { steady_state, full };
const char* to_string(ResimMethod m);
// "steady" or "full" (the CLI's spelling); nullopt for anything else.
std::optional<ResimMethod> resim_method_from(const std::string& s);

// The step a row is simulated with: its micro-batches, and, when the row's own step is extrapolated
// from it (steady_state), the micro-batches of one round (else 0) and the rounds its period is
// measured over (SimOptions::steady_round, steady_rounds).
struct ResimStep {
  int microbatches = 0;
  int round = 0;
  int rounds = 0;
  bool operator==(const ResimStep&) const = default;
};
ResimStep resim_step(const scenarios::Scenario& s, ResimMethod method);

// Flow re-simulation children started during the sweep, on the CPUs it leaves idle, for the steps of
// the best rows so far (offer): resimulate_flow takes over those of its rows, and the others are ended
// (at the next offer that drops their row, or when this is destroyed). A step's result depends on its
// scenario alone, so a row is the same whether its steps started ahead or not.
class ResimAhead {
 public:
  // `est` (as finish builds it: the plan's base, coster and GPUs) and `coster` must outlive this;
  // `rows`: the top rows that will be re-simulated; `jobs`: children at once.
  ResimAhead(const PlanEstimator& est, const OpCoster& coster, int rows, int jobs, ResimMethod method);
  ~ResimAhead();
  ResimAhead(const ResimAhead&) = delete;
  ResimAhead& operator=(const ResimAhead&) = delete;

  // The best rows so far, best first: keeps up to `jobs` children running for the steps of the first
  // `rows` of them, the longest steps first, and ends those of steps no longer wanted.
  void offer(const std::vector<PlanRow>& best);

  // A child started for one step: candidate index and micro-batches; its pid and the read end of its
  // pipe; `status` once it has been waited for.
  struct Child {
    std::uint64_t cand = 0;
    int microbatches = 0;
    int pid = -1;
    int fd = -1;
    std::optional<int> status;
  };
  // The child of that step, which the caller then owns; nullopt when none was started.
  std::optional<Child> take(std::uint64_t cand, int microbatches);
  // Ends the children not taken.
  void clear();

 private:
  struct Step;
  const PlanEstimator& est_;
  const OpCoster& coster_;
  std::size_t rows_;
  std::size_t jobs_;
  ResimMethod method_;
  std::vector<std::uint64_t> wanted_rows_;  // candidate indices of the last offer's rows
  std::vector<Step> steps_;                 // their steps, the longest first
  std::vector<Child> children_;
};

// Flow-fidelity re-simulation of scenarios[i] into *rows[i]: the step of resim_step in a child
// process of its own (SimGrid allows one engine per process), at most `jobs` at once. The
// children share nothing, so the rows are the same for every `jobs`; the longest steps start first.
// `started(i)`, when given, is called once per row, as its step starts. Steps that `ahead` started
// are taken over, not started again. Fills each row's flow_* fields, or flow_error.
void resimulate_flow(const std::vector<scenarios::Scenario>& scenarios, const OpCoster& coster,
                     const std::vector<PlanRow*>& rows, int jobs, ResimMethod method = ResimMethod::steady_state,
                     const std::function<void(std::size_t)>& started = {}, ResimAhead* ahead = nullptr);

// The CPUs this process may run on (its affinity mask): the default number of re-simulation processes.
int available_cpus();

}  // namespace threewalls::sim
