#pragma once
// The shipped synthetic profiles (calibration/profiles/default_<kind>.toml): raw points synthesised
// from the reference facts of docs/architecture.md and datasheet ceilings, fitted with exactly the code that
// fits measured data (ProfileBuilder). Every family's note says which of its numbers are facts,
// which are derived from facts and which are assumptions.
#include <string_view>

#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration::defaults {

inline constexpr std::string_view kSyntheticSource =
    "synthetic: reference facts (docs/architecture.md) and datasheet ceilings, not measured on this machine";

// The default profile of a GPU kind ("h100" or "h200"). Deterministic. Throws InputError for any
// other kind.
Profile make_default_profile(std::string_view gpu_kind);

}  // namespace threewalls::calibration::defaults
