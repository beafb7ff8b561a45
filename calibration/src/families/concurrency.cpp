// Family module: multi-stream concurrency, concurrency, model concurrency_v1 (models.hpp
// ConcurrencyModel). A point's measured time is the concurrent time; its serial time is an input.
#include "decoded.hpp"
#include "grid_common.hpp"
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

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"concurrency_section", "", "concurrency",
                 std::to_string(kConcurrencySectionExperts) +
                     " expert sections of a Switch-like layer (OpRunner: gather, fc1, activation, fc2, scatter-add) "
                     "spread round-robin over n streams, forked and joined by events, vs the same on one stream; "
                     "sm_fraction = the mean over the section's kernels",
                 "speed-up = serial time / concurrent time"});
  out.push_back({"concurrency_gemm", "", "concurrency",
                 "until 2026-11-26 (raw output of then): the same small GEMM 4 times on each of n streams at once "
                 "(one CublasLt per stream) vs 4n times on one stream",
                 "speed-up = serial time / concurrent time"});
}

void plan(GridPlan& p, int /*part*/) {
  // What a streams:N expert section runs: kConcurrencySectionExperts experts of a
  // Switch-like layer (gather, fc1, activation, fc2, scatter-add, as the step graph expands them),
  // spread round-robin over n streams, against the same on one stream. Shapes of the calibration's
  // own (rows per expert, d_model, FFN), none of a validation scenario's: the sections' kernels fill
  // from a few to all of the SMs.
  struct S {
    std::int64_t rows, hidden, ffn;
  };
  const std::vector<S> shapes =
      p.full() ? std::vector<S>{{32, 512, 2048}, {128, 512, 2048}, {128, 1536, 6144}, {512, 1536, 6144}}
               : std::vector<S>{{128, 512, 2048}, {512, 1536, 6144}};
  for (const auto& g : shapes) {
    // Up to 64 streams (a streams:64 expert section); past CUDA_DEVICE_MAX_CONNECTIONS (8 unless
    // set) streams share hardware work queues. The runner records the variable's value.
    for (const int streams : {2, 4, 8, 16, 32, 64}) {
      PointSpec s;
      s.op = "concurrency_section";
      s.family = "concurrency";
      s.params = {
          {"streams", static_cast<double>(streams)}, {"rows", d(g.rows)}, {"hidden", d(g.hidden)}, {"ffn", d(g.ffn)}};
      s.inputs = {static_cast<double>(streams), 0.0, 0.0};  // sm_fraction and serial_s: filled by the runner
      s.flops = 4.0 * d(g.rows) * d(g.hidden) * d(g.ffn) * kConcurrencySectionExperts;
      p.points.push_back(std::move(s));
    }
  }
}

}  // namespace

const ModuleGrid& concurrency_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
