#pragma once
// A fake Device for CI (docs/backend.md, "The fake device"): the executor's scheduling, the
// profiler's sampling and the fault handling run on a machine without a GPU, through the same code
// as a real run.
//
// Each stream is a host thread that executes its queue in order: an op "runs" by sleeping for a
// duration from a simple model, an event or marker completes when the stream reaches it and takes
// the host clock (steady_clock), a wait blocks the stream until its event completes. Collectives and
// send/recv rendezvous across the ranks of a run through a shared FakeFabric, which checks that every
// member issues the same op (phase, layer, micro-batch, kind) at the same position in each
// communicator, as NCCL requires, and raises a clear error when not. Graph capture records the
// enqueued commands (events recorded inside become the graph's own, markers are pinned) and a replay
// enqueues them again as one unit ordered on the launch stream.
//
// Duration model (microseconds, then clamped to [min_op_us, max_op_us]):
//   compute-wall ops        flops / flops_per_us
//   memory-wall ops, copies bytes / bytes_per_us
//   collectives, send/recv  bytes / link_bytes_per_us, from the arrival of the last member
//   framework host ops      shape[0] ns
// An eager launch may hold the calling thread for launch_host_us first (launch-bound tests).
// Sends of at most p2p_eager_bytes do not wait for their receiver (NCCL's sender writes into the
// peer's buffer, NCCL_BUFFSIZE = 4 MiB by default); larger ones meet their receiver first.
// Faults for tests: a rank that throws at its n-th launch, or whose n-th communication never
// arrives (a hung or killed peer: no error, its peers wait until they time out or are stopped).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "threewalls/backend/device.hpp"

namespace threewalls::backend {

struct FakeDeviceOptions {
  double flops_per_us = 5e7;       // compute-wall ops
  double bytes_per_us = 2e6;       // memory-wall ops and copies
  double link_bytes_per_us = 5e5;  // communication
  double min_op_us = 1.0;
  double max_op_us = 5000.0;
  double host_work_scale = 1.0;    // multiplies framework ops' hints
  double p2p_eager_bytes = 4.0 * 1024 * 1024;  // sends up to this size do not wait for the receiver
  // Host time one eager launch takes on the calling thread before its work is enqueued (a library
  // call's host cost: cuBLASLt, the attention's several kernels); 0 = enqueue at once.
  double launch_host_us = 0.0;
  // Faults (tests): rank `fail_rank` throws at its `fail_at_launch`-th launch (1-based, counting
  // every launch), or its `hang_at_comm`-th communication op never arrives at the rendezvous.
  int fail_rank = -1;
  int fail_at_launch = 0;
  int hang_rank = -1;
  int hang_at_comm = 0;
  // > 0: a launch blocks the calling thread while its stream already holds this many queued commands,
  // until one is taken or the device is aborted, as a launch into CUDA's bounded launch queue does
  // (the thread polls nothing meanwhile). 0 = unbounded.
  int launch_queue_depth = 0;
  // Device memory the segments of allocate_segment may total (0 = no limit); the ops' buffers are
  // not counted against it.
  std::size_t memory_bytes = 0;
};

// One op the fake device executed (for tests: ordering, overlap, durations).
struct FakeTraceEntry {
  int rank = 0;
  std::uint32_t op = 0;  // index into the rank class's ops
  int stream = 0;
  double start_us = 0.0;  // the fabric's clock
  double end_us = 0.0;
  bool in_graph = false;
};

// Shared by the fake devices of one run.
class FakeFabric {
 public:
  explicit FakeFabric(FakeDeviceOptions options = {});
  ~FakeFabric();
  FakeFabric(const FakeFabric&) = delete;
  FakeFabric& operator=(const FakeFabric&) = delete;

  [[nodiscard]] const FakeDeviceOptions& options() const { return options_; }
  // Distinct communicator ids (ProcessContext::make_comm_ids).
  std::vector<CommId> make_ids(std::size_t count);
  // Microseconds since the fabric was created (the clock of events, markers and the trace).
  [[nodiscard]] double now_us() const;
  [[nodiscard]] std::vector<FakeTraceEntry> trace() const;
  [[nodiscard]] std::size_t rendezvous_count() const;
  // Timing markers recorded on streams by every device of the fabric (outside graph captures; tests
  // count the markers per recorded step).
  [[nodiscard]] std::size_t markers_recorded() const;

  // ---- used by FakeDevice ----
  struct Arrival {
    int rank = 0;
    std::string what;  // "moe_dispatch_fwd layer 1 microbatch 0 (collective)"
    double duration_us = 0.0;
    bool awaits = true;  // false: an eager send, which does not wait for the meeting to complete
  };
  // Registers `me` as one of the `size` parties of meeting `key` (does not block).
  void arrive(const std::string& key, int size, const Arrival& me);
  // Blocks until every party of `key` arrived (false when `stop` turns true first), then until the
  // common end time. Throws SystemError naming both ops when the parties disagree.
  bool await(const std::string& key, const std::function<bool()>& stop);
  // arrive + await.
  bool rendezvous(const std::string& key, int size, const Arrival& me, const std::function<bool()>& stop);
  void add_trace(const FakeTraceEntry& e);
  void wake_all();  // a stop flag changed somewhere
  void count_marker();

 private:
  struct Meeting {
    std::vector<Arrival> arrivals;
    double end_us = -1.0;
    std::string error;
    int left = 0;  // parties still to leave await() once complete
  };
  FakeDeviceOptions options_;
  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Meeting> meetings_;
  std::uint64_t next_id_ = 1;
  std::size_t rendezvous_ = 0;
  std::size_t markers_ = 0;
  std::vector<FakeTraceEntry> trace_;
};

class FakeDevice : public Device {
 public:
  FakeDevice(FakeFabric& fabric, int rank);
  ~FakeDevice() override;

  [[nodiscard]] std::string name() const override { return "fake device"; }
  [[nodiscard]] OrderedJson settings() const override;
  void open(const DeviceSetup& setup, const scenarios::RankClass& cls) override;
  void prepare(const scenarios::StepGraph& graph, const scenarios::RankClass& cls) override;
  void launch(const scenarios::StepGraph& graph, const scenarios::Op& op, int stream, bool annotate) override;
  void launch_p2p_group(const scenarios::StepGraph& graph, const std::vector<const scenarios::Op*>& ops, int stream,
                        bool annotate) override;
  std::uint32_t record_event(int stream) override;
  void wait_event(int stream, std::uint32_t event) override;
  [[nodiscard]] bool event_done(std::uint32_t event) override;
  bool wait_event_host(std::uint32_t event, std::chrono::microseconds max_wait) override;
  void release_event(std::uint32_t event) override;
  std::uint32_t record_marker(int stream) override;
  [[nodiscard]] bool marker_done(std::uint32_t marker) override;
  [[nodiscard]] double elapsed_us(std::uint32_t from, std::uint32_t to) override;
  void release_marker(std::uint32_t marker) override;
  void host_read(int stream) override;
  void host_work(const scenarios::Op& op) override;
  [[nodiscard]] bool blocks_host(const scenarios::Op& op) const override;
  void begin_capture(int origin) override;
  std::uint32_t end_capture(int origin) override;
  void launch_graph(std::uint32_t graph, int origin) override;
  void poll() override;
  void abort() noexcept override;
  [[nodiscard]] std::size_t memory_in_use() override;
  [[nodiscard]] std::string memory_method() const override {
    return "fake: the largest op bytes per stream and the segments handed out";
  }
  // Fake addresses (never dereferenced); nullptr past FakeDeviceOptions::memory_bytes.
  [[nodiscard]] void* allocate_segment(std::size_t bytes) override;
  void free_segment(void* p, std::size_t bytes) override;

  // Events and markers ever created (tests: pools recycle).
  [[nodiscard]] std::size_t slots_created() const;

 private:
  enum class CmdKind : std::uint8_t { op, record, wait, p2p_group };
  struct Cmd {
    CmdKind kind = CmdKind::op;
    const scenarios::StepGraph* graph = nullptr;
    const scenarios::Op* op = nullptr;
    std::vector<const scenarios::Op*> group;  // p2p_group members
    std::uint32_t op_index = 0;
    std::uint32_t slot = 0;       // record / wait: the event or marker slot
    std::uint64_t generation = 0; // wait: the record it waits for
    bool in_graph = false;
  };
  struct Slot {
    std::uint64_t recorded = 0;   // records enqueued
    std::uint64_t completed = 0;  // records the stream reached
    double time_us = 0.0;         // when the last completed record was reached
    bool pinned = false;          // owned by a graph (never recycled)
    bool marker = false;
    bool released = false;        // markers: in the free pool (a second release throws)
  };
  struct StreamWorker;
  struct Graph {
    std::vector<std::pair<int, Cmd>> cmds;  // in capture order
    std::vector<int> streams;
  };
  struct Comm {
    std::string key;  // the id as text
    int size = 1;
    int index = 0;
    std::vector<int> members;
    std::uint64_t seq = 0;                     // collectives executed
    std::map<std::pair<int, int>, std::uint64_t> p2p;  // (peer, direction) -> transfers executed
  };

  void enqueue(int stream, Cmd c);
  std::uint32_t new_slot(bool marker, bool pinned);
  void execute(int stream, const Cmd& c);  // on the stream's thread
  void run_op(int stream, const Cmd& c);
  void run_p2p_group(int stream, const Cmd& c);
  // The meeting key and arrival of a communication op (advances the communicator's counters).
  std::pair<std::string, int> meeting_of(int stream, const Cmd& c, const scenarios::Op& op, FakeFabric::Arrival& me);
  void count_launch(const scenarios::StepGraph& graph, const scenarios::Op& op);
  [[nodiscard]] double duration_us(const scenarios::Op& op) const;
  [[nodiscard]] bool stopping() const;
  StreamWorker& worker(int stream);
  [[nodiscard]] std::uint32_t index_of(const scenarios::StepGraph& g, const scenarios::Op& op) const;

  FakeFabric& fabric_;
  int rank_;
  DeviceSetup setup_;
  std::map<int, std::unique_ptr<StreamWorker>> workers_;
  std::map<std::pair<int, int>, Comm> comms_;  // collectives: (group, stream)
  std::map<std::string, Comm> p2p_comms_;      // send/recv: by comm_key
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_events_;
  std::vector<std::uint32_t> free_markers_;
  std::vector<Graph> graphs_;
  bool capturing_ = false;
  int capture_origin_ = -1;
  Graph capture_;
  std::string error_;        // first asynchronous error
  bool aborted_ = false;
  int launches_ = 0;
  int comm_ops_ = 0;
  std::map<int, double> stream_bytes_;
  std::size_t segment_bytes_ = 0;             // handed out by allocate_segment, not yet freed
  std::uintptr_t next_segment_ = 1ULL << 40;  // fake addresses, never dereferenced
};

}  // namespace threewalls::backend
