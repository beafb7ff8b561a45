#include "threewalls/backend/parameter_state.hpp"

#include <algorithm>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/scenarios/parameters.hpp"

namespace threewalls::backend {

using scenarios::Collective;
using scenarios::DType;
using scenarios::Op;
using scenarios::OpKind;

ParameterState::ParameterState(const std::vector<Op>& ops, std::size_t weight_bytes, std::size_t gradient_bytes,
                               std::uint64_t seed, std::size_t kv_bytes_per_layer)
    : kv_per_layer_(kv_bytes_per_layer) {
  const std::vector<WeightUse> tensors = weight_tensors(ops);
  std::size_t weights_reach = weight_bytes;
  std::size_t gradients_reach = gradient_bytes;
  for (const Op& op : ops) {
    if (kv_per_layer_ > 0 && op.kind == OpKind::attention && kv_at_.count(op.layer) == 0) {
      const std::size_t at = kv_at_.size() * weight_aligned(kv_per_layer_);
      kv_at_[op.layer] = at;
    }
    if (!scenarios::works_on_parameter_state(op)) continue;
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(op.shape[0], 0));
    if (op.kind == OpKind::optimizer) {
      weights_reach = std::max(weights_reach, 2 * n);
      gradients_reach = std::max(gradients_reach, 4 * n);
    } else if (op.kind == OpKind::elementwise) {
      gradients_reach = std::max(gradients_reach, 4 * n);  // the norm copies the first half over the second
    } else {
      // In place: an op of b bytes reaches b bytes of its buffer (the members' chunks tile it).
      const auto bytes = static_cast<std::size_t>(std::max(0.0, op.bytes));
      if (op.collective() == Collective::all_gather) {
        weights_reach = std::max(weights_reach, bytes);
      } else {
        gradients_reach = std::max(gradients_reach, bytes);
      }
    }
  }
  std::size_t weights = 0;
  std::size_t gradients = 0;
  for (const WeightUse& u : tensors)
    (u.key.grad != 0 ? gradients : weights) += (u.key.grad != 0 ? 2 : 1) * weight_aligned(u.bytes);
  weights_ = DeviceBuffer(weight_aligned(std::max(weights, weights_reach)));
  gradients_ = DeviceBuffer(weight_aligned(std::max(gradients, gradients_reach)));
  const cudaStream_t s = nullptr;
  std::uint64_t fills = 0;
  if (!kv_at_.empty()) {
    kv_ = DeviceBuffer(kv_at_.size() * weight_aligned(kv_per_layer_));
    fill_random(kv_.as<bf16>(), static_cast<std::int64_t>(kv_.size() / 2), seed * 1000003ULL + (++fills), 1.0F, s);
  }
  fill_random(weights_.as<bf16>(), static_cast<std::int64_t>(weights_.size() / 2), seed * 1000003ULL + (++fills), 1.0F,
              s);
  fill_random_positive(gradients_.as<float>(), static_cast<std::int64_t>(gradients_.size() / 4),
                       seed * 1000003ULL + (++fills), 1.0F, s);
  auto* w = static_cast<char*>(weights_.data());
  auto* g = static_cast<char*>(gradients_.data());
  std::size_t w_at = 0;
  std::size_t g_at = 0;
  for (const WeightUse& u : tensors) {
    if (u.key.grad != 0) {
      at_[u.key] = Placed{g + g_at, u.bytes};
      g_at += 2 * weight_aligned(u.bytes);
    } else {
      at_[u.key] = Placed{w + w_at, u.bytes};
      if (u.key.dtype == DType::fp8) {
        fill_random(reinterpret_cast<fp8*>(w + w_at), static_cast<std::int64_t>(u.bytes), seed * 1000003ULL + (++fills),
                    1.0F, s);
      }
      w_at += weight_aligned(u.bytes);
    }
  }
  TW_CUDA_CHECK(cudaDeviceSynchronize());  // the fills are done before any stream reads them
}

void* ParameterState::kv_cache(const Op& op) const {
  if (kv_per_layer_ == 0 || !scenarios::reads_kv_cache(op, static_cast<double>(kv_per_layer_))) return nullptr;
  const auto it = kv_at_.find(op.layer);
  return it == kv_at_.end() ? nullptr : static_cast<char*>(kv_.data()) + it->second;
}

void* ParameterState::place(const WeightUse& use) const {
  const auto it = at_.find(use.key);
  return it == at_.end() || it->second.bytes < use.bytes ? nullptr : it->second.at;
}

}  // namespace threewalls::backend
