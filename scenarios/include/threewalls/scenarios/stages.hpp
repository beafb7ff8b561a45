#pragma once
// The layer-to-stage split of a pipeline: which transformer layers each virtual stage holds. This is
// the one reader of parallel.layers_per_stage, first_stage_layers and last_stage_layers; the
// expansion, the validation rules, the planner and the memory model all take their stages from it.
#include <vector>

namespace threewalls::scenarios {

struct Scenario;

// Virtual stage v = chunk * pp + stage (Megatron's numbering: every stage's chunk 0 first) holds
// count(v) consecutive layers starting at first(v); the layers ascend with v, so chunk 0 of stage 0
// starts at layer 0. A stage may hold no layer (an explicit layers_per_stage entry of 0).
//   - layers_per_stage given: its entries;
//   - first/last_stage_layers given: those on the first/last stage, the rest split evenly over the others;
//   - else num_layers / (pp x vpp) each;
//   - in a training step the last virtual stage also holds the multi-token-prediction depths
//     (model.mtp_num_layers), as layers num_layers, num_layers + 1, ... after its own.
// The split keys must satisfy rule pp-layers (validate_and_derive checks it); a layers_per_stage with
// other than pp x vpp entries throws Error.
class StageSplit {
 public:
  explicit StageSplit(const Scenario& s);

  [[nodiscard]] int pp() const { return pp_; }
  [[nodiscard]] int vpp() const { return vpp_; }
  [[nodiscard]] int virtual_stages() const { return static_cast<int>(count_.size()); }
  [[nodiscard]] int vstage(int stage, int chunk) const { return chunk * pp_ + stage; }
  [[nodiscard]] int count(int vstage) const { return count_[static_cast<std::size_t>(vstage)]; }
  [[nodiscard]] int first(int vstage) const { return first_[static_cast<std::size_t>(vstage)]; }
  [[nodiscard]] bool is_first_vstage(int stage, int chunk) const { return vstage(stage, chunk) == 0; }
  [[nodiscard]] bool is_last_vstage(int stage, int chunk) const { return vstage(stage, chunk) == virtual_stages() - 1; }
  // Layers of chunk `chunk` of pipeline stage `stage`, ascending.
  [[nodiscard]] std::vector<int> chunk_layers(int stage, int chunk) const;
  // Layers of pipeline stage `stage`, in chunk order.
  [[nodiscard]] std::vector<int> stage_layers(int stage) const;

 private:
  int pp_ = 1;
  int vpp_ = 1;
  std::vector<int> count_;
  std::vector<int> first_;
};

// Chunk passes of pipeline stage `stage` that the training expansion issues as forward-backward
// pairs under train.overlap_moe_expert_parallel_comm (a forward beside another micro-batch's
// backward, layer by layer: the steady state of the combined 1F1B schedule); 0 without the overlap.
// Of the stage's 2 x microbatches x vpp chunk passes, twice this many run paired.
int overlapped_pairs(const Scenario& s, int stage);

}  // namespace threewalls::scenarios
