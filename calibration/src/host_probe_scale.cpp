// A real run's host probe against a profile's charge for the same calls (host_probe_scale.hpp).
#include "threewalls/calibration/host_probe_scale.hpp"

#include <cmath>

#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/host_probe.hpp"

namespace threewalls::calibration {

std::optional<HostProbeScale> host_probe_scale(const OrderedJson& probe, const CostModel& model, double host_scale) {
  if (!probe.is_object() || !(host_scale > 0.0) || !std::isfinite(host_scale)) return std::nullopt;
  HostProbeScale out;
  auto add = [&](std::string_view key, Seconds charged) {
    const std::string k(key);
    const auto it = probe.find(k);
    if (it == probe.end() || !it->is_number()) return false;
    const double v = it->get<double>();
    if (!(v > 0.0) || !std::isfinite(v)) return false;
    out.keys.push_back(k);
    out.probe_us.push_back(v);
    out.charged_us.push_back(1e6 * charged.value * host_scale);
    return true;
  };
  if (probe.contains(std::string(host_probe::kTorchEagerOpKey))) {
    if (!add(host_probe::kTorchEagerOpKey, model.kernel_launch() + model.framework_op())) return std::nullopt;
  } else {
    if (!add(host_probe::kOpLaunchKey, model.kernel_launch() + model.op_dispatch())) return std::nullopt;
    for (const auto& g : host_probe::kGemmCalls) {
      if (!add(g.key, model.gemm_launch(g.m, g.n, g.k))) return std::nullopt;
    }
  }
  double measured = 0.0, charged = 0.0;
  for (std::size_t i = 0; i < out.keys.size(); ++i) {
    measured += out.probe_us[i];
    charged += out.charged_us[i];
  }
  if (!(charged > 0.0)) return std::nullopt;
  out.scale = measured / charged;
  return out;
}

std::optional<HostProbeScale> host_probe_scale_from_profile(const OrderedJson& probe,
                                                            const std::filesystem::path& profile_path,
                                                            double host_scale) {
  const Profile profile = Profile::load(profile_path);
  const CostModel model(profile);
  return host_probe_scale(probe, model, host_scale);
}

}  // namespace threewalls::calibration
