// Saved activations of a training step (rules in saved_activations.hpp).
#include "threewalls/backend/saved_activations.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "threewalls/scenarios/stages.hpp"

namespace threewalls::backend {

using scenarios::Op;
using scenarios::OpKind;

SavedActivationPlan plan_saved_activations(const scenarios::Scenario& s, const scenarios::RankClass& rc,
                                           const scenarios::ActivationOptions& opt) {
  SavedActivationPlan plan;
  if (!s.train) return plan;
  const scenarios::TrainSpec& tr = *s.train;
  const scenarios::StageSplit split(s);
  const int stage = rc.pp_stage;
  const int vpp = split.vpp();
  // Per layer: what its forward holds and what its recompute ops hold.
  std::map<int, std::pair<double, double>> layer_bytes;
  const double resid = scenarios::residual_bytes(s);
  const bool full = tr.recompute_granularity == scenarios::RecomputeGranularity::full;
  const int n = std::max(1, tr.recompute_num_layers);
  for (int ch = 0; ch < vpp; ++ch) {
    const std::vector<int> ls = split.chunk_layers(stage, ch);
    for (std::size_t idx = 0; idx < ls.size(); ++idx) {
      const int l = ls[idx];
      const double whole = scenarios::layer_activation_bytes(s, l, rc.expert_load, opt, false);
      const double kept = scenarios::layer_activation_bytes(s, l, rc.expert_load, opt, true);
      if (!full) {
        layer_bytes[l] = {kept, whole - kept};
        continue;
      }
      const int i = static_cast<int>(idx);
      const bool checkpointed = tr.recompute_method == scenarios::RecomputeMethod::block ? i < n : true;
      const bool group_input = tr.recompute_method == scenarios::RecomputeMethod::block ? i < n : i % n == 0;
      if (!checkpointed) {
        layer_bytes[l] = {kept, 0.0};
      } else {
        layer_bytes[l] = {group_input ? resid : 0.0, kept};
      }
    }
  }
  auto edge_bytes = [&](int ch) {
    double b = 0.0;
    if (split.is_first_vstage(stage, ch)) b += scenarios::embedding_activation_bytes(s, opt);
    if (split.is_last_vstage(stage, ch)) b += scenarios::head_activation_bytes(s);
    return b;
  };
  struct Slot {
    std::uint32_t id = 0;
    bool forward_held = false;
    bool recompute_held = false;
    std::int64_t last_backward = -1;
  };
  std::map<std::tuple<int, int, int>, Slot> slots;  // (layer, micro-batch, chunk)
  for (std::uint32_t i = 0; i < rc.ops.size(); ++i) {
    const Op& op = rc.ops[i];
    if (op.microbatch < 0 || op.kind == OpKind::host || op.is_comm()) continue;
    const int ch = std::max(0, static_cast<int>(op.chunk));
    const auto key = std::make_tuple(static_cast<int>(op.layer), static_cast<int>(op.microbatch), ch);
    auto [it, inserted] = slots.try_emplace(key);
    Slot& sl = it->second;
    if (inserted) sl.id = plan.slots++;
    const bool backward = (op.flags & scenarios::kBackward) != 0;
    const bool recompute = (op.flags & scenarios::kRecompute) != 0;
    if (backward) {
      sl.last_backward = i;
      continue;
    }
    double bytes = 0.0;
    if (recompute) {
      if (sl.recompute_held) continue;
      sl.recompute_held = true;
      if (op.layer >= 0) bytes = layer_bytes[op.layer].second;
    } else {
      if (sl.forward_held) continue;
      sl.forward_held = true;
      bytes = op.layer >= 0 ? layer_bytes[op.layer].first : edge_bytes(ch);
    }
    const auto b = static_cast<std::size_t>(std::llround(bytes));
    if (b > 0) plan.holds.push_back({i, sl.id, b});
  }
  for (const auto& [key, sl] : slots) {
    if (sl.last_backward >= 0) plan.releases.push_back({static_cast<std::uint32_t>(sl.last_backward), sl.id});
  }
  std::sort(plan.releases.begin(), plan.releases.end(),
            [](const SavedActivationPlan::Release& a, const SavedActivationPlan::Release& b) {
              return a.op != b.op ? a.op < b.op : a.slot < b.slot;
            });
  return plan;
}

}  // namespace threewalls::backend
