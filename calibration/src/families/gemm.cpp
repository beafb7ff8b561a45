// Family module: dense GEMMs, gemm.<dtype>, model gemm_roofline_v2 (models.hpp GemmModel), with the
// optional residual correction for fp8. Also the GEMM parameters and checks the grouped module
// shares (gemm_common.hpp).
#include "decoded.hpp"
#include "gemm_common.hpp"

namespace threewalls::calibration::detail {

std::vector<ParamSpec> gemm_wave_params() {
  return {
      {"tile_m", true, false, "rows of the output tile (chosen by the fit)"},
      {"tile_n", true, false, "columns of the output tile (chosen by the fit)"},
      {"efficiency_max", false, false, "e_max: fraction of the datasheet peak reached at large K"},
      {"k_half", false, false, "K at which the K-loop efficiency is half of e_max"},
      {"overhead_s", false, false, "t0: fixed time per kernel, seconds"},
      {"memory_bandwidth_bytes_per_s", false, false, "HBM read+write bandwidth of the memory-bound limit"},
  };
}

std::vector<ParamSpec> correction_params(const std::vector<std::pair<std::string, std::string>>& shape) {
  std::vector<ParamSpec> out;
  for (const auto& [key, what] : shape) {
    out.push_back(
        {"correction_" + key, true, true, "residual correction (optional): " + what + " of each centre", true});
  }
  out.push_back({"correction_log_factor", false, true,
                 "residual correction: r_j = ln(measured / model) at each centre (a fit point)", true});
  out.push_back({"correction_bandwidth", false, true,
                 "residual correction (one number): Gaussian kernel bandwidth h in log2 units of the shape", true});
  out.push_back({"correction_prior_weight", false, true,
                 "residual correction (one number): w0, the weight of a pseudo-point with r = 0", true});
  return out;
}

bool shape_correction_fitted(const FamilySpec& spec) {
  return (spec.kind == ModelKind::gemm && spec.dtype == DType::fp8) || spec.kind == ModelKind::grouped_gemm;
}

std::optional<std::string> check_gemm_head(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (s("tile_m") < 1 || s("tile_n") < 1) return "'tile_m' and 'tile_n' must be at least 1";
  if (!(s("efficiency_max") > 0)) return "'efficiency_max' must be > 0";
  if (s("k_half") < 0) return "'k_half' must be >= 0";
  return std::nullopt;
}

std::optional<std::string> check_gemm_tail(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (s("overhead_s") < 0) return "'overhead_s' must be >= 0";
  if (!(s("memory_bandwidth_bytes_per_s") > 0)) return "'memory_bandwidth_bytes_per_s' must be > 0";
  return std::nullopt;
}

std::optional<std::string> check_correction(const FamilySpec& spec, const Params& params) {
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  const auto& r = a("correction_log_factor");
  std::vector<std::string> shape_keys;
  for (const auto& ps : spec.params) {
    if (ps.key.rfind("correction_", 0) == 0 && ps.integer) shape_keys.push_back(ps.key);
  }
  const auto& h = a("correction_bandwidth");
  const auto& w0 = a("correction_prior_weight");
  if (r.empty()) {
    bool any = !h.empty() || !w0.empty();
    for (const auto& k : shape_keys) any = any || !a(k).empty();
    if (any) return "the residual correction needs 'correction_log_factor' with its other correction_* keys";
    return std::nullopt;
  }
  for (const auto& k : shape_keys) {
    if (a(k).size() != r.size()) return "'" + k + "' must have one entry per 'correction_log_factor' entry";
    for (double v : a(k)) {
      if (!(v >= 1 && v <= 9.007199254740992e15)) return "'" + k + "' entries must be positive integers";
    }
  }
  for (double v : r) {
    if (!(std::fabs(v) <= 5)) return "'correction_log_factor' entries must be in [-5, 5]";
  }
  if (h.size() != 1 || !(h[0] > 0)) return "'correction_bandwidth' must be one number > 0 in [ ]";
  if (w0.size() != 1 || !(w0[0] >= 0)) return "'correction_prior_weight' must be one number >= 0 in [ ]";
  return std::nullopt;
}

void put_correction(const FamilySpec& spec, Params& out, const ShapeCorrection& c) {
  auto& r = array_ref(spec, out, "correction_log_factor");
  for (const double v : c.log_factor) r.push_back(round_param(v));
  array_ref(spec, out, "correction_bandwidth") = {c.bandwidth};
  array_ref(spec, out, "correction_prior_weight") = {c.prior_weight};
}

namespace {

constexpr std::array<const char*, 3> kCorrectionShape = {"m", "n", "k"};

GemmModel gemm_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  GemmModel m;
  m.tile_m = static_cast<int>(as_int(scalar(s, p, "tile_m")));
  m.tile_n = static_cast<int>(as_int(scalar(s, p, "tile_n")));
  m.efficiency_max = scalar(s, p, "efficiency_max");
  m.k_half = scalar(s, p, "k_half");
  m.wave_tail = scalar(s, p, "wave_tail");
  m.overhead_s = scalar(s, p, "overhead_s");
  m.memory_bandwidth_bytes_per_s = scalar(s, p, "memory_bandwidth_bytes_per_s");
  m.device = device_of(hw, s.dtype);
  m.elements = element_bytes(s.dtype);
  m.correction = correction_of(s, p, kCorrectionShape, gemm_correction_features);
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  // gemm_roofline_v2: the grouped model's parameters plus the wave tail, and the optional correction.
  std::vector<ParamSpec> params = gemm_wave_params();
  params[0].description = "rows of the tile the wave tail is counted in (128)";
  params[1].description = "columns of the tile the wave tail is counted in (128)";
  params.insert(params.begin() + 4,
                ParamSpec{"wave_tail", false, false,
                          "waves of tiles whose K loop every GEMM pays besides its FLOPs (fill and tail)"});
  for (const auto& p : correction_params({{"m", "m"}, {"n", "n"}, {"k", "k"}})) params.push_back(p);
  for (DType dt : {DType::bf16, DType::fp8, DType::fp32}) {
    FamilySpec s;
    s.name = gemm_family(dt);
    s.model = "gemm_roofline_v2";
    s.dtype = dt;
    s.description =
        std::string("dense ") + to_string(dt) +
        " GEMM C[m,n] = A[m,k] B[k,n] x batch: t = max((F + tail 2 k Tm Tn SMs) / (P e_max k/(k+k_half)), B "
        "/ BW) + t0";
    s.inputs = {{"m", true, "rows of A and C"},
                {"n", true, "columns of B and C"},
                {"k", true, "inner dimension"},
                {"batch", true, "independent products in one call"}};
    s.params = params;
    s.reads = {copy_family(CopyKind::d2d)};
    out.push_back(s);
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) {
  const Hardware& hw = *ctx.hardware;
  std::vector<GemmModel::Sample> s;
  for (const auto& p : points) {
    s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]), p.time.median_s});
  }
  const auto m = GemmModel::fit(s, device_of(hw, spec.dtype), element_bytes(spec.dtype), memory_bandwidth(ctx));
  Params out = round_all({{static_cast<double>(m.tile_m)},
                          {static_cast<double>(m.tile_n)},
                          {m.efficiency_max},
                          {m.k_half},
                          {m.wave_tail},
                          {m.overhead_s},
                          {m.memory_bandwidth_bytes_per_s}});
  out.resize(spec.params.size());  // the optional correction arrays, empty unless fitted below
  if (shape_correction_fitted(spec)) {
    // Residuals of the stored (rounded) roofline; centres are the fit points' shapes.
    const GemmModel stored = gemm_of(spec, out, hw);
    fit_correction(
        spec, out, s, kCorrectionShape,
        [](const auto& x) {
          return std::array<double, 3>{static_cast<double>(x.m), static_cast<double>(x.n), static_cast<double>(x.k)};
        },
        [](const auto& x) { return gemm_correction_features(x.m, x.n, x.k); },
        [&](const auto& x) { return stored.roofline_time_s(x.m, x.n, x.k, x.batch); });
  }
  return out;
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  return gemm_of(spec, params, hw)
      .time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  if (auto e = check_gemm_head(spec, params)) return e;
  if (scalar(spec, params, "wave_tail") < 0) return "'wave_tail' must be >= 0";
  if (auto e = check_gemm_tail(spec, params)) return e;
  return check_correction(spec, params);
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.gemm[idx(f.spec().dtype)] = gemm_of(f.spec(), f.params, hw);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  return cm.gemm(as_int(in[0]), as_int(in[1]), as_int(in[2]), spec.dtype, as_int(in[3])).value;
}

}  // namespace

GemmModel decode_gemm(const Family& f, const Hardware& hw) { return gemm_of(f.spec(), f.params, hw); }

const FamilyModule& gemm_module() {
  static const FamilyModule m{1, add_specs, fit, predict_point, check, store, nullptr, cost};
  return m;
}

}  // namespace threewalls::calibration::detail
