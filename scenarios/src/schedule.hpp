#pragma once
// The pipeline schedule: Megatron-Core's order of forward and backward micro-batches on one pipeline
// rank, 1F1B for vpp = 1 and interleaved (microbatch_group_size_per_vp_stage = pp) for vpp > 1.
#include <cstddef>
#include <vector>

namespace threewalls::scenarios::detail {

struct SchedItem {
  bool forward;
  int mb;
  int chunk;
};

// The items of pipeline stage `stage`, in issue order. `extra_warmup` adds forwards to the interleaved
// schedule's warm-up (Megatron adds one with the expert-parallel overlap, so that the forward and the
// backward it runs beside are independent).
std::vector<SchedItem> schedule(int pp, int vpp, int microbatches, int stage, int extra_warmup = 0);

// The items of pipeline stage `stage` as the training expansion issues them: schedule() with the
// warm-up forward Megatron adds to the interleaved schedule under the expert-parallel overlap.
std::vector<SchedItem> stage_schedule(int pp, int vpp, int microbatches, int stage, bool ep_overlap);

// One issue step: an item alone, or (expert-parallel overlap) a forward and a backward of different
// chunk passes issued together, layer by layer.
struct Issue {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t item = 0;     // the item alone, or the pair's forward
  std::size_t bwd = kNone;  // the pair's backward
  [[nodiscard]] bool paired() const { return bwd != kNone; }
};

// The issue steps of `items` in order. With ep_overlap, two adjacent items, one forward and one
// backward of different chunk passes, are one pair (scanned from the front: an item pairs at most
// once); every other item is issued alone.
std::vector<Issue> issue_order(const std::vector<SchedItem>& items, bool ep_overlap);

}  // namespace threewalls::scenarios::detail
