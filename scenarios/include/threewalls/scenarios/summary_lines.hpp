#pragma once
// One-line descriptions of a scenario for summaries and reports, in Megatron-LM's terms: `sim`'s
// summary prints them, `export --format html` shows them beside each run.
#include <string>

#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

// "46.7 B parameters, 12.9 B active per token (32 layers, 8 experts, top-2)" or
// "8.0 B parameters (32 layers, dense)": model_parameters and active_parameters (parameters.hpp).
std::string model_line(const Scenario& s);
// "TP 2, CP 1, PP 4, VPP 1, DP 8; EP 8, ETP 1 (expert DP 1); 16 micro-batches of 1 x 4096 tokens per
// DP rank (global batch 128)", or the inference batch instead of the micro-batches.
std::string layout_line(const Scenario& s);

}  // namespace threewalls::scenarios
