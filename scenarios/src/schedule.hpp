#pragma once
// The pipeline schedule: Megatron-Core's order of forward and backward micro-batches on one pipeline
// rank, 1F1B for vpp = 1 and interleaved (microbatch_group_size_per_vp_stage = pp) for vpp > 1.
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

}  // namespace threewalls::scenarios::detail
