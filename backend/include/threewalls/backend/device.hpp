#pragma once
// The Device seam of the executor (docs/backend.md, "Executor"): everything the executor asks of one
// GPU, so that the same scheduling code runs on CUDA/cuBLAS/NCCL (cuda_device.hpp) and, in CI, on a
// fake device whose streams are host threads timed by a host clock (fake_device.hpp). This header
// needs no CUDA.
//
// Contract
//  * One Device per rank, created, used and destroyed on that rank's thread.
//  * Streams are named by their index in StepGraph::streams; open() creates the ones listed.
//  * launch, record_event, wait_event, record_marker and launch_graph enqueue and return at once;
//    work on a stream runs in enqueue order (FIFO); wait_event(s, e) makes stream s wait until the
//    work before event e (recorded on another stream) has finished.
//  * Events synchronise, markers time. Both are small ids from recycled pools: an event may be
//    released as soon as every wait on it is enqueued, a marker once it has been read.
//  * Between begin_capture(origin) and end_capture(origin) enqueued work is captured into a graph
//    instead of run; a stream joins the capture by waiting on an event recorded in it. Markers
//    recorded during a capture are pinned to the graph: each replay re-records them, release()
//    ignores them. launch_graph(g, origin) replays the whole graph as one unit ordered on `origin`.
//  * Failures throw (backend::DeviceError for CUDA and NCCL, SystemError for the fake) with the rank,
//    the call and file:line. poll() raises asynchronous failures (a failed collective); abort() stops
//    every communication of the device so that nothing it enqueued stays blocked (ncclCommAbort).
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

// An opaque communicator id, the same in every member (ncclUniqueId for CUDA devices).
struct CommId {
  std::array<char, 128> bytes{};
};

// One communicator of a rank. Collectives: one per (group, stream) the rank uses, so collectives
// on compute and on dp_comm (say) never wait on each other inside one communicator. Send/recv: one
// per directed pair of ranks and pipeline direction ("pp@pp_fwd:2>3": group, the stream name without
// its _send/_recv suffix, sender > receiver), a two-rank communicator, so that a rank's sends and its
// receives never share one: NCCL orders a communicator's operations as they were issued, which
// would let a send wait behind an unrelated receive.
struct CommSpec {
  std::string key;  // comm_key(): "ep@compute", "pp@pp_fwd:2>3"
  bool p2p = false;
  scenarios::Group group = scenarios::Group::none;
  int stream = -1;           // collectives: the stream whose ops use it; p2p: -1
  std::vector<int> members;  // global ranks, in group order (p2p: the two ranks, ascending)
  int index = 0;             // this rank's position in `members`
  CommId id;
  [[nodiscard]] const std::string& name() const { return key; }
};

// The stream name without a trailing "_send" or "_recv" ("pp_fwd_send" -> "pp_fwd").
std::string base_stream_name(const std::string& name);
// The key of the communicator op `op` of `rank` uses (see CommSpec).
std::string comm_key(const scenarios::StepGraph& graph, int rank, const scenarios::Op& op);

// What a device is opened with.
struct DeviceSetup {
  int rank = 0;
  int world_size = 1;
  const scenarios::StepGraph* graph = nullptr;  // the first step's graph (streams, layout)
  std::vector<int> streams;                     // stream indices with device work on this rank
  std::vector<CommSpec> comms;
  std::uint64_t seed = 0;                       // run.seed: every buffer's random content derives from it
  double routing_imbalance = 1.0;               // train.routing_imbalance (MoE all-to-all splits)
  int num_experts = 0;                          // model.num_experts (the routing permute ops follow)
  // Training: the bytes of the rank's parameter state (scenarios::training_parameter_state), which the
  // device allocates once and its runners share (parameter_state.hpp). Zero: none.
  std::size_t parameter_weight_bytes = 0;
  std::size_t parameter_gradient_bytes = 0;
  // Inference with its weights in HBM: the resident weights (parameter_weight_bytes,
  // scenarios::inference_weight_bytes) and one layer's KV cache (scenarios::kv_cache_bytes_per_layer).
  std::size_t kv_cache_bytes_per_layer = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Returns true when the run is being stopped (another rank failed): long waits inside open()
  // (communicator creation) poll it and give up.
  std::function<bool()> stop_requested;
};

class Device {
 public:
  virtual ~Device() = default;

  // "NVIDIA H100 80GB HBM3" or "fake device".
  [[nodiscard]] virtual std::string name() const = 0;
  // Effective device settings for the run header (library versions, stream priorities, ...).
  [[nodiscard]] virtual OrderedJson settings() const = 0;

  // Creates streams and communicators (every member of a communicator opens it: a collective call)
  // and prepares buffers for the ops of `cls`. Throws InputError for ops the device cannot run.
  virtual void open(const DeviceSetup& setup, const scenarios::RankClass& cls) = 0;
  // Prepares the ops of another step's class (inference graphs vary per step). Synchronous.
  virtual void prepare(const scenarios::StepGraph& graph, const scenarios::RankClass& cls) = 0;

  // Enqueues the op's work on `stream` (not for host ops). `annotate`: an NVTX range around the launch.
  virtual void launch(const scenarios::StepGraph& graph, const scenarios::Op& op, int stream, bool annotate) = 0;
  // Send/recv ops adjacent in issue order on one stream, issued as one NCCL group (ncclGroupStart /
  // ncclGroupEnd, Megatron's batch_isend_irecv): they start together and progress independently; the
  // stream moves on when all are done. The simulator groups them the same way.
  virtual void launch_p2p_group(const scenarios::StepGraph& graph, const std::vector<const scenarios::Op*>& ops,
                                int stream, bool annotate) = 0;

  virtual std::uint32_t record_event(int stream) = 0;
  virtual void wait_event(int stream, std::uint32_t event) = 0;
  [[nodiscard]] virtual bool event_done(std::uint32_t event) = 0;
  // Blocks up to `max_wait` for the event; returns whether it is done. Cheap to call in a loop.
  virtual bool wait_event_host(std::uint32_t event, std::chrono::microseconds max_wait) = 0;
  virtual void release_event(std::uint32_t event) = 0;

  virtual std::uint32_t record_marker(int stream) = 0;
  [[nodiscard]] virtual bool marker_done(std::uint32_t marker) = 0;
  [[nodiscard]] virtual double elapsed_us(std::uint32_t from, std::uint32_t to) = 0;
  virtual void release_marker(std::uint32_t marker) = 0;

  // A small device-to-host read on `stream` that blocks until it arrives (the executor has waited
  // for the stream's work first, so this does not block for long).
  virtual void host_read(int stream) = 0;
  // Host work of a framework op (its duration hint, shape[0] nanoseconds).
  virtual void host_work(const scenarios::Op& op) = 0;
  // Copy ops that block the host (disk reads): run on the calling thread.
  [[nodiscard]] virtual bool blocks_host(const scenarios::Op& op) const = 0;

  virtual void begin_capture(int origin) = 0;
  virtual std::uint32_t end_capture(int origin) = 0;
  virtual void launch_graph(std::uint32_t graph, int origin) = 0;

  // Raises an asynchronous failure (collective error) if there is one.
  virtual void poll() = 0;
  // Stops all communication (idempotent). Called from the rank's thread, or from the executor's
  // watchdog thread while the rank's thread is blocked inside a device call: thread-safe for that.
  virtual void abort() noexcept = 0;
  // Device memory in use now, bytes (the executor keeps the high-water mark).
  [[nodiscard]] virtual std::size_t memory_in_use() = 0;
  // How memory_in_use() measures ("cudaMemGetInfo ...").
  [[nodiscard]] virtual std::string memory_method() const = 0;
  // A segment of device memory for the executor's caching allocator (saved activations,
  // caching_allocator.hpp): nullptr when the device has no room for `bytes` (other failures throw).
  // free_segment gives one back. Called on the rank's thread, never during a capture.
  [[nodiscard]] virtual void* allocate_segment(std::size_t bytes) = 0;
  virtual void free_segment(void* p, std::size_t bytes) = 0;
};

}  // namespace threewalls::backend
