// The Stepper (stepper.hpp): training steps are one graph; inference steps advance the state that
// the next step depends on.
#include "threewalls/scenarios/stepper.hpp"

#include <memory>

#include "inference.hpp"
#include "training.hpp"

namespace threewalls::scenarios {

Stepper::Stepper(const Scenario& s)
    : scenario_(s), inference_(s.train ? nullptr : std::make_unique<detail::InferenceState>(s)) {}
Stepper::~Stepper() = default;
Stepper::Stepper(Stepper&&) noexcept = default;
Stepper& Stepper::operator=(Stepper&&) noexcept = default;

StepGraph Stepper::expand(int step) {
  if (!inference_) {
    StepGraph g = detail::expand_training(scenario_);
    g.step = step;
    return g;
  }
  if (inference_->step > step) *inference_ = detail::InferenceState(scenario_);
  inference_->advance_to(scenario_, step);
  return detail::expand_inference(scenario_, step, *inference_);
}

StepGraph expand(const Scenario& s, int step) { return Stepper(s).expand(step); }

}  // namespace threewalls::scenarios
