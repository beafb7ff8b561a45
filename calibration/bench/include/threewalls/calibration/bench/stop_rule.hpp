#pragma once
// When to stop sampling a point (nvbench's habit: stop when the noise is low, not after a fixed
// count), host-only and deterministic so that it is tested without a GPU.
//
// A point is sampled until
//   * at least `min_samples` samples are in, and the 95% confidence interval of the median is
//     narrower than `target_rel_ci` (half-width relative to the median)            -> converged
//   * or `time_bound_s` of wall time has been spent on the point (min_samples first) -> time_bound
//   * or `max_samples` samples are in                                                -> max_samples
// The CI is distribution-free: order statistics x_(j) .. x_(k) with j = floor((n - 1.96 sqrt n) / 2),
// k = ceil(1 + (n + 1.96 sqrt n) / 2) (1-based, clamped to [1, n]); for few samples it is the whole
// range, which keeps sampling going until enough samples agree.
#include <string>
#include <vector>

namespace threewalls::calibration::bench {

struct StopRule {
  int min_samples = 5;
  int max_samples = 200;
  double target_rel_ci = 0.01;
  double time_bound_s = 0.25;
};

enum class StopReason { keep_going, converged, time_bound, max_samples };
const char* to_string(StopReason r);

// Half-width of the 95% CI of the median, relative to the median (+inf for fewer than 2 samples or
// a median <= 0).
double median_ci_rel_half_width(std::vector<double> samples);

// The decision after `samples` were taken in `elapsed_s` seconds of wall time.
StopReason should_stop(const StopRule& rule, const std::vector<double>& samples, double elapsed_s);

// How many back-to-back runs one sample averages: enough that a sample lasts about `target_s`
// (small kernels are timed in batches so that event resolution and launch gaps do not dominate),
// between 1 and `max_reps`. `single_run_s` is a first estimate of one run.
int reps_per_sample(double single_run_s, double target_s, int max_reps);

}  // namespace threewalls::calibration::bench
