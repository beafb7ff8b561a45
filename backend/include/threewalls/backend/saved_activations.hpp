#pragma once
// Saved activations of a training step as a framework holds them (docs/backend.md, "Memory"): each
// layer's forward, per micro-batch and model chunk, takes the bytes the layer saves for its backward
// (scenarios/activations.hpp, the memory model's rule) from the caching allocator, and the end of that
// layer's backward for the same micro-batch and chunk gives them back; the pipeline schedule in the
// StepGraph's issue order then decides how many are held at once.
//   * selective recomputation: the forward holds what the layer keeps; the recompute ops ahead of
//     the backward hold what was dropped, until the backward ends;
//   * full recomputation: the forward holds only the input of the first layer of each checkpoint
//     group (uniform: every recompute_num_layers layers of a chunk; block: each of the first
//     recompute_num_layers layers of a chunk), the recompute ops the layer's whole activations;
//   * the embedding (first stage) and the output head (last stage) hold their tensors per micro-batch
//     from the first forward op outside the layers (layer -1) of that micro-batch and chunk until its
//     last backward op.
// A pure function of the scenario and the rank class (no device): tested on CPU.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "threewalls/scenarios/activations.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::backend {

struct SavedActivationPlan {
  struct Hold {
    std::uint32_t op = 0;    // held when this op is issued (before it)
    std::uint32_t slot = 0;  // the (layer, micro-batch, chunk) whose backward gives it back
    std::size_t bytes = 0;
  };
  struct Release {
    std::uint32_t op = 0;  // given back once this op is issued (after it)
    std::uint32_t slot = 0;
  };
  std::vector<Hold> holds;        // ascending op
  std::vector<Release> releases;  // ascending op
  std::uint32_t slots = 0;
};

// The plan of rank class `rc` (training steps only: empty for inference).
SavedActivationPlan plan_saved_activations(const scenarios::Scenario& s, const scenarios::RankClass& rc,
                                           const scenarios::ActivationOptions& opt = {});

}  // namespace threewalls::backend
