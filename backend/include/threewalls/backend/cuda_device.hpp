#pragma once
// The executor's Device on a real GPU (docs/backend.md, "Executor"): CUDA streams, cuBLASLt and
// our kernels through one OpRunner per stream, NCCL through one non-blocking communicator per
// (group, stream), events from a recycled pool, timing markers from the profiler's CudaEventClock,
// NVTX3 ranges in the `threewalls` domain, CUDA graphs captured in thread-local mode.
//
// Why one OpRunner per stream: a CublasLt handle's workspace may only serve one stream at a time,
// and an OpRunner's collectives use the communicators of one CommTable; with a runner per stream,
// concurrent streams never share a workspace or a communicator. Buffers are per stream too (the data
// is random: we measure time, not train).
// Send/recv go through backend::send/recv on two-rank communicators, one per directed pair of ranks
// and pipeline direction (CommSpec), so a rank's sends never queue behind its receives.
#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "threewalls/backend/device.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/backend/parameter_state.hpp"
#include "threewalls/profiler/cuda_profiler.hpp"

namespace threewalls::backend {

class CudaDevice : public Device {
 public:
  // Makes `ordinal` the calling thread's device and tags the thread's errors with `rank`.
  CudaDevice(int rank, int ordinal);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  [[nodiscard]] std::string name() const override;
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
  [[nodiscard]] std::string memory_method() const override;
  [[nodiscard]] void* allocate_segment(std::size_t bytes) override;
  void free_segment(void* p, std::size_t bytes) override;

 private:
  struct PerStream {
    Stream stream;
    std::unique_ptr<CommTable> comms;
    std::unique_ptr<OpRunner> runner;
    DeviceBuffer p2p_send;
    DeviceBuffer p2p_recv;
    std::map<scenarios::Group, std::string> comm_names;  // group -> "ep@compute"
  };
  PerStream& at(int stream);
  void create_comms();
  void probe_host();
  void prepare_stream(int s, const std::vector<scenarios::Op>& ops);
  void p2p(const scenarios::StepGraph& graph, const scenarios::Op& op, PerStream& ps);
  NcclComm& p2p_comm(const scenarios::StepGraph& graph, const scenarios::Op& op);
  const nvtx3::registered_string_in<profiler::cuda::NvtxDomain>& nvtx_name(const scenarios::StepGraph& g,
                                                                           const scenarios::Op& op);

  // First member: makes the device current (and tags the thread) before any other member creates
  // CUDA objects (the event clock creates its pool in its constructor).
  struct Binder {
    Binder(int rank, int ordinal);
  };
  Binder binder_;
  int rank_;
  int ordinal_;
  DeviceSetup setup_;
  // Training: the rank's parameter state, shared by the streams' runners (declared first: it outlives them).
  std::unique_ptr<ParameterState> parameter_state_;
  std::map<int, PerStream> streams_;
  std::map<std::string, NcclComm> p2p_comms_;  // send/recv: two-rank communicators by comm_key
  std::vector<Event> events_;
  std::vector<std::uint32_t> free_events_;
  profiler::cuda::CudaEventClock clock_;
  profiler::cuda::NvtxNames nvtx_;
  std::map<const scenarios::StepGraph*, std::vector<const nvtx3::registered_string_in<profiler::cuda::NvtxDomain>*>>
      nvtx_by_graph_;
  std::vector<CudaGraph> graphs_;
  std::vector<GraphExec> execs_;
  bool capturing_ = false;
  std::atomic<bool> aborted_{false};  // abort() may come from the executor's watchdog thread
  OrderedJson host_probe_;  // settings()["host_probe"]: this process's host costs, measured at open()
};

}  // namespace threewalls::backend
