#pragma once
#include <string>

#include "threewalls/scenarios/loader.hpp"

namespace threewalls::scenarios {

// Derives the keys whose defaults depend on others (dp, edp, kv_channels, num_query_groups,
// gpu_memory, num_microbatches) and applies every consistency rule (see rules.hpp).
void validate_and_derive(Scenario& s, const KeyLocations& where, const std::string& file, ErrorList& errors);

}  // namespace threewalls::scenarios
