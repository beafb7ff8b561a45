#include "schedule.hpp"

#include <algorithm>

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

}  // namespace threewalls::scenarios::detail
