// Family module: host time of one cuBLASLt GEMM call, host.gemm_call, model gemm_call_v1 (models.hpp
// GemmCallModel): the shape-aware form of host.gemm_launch (optional; the simulator prefers it).
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

GemmCallModel gemm_call_of(const FamilySpec& s, const Params& p) {
  return GemmCallModel{scalar(s, p, "t_one_s"), scalar(s, p, "t_extra_s"), scalar(s, p, "split_ratio")};
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.name = std::string(kGemmCallFamily);
  s.model = "gemm_call_v1";
  s.description =
      "host time of one cuBLASLt GEMM call as OpRunner makes it, one launch or more (split-K: a reduction kernel or a "
      "memset): "
      "t = t_one + t_extra [k / (ceil(m/128) ceil(n/128)) >= split_ratio]";
  s.inputs = {
      {"m", true, "rows of C"},
      {"n", true, "columns of C"},
      {"k", true, "reduction length"},
      {"nodes", true, "graph nodes one call launched (kernels and memsets), counted by graph capture (0: unknown)"}};
  s.params = {
      {"t_one_s", false, false, "host time of a call that launches one kernel, seconds"},
      {"t_extra_s", false, false, "host time of each further node of a split call, seconds"},
      {"split_ratio", false, false, "k per 128 x 128 output tile from which cuBLASLt splits K (0: never seen)"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<GemmCallModel::Sample> s;
  for (const auto& p : points) {
    s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), static_cast<int>(as_int(p.inputs[3])),
                 p.time.median_s});
  }
  const auto m = GemmCallModel::fit(s);
  return round_all({{m.t_one_s}, {m.t_extra_s}, {m.split_ratio}});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return gemm_call_of(spec, params).time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (!(s("t_one_s") > 0)) return "'t_one_s' must be > 0";
  if (!(s("t_extra_s") >= 0)) return "'t_extra_s' must be >= 0";
  if (!(s("split_ratio") >= 0) || !std::isfinite(s("split_ratio"))) return "'split_ratio' must be a finite number >= 0";
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.gemm_call = gemm_call_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& gemm_call_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
