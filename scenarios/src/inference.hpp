#pragma once
// Inference: a prefill step then decode steps, cycling (step k: position k mod (1 + generate_tokens)).
// A step depends on the steps before it through the routing sampler and the GPU expert cache, which
// InferenceState carries from one step to the next (the Stepper owns it, stepper.hpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "threewalls/scenarios/routing.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios::detail {

// Per-layer GPU expert cache with LRU or LFU eviction (ties broken by expert id).
class ExpertCache {
 public:
  ExpertCache(int layers, int capacity, CachePolicy policy)
      : capacity_(capacity), policy_(policy), entries_(static_cast<std::size_t>(layers)) {}

  [[nodiscard]] bool contains(int layer, int expert) const {
    for (const auto& e : entries_[static_cast<std::size_t>(layer)]) {
      if (e.expert == expert) return true;
    }
    return false;
  }

  // Marks `experts` used at time `clock`; misses are inserted, evicting by policy.
  void use(int layer, const std::vector<int>& experts, std::uint64_t clock) {
    auto& es = entries_[static_cast<std::size_t>(layer)];
    for (int x : experts) {
      auto it = std::find_if(es.begin(), es.end(), [&](const Entry& e) { return e.expert == x; });
      if (it != es.end()) {
        it->last_use = clock;
        ++it->uses;
        continue;
      }
      if (capacity_ <= 0) continue;
      if (static_cast<int>(es.size()) >= capacity_) {
        auto victim = std::min_element(es.begin(), es.end(), [&](const Entry& a, const Entry& b) {
          if (policy_ == CachePolicy::lfu && a.uses != b.uses) return a.uses < b.uses;
          if (a.last_use != b.last_use) return a.last_use < b.last_use;
          return a.expert < b.expert;
        });
        // Do not evict an expert used in this same layer visit.
        if (victim->last_use == clock) continue;
        es.erase(victim);
      }
      es.push_back({x, clock, 1});
    }
  }

  // Fills the cache with the first `capacity` experts of every layer (the warm start).
  void warm(int layers) {
    for (int l = 0; l < layers; ++l) {
      auto& es = entries_[static_cast<std::size_t>(l)];
      for (int e = 0; e < capacity_; ++e) es.push_back({e, 0, 0});
    }
  }

 private:
  struct Entry {
    int expert;
    std::uint64_t last_use;
    std::uint64_t uses;
  };
  int capacity_;
  CachePolicy policy_;
  std::vector<std::vector<Entry>> entries_;
};

// What an inference step depends on from the steps before it: the routing sampler's state, the
// expert cache after every earlier step's activations, and this step's routing choices.
struct InferenceState {
  explicit InferenceState(const Scenario& s)
      : sampler(s),
        cache(s.model.num_layers, s.infer->expert_offload.enabled ? s.infer->expert_offload.cache_experts_per_layer : 0,
              s.infer->expert_offload.policy) {
    cache.warm(s.model.num_layers);
  }

  // Advances to `target` (>= step): the cache takes in each step's activations before the next
  // step's choices are drawn.
  void advance_to(const Scenario& s, int target);

  int step = -1;  // the step whose choices are in `choices`; the cache holds the steps before it
  RoutingSampler sampler;
  ExpertCache cache;
  RoutingSampler::StepChoices choices;
  std::uint64_t clock = 1;
};

// The StepGraph of inference step `step`, from the state advanced to it.
StepGraph expand_inference(const Scenario& s, int step, const InferenceState& state);

}  // namespace threewalls::scenarios::detail
