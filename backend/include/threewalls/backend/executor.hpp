#pragma once
// The executor of `threewalls run` (docs/backend.md, "Executor"): runs a scenario's steps on real
// devices, one thread per local rank, exactly as its StepGraph says, and writes the run directory
// (source "real") through the profiler's RunDirWriter. Device-independent: it drives the Device seam
// (device.hpp), so the same code runs on CUDA (cuda_device.hpp) and on the fake device in CI.
//
// Per rank thread, per step:
//   * ops in host issue order; each device op on the CUDA stream of its StepGraph stream (same-stream
//     FIFO), cross-stream `deps` as events (recorded only after ops something waits on, released to
//     the pool once the step's waits are enqueued); host ops on the thread itself: stream_sync and
//     barrier wait for their deps' events, gpu_read waits for its stream then reads, framework ops
//     keep the host busy for their hint; copies that block the host (disk reads) run on the thread;
//   * CUDA-graph runs (RankClass::graph_runs): captured before the first step that uses them
//     (outside timing), replayed with one launch; deps from outside the run are waited on by the
//     launch stream, the other streams of the run are joined before and after it;
//   * steps are fenced on the device: every stream joins the anchor stream (compute) at a step's end,
//     the next step's epoch is recorded there and every stream waits for it; the host runs at most
//     max_steps_in_flight steps ahead of the device;
//   * timing by the profiler's StepRecorder (sampled steps and ranks only, markers around every
//     timed op, host ops on the host clock, non-blocking harvest, flushes through one RecordSink);
//     warm-up steps are never recorded;
//   * every host wait polls: the run's stop flag (another rank failed), the device's asynchronous
//     errors, and a timeout (no progress), after which the device aborts its communicators.
// A rank that fails stops every rank: they abort and raise "stopped after rank N failed". execute()
// rethrows the first failure (its type kept: InputError or SystemError) naming every rank.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "threewalls/backend/device.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/sampling.hpp"
#include "threewalls/profiler/summary.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

struct ExecutorOptions {
  int steps = -1;         // measured steps; -1 = the scenario's run.steps
  int warmup_steps = -1;  // unrecorded steps first; -1 = run.warmup_steps
  std::filesystem::path out_dir;  // run directory; empty = none (records are still timed and summarised)
  bool overwrite = false;         // replace an existing run directory
  std::vector<std::string> argv;  // for the run header
  // No progress for this long in a host wait (a stuck peer, a hung collective): abort and fail.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // After a failure, how long other ranks get to stop before execute() gives up on them.
  // The executor's watchdog aborts a standing-still thread's communicators 1 s after the stop; a thread
  // that has not returned 2 s later will not (it waits on something no abort reaches), so a failed run
  // ends within the timeout plus a few seconds.
  std::chrono::milliseconds stop_grace{std::chrono::seconds(3)};
  int max_steps_in_flight = 2;     // host run-ahead, in steps
  // Re-anchor device time on the host clock this often (when the device is idle between steps): GPU
  // event time and the host's steady clock drift apart by ~17 ppm on the H100 (host sync records of
  // the offload study grew by 3.5 us per 180 ms step with 10 s), so host records that start at a
  // device time need a recent anchor.
  double realign_every_s = 0.1;
  // Recorded steps: an op issued right behind a timed op on its stream, nothing in between, starts
  // at that op's end marker instead of its own (n + 1 timing markers for n back-to-back ops, not 2n;
  // docs/profiler.md, "Shared boundary markers"). false: two markers per op (tests, comparisons).
  bool share_timing_markers = true;
  std::string source = "real";     // run header source
  // Fault injection, to demonstrate fault handling on real GPUs (`threewalls run --inject-fault`):
  // in measured step `fault_step`, rank `fault_rank` stops halfway through issuing the step's ops and
  // either fails (throws) or hangs (issues nothing more and raises nothing, as a stuck process would).
  enum class Fault : std::uint8_t { none, fail, hang };
  Fault fault = Fault::none;
  int fault_rank = -1;
  int fault_step = 0;
};

// How this process takes part in the run.
struct ProcessContext {
  std::vector<int> local_ranks;  // ranks run here, one thread each (single process: all of them)
  bool creator = true;           // creates the run directory, run.json and summary.json
  // Communicator ids, the same list in every process for the same `count` (ncclGetUniqueId in one
  // process, broadcast over MPI to the others).
  std::function<std::vector<CommId>(std::size_t count)> make_comm_ids;
  // Synchronises all processes (null in a single process).
  std::function<void()> barrier;
  // Gathers one number per local rank to the creator: returns world-sized values there (others:
  // anything). Null in a single process.
  std::function<std::vector<double>(const std::vector<double>& local)> gather;
  // Host clock of the run: microseconds since the run's start_time on a clock every process shares.
  std::function<double()> host_now_us;
  std::string start_time;  // ISO 8601 UTC of the run start (the same in every process)
};

// Creates rank `rank`'s device on that rank's thread (`local_index` among this process's ranks).
using DeviceFactory = std::function<std::unique_ptr<Device>(int rank, int local_index)>;

struct RankReport {
  int rank = 0;
  std::size_t peak_bytes = 0;  // high-water mark of Device::memory_in_use()
  // The caching allocator of the saved activations (caching_allocator.hpp): its peaks over the run.
  std::size_t peak_allocated_bytes = 0;
  std::size_t peak_reserved_bytes = 0;
  double loop_us = 0.0;        // host time of the measured steps (first measured step to all work done)
};

struct RunResult {
  std::filesystem::path run_dir;  // empty when none was written
  profiler::Summary summary;      // from the recorded steps (empty when nothing was recorded)
  OrderedJson summary_json;
  bool recorded = false;
  std::vector<RankReport> ranks;  // local ranks
  double mean_step_us = 0.0;      // max over local ranks of loop_us / measured steps (host clock)
  int steps = 0;
  int warmup_steps = 0;
  std::string device;             // the first local device's name
  double model_flops_per_step = 0.0;
  double tokens_per_step = 0.0;
  std::size_t phase_records = 0;  // phase records written (this process)
};

// Runs `s`. Throws InputError (scenario the backend cannot run, world size mismatch, existing run
// directory), SystemError/DeviceError (device or communication failure of any rank).
RunResult execute(const scenarios::Scenario& s, const ProcessContext& process, const DeviceFactory& make_device,
                  const ExecutorOptions& options);

// True once execute() gave up on a rank thread stuck inside a device call (its error says which). The
// process must then end with std::_Exit after reporting: static destruction and the CUDA runtime's
// teardown would wait on that thread for ever.
[[nodiscard]] bool rank_threads_abandoned();

// ---- building blocks, exposed for tests ----

// One communicator instance of the world (CommSpec without the rank's view).
struct CommInstance {
  std::string key;
  bool p2p = false;
  scenarios::Group group = scenarios::Group::none;
  int stream = -1;
  std::vector<int> members;
  [[nodiscard]] bool operator<(const CommInstance& o) const;
};
// Every communicator instance the graphs need, in a deterministic order (the order ids are made in).
// Throws InputError when a member lacks the communicator its peers use (an inconsistent graph: a
// collective some members would never join, a send without a receive).
std::vector<CommInstance> comm_instances(const std::vector<const scenarios::StepGraph*>& graphs);
// The communicators of `rank`, with ids from `ids` (index-aligned with `instances`).
std::vector<CommSpec> comm_specs(const std::vector<CommInstance>& instances, const std::vector<CommId>& ids,
                                 const scenarios::StepGraph& graph, int rank);
// The per-peer byte split of a MoE all-to-all (StepGraph contract, step_graph.hpp): shape[1] = 0:
// B / n to and from everyone; 1 (dispatch): send B share(j) to member j, receive B share(own);
// 2 (combine): send B share(own) to everyone, receive B share(j) from member j. B = shape[0] (the
// balanced bytes), rounded down to whole bf16 elements per peer so both sides agree.
void all_to_all_split(const scenarios::Op& op, int group_size, int own_index, double imbalance,
                      std::vector<std::size_t>& send_bytes, std::vector<std::size_t>& recv_bytes);

}  // namespace threewalls::backend
