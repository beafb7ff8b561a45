// Family module: extra host time per launch rotating over N streams, model stream_cycle_v1
// (models.hpp StreamCycleModel; optional, absent: no extra). Two families: host.stream_cycle
// (threewalls run's OpRunners, measured by calibrate) and host.framework_stream_op (an eager
// framework's expert loop, measured by python3 -m threewalls.bench.framework).
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

StreamCycleModel stream_cycle_of(const FamilySpec& s, const Params& p) {
  StreamCycleModel m;
  for (double v : array(s, p, "streams")) m.streams.push_back(static_cast<int>(as_int(v)));
  m.extra_s = array(s, p, "extra_s");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kStreamCycleFamily);
  s.model = "stream_cycle_v1";
  s.description =
      "extra host time per launch when visits of 5 launches (kernel, GEMM call, kernel, GEMM call, kernel) rotate "
      "over N streams with a cuBLASLt handle each, over the same visits on one stream: median per N, "
      "log2-interpolated from extra(1) = 0";
  s.inputs = {{"streams", true, "streams the visits rotate over (>= 2)"}};
  s.params = {{"streams", true, true, "measured stream counts, increasing, >= 2"},
              {"extra_s", false, true, "extra host seconds per launch per measured stream count"}};
  out.push_back(s);
  s.name = std::string(kFrameworkStreamFamily);
  s.description =
      "extra host time per launch of an eager framework's expert loop (forward with autograd and backward) whose "
      "experts rotate over N streams, over the same loop on one stream (PyTorch: side-stream dispatch, the "
      "allocator's stream events, the autograd engine's cross-stream synchronisation): median per N, "
      "log2-interpolated from extra(1) = 0";
  s.inputs = {{"streams", true, "streams the experts rotate over (>= 2)"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<StreamCycleModel::Sample> s;
  for (const auto& p : points) s.push_back({small_int(p.inputs[0], "streams"), p.time.median_s});
  const auto m = StreamCycleModel::fit(s);
  std::vector<double> streams(m.streams.begin(), m.streams.end());
  return round_all({streams, m.extra_s});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return stream_cycle_of(spec, params).extra(static_cast<int>(as_int(p.inputs[0])));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  const auto& n = array(spec, params, "streams");
  const auto& extra = array(spec, params, "extra_s");
  if (n.empty()) return "'streams' needs at least one stream count";
  if (extra.size() != n.size()) return "'extra_s' must have one entry per stream count";
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) {
      return "'streams' entries must be between 2 and 1048576 and increasing";
    }
    if (!(extra[i] > 0) || !std::isfinite(extra[i])) return "'extra_s' entries must be > 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  (f.name == kFrameworkStreamFamily ? models.framework_stream : models.stream_cycle) =
      stream_cycle_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& stream_cycle_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"host_stream_cycle", "", std::string(kStreamCycleFamily),
                 "extra host time per launch of visits of 5 launches (count kernel, 16 x 512 x 256 GEMM call, kernel, "
                 "GEMM call, kernel) rotating over N streams with a cuBLASLt handle each (as OpRunner per stream) "
                 "over the same visits on one stream (one, N, one again per sample); the check counts the kernels and "
                 "checks the last GEMM",
                 "seconds per launch"});
}

void plan(GridPlan& p, int /*part*/) {
  // Launches rotating over N streams with a cuBLASLt handle each (host.stream_cycle): the
  // host cost of spreading a layer's ops over many streams, beyond the waits and events.
  for (const int n : p.full() ? std::vector<int>{4, 16, 64} : std::vector<int>{8, 64}) {
    PointSpec s;
    s.op = "host_stream_cycle";
    s.family = std::string(kStreamCycleFamily);
    s.params = {{"streams", d(n)}};
    s.inputs = {d(n)};
    p.points.push_back(std::move(s));
  }
}

}  // namespace

const ModuleGrid& stream_cycle_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
