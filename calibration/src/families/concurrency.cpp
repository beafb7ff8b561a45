// Family module: multi-stream concurrency, concurrency, model concurrency_v1 (models.hpp
// ConcurrencyModel). A point's measured time is the concurrent time; its serial time is an input.
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

ConcurrencyModel concurrency_of(const FamilySpec& s, const Params& p) {
  ConcurrencyModel m;
  for (double v : array(s, p, "streams")) m.streams.push_back(static_cast<int>(as_int(v)));
  m.efficiency = array(s, p, "efficiency");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.name = std::string(kConcurrencyFamily);
  s.model = "concurrency_v1";
  s.description = "multi-stream concurrency, f the running kernels' mean SM fraction: speed-up s = min(n, 1/f)^e(n)";
  s.inputs = {{"streams", true, "kernels run at once, one per stream"},
              {"sm_fraction", false, "fraction of the SMs one kernel occupies"},
              {"serial_s", false, "time of the same kernels back to back on one stream, seconds"}};
  s.params = {{"streams", true, true, "measured stream counts, increasing"},
              {"efficiency", false, true, "e(n) per measured stream count"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<ConcurrencyModel::Sample> s;
  for (const auto& p : points)
    s.push_back({small_int(p.inputs[0], "streams"), p.inputs[1], p.inputs[2], p.time.median_s});
  const auto m = ConcurrencyModel::fit(s);
  std::vector<double> streams(m.streams.begin(), m.streams.end());
  return round_all({streams, m.efficiency});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return p.inputs[2] / concurrency_of(spec, params).speedup(static_cast<int>(as_int(p.inputs[0])), p.inputs[1]);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  const auto& n = array(spec, params, "streams");
  if (n.empty()) return "'streams' needs at least one stream count";
  if (array(spec, params, "efficiency").size() != n.size()) return "'efficiency' must have one entry per stream count";
  if (!increasing_counts(n)) return "'streams' entries must be between 2 and 1048576 and increasing";
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.concurrency = concurrency_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& concurrency_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
