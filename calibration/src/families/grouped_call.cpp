// Family module: host time of one grouped-GEMM call, host.grouped_gemm_call, model grouped_call_v1
// (models.hpp GroupedCallModel): the shape-aware form of host.grouped_gemm_launch (optional).
#include <tuple>

#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

GroupedCallModel grouped_call_of(const FamilySpec& s, const Params& p) {
  return GroupedCallModel{scalar(s, p, "t_one_s"), scalar(s, p, "t_run_s")};
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kGroupedCallFamily);
  s.model = "grouped_call_v1";
  s.description =
      "host time of one grouped-GEMM call of OpRunner (lt_batched: one cuBLASLt matmul per run of experts "
      "with equal rows): t = t_one + (runs - 1) t_run";
  s.inputs = {{"groups", true, "experts"},
              {"total_rows", true, "rows of all experts"},
              {"max_rows", true, "rows of the largest expert (the split of expert_rows)"},
              {"n", true, "output columns"},
              {"k", true, "reduction length"}};
  s.params = {{"t_one_s", false, false, "host time of a call of one run, seconds"},
              {"t_run_s", false, false, "host time of each further run (one more matmul), seconds"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<GroupedCallModel::Sample> s;
  for (const auto& p : points)
    s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), p.time.median_s});
  const auto m = GroupedCallModel::fit(s);
  return round_all({{m.t_one_s}, {m.t_run_s}});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return grouped_call_of(spec, params).time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  if (!(scalar(spec, params, "t_one_s") > 0)) return "'t_one_s' must be > 0";
  if (!(scalar(spec, params, "t_run_s") >= 0)) return "'t_run_s' must be >= 0";
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.grouped_call = grouped_call_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& grouped_call_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"host_grouped_gemm_launch", "", std::string(kGroupedCallFamily),
                 "host time of one GroupedGemm::run (OpRunner's grouped_impl, prepared plan) while a blocking kernel "
                 "holds the stream",
                 "seconds per call"});
}

void plan(GridPlan& p, int /*part*/) {
  // Grouped GEMM (lt_batched: one cuBLASLt call when balanced, three with a hot expert).
  for (const auto& [groups, rows, n, k, skew] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, double>>{
           {64, 96, 2560, 640, 1.0}, {64, 96, 2560, 640, 3.0}, {16, 640, 1536, 1024, 1.0}}) {
    PointSpec s;
    s.op = "host_grouped_gemm_launch";
    s.family = std::string(kGroupedCallFamily);
    const std::int64_t max_rows = static_cast<std::int64_t>(std::llround(skew * d(rows)));
    s.params = {
        {"groups", d(groups)}, {"total_rows", d(groups * rows)}, {"max_rows", d(max_rows)}, {"n", d(n)}, {"k", d(k)}};
    s.inputs = {d(groups), d(groups * rows), d(max_rows), d(n), d(k)};
    s.flops = 2.0 * d(groups * rows) * d(n) * d(k);
    p.points.push_back(std::move(s));
  }
}

}  // namespace

const ModuleGrid& grouped_call_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
