#pragma once
// Discrete-event execution of one step of a StepGraph (docs/simulator.md, "Execution").
//
// One representative rank per rank class is simulated; every member of a class does what its
// representative does at the same instants. Each representative has
//   * a host lane that issues the class's ops in list order: an eager launch costs host time, a
//     CUDA-graph run one graph launch, a blocking host op (stream_sync, gpu_read, barrier) waits
//     for its dependencies on the device;
//   * streams: an op starts when the host has launched it, the previous op of its stream has
//     finished and its dependencies have finished (StepGraph contract, step_graph.hpp);
//   * a GPU shared by concurrent kernels of different streams (processor sharing at the profile's
//     multi-stream throughput);
//   * communication: a collective starts when every rank class of its group has arrived at it and
//     ends for all of them together; a send starts with its matching recv. Both become flows on the
//     platform (flow fidelity, through a FlowEngine) or closed-form durations (analytic fidelity).
//
// The executor owns no simulation engine: the flow engine (SimGrid) is passed in, and the clock is
// the engine's when one is given.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/flows.hpp"
#include "threewalls/sim/op_coster.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim {

enum class Fidelity : std::uint8_t { flow, analytic };
const char* to_string(Fidelity f);

// Runs groups of flows with max-min sharing of the platform's links. Implemented on SimGrid
// (simgrid_network.hpp) and by fakes in tests.
class FlowEngine {
 public:
  virtual ~FlowEngine() = default;
  // The engine's clock, seconds.
  [[nodiscard]] virtual double now() const = 0;
  // Moves the clock to `until` (>= now()) or to the first instant before it at which a group
  // completes; appends the groups completed at that instant. Returns the new clock.
  virtual double advance(double until, std::vector<std::uint64_t>& completed) = 0;
  // Starts the flows of group `id` at now(). Every flow carries bytes > 0 on a non-empty route.
  virtual void start_group(std::uint64_t id, std::span<const PlacedFlow> flows) = 0;
  // Whether some flow is still running.
  [[nodiscard]] virtual bool busy() const = 0;
  // Changes a link's bandwidth (used between steps, for step-ranged slowdowns).
  virtual void set_link_bandwidth(std::uint32_t link, BytesPerSecond bw) = 0;
};

struct ExecutorOptions {
  Fidelity fidelity = Fidelity::flow;
  AllReduceChoice allreduce = AllReduceChoice::automatic;
  // Routing imbalance of MoE all-to-alls (train.routing_imbalance): RoutingModel(ep, imbalance).
  double routing_imbalance = 1.0;
  // How MoE dispatch and combine reach other nodes (flows.hpp, ExpertDispatch); expert_dispatch_of.
  ExpertDispatch dispatch;
  // Hardware work queues per GPU (CUDA_DEVICE_MAX_CONNECTIONS of the real run: the scenario's
  // run.cuda_device_max_connections, CUDA's default 8). Streams map onto them round-robin in creation order and each
  // queue dispatches in issue order (docs/simulator.md, "Hardware work queues"). 0: one queue per
  // stream.
  int hardware_queues = 8;
  // run.framework: pytorch_eager adds host.framework_op to every launch outside a CUDA-graph run.
  scenarios::Framework framework = scenarios::Framework::cpp;
  // A pending NCCL kernel resident on every GPU for the whole step, besides the graph's own: the
  // posted pipeline receive of a stage (a pipeline stage posts its receives ahead, each waits for
  // its peer), for a graph that lacks the pipeline (the planner's reduced runs, docs/planner.md).
  bool pending_receive_throughout = false;
};

// Slowdown (time with / time alone) of kernel op `op` while NCCL kernels are resident on its GPU:
// the larger of the profile's factors (OpCoster::nccl_resident_slowdown) of the cases present, by
// the op's compute class (GEMM with its 128 x 128 output tiles, attention, memory-bound); 1 when
// none is resident or the coster does not model residency.
double nccl_resident_factor(const OpCoster& coster, const scenarios::Op& op, bool pending, bool transferring);

// The scenario's expert dispatch: train or infer token_dispatcher (flex, else alltoall), the model's
// routed experts, top-k and router groups.
ExpertDispatch expert_dispatch_of(const scenarios::Scenario& s);

// The executor settings a scenario gives (the rest keep their defaults): the training step's routing
// imbalance, expert_dispatch_of, the framework that drives the GPU and the hardware queues
// (run.cuda_device_max_connections).
ExecutorOptions executor_options_of(const scenarios::Scenario& s);

// Which ops of a class carry the profiler's timing markers in a step (a real run records two CUDA
// events around every timed op: docs/simulator.md, "Host lane"). By class: none, every op (layer
// granularity) or the coarse-view ops only.
enum class Timing : std::uint8_t { none, every_op, coarse_ops };

// When each op of a rank class ran, seconds relative to the step's epoch.
struct ClassTimeline {
  std::vector<double> start;
  std::vector<double> end;
  // What a phase record of the op measures (threewalls run's timing events): for a timed eager op,
  // from when its start marker ran on the device (recorded by the host just before the launch, run
  // once the stream reached it) to when its end marker ran (after the op and after the host recorded
  // it behind the launch); otherwise start / end. Empty (a class without Timing): use start / end.
  std::vector<double> record_start;
  std::vector<double> record_end;
  // Per op, seconds at the start of its record during which the device waited for the host's launch
  // call of the op (timed eager compute/memory ops: clamp(launch returned - record start, 0, record
  // duration)); empty or 0 elsewhere. The record's launch_wait_us.
  std::vector<double> launch_wait;
  double step_end = 0.0;  // end of the class's last op, or of the host's step-end join if later
};

struct StepResult {
  double epoch = 0.0;     // absolute simulated time the step started
  double duration = 0.0;  // until the last op of any class ended
  std::vector<ClassTimeline> classes;
  std::size_t collectives = 0;   // collective and point-to-point instances run
  std::size_t flows_started = 0; // flows handed to the flow engine
};

class Executor {
 public:
  Executor(const OpCoster& coster, ExecutorOptions options);

  // Simulates one step of `graph` from absolute time `epoch` on `platform` (whose link bandwidths
  // already include this step's link slowdowns). `compute_factor[c]` multiplies the kernel
  // durations of class c (GPU slowdowns; empty = 1 everywhere). Flow fidelity needs `engine`
  // (its clock must not be past `epoch`); analytic fidelity ignores it.
  //
  // `timing[c]`: the profiler's timing markers of class c in this step (empty = none anywhere).
  //
  // Throws InputError when the graph cannot run: a dependency or group that no class satisfies
  // (a deadlock is reported with the op that waits and what it waits for), a group the layout does
  // not know, a send without a matching recv.
  StepResult run_step(const scenarios::StepGraph& graph, const Platform& platform,
                      std::span<const double> compute_factor, double epoch, FlowEngine* engine,
                      std::span<const Timing> timing = {}) const;

  // The ranks whose ports the flows of a step of `graph` can use (sorted, unique): each rank
  // class's representative, and the destinations of the flows its collectives, sends and copies
  // start (a superset: every destination the op's algorithm has, whatever the bytes). A flow
  // platform built for these ranks only (SimGridEngine) holds everything the step reaches.
  [[nodiscard]] std::vector<int> flow_ranks(const scenarios::StepGraph& graph) const;

  [[nodiscard]] const ExecutorOptions& options() const { return options_; }

 private:
  const OpCoster& coster_;
  ExecutorOptions options_;
};

}  // namespace threewalls::sim
