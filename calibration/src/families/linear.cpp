// The linear_v1 model (models.hpp LinearModel: t = alpha + bytes / beta, piecewise by size), shared
// by the memory-bound kernel (memory.cpp) and copy (copy.cpp) modules.
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

LinearModel linear_of(const FamilySpec& s, const Params& p) {
  LinearModel m;
  m.alpha_s = scalar(s, p, "alpha_s");
  m.knots_bytes = array(s, p, "knots_bytes");
  m.bandwidths_bytes_per_s = array(s, p, "bandwidths_bytes_per_s");
  return m;
}

}  // namespace

FamilySpec linear_spec(std::string name, std::string what, std::string input_description) {
  FamilySpec s;
  s.name = std::move(name);
  s.model = "linear_v1";
  s.description = std::move(what) + ": t = alpha + bytes / beta (piecewise by size)";
  s.inputs = {{"bytes", true, std::move(input_description)}};
  s.params = {
      {"alpha_s", false, false, "latency: time of a zero-byte operation, seconds"},
      {"knots_bytes", false, true, "sizes where the bandwidth changes (empty: one segment)"},
      {"bandwidths_bytes_per_s", false, true, "bandwidth of each segment, smallest sizes first"},
  };
  return s;
}

Params fit_linear(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<LinearModel::Sample> s;
  for (const auto& p : points) s.push_back({p.inputs[0], p.time.median_s});
  const auto m = LinearModel::fit(s);
  return round_all({{m.alpha_s}, m.knots_bytes, m.bandwidths_bytes_per_s});
}

double predict_linear(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return linear_of(spec, params).time_s(p.inputs[0]);
}

std::optional<std::string> check_linear(const FamilySpec& spec, const Params& params) {
  if (scalar(spec, params, "alpha_s") < 0) return "'alpha_s' must be >= 0";
  const auto& bw = array(spec, params, "bandwidths_bytes_per_s");
  const auto& kn = array(spec, params, "knots_bytes");
  if (bw.empty()) return "'bandwidths_bytes_per_s' needs at least one segment";
  if (kn.size() + 1 != bw.size()) return "'knots_bytes' must have one entry fewer than 'bandwidths_bytes_per_s'";
  for (double v : bw) {
    if (!(v > 0)) return "'bandwidths_bytes_per_s' entries must be > 0";
  }
  for (std::size_t i = 0; i < kn.size(); ++i) {
    if (!(kn[i] > 0) || (i > 0 && !(kn[i] > kn[i - 1]))) return "'knots_bytes' must be positive and increasing";
  }
  return std::nullopt;
}

LinearModel decode_linear(const Family& f) { return linear_of(f.spec(), f.params); }

}  // namespace threewalls::calibration::detail
