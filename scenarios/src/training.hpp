#pragma once
// The training step (a StepGraph whose classes are pipeline stage x hot/cold EP rank x slow rank).
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios::detail {

StepGraph expand_training(const Scenario& s);

}  // namespace threewalls::scenarios::detail
