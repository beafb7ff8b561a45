#pragma once
// Where OpRunner keeps the parameters that GEMMs read (and the gradients that weight-gradient GEMMs
// write): one place per parameter tensor, so that a step reads them from memory as a deployment
// does, not from L2.
//
// Why: activations alias freely in OpRunner (one buffer slot per operand position), which is fine
// for time as long as what a kernel reads is as hot or cold in L2 as in a real model. Parameters are
// not: a MoE layer's 64 experts each read their own weights once per step, so a small-row expert
// GEMM reads its weights from HBM. With one shared weight slot they stayed in L2 (50 MiB on H100),
// and a 16 x 4096 x 1024 expert GEMM ran about 25% faster in `threewalls run` than the calibration
// (which rotates its operands through cold copies) and than a deployment
// (docs/validation/host_overhead.md).
//
// Placement (pure, no GPU; tested on CPU): parameters are laid out in first-use order. When they
// all fit in 6 x (L2 + the largest) bytes they are all resident and distinct, as in a deployment;
// beyond that the sequence is cut into runs of at least half that, each laid out from offset 0, so
// that tensors sharing memory are more than 2 x L2 bytes of other parameters apart in issue order,
// both ways round the step: none is still in L2 when its memory is read again. Memory then stays
// bounded. A training rank does not use this placement: its parameter state holds every tensor,
// resident (parameter_state.hpp).
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

// One parameter tensor (or its gradient) of a GEMM: the forward GEMM's output and input widths,
// the batch of a batched GEMM, where it lives in the model, and dtype. Forward, dgrad and wgrad ops
// of one linear layer name the same tensor (the wgrad as its gradient). Two tensors of one (layer,
// chunk, expert) with the same shape are one key. A grouped GEMM's tensor holds all of the layer's
// local experts (count 0 in the key): inference runs only the activated ones, a different number
// each step, so its bytes are the op's and the runner sizes the tensor for the most it has seen.
struct WeightKey {
  std::int32_t layer = -1;
  std::int32_t chunk = -1;
  std::int32_t expert = -1;
  std::int64_t out = 0;
  std::int64_t in = 0;
  std::int64_t count = 1;  // batch of a batched GEMM; 0 for grouped GEMMs (see above)
  std::uint8_t grad = 0;  // 1: the gradient a wgrad op writes
  scenarios::DType dtype = scenarios::DType::bf16;
  auto operator<=>(const WeightKey&) const = default;
};

struct WeightUse {
  WeightKey key;
  std::size_t bytes = 0;
};

// The parameter tensor `op` reads or writes: gemm and grouped_gemm ops; nullopt for every other kind.
[[nodiscard]] std::optional<WeightUse> weight_of(const scenarios::Op& op);

inline constexpr std::size_t kWeightAlign = 256;

// Bytes a tensor of `bytes` takes in a layout: at least 1, rounded up to kWeightAlign.
[[nodiscard]] std::size_t weight_aligned(std::size_t bytes);

// The parameter tensors `ops` read or write (weight_of), each once, in first-use order, with the most
// bytes any of its ops asks for; uses for which `skip` returns true are left out (a caller's tensors
// already placed with enough bytes).
[[nodiscard]] std::vector<WeightUse> weight_tensors(const std::vector<scenarios::Op>& ops,
                                                    const std::function<bool(const WeightUse&)>& skip = {});

struct WeightPlacement {
  std::size_t arena_bytes = 0;
  std::vector<std::size_t> offsets;  // per size, in the order given
  bool all_resident = true;          // every tensor has memory of its own
};

// Places tensors of `sizes` bytes (first-use order) for a device with `l2_bytes` of L2.
[[nodiscard]] WeightPlacement place_weights(const std::vector<std::size_t>& sizes, std::size_t l2_bytes);

}  // namespace threewalls::backend
