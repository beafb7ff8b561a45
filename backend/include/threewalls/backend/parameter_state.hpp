#pragma once
// A training rank's parameter state as Megatron-Core holds it, shared by the rank's OpRunners (one per
// stream; CudaDevice owns it): one bf16 weight buffer and one fp32 gradient buffer (Megatron's
// `main_grad`), every tensor resident, at least the bytes the memory model charges
// (scenarios::training_parameter_state). Each GEMM's weight (weights.hpp, weight_of) is a place in the
// weight buffer, in first-use order; each wgrad's gradient owns 4 bytes per parameter of the gradient
// buffer, and its bf16 output fills the first half (gradients sit where a fused fp32 accumulation would
// write them, with the calibrated bf16 kernel). The ops that work on the state
// (scenarios::works_on_parameter_state) run on these buffers instead of buffer slots: the Adam step
// reads its gradients here and writes its bf16 weights here (its fp32 master weights and moments stay
// in its runner's slots: 12 bytes per parameter of the optimizer shard), the gradient norm reads the
// gradient buffer, and the data-parallel collectives run in place (reductions on the gradient buffer,
// gathers on the weight buffer), as Megatron's distributed-data-parallel buffers do. An inference rank
// holds its weights the same way (no gradients) and a KV cache of every layer, which decode attention
// reads its keys and values from.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/weights.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

class ParameterState {
 public:
  // Synchronous (allocates and fills with seeded random data). The buffers hold at least
  // `weight_bytes` / `gradient_bytes`, every tensor of `ops`, and what the ops that work on the state
  // reach (the optimizer's shard, the gradient norm's parameters, the collectives' bytes).
  // Inference: `kv_bytes_per_layer` > 0 also holds a KV cache of that many bytes for every layer with
  // attention ops (scenarios::kv_cache_bytes_per_layer), and `gradient_bytes` is 0.
  ParameterState(const std::vector<scenarios::Op>& ops, std::size_t weight_bytes, std::size_t gradient_bytes,
                 std::uint64_t seed, std::size_t kv_bytes_per_layer = 0);

  // Where the tensor of `use` lives; nullptr when the state does not hold it (or holds fewer bytes).
  [[nodiscard]] void* place(const WeightUse& use) const;
  [[nodiscard]] void* weights() const { return weights_.data(); }
  [[nodiscard]] void* gradients() const { return gradients_.data(); }
  [[nodiscard]] std::size_t weight_capacity() const { return weights_.size(); }
  [[nodiscard]] std::size_t gradient_capacity() const { return gradients_.size(); }
  // The keys and values of a decode attention op that reads the KV cache (scenarios::reads_kv_cache): its
  // layer's share of the cache, keys first; nullptr when it does not.
  [[nodiscard]] void* kv_cache(const scenarios::Op& op) const;
  [[nodiscard]] std::size_t bytes() const { return weights_.size() + gradients_.size() + kv_.size(); }
  [[nodiscard]] std::size_t tensors() const { return at_.size(); }

 private:
  struct Placed {
    void* at = nullptr;
    std::size_t bytes = 0;
  };
  DeviceBuffer weights_;
  DeviceBuffer gradients_;
  DeviceBuffer kv_;
  std::size_t kv_per_layer_ = 0;
  std::map<int, std::size_t> kv_at_;  // layer -> offset in kv_
  std::map<WeightKey, Placed> at_;
};

}  // namespace threewalls::backend
