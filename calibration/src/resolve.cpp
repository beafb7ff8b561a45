#include "threewalls/calibration/resolve.hpp"

#include <algorithm>

#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

#ifndef THREEWALLS_SOURCE_DIR
#error "THREEWALLS_SOURCE_DIR must be defined by the build (calibration/CMakeLists.txt)"
#endif

namespace threewalls::calibration {

std::filesystem::path default_profile_dir() {
  return std::filesystem::path(THREEWALLS_SOURCE_DIR) / "calibration" / "profiles";
}

ResolvedProfile resolve_profile(std::string_view spec, std::string_view gpu_kind,
                                const std::filesystem::path& scenario_dir, const std::filesystem::path& profile_dir) {
  if (spec.empty()) throw InputError("calibration profile: empty; give \"auto\" or a path to a profile file");
  if (spec != "auto") {
    std::filesystem::path p(spec);
    if (p.is_relative() && !scenario_dir.empty()) p = scenario_dir / p;
    if (!std::filesystem::is_regular_file(p)) {
      throw InputError(SourceLocation{p.string(), 0, 0},
                       std::string("calibration profile not found (") +
                           (std::filesystem::exists(p) ? "not a regular file" : "no such file") + "; asked for " +
                           threewalls::quoted(spec) +
                           (std::filesystem::path(spec).is_relative() ? ", relative to the scenario's folder" : "") +
                           ")");
    }
    return {p, "calibration.profile = " + threewalls::quoted(spec) + " names this file", false};
  }
  const auto& kinds = known_gpu_kinds();
  if (std::find(kinds.begin(), kinds.end(), gpu_kind) == kinds.end()) {
    std::string msg = "calibration profile \"auto\": no shipped profile for GPU kind " + threewalls::quoted(gpu_kind) +
                      "; known: " + join(kinds, ", ", true);
    if (auto near = nearest(gpu_kind, kinds)) msg += " (did you mean " + threewalls::quoted(*near) + "?)";
    throw InputError(msg);
  }
  const std::filesystem::path dir = profile_dir.empty() ? default_profile_dir() : profile_dir;
  const std::string kind(gpu_kind);
  const auto measured = dir / (kind + ".toml");
  const auto synthetic = dir / ("default_" + kind + ".toml");
  const std::string dir_reason = profile_dir.empty() ? "the source tree's profiles folder" : "--profile-dir";
  if (std::filesystem::is_regular_file(measured)) {
    return {measured,
            "calibration.profile = \"auto\" for " + kind + ": the measured profile " + kind + ".toml in " + dir_reason,
            true};
  }
  if (std::filesystem::is_regular_file(synthetic)) {
    return {synthetic,
            "calibration.profile = \"auto\" for " + kind + ": no measured " + kind + ".toml in " + dir_reason +
                ", so the synthetic default_" + kind + ".toml",
            true};
  }
  throw InputError("calibration profile \"auto\" for " + kind + ": neither " + measured.string() + " nor " +
                   synthetic.string() + " exists");
}

}  // namespace threewalls::calibration
