#pragma once
// Expands the steps of one run in order. An executor owns one Stepper per run and asks it for each
// step's StepGraph. Training steps are all the same graph. An inference step depends on every earlier
// step: the routing sampler's draws (decode tokens keep their previous experts with probability
// `routing_locality`) and the GPU expert cache, which each step's activations update. The stepper
// carries that state from one step to the next, so a run of n steps costs n step expansions; asking
// for an earlier step than the last one starts again from step 0. Two steppers of the same scenario
// give the same graphs, and `expand(s, step)` (step_graph.hpp) is a fresh stepper's graph of `step`.
#include <memory>

#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {

namespace detail {
struct InferenceState;
}

class Stepper {
 public:
  // Keeps a copy of `s`.
  explicit Stepper(const Scenario& s);
  ~Stepper();
  Stepper(Stepper&&) noexcept;
  Stepper& operator=(Stepper&&) noexcept;
  Stepper(const Stepper&) = delete;
  Stepper& operator=(const Stepper&) = delete;

  // The StepGraph of step `step` (>= 0). Throws InputError for scenarios that the expansion does not
  // support.
  [[nodiscard]] StepGraph expand(int step);

 private:
  Scenario scenario_;
  std::unique_ptr<detail::InferenceState> inference_;  // null for training scenarios
};

}  // namespace threewalls::scenarios
