#include "threewalls/calibration/fit.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace threewalls::calibration::fit {

void Design::add_row(std::vector<double> row) {
  if (rows.empty() && cols == 0) cols = row.size();
  if (row.size() != cols)
    throw std::invalid_argument("design row has " + std::to_string(row.size()) + " columns, expected " +
                                std::to_string(cols));
  rows.push_back(std::move(row));
}

namespace {

void check_problem(const Design& a, const std::vector<double>& y, const std::vector<double>& w) {
  if (a.rows.size() != y.size() || y.size() != w.size()) {
    throw std::invalid_argument("least squares: " + std::to_string(a.rows.size()) + " rows, " +
                                std::to_string(y.size()) + " observations, " + std::to_string(w.size()) + " weights");
  }
  if (a.cols == 0) throw std::invalid_argument("least squares: no columns");
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i]) || !std::isfinite(w[i]) || w[i] < 0) {
      throw std::invalid_argument("least squares: observation " + std::to_string(i) +
                                  " is not finite or has a negative weight");
    }
    for (double v : a.rows[i]) {
      if (!std::isfinite(v))
        throw std::invalid_argument("least squares: regressor of row " + std::to_string(i) + " is not finite");
    }
  }
}

// Solves the weighted problem restricted to the columns in `cols`; nullopt when rank-deficient.
std::optional<Eigen::VectorXd> solve_subset(const Design& a, const std::vector<double>& y, const std::vector<double>& w,
                                            const std::vector<std::size_t>& cols) {
  const auto n = static_cast<Eigen::Index>(y.size());
  const auto p = static_cast<Eigen::Index>(cols.size());
  if (n < p) return std::nullopt;
  Eigen::MatrixXd m(n, p);
  Eigen::VectorXd rhs(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto iu = static_cast<std::size_t>(i);
    const double s = std::sqrt(w[iu]);
    for (Eigen::Index j = 0; j < p; ++j) m(i, j) = s * a.rows[iu][cols[static_cast<std::size_t>(j)]];
    rhs(i) = s * y[iu];
  }
  // Scale columns to unit norm so that the rank decision does not depend on units (bytes vs 1).
  Eigen::VectorXd scale(p);
  for (Eigen::Index j = 0; j < p; ++j) {
    const double nrm = m.col(j).norm();
    if (!(nrm > 0)) return std::nullopt;
    scale(j) = nrm;
    m.col(j) /= nrm;
  }
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(m);
  qr.setThreshold(1e-10);
  if (qr.rank() < p) return std::nullopt;
  Eigen::VectorXd x = qr.solve(rhs);
  for (Eigen::Index j = 0; j < p; ++j) x(j) /= scale(j);
  return x;
}

double weighted_cost(const Design& a, const std::vector<double>& y, const std::vector<double>& w,
                     const std::vector<double>& x) {
  double c = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    double r = -y[i];
    for (std::size_t j = 0; j < x.size(); ++j) r += a.rows[i][j] * x[j];
    c += w[i] * r * r;
  }
  return c;
}

}  // namespace

std::vector<double> weighted_least_squares(const Design& a, const std::vector<double>& y,
                                           const std::vector<double>& w) {
  check_problem(a, y, w);
  std::vector<std::size_t> all(a.cols);
  for (std::size_t j = 0; j < a.cols; ++j) all[j] = j;
  auto x = solve_subset(a, y, w, all);
  if (!x) {
    throw std::invalid_argument("least squares: " + std::to_string(y.size()) + " observations cannot determine " +
                                std::to_string(a.cols) + " parameters (too few distinct points)");
  }
  return {x->data(), x->data() + x->size()};
}

std::vector<double> nonnegative_least_squares(const Design& a, const std::vector<double>& y,
                                              const std::vector<double>& w) {
  check_problem(a, y, w);
  if (a.cols > 8) throw std::invalid_argument("nonnegative least squares: at most 8 columns");
  std::optional<std::vector<double>> best;
  double best_cost = std::numeric_limits<double>::infinity();
  const std::size_t subsets = std::size_t{1} << a.cols;
  // Larger free sets first, so that among equal costs the one using more regressors wins (stable).
  for (std::size_t s = subsets; s-- > 1;) {
    std::vector<std::size_t> cols;
    for (std::size_t j = 0; j < a.cols; ++j) {
      if (s & (std::size_t{1} << j)) cols.push_back(j);
    }
    auto x = solve_subset(a, y, w, cols);
    if (!x) continue;
    std::vector<double> full(a.cols, 0.0);
    bool feasible = true;
    for (std::size_t j = 0; j < cols.size(); ++j) {
      const double v = (*x)(static_cast<Eigen::Index>(j));
      if (v < 0) {
        feasible = false;
        break;
      }
      full[cols[j]] = v;
    }
    if (!feasible) continue;
    const double c = weighted_cost(a, y, w, full);
    if (c < best_cost * (1 - 1e-12)) {
      best_cost = c;
      best = std::move(full);
    }
  }
  if (!best)
    throw std::invalid_argument("nonnegative least squares: no solvable set of parameters (too few distinct points)");
  return *best;
}

namespace {

double half_norm2(const std::vector<double>& r) {
  double c = 0;
  for (double v : r) {
    if (!std::isfinite(v)) return std::numeric_limits<double>::infinity();
    c += v * v;
  }
  return 0.5 * c;
}

std::vector<double> clamp_theta(std::vector<double> t, double bound) {
  for (double& v : t) v = std::clamp(v, -bound, bound);
  return t;
}

}  // namespace

LmResult levenberg_marquardt(const ResidualFn& residuals, std::vector<double> theta0, const LmOptions& options) {
  LmResult out;
  out.theta = clamp_theta(std::move(theta0), options.theta_bound);
  std::vector<double> r = residuals(out.theta);
  out.cost = half_norm2(r);
  const auto p = static_cast<Eigen::Index>(out.theta.size());
  if (p == 0 || !std::isfinite(out.cost)) return out;
  double lambda = options.initial_lambda;
  for (int it = 0; it < options.max_iterations; ++it) {
    out.iterations = it + 1;
    const auto n = static_cast<Eigen::Index>(r.size());
    Eigen::MatrixXd jac(n, p);
    for (Eigen::Index j = 0; j < p; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      const double h = 1e-6 * std::max(1.0, std::fabs(out.theta[ju]));
      auto tp = out.theta;
      auto tm = out.theta;
      tp[ju] += h;
      tm[ju] -= h;
      const auto rp = residuals(tp);
      const auto rm = residuals(tm);
      for (Eigen::Index i = 0; i < n; ++i) {
        const auto iu = static_cast<std::size_t>(i);
        const double d = (rp[iu] - rm[iu]) / (2 * h);
        jac(i, j) = std::isfinite(d) ? d : 0.0;
      }
    }
    Eigen::VectorXd rv(n);
    for (Eigen::Index i = 0; i < n; ++i) rv(i) = r[static_cast<std::size_t>(i)];
    const Eigen::MatrixXd jtj = jac.transpose() * jac;
    const Eigen::VectorXd g = jac.transpose() * rv;
    if (g.lpNorm<Eigen::Infinity>() < 1e-15) {
      out.converged = true;
      break;
    }
    bool improved = false;
    while (lambda <= options.max_lambda) {
      Eigen::MatrixXd a = jtj;
      for (Eigen::Index j = 0; j < p; ++j) a(j, j) += lambda * std::max(jtj(j, j), 1e-12);
      const Eigen::VectorXd step = a.ldlt().solve(-g);
      std::vector<double> cand = out.theta;
      for (Eigen::Index j = 0; j < p; ++j) cand[static_cast<std::size_t>(j)] += step(j);
      cand = clamp_theta(std::move(cand), options.theta_bound);
      auto rc = residuals(cand);
      const double c = half_norm2(rc);
      if (c < out.cost) {
        const double gain = (out.cost - c) / std::max(out.cost, 1e-300);
        out.theta = std::move(cand);
        r = std::move(rc);
        out.cost = c;
        lambda = std::max(lambda / 10, 1e-12);
        improved = true;
        if (gain < options.relative_tolerance) out.converged = true;
        break;
      }
      lambda *= 10;
    }
    if (!improved) {
      out.converged = true;  // no descent direction left at any damping: a (local) minimum
      break;
    }
    if (out.converged || out.cost == 0.0) break;
  }
  return out;
}

LmResult levenberg_marquardt_multistart(const ResidualFn& residuals, const std::vector<std::vector<double>>& starts,
                                        const LmOptions& options) {
  if (starts.empty()) throw std::invalid_argument("levenberg_marquardt_multistart: no start");
  LmResult best;
  bool have = false;
  for (const auto& s : starts) {
    auto r = levenberg_marquardt(residuals, s, options);
    if (!have || r.cost < best.cost) {
      best = std::move(r);
      have = true;
    }
  }
  return best;
}

double median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of no values");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double quantile(std::vector<double> values, double q) {
  if (values.empty()) throw std::invalid_argument("quantile of no values");
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("quantile: q must be in [0, 1]");
  std::sort(values.begin(), values.end());
  const double h = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

ErrorStats relative_error_stats(const std::vector<double>& predicted, const std::vector<double>& measured) {
  if (predicted.size() != measured.size()) throw std::invalid_argument("relative_error_stats: size mismatch");
  ErrorStats s;
  if (predicted.empty()) {
    s.median = s.max = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  std::vector<double> e;
  e.reserve(predicted.size());
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    if (!(measured[i] >= 0)) throw std::invalid_argument("relative_error_stats: measured value must be >= 0");
    if (measured[i] == 0) {
      // A quantity that can be zero (bytes a stage allocates): exact when predicted zero, else it
      // has no relative error and is not counted.
      if (predicted[i] == 0) e.push_back(0.0);
      continue;
    }
    e.push_back(std::fabs(predicted[i] - measured[i]) / measured[i]);
  }
  s.count = e.size();
  if (e.empty()) {
    s.median = s.max = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  s.max = *std::max_element(e.begin(), e.end());
  s.median = median(std::move(e));
  return s;
}

ErrorStats leave_one_out(std::size_t n, const std::function<std::optional<double>(std::size_t)>& predict_without,
                         const std::vector<double>& measured) {
  if (measured.size() != n) throw std::invalid_argument("leave_one_out: size mismatch");
  std::vector<double> pred;
  std::vector<double> meas;
  for (std::size_t i = 0; i < n; ++i) {
    auto p = predict_without(i);
    if (!p) continue;
    pred.push_back(*p);
    meas.push_back(measured[i]);
  }
  return relative_error_stats(pred, meas);
}

double round_significant(double value, int digits) {
  if (value == 0.0 || !std::isfinite(value)) return value;
  // Decimal rounding through the shortest-exact formatter: the same digits on every platform.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific, digits - 1);
  double out = 0;
  std::from_chars(buf, res.ptr, out);
  return out;
}

}  // namespace threewalls::calibration::fit
