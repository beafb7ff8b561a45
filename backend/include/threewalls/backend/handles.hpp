#pragma once
// Move-only RAII handles for CUDA objects, and NVTX3 ranges in the `threewalls` domain.
//
// Ownership: each handle owns exactly one CUDA object and releases it in its destructor (errors in
// destructors are swallowed: a destructor runs during unwinding too). Handles are not thread-safe
// except EventPool; a rank thread owns its handles. All of them must be destroyed while the device
// they were created on is current (the executor keeps one device per thread).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nvtx3/nvtx3.hpp>

namespace threewalls::backend {

// ---- devices ----
// Number of CUDA devices; 0 (and `reason` set, if given) when there is no usable driver or device.
[[nodiscard]] int device_count(std::string* reason = nullptr);
void set_device(int device);
// Destroys this process's primary context on every visible device (cudaDeviceReset): every
// allocation, stream and handle of it goes, so destroy the objects holding them first. For a process
// done with its GPUs that hands them to a child (calibrate --host-processes). The device itself is
// not reset.
void release_devices();
[[nodiscard]] int current_device();
// "NVIDIA H100 80GB HBM3" for the current device.
[[nodiscard]] std::string device_name();

// ---- streams and events ----
class Stream {
 public:
  // A non-blocking stream (does not synchronise with the legacy default stream). Lower `priority`
  // numbers are higher priority (CUDA convention); 0 is the default.
  explicit Stream(int priority = 0);
  ~Stream();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  [[nodiscard]] cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }  // NOLINT(google-explicit-constructor): used like the raw handle
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;  // empty: owns nothing
  // timing = true for events the profiler times with; false for pure synchronisation events
  // (cudaEventDisableTiming, cheaper to record and wait on).
  explicit Event(bool timing);
  ~Event();
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  [[nodiscard]] cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream) const;
  void synchronize() const;
  // Whether the work before the last record has finished (cudaEventQuery).
  [[nodiscard]] bool done() const;
  // Milliseconds between two recorded, completed timing events (cudaEventElapsedTime).
  [[nodiscard]] static float elapsed_ms(const Event& start, const Event& stop);

 private:
  cudaEvent_t e_ = nullptr;
};

// Recycled events: acquire() hands out a free event (creating one only when none is free), and the
// lease returns it when destroyed. Events are never created per op in steady state. Thread-safe.
class EventPool {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(EventPool* pool, Event e) : pool_(pool), event_(std::move(e)) {}
    ~Lease();
    Lease(Lease&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), event_(std::move(o.event_)) {}
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    [[nodiscard]] const Event& event() const { return event_; }
    [[nodiscard]] cudaEvent_t get() const { return event_.get(); }

   private:
    EventPool* pool_ = nullptr;
    Event event_;
  };

  explicit EventPool(bool timing = true, std::size_t reserve = 0);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  [[nodiscard]] Lease acquire();
  [[nodiscard]] std::size_t created() const;  // events created so far (for tests: recycling works)
  [[nodiscard]] std::size_t free_count() const;

 private:
  friend class Lease;
  void give_back(Event e);
  bool timing_;
  mutable std::mutex mu_;
  std::vector<Event> free_;
  std::size_t created_ = 0;
};

// ---- memory ----
// Device memory from cudaMalloc. An allocation failure throws DeviceError saying what was
// requested and what was free.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] void* data() const { return p_; }
  template <class T>
  [[nodiscard]] T* as() const { return static_cast<T*>(p_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }
  [[nodiscard]] bool empty() const { return bytes_ == 0; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// Page-locked host memory from cudaMallocHost (page aligned, so usable for O_DIRECT reads).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  [[nodiscard]] void* data() const { return p_; }
  template <class T>
  [[nodiscard]] T* as() const { return static_cast<T*>(p_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// ---- CUDA graphs ----
class CudaGraph {
 public:
  CudaGraph() = default;
  explicit CudaGraph(cudaGraph_t g) : g_(g) {}
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  [[nodiscard]] cudaGraph_t get() const { return g_; }
  [[nodiscard]] std::size_t num_nodes() const;

  // Capture: begin_capture(s); <launch work on s, and on streams forked from s by events>;
  // CudaGraph g = CudaGraph::end_capture(s). Global capture mode: an illegal call during capture
  // (a synchronous copy, cudaMalloc, ...) fails instead of silently running outside the graph.
  static void begin_capture(cudaStream_t s);
  [[nodiscard]] static CudaGraph end_capture(cudaStream_t s);

 private:
  cudaGraph_t g_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(const CudaGraph& g);
  ~GraphExec();
  GraphExec(GraphExec&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  [[nodiscard]] cudaGraphExec_t get() const { return e_; }
  void launch(cudaStream_t s) const;

 private:
  cudaGraphExec_t e_ = nullptr;
};

// ---- NVTX3 ----
struct threewalls_domain {  // NOLINT(readability-identifier-naming): nvtx3 looks up `name`
  static constexpr char const* name{"threewalls"};
};
// A scoped range in the threewalls domain: `NvtxRange r{"attn fwd L3"};`.
using NvtxRange = nvtx3::scoped_range_in<threewalls_domain>;

}  // namespace threewalls::backend
