#pragma once
// OpRunner: launches the real work of one StepGraph op on one rank.
//
// Contract for the executor
//  * One OpRunner per rank thread, used only from that thread, with the rank's device current.
//  * prepare(ops) before timing: sizes the buffers for every op of the rank's class (reused across
//    ops; activations alias freely: we measure time, not train a model), fills them with seeded
//    random non-zero data, and builds the plans (grouped-GEMM pointer arrays, routings, attention
//    statistics). Parameters are the exception: every GEMM's weight (and a wgrad's gradient) has a
//    place of its own (weights.hpp), so it is read from memory, not L2, as in a deployment; a
//    placed parameter never moves. After prepare, run() allocates nothing and can be captured in a
//    CUDA graph, except copy ops with CopyKind::disk_read and h2d/d2h_pageable, which are
//    host-synchronous.
//  * run(op, stream) enqueues the op's work on `stream` and returns (asynchronous), except
//    disk_read (a blocking file read on the calling thread). An op it was not prepared for is
//    prepared on the spot (synchronising the device).
//  * Collectives, send and recv use the communicator of op.group from the CommTable given at
//    construction; all members of a group must run the matching op (StepGraph contract).
//  * Host ops (OpKind::host) belong to the executor's host thread and throw here, except that
//    gpu_read() offers the device read a HostKind::gpu_read op performs.
// The op kind -> kernel mapping is documented op kind by op kind in docs/backend.md.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/fused_attention.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/parameter_state.hpp"
#include "threewalls/backend/weights.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

struct OpRunnerConfig {
  std::uint64_t seed = 1;                 // run.seed: every buffer's random content derives from it
  GroupedImpl grouped_impl = GroupedImpl::lt_batched;
  std::size_t attention_workspace = Attention::kDefaultWorkspace;  // of the unfused attention, when it runs
  int route_experts = 64;                 // experts of the routing that permute/unpermute ops follow
  std::int64_t embedding_rows = 32768;    // rows of the embedding table (vocabulary shard) to gather from
  std::string scratch_dir = "/tmp";       // where the disk-tier file for disk_read copies is written
  // A training rank's parameter state (parameter_state.hpp), shared by the rank's runners and outliving
  // them. When set, GEMM weights and wgrad gradients are its places, and the ops that work on it
  // (scenarios::works_on_parameter_state: the optimizer step, the gradient norm, the data-parallel
  // collectives) run on its buffers, not on buffer slots. Null (inference, calibration): parameters get
  // places of their own, bounded (weights.hpp), and those ops work on buffer slots.
  const ParameterState* parameter_state = nullptr;
};

// Per-peer split of an all-to-all, in bytes (send_bytes[p] to member p, recv_bytes[p] from it). The
// executor knows dispatch from combine and the RoutingModel; without a split OpRunner sends
// op.bytes / group_size to every member.
using AllToAllSplit = std::function<void(const scenarios::Op& op, int group_size, std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes)>;

class OpRunner {
 public:
  explicit OpRunner(OpRunnerConfig config, CommTable* comms = nullptr);
  ~OpRunner();
  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;

  // Synchronous: allocates, fills and plans for all of `ops`. Throws InputError for an op kind /
  // shape combination the backend does not support (the message names the op and why).
  void prepare(const std::vector<scenarios::Op>& ops);
  void run(const scenarios::Op& op, cudaStream_t stream);
  // A small device->host read that blocks the host until `stream` reaches it (HostKind::gpu_read).
  void gpu_read(cudaStream_t stream);

  void set_all_to_all_split(AllToAllSplit split) { a2a_split_ = std::move(split); }
  [[nodiscard]] std::size_t device_bytes() const;  // device memory held by buffers and plans
  [[nodiscard]] std::size_t weight_bytes() const { return weight_bytes_; }  // of that, parameters' own places
  [[nodiscard]] std::size_t weight_tensors() const { return weight_at_.size(); }
  // Where `op`'s parameter lives (after prepare); nullptr for ops without one.
  [[nodiscard]] void* weight_ptr(const scenarios::Op& op) const;
  [[nodiscard]] CublasLt& blas() { return *lt_; }

  // Buffer slots (exposed for tests and docs): bf16 activations, fp32 state, int32 ids, fp8.
  static constexpr int kBf16Slots = 8;
  static constexpr int kF32Slots = 4;
  static constexpr int kI32Slots = 4;
  static constexpr int kF8Slots = 2;
  struct Need {
    std::size_t bf16[kBf16Slots] = {};  // bytes
    std::size_t f32[kF32Slots] = {};
    std::size_t i32[kI32Slots] = {};
    std::size_t f8[kF8Slots] = {};
    std::size_t pinned = 0, pageable = 0, disk_file = 0;
    void merge(const Need& o);
  };
  // What `op` needs (pure function of the op and the config; throws InputError when unsupported).
  // Needs no GPU: CI checks with it that every op of the shipped scenarios is supported.
  [[nodiscard]] static Need need_of(const scenarios::Op& op, const OpRunnerConfig& config);
  [[nodiscard]] Need need_of(const scenarios::Op& op) const { return need_of(op, cfg_); }

 private:
  struct Routing;
  void ensure(const Need& need);
  void place_parameters(const std::vector<scenarios::Op>& ops);
  void prepare_op(const scenarios::Op& op);
  Routing& routing(std::int64_t tokens, int k, cudaStream_t stream);
  GroupedGemm& grouped(const scenarios::Op& op, void* weight);
  void* placed(const WeightUse& use) const;
  void* weight_for(const scenarios::Op& op);
  void run_collective(const scenarios::Op& op, cudaStream_t stream);
  void run_p2p(const scenarios::Op& op, cudaStream_t stream);
  void run_copy(const scenarios::Op& op, cudaStream_t stream);

  OpRunnerConfig cfg_;
  CommTable* comms_;
  AllToAllSplit a2a_split_;
  std::unique_ptr<CublasLt> lt_;
  // The attention implementations, created when an op first needs one (scenarios::attention_kernel):
  // an unfused-only run holds no cuDNN handle, a fused-only run no unfused score workspace.
  Attention& unfused_attention();
  FusedAttention& fused_attention();
  DecodeAttention& decode_attention();
  void run_attention(const scenarios::Op& op, cudaStream_t stream);
  std::unique_ptr<Attention> attention_;
  std::unique_ptr<FusedAttention> fused_;
  std::unique_ptr<DecodeAttention> decode_;
  Need have_;
  DeviceBuffer bf16_[kBf16Slots];
  DeviceBuffer f32_[kF32Slots];
  DeviceBuffer i32_[kI32Slots];
  DeviceBuffer f8_[kF8Slots];
  PinnedBuffer pinned_;
  std::vector<char> pageable_;
  std::string disk_path_;
  std::size_t disk_bytes_ = 0;
  PinnedBuffer read_flag_;
  std::map<std::pair<std::int64_t, int>, std::unique_ptr<Routing>> routings_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, const void*>,
           std::unique_ptr<GroupedGemm>>
      grouped_;
  // Parameters (weights.hpp): arenas are only added, never freed or moved while the runner lives
  // (captured CUDA graphs hold their addresses).
  std::vector<DeviceBuffer> weight_arenas_;
  struct Placed {
    void* at = nullptr;
    std::size_t bytes = 0;
  };
  std::map<WeightKey, Placed> weight_at_;  // a tensor that needs more bytes later is placed again
  std::size_t weight_bytes_ = 0;
  std::size_t weight_wrap_ = 0;  // past the cap: where the next new tensor shares memory
  std::size_t l2_bytes_ = 0;
  std::int64_t min_xent_shard_ = 0;
  std::uint64_t fills_ = 0;  // how many slot fills so far (varies the seed)
};

}  // namespace threewalls::backend
