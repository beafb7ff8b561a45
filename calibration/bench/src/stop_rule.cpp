#include "threewalls/calibration/bench/stop_rule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace threewalls::calibration::bench {

const char* to_string(StopReason r) {
  switch (r) {
    case StopReason::keep_going:
      return "keep_going";
    case StopReason::converged:
      return "converged";
    case StopReason::time_bound:
      return "time_bound";
    case StopReason::max_samples:
      return "max_samples";
  }
  return "?";
}

double median_ci_rel_half_width(std::vector<double> s) {
  const auto n = static_cast<std::ptrdiff_t>(s.size());
  if (n < 2) return std::numeric_limits<double>::infinity();
  std::sort(s.begin(), s.end());
  const double med = n % 2 == 1 ? s[static_cast<std::size_t>(n / 2)]
                                : 0.5 * (s[static_cast<std::size_t>(n / 2 - 1)] + s[static_cast<std::size_t>(n / 2)]);
  if (!(med > 0.0)) return std::numeric_limits<double>::infinity();
  const double dn = static_cast<double>(n);
  const double z = 1.96 * std::sqrt(dn);
  auto j = static_cast<std::ptrdiff_t>(std::floor((dn - z) / 2.0));
  auto k = static_cast<std::ptrdiff_t>(std::ceil(1.0 + (dn + z) / 2.0));
  j = std::clamp<std::ptrdiff_t>(j, 1, n);
  k = std::clamp<std::ptrdiff_t>(k, 1, n);
  return (s[static_cast<std::size_t>(k - 1)] - s[static_cast<std::size_t>(j - 1)]) / (2.0 * med);
}

StopReason should_stop(const StopRule& rule, const std::vector<double>& samples, double elapsed_s) {
  const auto n = static_cast<int>(samples.size());
  if (n >= rule.max_samples) return StopReason::max_samples;
  if (n < rule.min_samples) return StopReason::keep_going;
  if (median_ci_rel_half_width(samples) <= rule.target_rel_ci) return StopReason::converged;
  if (elapsed_s >= rule.time_bound_s) return StopReason::time_bound;
  return StopReason::keep_going;
}

int reps_per_sample(double single_run_s, double target_s, int max_reps) {
  if (max_reps < 1) return 1;
  if (!(single_run_s > 0.0) || !std::isfinite(single_run_s)) return 1;
  const double r = std::ceil(target_s / single_run_s);
  if (!(r > 1.0)) return 1;
  return static_cast<int>(std::min(r, static_cast<double>(max_reps)));
}

}  // namespace threewalls::calibration::bench
