#pragma once
// The simulator's view of a calibration profile: durations of primitive operations from the
// profile's fitted models (never a lookup of the exact shapes of a scenario). calibration/ depends
// only on core/, so this interface takes primitive shapes, not StepGraph ops; sim/ maps ops to calls.
//
// Every function documents its model equation where it is implemented (calibration/src/*.cpp) and
// in docs/calibration.md. All durations are for one GPU of the profiled kind, alone (no contention:
// the simulator adds sharing of links and streams on top).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/core/units.hpp"
#include "threewalls/core/vocabulary.hpp"

namespace threewalls::calibration {

class Profile;

using threewalls::to_string;

// Effective parameters of a collective for the flow-level simulator: latency term and the bus
// bandwidth (nccl-tests definition) it reaches alone at that size and group size.
struct CollectiveParams {
  Seconds latency;           // alpha: time of a zero-byte collective
  BytesPerSecond bus_bandwidth;  // beta_eff(S): bus bandwidth at this size
};

// nccl-tests bus-bandwidth factor f(n) of a collective over n ranks: all_reduce 2(n-1)/n;
// all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast and send_recv 1. A lone collective of
// S bytes takes latency + (S * f(n)) / bus_bandwidth (CollectiveParams at that S and n).
double bus_bandwidth_factor(Collective kind, int group_size);

// Shape of a fused attention call; kv_heads < heads for GQA/MQA (K and V are smaller to read).
struct AttentionShape {
  std::int64_t batch = 1;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 1;
  std::int64_t head_dim_qk = 0;
  std::int64_t head_dim_v = 0;
  bool causal = false;
  // Sliding window (causal only): the keys each query sees at most, itself included; 0 = none
  // (core/attention_mask.hpp).
  std::int64_t window = 0;
};

class CostModel {
 public:
  explicit CostModel(const Profile& profile);
  ~CostModel();
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;
  CostModel(CostModel&&) noexcept;
  CostModel& operator=(CostModel&&) noexcept;

  // ---- compute ----
  // C[m,n] = A[m,k] B[k,n] (times `batch` independent products).
  [[nodiscard]] Seconds gemm(std::int64_t m, std::int64_t n, std::int64_t k, DType dt, std::int64_t batch = 1) const;
  // One GEMM per group (local expert) with `total_rows` rows in all and at most `max_rows` in one group.
  [[nodiscard]] Seconds grouped_gemm(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                     std::int64_t n, std::int64_t k, DType dt) const;
  // Fused attention over (batch, heads) with the given sequence lengths and head dims.
  [[nodiscard]] Seconds attention(std::int64_t batch, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t heads,
                                  std::int64_t head_dim_qk, std::int64_t head_dim_v, bool causal, bool backward) const;
  // The same with K/V heads given (GQA/MQA); the call above is this one with kv_heads = heads.
  [[nodiscard]] Seconds attention(const AttentionShape& shape, bool backward) const;
  // Fused attention (flash-style, the scores never in memory) by its own fit, attention_fused.fwd /
  // attention_fused.bwd; the split-KV decode attention (one query per sequence, shape.seq_q = 1) by
  // attention_decode. Empty when the profile lacks the family (profiles calibrated before them): the
  // caller then costs the kernel with attention() and says so. InputError for negative dimensions.
  [[nodiscard]] std::optional<Seconds> fused_attention(const AttentionShape& shape, bool backward) const;
  [[nodiscard]] std::optional<Seconds> decode_attention(const AttentionShape& shape) const;
  // Whether the profile has those families (what the two calls above answer empty for, without
  // costing a shape).
  [[nodiscard]] bool has_fused_attention(bool backward) const;
  [[nodiscard]] bool has_decode_attention() const;
  // Memory-bound kernels by bytes read + written (element-wise, activation, residual, permute, loss).
  [[nodiscard]] Seconds elementwise(Bytes bytes) const;
  // Normalisation kernels (rows x hidden, bytes read + written).
  [[nodiscard]] Seconds norm(Bytes bytes) const;
  // One memory-bound kernel by its own fit (a family of kMemoryKernelFamilies, e.g.
  // "norm_rmsnorm_bwd"): the kernels' bandwidths differ by 7x (add 4.3 TB/s, RMSNorm backward
  // 0.6 TB/s on H200), so the pooled elementwise / norm fits miss each by 17-23%. Falls back to the
  // pooled fit ("norm..." -> norm, else elementwise) when the profile lacks the family.
  [[nodiscard]] Seconds memory_kernel(std::string_view kernel_family, Bytes bytes) const;
  // One kernel launch sequence by its own shape fit (a kernel_terms family, kernel_terms.hpp: the
  // MoE router, permute / unpermute, embedding, cross-entropy, Adam), `inputs` in the family's input
  // order: t = t0 + sum_j c_j prod x. Empty when the profile lacks the family (older profiles: the
  // caller falls back to the pooled elementwise(bytes) fit). InputError for an unknown family or a
  // wrong number of inputs.
  [[nodiscard]] std::optional<Seconds> fitted_kernel(std::string_view kernel_family,
                                                     const std::vector<double>& inputs) const;

  // ---- copies ----
  [[nodiscard]] Seconds copy(CopyKind dir, Bytes bytes) const;

  // ---- communication ----
  // nccl-tests conventions: `bytes` is the "size" column (all_reduce: buffer; all_gather: output;
  // reduce_scatter: input; all_to_all: bytes each rank sends in total); bus bandwidth factors
  // 2(n-1)/n, (n-1)/n, (n-1)/n, (n-1)/n, 1 for send_recv.
  [[nodiscard]] Seconds collective(Collective kind, Bytes bytes, int group_size, LinkScope scope) const;
  [[nodiscard]] CollectiveParams collective_params(Collective kind, Bytes bytes, int group_size, LinkScope scope) const;

  // ---- host ----
  [[nodiscard]] Seconds kernel_launch() const;     // host time of one eager kernel launch
  [[nodiscard]] Seconds framework_op() const;      // extra host time per op of a framework (eager dispatch)
  [[nodiscard]] Seconds event_record() const;
  [[nodiscard]] Seconds stream_sync() const;       // host cost of a stream sync on an idle stream
  [[nodiscard]] Seconds gpu_read() const;          // a small device->host read that blocks the host
  [[nodiscard]] Seconds graph_launch() const;      // host time of one CUDA-graph launch
  [[nodiscard]] Seconds graph_node() const;        // device-side cost per graph node
  // Device time one profiler timing marker (a CUDA event record on the op's stream) adds to the
  // stream, on recorded steps; 0 when the profile has no host.timing_marker entry.
  [[nodiscard]] Seconds timing_marker() const;
  [[nodiscard]] Seconds collective_launch() const; // host time to enqueue one NCCL call
  // Host time of one library call as OpRunner makes it (optional families host.gemm_launch,
  // host.grouped_gemm_launch, host.attention_launch, host.attention_bwd_launch; calibrated behind a
  // blocking kernel). Each falls back to kernel_launch() when the profile lacks its family (older
  // profiles).
  [[nodiscard]] Seconds gemm_launch() const;
  [[nodiscard]] Seconds grouped_gemm_launch() const;
  [[nodiscard]] Seconds attention_launch() const;      // forward
  [[nodiscard]] Seconds attention_bwd_launch() const;  // backward
  // The same calls by shape: host.gemm_call (one kernel, or two when split-K is predicted) and
  // host.grouped_gemm_call (one matmul per run of equal rows) when the profile has them, else the
  // median forms above.
  [[nodiscard]] Seconds gemm_launch(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1) const;
  [[nodiscard]] Seconds grouped_gemm_launch(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows) const;
  [[nodiscard]] bool has_library_launch_costs() const;  // the profile has at least one of the four
  // Extra host time per launch when a step's launches rotate over `streams` streams (each with its
  // own OpRunner and cuBLASLt handle), over launching on one: host.stream_cycle; 0 without it.
  [[nodiscard]] Seconds stream_cycle_extra(int streams) const;
  // The same for an eager framework's expert loop (PyTorch eager: experts on N streams against one;
  // host.framework_stream_op), per launch of the loop; empty without the family.
  [[nodiscard]] std::optional<Seconds> framework_stream_extra(int streams) const;
  // threewalls run's own per-op host path: extra host time of OpRunner::run over the bare launch
  // (host.op_dispatch; 0 without it), and extra host time of a recorded op over the unrecorded
  // launch, markers included (host.record_op; empty without it: the simulator then charges two
  // event records).
  [[nodiscard]] Seconds op_dispatch() const;
  [[nodiscard]] std::optional<Seconds> record_op() const;
  // Host time of one cudaStreamWaitEvent on a stream other than the event's, the streams rotating
  // (host.stream_wait; host.event_record when the profile lacks it).
  [[nodiscard]] Seconds stream_wait() const;
  // An eager framework's host costs besides its forward per-op dispatch (framework_op), measured by
  // the Python package's framework benchmark; empty when the profile lacks them: the host time of a
  // backward op on top of the kernel launch (the autograd engine's node and the C++ dispatch;
  // host.framework_backward_op), and of one device-to-host read the framework makes
  // (host.framework_sync), and of the plan a fused attention builds at a shape it has not run
  // (host.framework_attention_plan).
  [[nodiscard]] std::optional<Seconds> framework_backward_op() const;
  [[nodiscard]] std::optional<Seconds> framework_sync() const;
  [[nodiscard]] std::optional<Seconds> framework_attention_plan() const;
  // An eager framework's forward op that records an autograd node (a training step's forward), on top
  // of the kernel launch (host.framework_autograd_op); empty: framework_op is charged.
  [[nodiscard]] std::optional<Seconds> framework_autograd_op() const;
  // An eager framework's recording of one timed op on a recorded step (the reference runner's
  // phases), over the op unrecorded (host.framework_record_op); empty: record_op is charged.
  [[nodiscard]] std::optional<Seconds> framework_record_op() const;

  // ---- concurrency ----
  // Throughput factor of `streams` concurrent small kernels relative to running them back to back
  // (1 = no gain; > 1 = faster together), for kernels of `sm_fraction` of the GPU each.
  [[nodiscard]] double stream_concurrency(int streams, double sm_fraction) const;

  // ---- compute beside resident NCCL kernels (optional family nccl.interference) ----
  // Slowdown t_with / t_alone of a compute kernel while an NCCL kernel is resident on the same GPU
  // (models.hpp, NcclInterferenceModel): `nccl_case` 0 = a p2p/collective kernel waiting for its
  // peer, 1 = transferring; `compute_class` 0 = GEMM (`tiles` = 128 x 128 output tiles of the call),
  // 1 = attention, 2 = memory-bound, 3 = grouped GEMM (`tiles` = every group's output tiles). 1 when the profile has no
  // nccl.interference family (older profiles: no slowdown, the behaviour before the family existed) or lacks the case.
  [[nodiscard]] double nccl_resident_slowdown(int nccl_case, int compute_class, double tiles) const;
  [[nodiscard]] bool has_nccl_interference() const;
  // ---- NCCL device memory (optional family nccl.memory) ----
  struct NcclMemory {
    Bytes communicator;  // per communicator of more than one rank
    Bytes collective;    // per communicator that runs collectives
    Bytes p2p_peer;      // per distinct send/recv peer
  };
  // Empty when the profile has no nccl.memory family (the memory model keeps its fixed constants).
  [[nodiscard]] std::optional<NcclMemory> nccl_memory() const;
  // ---- expert dispatch over RDMA (optional family dispatch.flex.network) ----
  // RDMA bandwidth of a flex (DeepEP-style) dispatch (combine = false) or combine over an expert-parallel
  // group of `group_size` ranks; empty when the profile has no dispatch.flex.network family.
  [[nodiscard]] std::optional<BytesPerSecond> expert_dispatch_bandwidth(int group_size, bool combine) const;
  // ---- per-process device memory (optional family device.memory) ----
  struct DeviceMemory {
    Bytes context;       // the CUDA context, per process
    Bytes modules;       // the backend's kernel modules, per process
    Bytes blas;          // the first OpRunner's cuBLASLt and cuBLAS handles, workspace, GEMM modules
    Bytes blas_further;  // per further OpRunner: cuBLASLt and cuBLAS handles, workspace
    Bytes cudnn;         // per OpRunner that runs fused attention: cuDNN handle, graphs, workspace
    Bytes granularity;   // bytes newly mapped by a 1-byte cudaMalloc (DeviceMemoryModel, stage 5); unused
  };
  // Empty when the profile has no device.memory family (the memory model keeps its fixed constants).
  [[nodiscard]] std::optional<DeviceMemory> device_memory() const;

  // ---- hardware ----
  [[nodiscard]] FlopsPerSecond peak_flops(DType dt) const;  // datasheet dense peak
  [[nodiscard]] BytesPerSecond hbm_bandwidth() const;       // measured copy bandwidth (read + write)
  [[nodiscard]] int sm_count() const;

  // ---- a calibration point ----
  // What the calls above give for a point of `family` (a FamilySpec name, its inputs in the
  // registry's order), exactly as the simulator asks for that op: held-out points are scored
  // through it. Empty for a family the simulator costs otherwise (host costs, concurrency, NCCL
  // interference and memory, copies) and for a kernel_terms family the profile lacks.
  [[nodiscard]] std::optional<Seconds> predict_point(std::string_view family, const std::vector<double>& inputs) const;

  // ---- identity ----
  // Profile::id() of the profile this model was built from, for run headers.
  [[nodiscard]] const std::string& profile_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace threewalls::calibration
