#pragma once
// threewalls' CUDA profiler: sampled, bounded, per-rank JSONL timing of any C++ training loop
// (docs/profiler.md, "CUDA profiler"). Link the CMake target threewalls::profiler_cuda.
//
//   namespace tp = threewalls::profiler;
//   tp::cuda::ProfilerOptions o;
//   o.out_dir = "run1"; o.rank = rank; o.world_size = world;
//   o.sampling.record_every_n_steps = 10;            // the sampling knobs: docs/profiler.md
//   tp::cuda::Profiler prof(o);
//   const auto fwd = prof.phase_id("forward");
//   for (int step = 0; step < steps; ++step) {
//     prof.begin_step(step, stream);                  // epoch event (recorded steps only)
//     { auto p = prof.phase(fwd, stream, {.layer = 0, .flops = f}); forward(stream); }
//     prof.end_step(stream);                          // non-blocking harvest of finished steps
//   }
//   prof.finish();                                    // drain, summary.json, footers
//
// Each recorded phase costs two CUDA events from a recycled pool (never created per phase in steady
// state) and one NVTX3 range in the `threewalls` domain; nothing waits for the GPU: finished steps
// are harvested with cudaEventQuery at later steps and written by a background thread through the
// same RunDirWriter as the simulator, flushed every flush_every_n_steps. A disabled profiler
// (sampling.enabled = false) creates no file, records no event and emits no NVTX range: each call is
// one branch. Steps that are not sampled record no events; their NVTX ranges are still emitted so a
// timeline tool sees every step.
//
// Thread-safety: one Profiler per rank (GPU); its calls come from one thread.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nvtx3/nvtx3.hpp>

#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/record_sink.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/sampling.hpp"
#include "threewalls/profiler/step_recorder.hpp"

namespace threewalls::profiler::cuda {

// The NVTX3 domain of every threewalls range (the same name as the backend's, so one domain).
struct NvtxDomain {
  static constexpr char const* name{"threewalls"};
};

// CUDA events from a recycled pool, as StepRecorder's clock. One clock per device, used from one
// thread with that device current. Errors throw SystemError naming the call and file:line.
class CudaEventClock {
 public:
  using Stream = cudaStream_t;
  struct Marker {
    std::uint32_t id = 0xffffffffU;  // index into the clock's events; default = none
    friend bool operator==(Marker a, Marker b) { return a.id == b.id; }
  };

  explicit CudaEventClock(std::size_t reserve = 64);
  ~CudaEventClock();
  CudaEventClock(const CudaEventClock&) = delete;
  CudaEventClock& operator=(const CudaEventClock&) = delete;

  Marker mark(cudaStream_t s);
  // A marker for stream capture: an external event-record node (cudaEventRecordExternal) that every
  // replay of the graph re-records. Pinned: release() ignores it; it lives as long as the clock.
  Marker mark_pinned(cudaStream_t s);
  [[nodiscard]] bool done(Marker m);
  [[nodiscard]] double elapsed_us(Marker a, Marker b);
  void release(Marker m);
  [[nodiscard]] cudaEvent_t event(Marker m) const { return events_[m.id]; }
  [[nodiscard]] std::size_t created() const { return events_.size(); }  // events ever created
  [[nodiscard]] std::size_t free_count() const { return free_.size(); }

 private:
  Marker acquire(bool pinned);
  std::vector<cudaEvent_t> events_;
  std::vector<std::uint8_t> pinned_;
  std::vector<std::uint32_t> free_;
};

// Registered NVTX strings by name (registering once per name keeps ranges cheap).
class NvtxNames {
 public:
  const nvtx3::registered_string_in<NvtxDomain>& get(std::string_view name);

 private:
  std::vector<std::pair<std::string, std::unique_ptr<nvtx3::registered_string_in<NvtxDomain>>>> names_;
};

// A pushed NVTX range (push in the constructor when `on`, pop in the destructor).
class NvtxScope {
 public:
  NvtxScope() = default;
  NvtxScope(const nvtx3::registered_string_in<NvtxDomain>& name, std::int32_t payload, bool on);
  ~NvtxScope();
  NvtxScope(NvtxScope&& o) noexcept : on_(std::exchange(o.on_, false)) {}
  NvtxScope& operator=(NvtxScope&& o) noexcept;
  NvtxScope(const NvtxScope&) = delete;
  NvtxScope& operator=(const NvtxScope&) = delete;

 private:
  bool on_ = false;
};

struct ProfilerOptions {
  SamplingConfig sampling;            // knobs; sampling.enabled = false disables everything
  std::filesystem::path out_dir;      // run directory (created; refused when non-empty unless overwrite)
  bool overwrite = false;
  int rank = 0;
  int world_size = 1;
  // One process per rank (MPI): every process but `creator` joins the directory the creator made.
  bool creator = true;
  std::string run_name = "cuda_loop";  // scenario.name in the run header
  std::vector<std::string> argv;
  std::uint64_t seed = 0;
  OrderedJson settings = OrderedJson::object();  // extra effective settings for the header
};

// What a phase is, besides its name (all optional).
struct PhaseInfo {
  std::int32_t layer = kAbsent;
  std::int32_t microbatch = kAbsent;
  Wall wall = Wall::compute;
  double bytes = 0.0;
  double flops = 0.0;
  std::string_view stream = "compute";
  std::string_view group = {};        // process group of a communication phase
  CoarseView coarse = CoarseView::none;
};

class Profiler {
 public:
  explicit Profiler(ProfilerOptions options);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  [[nodiscard]] bool enabled() const { return enabled_; }
  [[nodiscard]] bool recording() const { return recorder_ && recorder_->recording(); }

  using PhaseId = std::uint32_t;
  PhaseId phase_id(std::string_view name);

  // Starts step `step` on `stream` (records its epoch event when the step is sampled).
  void begin_step(int step, cudaStream_t stream);

  class Phase {
   public:
    Phase() = default;
    ~Phase() { end(); }
    Phase(Phase&& o) noexcept;
    Phase& operator=(Phase&&) = delete;
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    // Ends the phase now (records its end event); the destructor does it otherwise.
    void end();

   private:
    friend class Profiler;
    Profiler* prof_ = nullptr;
    cudaStream_t stream_ = nullptr;
    CudaEventClock::Marker start_{};
    PhaseRecord record_;
    NvtxScope nvtx_;
    bool timed_ = false;
  };
  // A phase on `stream` from now until the returned object ends.
  [[nodiscard]] Phase phase(PhaseId id, cudaStream_t stream, const PhaseInfo& info = {});
  // Ends the step: `stream` must be ordered after all of the step's work (join other streams into it
  // first). Harvests finished steps without waiting.
  void end_step(cudaStream_t stream);
  // Waits for every recorded step, writes summary.json (from all records of this process) and the
  // footers. Idempotent; the destructor calls it (swallowing errors) when the loop did not.
  void finish();
  [[nodiscard]] const std::filesystem::path& out_dir() const { return options_.out_dir; }
  [[nodiscard]] std::size_t events_created() const { return clock_ ? clock_->created() : 0; }

 private:
  [[nodiscard]] double host_now_us() const;
  ProfilerOptions options_;
  bool enabled_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<RunDirWriter> writer_;
  std::unique_ptr<RecordSink> sink_;
  std::unique_ptr<CudaEventClock> clock_;
  std::unique_ptr<StepRecorder<CudaEventClock>> recorder_;
  NvtxNames nvtx_;
  std::vector<std::string> phase_names_;
  std::vector<std::uint32_t> phase_ids_;  // by PhaseId: the writer's interned id
};

}  // namespace threewalls::profiler::cuda
