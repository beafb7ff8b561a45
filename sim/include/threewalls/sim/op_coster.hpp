#pragma once
// What one StepGraph op costs alone, from the calibration profile. The executor asks only this
// interface, so tests run it on fakes with closed-form costs; CostModelCoster is the real one, a
// mapping of every OpKind onto calibration::CostModel (docs/simulator.md, "Costs"):
//
//   gemm                                  -> gemm(m, n, k, dtype, batch)
//   grouped_gemm                          -> grouped_gemm(groups, total rows, max rows, n, k, dtype);
//                                            wgrad (shape[5] = 1) swaps the roles: per group n x k
//                                            outputs with the group's rows as the reduction, costed
//                                            as grouped_gemm(groups, n * groups, n, k, max rows)
//   attention                             -> by scenarios::attention_kernel: fused -> fused_attention
//                                            (attention_fused.fwd/.bwd), decode -> decode_attention
//                                            (attention_decode), unfused -> attention(shape, backward);
//                                            a profile without the kernel's family: attention()
//                                            with a warning (substitution)
//   elementwise                           -> memory_kernel(kernel run launches, bytes)
//   softmax_topk, permute, unpermute,
//   embedding, cross_entropy, optimizer   -> fitted_kernel(family, shape) (fitted_kernel_of below);
//                                            elementwise(bytes) when the profile lacks the family
//   norm                                  -> fitted_kernel(RMSNorm or LayerNorm family, rows, hidden);
//                                            else memory_kernel(that kernel, bytes); else norm(bytes)
//   copy                                  -> copy(direction, bytes)
//   collective, send/recv                 -> collective_params(kind, bytes, n, scope) (flows on top)
//   host                                  -> the host costs below
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/flows.hpp"

namespace threewalls::calibration {
class CostModel;
}

namespace threewalls::sim {

// Latency term and bus bandwidth (nccl-tests) of a collective alone at its size and group size.
struct CommParams {
  Seconds latency;
  BytesPerSecond bus_bandwidth;
};

// Host-side costs (docs/simulator.md, "Host lane").
struct HostCosts {
  Seconds kernel_launch;      // one eager kernel or copy launch
  Seconds collective_launch;  // one NCCL call
  Seconds graph_launch;       // one CUDA-graph launch
  Seconds graph_node;         // device time added to each op replayed in a CUDA graph
  Seconds stream_sync;        // a stream synchronisation once the stream is idle
  Seconds gpu_read;           // a small device-to-host read once its producer has finished
  Seconds framework_op;       // one host-side framework op (HostKind::framework without a duration hint)
  Seconds event_record;       // one cudaEventRecord; also the cost taken for one cudaStreamWaitEvent
  Seconds timing_marker;      // device time of one profiler timing marker on its stream (recorded steps)
  // Host time of one library call (a cuBLASLt GEMM costs ~2-4x an empty kernel's launch);
  // empty: kernel_launch is charged (profiles without the families, test costers).
  std::optional<Seconds> gemm_launch;          // gemm ops (CublasLt::gemm)
  std::optional<Seconds> grouped_gemm_launch;  // grouped_gemm ops (GroupedGemm::run)
  std::optional<Seconds> attention_launch;     // forward attention ops (Attention::forward)
  std::optional<Seconds> attention_bwd_launch; // backward attention ops (Attention::backward)
  // threewalls run's own per-op path (optional families; 0 / empty: not charged):
  Seconds op_dispatch{0.0};            // OpRunner::run around every eager launch
  std::optional<Seconds> record_op;    // a recorded op's markers and record (empty: two event records)
  std::optional<Seconds> stream_wait;  // one cross-stream cudaStreamWaitEvent (empty: event_record)
  // An eager framework's (run.framework = "pytorch_eager") other host costs (optional families;
  // empty: framework_op and gpu_read are charged in their place, and the run header says so):
  std::optional<Seconds> framework_backward_op;  // per backward launch, in place of framework_op
  std::optional<Seconds> framework_sync;         // a device-to-host read, in place of gpu_read
  // The plan an eager framework's fused attention builds at a shape new to the process (an attention
  // op flagged kNewShape); empty: not charged.
  std::optional<Seconds> framework_attention_plan;
  // A training step's forward launch, which records its autograd node, in place of framework_op.
  std::optional<Seconds> framework_autograd_op;
  // A timed op of a recorded step: the framework's recording (its events included), in place of
  // record_op.
  std::optional<Seconds> framework_record_op;
};

// The kernel_terms family (calibration/kernel_terms.hpp) and inputs of a softmax_topk, permute,
// unpermute, embedding, cross_entropy, optimizer or norm op (norm: RMSNorm or LayerNorm by op.sub,
// inputs rows and hidden): the launch sequence OpRunner runs for the op's kind and direction, with OpRunner's shape mapping (permute / unpermute: topk = rows / op.tokens
// when that divides and is at most 32, else 1). std::logic_error for other kinds.
struct FittedKernel {
  std::string_view family;
  std::vector<double> inputs;
};
[[nodiscard]] FittedKernel fitted_kernel_of(const scenarios::Op& op);
// The family and inputs of PyTorch eager's implementation of `op` (calibration::pytorch_twin of
// fitted_kernel_of's family, or one of PyTorch's own element-wise and gradient-norm families):
// permute / unpermute by tokens = rows / topk (shape[2], 0 = 1), topk and hidden; embedding by
// tokens, hidden and the table's rows (shape[2]); swiglu, gelu (either direction) and a backward
// add by output elements; the gradient norm (element-wise reduce) by parameters. Empty for op kinds
// whose PyTorch kernels are not separately measured (GEMMs, attention, forward adds, copies).
[[nodiscard]] std::optional<FittedKernel> pytorch_kernel_of(const scenarios::Op& op);
// The family of PyTorch eager's host time for `op`'s body (calibration::kPytorchHostFamilyPrefix),
// input autograd = `records_autograd` for a forward op, 1 for a backward one: the pytorch_host twin of
// pytorch_kernel_of's family; a per-expert permute / unpermute (an eager expert loop's gather and
// combine) expert_gather / expert_scatter, forward or backward (a scatter of RowWeights::unweighted
// expert_scatter_unweighted, the weighted family its fallback); a gemm linear (a backward gemm, dgrad or wgrad, half of
// linear_bwd: autograd runs both products in one node); attention attention. Empty for the rest
// (grouped GEMMs, forward adds, copies, the optimizer, host ops).
struct HostBody {
  std::string family;
  double autograd = 0.0;
  double share = 1.0;    // of the family's time this op carries
  std::string fallback;  // priced in its place where the profile lacks `family` (empty: none)
};
[[nodiscard]] std::optional<HostBody> pytorch_host_body_of(const scenarios::Op& op, bool records_autograd);

// NCCL device memory of the profile (calibration family nccl.memory, models.hpp NcclMemoryModel).
struct NcclMemoryParams {
  Bytes communicator;  // per communicator of more than one rank
  Bytes collective;    // per communicator that runs collectives
  Bytes p2p_peer;      // per distinct send/recv peer (both directions)
};

// Per-process device memory of the profile (calibration family device.memory, models.hpp
// DeviceMemoryModel).
struct DeviceMemoryParams {
  Bytes context;       // the CUDA context, per process
  Bytes modules;       // the backend's kernel modules, per process
  Bytes blas;          // the first OpRunner's cuBLASLt and cuBLAS handles, workspace and GEMM modules
  Bytes blas_further;  // per further OpRunner (device stream with ops)
  Bytes cudnn;         // per OpRunner that runs fused attention
  Bytes granularity;   // device bytes per allocation are a multiple of this
};

// kernel_time, library_launch and nccl_resident_slowdown are functions of their arguments; of an op,
// of its shape, flops, bytes, tokens, kind, sub, dtype and flags only (the executor asks them once per
// distinct kernel of a step).
class OpCoster {
 public:
  virtual ~OpCoster() = default;
  // Device time of a kernel op alone on its GPU: compute and memory kernels and d2d / disk copies.
  [[nodiscard]] virtual Seconds kernel_time(const scenarios::Op& op) const = 0;
  // Time of a host <-> device copy alone on its PCIe link (pinned or pageable).
  [[nodiscard]] virtual Seconds copy_time(scenarios::CopyKind kind, Bytes bytes) const = 0;
  [[nodiscard]] virtual CommParams comm_params(Collective kind, Bytes bytes, int group_size, LinkScope scope) const = 0;
  [[nodiscard]] virtual HostCosts host_costs() const = 0;
  // Throughput of `streams` concurrent kernels of `sm_fraction` of the GPU each, relative to running
  // them back to back (1 = no gain).
  [[nodiscard]] virtual double stream_concurrency(int streams, double sm_fraction) const = 0;
  [[nodiscard]] virtual int sm_count() const = 0;
  // Slowdown (time with / time alone) of a compute kernel while an NCCL kernel is resident on its GPU
  // (calibration family nccl.interference, docs/simulator.md "Compute beside resident NCCL kernels"):
  // `nccl_case` 0 = an NCCL kernel waiting for its peer, 1 = transferring; `compute_class` 0 = GEMM
  // (`tiles`: 128 x 128 output tiles), 1 = attention, 2 = memory-bound, 3 = grouped GEMM (`tiles`: all
  // groups' output tiles). Costers without the model
  // (older profiles, test fakes) return 1 and say so through models_nccl_residency().
  [[nodiscard]] virtual double nccl_resident_slowdown(int /*nccl_case*/, int /*compute_class*/,
                                                      double /*tiles*/) const {
    return 1.0;
  }
  [[nodiscard]] virtual bool models_nccl_residency() const { return false; }
  // NCCL device memory measured by the calibration; empty: the memory model keeps its constants.
  [[nodiscard]] virtual std::optional<NcclMemoryParams> nccl_memory() const { return std::nullopt; }
  // Per-process device memory measured by the calibration; empty: the memory model keeps its constants.
  [[nodiscard]] virtual std::optional<DeviceMemoryParams> device_memory() const { return std::nullopt; }
  // RDMA bandwidth of a flex (DeepEP-style) MoE dispatch or combine over `group_size` expert-parallel
  // ranks; empty: the network part is priced on the all-to-all network curve (docs/simulator.md).
  [[nodiscard]] virtual std::optional<BytesPerSecond> expert_dispatch_bandwidth(int /*group_size*/,
                                                                                bool /*combine*/) const {
    return std::nullopt;
  }
  // Host time of the library call OpRunner makes for a gemm or grouped_gemm op, by its shape (split-K
  // GEMMs launch a second kernel; a grouped GEMM one matmul per run of equal rows); empty: the
  // per-kind constant of HostCosts (test fakes, other kinds).
  [[nodiscard]] virtual std::optional<Seconds> library_launch(const scenarios::Op& /*op*/) const { return std::nullopt; }
  // Extra host time of each kernel or library launch when a rank's launches rotate over `streams`
  // streams (each with its own OpRunner), over launching on one (calibration host.stream_cycle);
  // 0 for costers without it.
  [[nodiscard]] virtual Seconds stream_cycle_extra(int /*streams*/) const { return Seconds(0.0); }
  // run.framework = "pytorch_eager": the extra host time of each launch of an expert loop whose
  // experts rotate over `streams` streams, over the loop on one (calibration
  // host.framework_stream_op); empty for costers without it.
  [[nodiscard]] virtual std::optional<Seconds> framework_stream_extra(int /*streams*/) const { return std::nullopt; }
  // run.framework = "pytorch_eager": the host time PyTorch spends issuing `op`'s body (its Python,
  // dispatcher, autograd node and kernel launches, pytorch_host_body_of), in place of the per-launch
  // costs; `records_autograd`: a training step's forward. Empty: the per-launch costs (other
  // frameworks, profiles without the family, test fakes).
  [[nodiscard]] virtual std::optional<Seconds> framework_body_host(const scenarios::Op& /*op*/,
                                                                   bool /*records_autograd*/) const {
    return std::nullopt;
  }
  // When kernel_time prices `op` with the fit of another kernel than the one the op runs on (fused
  // attention from the unfused attention fits, for a profile without fused attention families), the
  // sentence the simulator prints as a warning; empty otherwise.
  [[nodiscard]] virtual std::optional<std::string> substitution(const scenarios::Op& /*op*/) const {
    return std::nullopt;
  }
};

// The CostModel-backed coster. Keeps a reference: `model` must outlive it. `host_scale` multiplies
// every host-side cost (launches, library calls, syncs, reads, event records, the executor's per-op
// path, the stream-cycle extra), not the device time of graph nodes and timing markers: a host
// measured slower or faster than the profile's (threewalls sim --host-scale). `disk_scale` multiplies
// the time of every disk read (copy kind disk_read), nothing else: a disk slower or faster than the
// calibrated one (threewalls sim --disk-scale). InputError unless both are > 0. kernel_time remembers
// the time of each distinct combination of the op fields it reads (ops repeat across layers and
// micro-batches): one coster is not for concurrent use.
class CostModelCoster final : public OpCoster {
 public:
  // `framework`: what drives the GPU (run.framework); pytorch_eager prices the ops pytorch_kernel_of
  // names by those families where the profile has them, else by the backend's (substitution() says so).
  explicit CostModelCoster(const calibration::CostModel& model, double host_scale = 1.0, double disk_scale = 1.0,
                           scenarios::Framework framework = scenarios::Framework::cpp);
  [[nodiscard]] Seconds kernel_time(const scenarios::Op& op) const override;
  [[nodiscard]] Seconds copy_time(scenarios::CopyKind kind, Bytes bytes) const override;
  [[nodiscard]] CommParams comm_params(Collective kind, Bytes bytes, int group_size, LinkScope scope) const override;
  [[nodiscard]] HostCosts host_costs() const override { return host_; }
  [[nodiscard]] std::optional<Seconds> framework_body_host(const scenarios::Op& op,
                                                           bool records_autograd) const override;
  [[nodiscard]] double stream_concurrency(int streams, double sm_fraction) const override;
  [[nodiscard]] int sm_count() const override;
  [[nodiscard]] double nccl_resident_slowdown(int nccl_case, int compute_class, double tiles) const override;
  [[nodiscard]] bool models_nccl_residency() const override;
  [[nodiscard]] std::optional<NcclMemoryParams> nccl_memory() const override;
  [[nodiscard]] std::optional<DeviceMemoryParams> device_memory() const override;
  [[nodiscard]] std::optional<BytesPerSecond> expert_dispatch_bandwidth(int group_size, bool combine) const override;
  [[nodiscard]] std::optional<Seconds> library_launch(const scenarios::Op& op) const override;
  [[nodiscard]] Seconds stream_cycle_extra(int streams) const override;
  [[nodiscard]] std::optional<Seconds> framework_stream_extra(int streams) const override;
  [[nodiscard]] std::optional<std::string> substitution(const scenarios::Op& op) const override;

 private:
  // The op fields kernel_time reads.
  struct KernelKey {
    scenarios::OpShape shape{};
    double bytes = 0.0;
    std::int32_t tokens = 0;
    scenarios::OpKind kind = scenarios::OpKind::gemm;
    std::uint8_t sub = 0;
    scenarios::DType dtype = scenarios::DType::bf16;
    std::uint8_t flags = 0;
    bool operator==(const KernelKey&) const = default;
  };
  struct KernelKeyHash {
    std::size_t operator()(const KernelKey& k) const;
  };
  [[nodiscard]] Seconds compute_kernel_time(const scenarios::Op& op) const;

  const calibration::CostModel& model_;
  double host_scale_ = 1.0;
  double disk_scale_ = 1.0;
  scenarios::Framework framework_ = scenarios::Framework::cpp;
  HostCosts host_;
  mutable std::unordered_map<KernelKey, Seconds, KernelKeyHash> kernel_times_;
};

using scenarios::sm_fraction;  // step_graph.hpp: the share of SMs an op's kernel fills

}  // namespace threewalls::sim
