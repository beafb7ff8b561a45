#include "threewalls/backend/weights.hpp"

#include <algorithm>
#include <map>

namespace threewalls::backend {

using scenarios::DType;
using scenarios::Op;
using scenarios::OpKind;

std::optional<WeightUse> weight_of(const Op& op) {
  const auto& s = op.shape;
  const bool bwd = (op.flags & scenarios::kBackward) != 0;
  const bool wgrad = (op.flags & scenarios::kWgrad) != 0;
  WeightUse u;
  u.key.layer = op.layer;
  u.key.chunk = op.chunk;
  u.key.expert = op.expert;
  u.key.dtype = op.dtype;
  if (op.kind == OpKind::gemm) {
    if (s[0] <= 0 || s[1] <= 0 || s[2] <= 0) return std::nullopt;
    if (op.dtype == DType::fp8 && wgrad) return std::nullopt;  // fp8 runs the forward layout: no gradient tensor
    // gemm shapes (StepGraph expansion): forward {tokens, out, in}: reads W[out x in]; dgrad
    // {tokens, in, out}: reads W; wgrad {in, out, tokens}: writes dW[in x out].
    if (wgrad) {
      u.key.out = s[1], u.key.in = s[0], u.key.grad = 1;
    } else if (bwd) {
      u.key.out = s[2], u.key.in = s[1];
    } else {
      u.key.out = s[1], u.key.in = s[2];
    }
    u.key.count = std::max<std::int64_t>(s[3], 1);
  } else if (op.kind == OpKind::grouped_gemm) {
    if (s[0] <= 0 || s[1] <= 0 || s[2] <= 0 || s[3] <= 0 || op.dtype == DType::fp8) return std::nullopt;
    // Forward and wgrad carry {rows, out, in, experts}, dgrad {rows, in, out, experts}.
    const bool swapped = bwd && !wgrad;
    u.key.out = swapped ? s[2] : s[1];
    u.key.in = swapped ? s[1] : s[2];
    // One tensor for all of the layer's local experts, whichever of them this op runs (inference
    // runs the activated ones): the key leaves the count out, the bytes are this op's.
    u.key.count = 0;
    u.key.grad = wgrad ? 1 : 0;
  } else {
    return std::nullopt;
  }
  const std::size_t elt = op.dtype == DType::fp8 ? 1 : 2;
  const std::int64_t matrices = op.kind == OpKind::grouped_gemm ? s[3] : u.key.count;
  u.bytes = static_cast<std::size_t>(u.key.out) * static_cast<std::size_t>(u.key.in) *
            static_cast<std::size_t>(matrices) * elt;
  return u;
}

std::size_t weight_aligned(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + kWeightAlign - 1) / kWeightAlign * kWeightAlign;
}

std::vector<WeightUse> weight_tensors(const std::vector<Op>& ops, const std::function<bool(const WeightUse&)>& skip) {
  std::vector<WeightUse> tensors;
  std::map<WeightKey, std::size_t> index;
  for (const Op& op : ops) {
    const auto u = weight_of(op);
    if (!u || (skip && skip(*u))) continue;
    const auto [it, added] = index.emplace(u->key, tensors.size());
    if (added) {
      tensors.push_back(*u);
    } else {
      tensors[it->second].bytes = std::max(tensors[it->second].bytes, u->bytes);
    }
  }
  return tensors;
}

WeightPlacement place_weights(const std::vector<std::size_t>& sizes, std::size_t l2_bytes) {
  WeightPlacement p;
  p.offsets.resize(sizes.size());
  std::size_t total = 0;
  std::size_t largest = 0;
  std::vector<std::size_t> aligned(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    aligned[i] = weight_aligned(sizes[i]);
    total += aligned[i];
    largest = std::max(largest, aligned[i]);
  }
  // A lap: 3 x (L2 + largest). Up to two laps, everything is resident.
  const std::size_t lap = 3 * (l2_bytes + largest);
  if (total <= 2 * lap) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      p.offsets[i] = at;
      at += aligned[i];
    }
    p.arena_bytes = total;
    p.all_resident = true;
    return p;
  }
  // Beyond: the tensors, in order, are cut into `laps` runs of about total / laps (>= lap) bytes by
  // their start position, and every run is laid out from offset 0. Two tensors that share memory
  // then sit about a whole number of runs apart in issue order, both ways round the step: at least
  // total / laps less two tensors, i.e. 3 x L2 + largest of other tensors (tests/backend/weights_test).
  const std::size_t laps = total / lap;
  std::size_t pos = 0;
  std::size_t run_start = 0;
  std::size_t run = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t r = std::min(laps - 1, pos * laps / total);
    if (i == 0 || r != run) {
      run = r;
      run_start = pos;
    }
    p.offsets[i] = pos - run_start;
    p.arena_bytes = std::max(p.arena_bytes, p.offsets[i] + aligned[i]);
    pos += aligned[i];
  }
  p.all_resident = false;
  return p;
}

}  // namespace threewalls::backend
