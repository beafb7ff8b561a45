#include "schedule.hpp"

#include <algorithm>

#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/stages.hpp"

namespace threewalls::scenarios::detail {

// Megatron-Core's order of forward and backward micro-batches on one pipeline rank.
std::vector<SchedItem> schedule(int pp, int vpp, int microbatches, int stage, int extra_warmup) {
  std::vector<SchedItem> out;
  const int M = microbatches;
  if (vpp == 1) {
    const int warmup = std::min(pp - stage - 1, M);
    const int remaining = M - warmup;
    for (int i = 0; i < warmup; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < remaining; ++i) {
      out.push_back({true, warmup + i, 0});
      out.push_back({false, i, 0});
    }
    for (int i = 0; i < warmup; ++i) out.push_back({false, remaining + i, 0});
    return out;
  }
  // Interleaved (microbatch_group_size_per_vp_stage = pp).
  const int total = M * vpp;
  int warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp + extra_warmup;
  warmup = std::min(warmup, total);
  const int remaining = total - warmup;
  auto chunk_of = [&](int k, bool fwd) {
    int in_group = k % (pp * vpp);
    int ch = in_group / pp;
    return fwd ? ch : vpp - ch - 1;
  };
  auto mb_of = [&](int k) {
    int group = k / (pp * vpp);
    return group * pp + k % pp;
  };
  for (int k = 0; k < warmup; ++k) out.push_back({true, mb_of(k), chunk_of(k, true)});
  for (int i = 0; i < remaining; ++i) {
    int kf = warmup + i;
    out.push_back({true, mb_of(kf), chunk_of(kf, true)});
    out.push_back({false, mb_of(i), chunk_of(i, false)});
  }
  for (int k = remaining; k < total; ++k) out.push_back({false, mb_of(k), chunk_of(k, false)});
  return out;
}

std::vector<SchedItem> stage_schedule(int pp, int vpp, int microbatches, int stage, bool ep_overlap) {
  return schedule(pp, vpp, microbatches, stage, ep_overlap && vpp > 1 ? 1 : 0);
}

std::vector<Issue> issue_order(const std::vector<SchedItem>& items, bool ep_overlap) {
  std::vector<Issue> out;
  out.reserve(items.size());
  for (std::size_t it = 0; it < items.size(); ++it) {
    if (ep_overlap && it + 1 < items.size()) {
      const SchedItem& a = items[it];
      const SchedItem& b = items[it + 1];
      if (a.forward != b.forward && !(a.mb == b.mb && a.chunk == b.chunk)) {
        out.push_back(a.forward ? Issue{it, it + 1} : Issue{it + 1, it});
        ++it;
        continue;
      }
    }
    out.push_back(Issue{it});
  }
  return out;
}

}  // namespace threewalls::scenarios::detail

namespace threewalls::scenarios {

int overlapped_pairs(const Scenario& s, int stage) {
  if (!s.train || !s.train->overlap_moe_expert_parallel_comm) return 0;
  const auto& p = s.parallel;
  const auto items = detail::stage_schedule(p.pp, p.vpp, s.train->num_microbatches, stage, true);
  int pairs = 0;
  for (const auto& is : detail::issue_order(items, true)) pairs += is.paired() ? 1 : 0;
  return pairs;
}

}  // namespace threewalls::scenarios
