#pragma once
// Peak GPU memory per rank class: weights, gradients, optimizer state, activations of the
// micro-batches in flight, communication and dispatcher buffers, CUDA-graph pools; and the OOM verdict.
// Pure formulas of the scenario (and of the StepGraph's rank classes for stages and expert load).
// Every formula is in docs/memory_model.md, with its source (Korthikanti et al. 2022 for activations,
// Megatron-LM's distributed optimizer for the 18 and 6 + 12/d bytes per parameter).
#include <optional>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/activations.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/op_coster.hpp"

namespace threewalls::sim {

// Modelling choices that the scenario language does not express: those of the saved activations
// (scenarios/activations.hpp) and these.
struct MemoryOptions {
  bool fused_attention = true;  // scenarios::ActivationOptions::fused_attention
  bool dropout = false;         // scenarios::ActivationOptions::dropout
  // NCCL device memory measured by the calibration (profile family nccl.memory; the simulator and
  // the planner fill it from their coster). Empty: the fixed constants kNcclBytesPerCommunicator /
  // kNcclBytesPerPeer below (docs/memory_model.md, "Buffers").
  std::optional<NcclMemoryParams> nccl{};
  // Per-process device memory measured by the calibration (profile family device.memory): the CUDA
  // context, kernel modules, cuBLASLt / cuDNN handles and workspaces. Empty: the fixed constants
  // kCudaContextBytes and kOpRunnerWorkspaceBytes below (docs/memory_model.md, "Buffers").
  std::optional<DeviceMemoryParams> device{};
  // Where the NCCL buffers of a class are counted (nccl measured): null, on the class's own ops;
  // else on the ops of this graph's first class of the same pipeline stage, for a graph without
  // ops (the planner's skeleton, docs/planner.md). Its layout must be the graph's.
  const scenarios::StepGraph* communication_ops = nullptr;
  [[nodiscard]] scenarios::ActivationOptions activations() const { return {fused_attention, dropout}; }
};

// Bytes per parameter of weights + gradients + optimizer (bf16 weights, fp32 gradients, fp32 master
// weights and two Adam moments): 18 without the distributed optimizer, 6 + 12/d with it over d ranks.
double training_bytes_per_parameter(bool distributed_optimizer, int d);

// Micro-batches in flight on `stage`, in units of one model chunk (a stage's layers / vpp):
// 1F1B min(pp - stage, m); interleaved min(2 (pp - stage - 1) + (vpp - 1) pp + 1, m vpp); one more
// with the expert-parallel overlap (train.overlap_moe_expert_parallel_comm).
int inflight_chunk_microbatches(int pp, int vpp, int stage, int microbatches, bool ep_overlap = false);

struct MemoryBreakdown {
  Bytes weights;
  Bytes gradients;
  Bytes optimizer;
  Bytes activations;
  Bytes buffers;
  Bytes graph_pools;
  [[nodiscard]] Bytes total() const {
    return weights + gradients + optimizer + activations + buffers + graph_pools;
  }
};

struct ClassMemory {
  int id = 0;
  std::string label;
  int ranks = 0;
  MemoryBreakdown breakdown;
  scenarios::ParameterCount params;
  int inflight = 0;                  // chunk-micro-batches (training) or 1 (inference)
  double activation_per_microbatch = 0.0;  // bytes of one micro-batch of the stage (all its layers)
  [[nodiscard]] Bytes peak() const { return breakdown.total(); }
};

struct MemoryReport {
  Bytes gpu_memory;
  std::vector<ClassMemory> classes;
  [[nodiscard]] bool oom() const;
  // The first class over the limit, -1 when none.
  [[nodiscard]] int first_oom_class() const;
};

// The operand buffers of `op` (docs/memory_model.md, "Buffers"): its bytes, less a decode attention's
// keys and values read from the KV cache; 0 for host ops and the ops that work on the parameter state
// (scenarios::works_on_parameter_state).
double operand_bytes(const scenarios::Scenario& s, const scenarios::Op& op);
// The ops of `ops` that set the runners' memory (per stream: the one of the most operand bytes, and a
// fused attention, whose runner holds a cuDNN handle): a class with only these ops has the same
// buffers. The planner gives them to its skeleton classes (docs/planner.md).
std::vector<scenarios::Op> runner_ops(const scenarios::Scenario& s, const std::vector<scenarios::Op>& ops);

// The memory model of every rank class of `graph`.
MemoryReport memory_model(const scenarios::Scenario& s, const scenarios::StepGraph& graph, const MemoryOptions& opt = {});

// Constants of the buffer model (docs/memory_model.md).
inline constexpr double kCudaContextBytes = 512.0 * 1024 * 1024;      // context, cuBLAS workspaces
inline constexpr double kOpRunnerWorkspaceBytes = 32.0 * 1024 * 1024;  // per further stream (CublasLt)
inline constexpr double kNcclBytesPerCommunicator = 64.0 * 1024 * 1024;
inline constexpr double kNcclBytesPerPeer = 2.0 * 1024 * 1024;         // all-to-all peer buffers
inline constexpr double kDeepEpBufferBytes = 1024.0 * 1024 * 1024;     // flex dispatcher, per buffer
// NCCL's p2p buffers (docs/memory_model.md, "NCCL buffers per peer"; NVIDIA/nccl src/init.cc,
// src/graph/paths.cc, src/transport/p2p.cc and net.cc, defaults of NCCL 2.19-2.28): one NVLink p2p
// channel with a peer, both directions (a 4 MiB SIMPLE buffer and the 512 KiB LL + 4.7 MiB LL128
// buffers, each allocation rounded up to CUDA_IPC_MIN, 2 MiB);
inline constexpr double kNcclP2pChannelBytes = 12.0 * 1024 * 1024;
// p2p channels of a communicator (MAXCHANNELS-bound p2pnChannels on H100 / H200 NVLink);
inline constexpr int kNcclP2pChannels = 32;
// channels per network peer: max(NICs, ceil(NIC bandwidth / NCCL_P2P_PER_CHANNEL_NET_BW 14 GB/s))
// for one 400 Gb/s (50 GB/s) NIC per GPU;
inline constexpr int kNcclNetChannelsPerPeer = 4;
// a communicator's shared p2p network buffers (NCCL_NET_SHARED_BUFFERS, on by default), send and
// receive: 2 x p2pnChannels x NCCL_SHARED_STEPS 16 x NCCL_P2P_NET_CHUNKSIZE 128 KiB.
inline constexpr double kNcclNetSharedPoolBytes = 2.0 * kNcclP2pChannels * 16 * 128.0 * 1024;

}  // namespace threewalls::sim
