#pragma once
// Generic fitting helpers for calibration models (host-only, Eigen inside the .cpp; the interface
// uses std::vector so that callers need not see Eigen).
//
// Every model in threewalls is fitted on *relative* error: a point measured at 5 us and one at 5 ms
// count the same, because the simulator needs the same relative accuracy for a tiny kernel and a
// large collective. Linear models therefore use weights 1/y^2; non-linear ones use residuals
// (prediction - y) / y.
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

namespace threewalls::calibration::fit {

// A dense row-major design matrix: rows.size() observations of `cols` regressors each.
struct Design {
  std::size_t cols = 0;
  std::vector<std::vector<double>> rows;
  void add_row(std::vector<double> row);
};

// Minimises sum_i w_i (a_i . x - y_i)^2 (column-pivoted Householder QR on sqrt(w)-scaled rows).
// Throws std::invalid_argument on inconsistent sizes, non-finite input, fewer rows than columns or
// a rank-deficient design (callers turn that into an InputError naming the family).
std::vector<double> weighted_least_squares(const Design& a, const std::vector<double>& y, const std::vector<double>& w);

// The same with x >= 0 for every column. Exact for the small problems we have (at most 8 columns):
// the optimum of a convex quadratic under x >= 0 is the unconstrained optimum on its free set, so
// every free set is tried and the best feasible one kept. Columns that cannot be determined on a free
// set make that free set infeasible. Throws std::invalid_argument when no free set is solvable.
std::vector<double> nonnegative_least_squares(const Design& a, const std::vector<double>& y,
                                              const std::vector<double>& w);

// Residual vector r(theta); the fit minimises 0.5 * |r|^2.
using ResidualFn = std::function<std::vector<double>(const std::vector<double>& theta)>;

struct LmOptions {
  int max_iterations = 200;
  double relative_tolerance = 1e-12;  // stop when the cost improves by less than this fraction
  double initial_lambda = 1e-3;
  double max_lambda = 1e12;
  double theta_bound = 40.0;  // |theta_j| is clamped to this (theta are log-parameters: e^40 is huge)
};

struct LmResult {
  std::vector<double> theta;
  double cost = 0.0;  // 0.5 * |r|^2 at theta
  int iterations = 0;
  bool converged = false;
};

// Levenberg-Marquardt with Marquardt's diagonal scaling and a central-difference Jacobian. Models
// pass log-parameters as theta so that positivity holds by construction and scales are uniform.
// Non-finite residuals count as an infinite cost (the step is rejected).
LmResult levenberg_marquardt(const ResidualFn& residuals, std::vector<double> theta0, const LmOptions& options = {});

// Runs LM from each start and keeps the lowest cost (ties: the earliest start), which protects the
// small non-convex model fits from a bad basin. `starts` must not be empty.
LmResult levenberg_marquardt_multistart(const ResidualFn& residuals, const std::vector<std::vector<double>>& starts,
                                        const LmOptions& options = {});

// Median and maximum of |relative error| over the points that have one.
struct ErrorStats {
  double median = 0.0;
  double max = 0.0;
  std::size_t count = 0;  // how many points entered the statistic
};

// |pred_i - meas_i| / meas_i. Sizes must agree; meas_i must be >= 0. A zero measurement (bytes a
// stage allocates can be none) counts as 0 when predicted zero and is left out otherwise.
ErrorStats relative_error_stats(const std::vector<double>& predicted, const std::vector<double>& measured);

// Leave-one-out error: for each point i, `predict_without(i)` fits the model on every other point
// and predicts point i, or returns nullopt when the remaining points cannot determine the model.
// Points with nullopt are left out of the statistic (count says how many entered it); with none
// left, median and max are NaN.
ErrorStats leave_one_out(std::size_t n, const std::function<std::optional<double>(std::size_t)>& predict_without,
                         const std::vector<double>& measured);

// Median (mean of the two middle values for an even count) and linear-interpolated quantile
// (q in [0, 1], type 7 of Hyndman & Fan, as numpy's default). Throw std::invalid_argument when empty.
double median(std::vector<double> values);
double quantile(std::vector<double> values, double q);

// `value` rounded to `digits` significant decimal digits (0 and non-finite values unchanged).
// Fitted parameters are stored rounded so that a profile reads the same on every machine.
double round_significant(double value, int digits);

}  // namespace threewalls::calibration::fit
