#pragma once
// Which calibration profile a simulation uses. No environment variable takes part: the choice is a
// function of the arguments, and its reason is returned so that the caller writes it into the run
// header.
#include <filesystem>
#include <string>
#include <string_view>

namespace threewalls::calibration {

struct ResolvedProfile {
  std::filesystem::path path;
  std::string reason;    // one sentence: what was asked and why this file was chosen
  bool shipped = false;  // true when taken from the profiles folder ("auto")
};

// The folder of shipped profiles in this build's source tree: <THREEWALLS_SOURCE_DIR>/calibration/profiles.
std::filesystem::path default_profile_dir();

// spec "auto": <profile_dir>/<gpu_kind>.toml if it exists (measured by `threewalls calibrate`),
//   else <profile_dir>/default_<gpu_kind>.toml (synthetic); profile_dir defaults to
//   default_profile_dir() when empty.
// Any other spec is a path; a relative one is taken relative to `scenario_dir`.
// Throws InputError for an unknown gpu_kind (listing the known ones) or when no file exists
// (naming every path tried).
ResolvedProfile resolve_profile(std::string_view spec, std::string_view gpu_kind,
                                const std::filesystem::path& scenario_dir,
                                const std::filesystem::path& profile_dir = {});

}  // namespace threewalls::calibration
