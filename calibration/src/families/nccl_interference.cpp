// Family module: compute kernels beside a resident NCCL kernel, nccl.interference, model
// nccl_resident_v2 (models.hpp NcclInterferenceModel; optional, absent: no slowdown).
#include <algorithm>

#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

NcclInterferenceModel nccl_interference_of(const FamilySpec& s, const Params& p) {
  NcclInterferenceModel m;
  for (double v : array(s, p, "cases")) m.cases.push_back(static_cast<int>(as_int(v)));
  m.gemm_tiles = array(s, p, "gemm_tiles");
  m.gemm_factor = array(s, p, "gemm_factor");
  m.attention_factor = array(s, p, "attention_factor");
  m.memory_factor = array(s, p, "memory_factor");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.name = std::string(kNcclInterferenceFamily);
  s.model = "nccl_resident_v2";
  s.description =
      "compute kernels while an NCCL kernel is resident on the GPU (case 0: a receive waiting for its peer, 1: a "
      "large all-reduce transferring): GEMM t = alone G_c(T), the measured slowdown at the calibration's GEMMs, "
      "linear in ln T between them; attention t = alone a_c, memory-bound t = alone b_c";
  s.inputs = {{"case", true, "0: pending receive (spinning), 1: all-reduce transferring"},
              {"kernel", true, "0: GEMM, 1: attention, 2: memory-bound kernel"},
              {"tiles", true, "128 x 128 output tiles of a GEMM (0 for other kernels)"},
              {"alone_s", false, "the kernel's time with no NCCL kernel resident, seconds"}};
  s.params = {{"cases", true, true, "measured cases, increasing"},
              {"gemm_tiles", false, true, "tiles of the measured GEMMs (the knots of G_c), ascending"},
              {"gemm_factor", false, true, "G_c at gemm_tiles, case-major (one run of gemm_tiles' length per case)"},
              {"attention_factor", false, true, "a_c: attention slowdown, per case"},
              {"memory_factor", false, true, "b_c: memory-bound kernel slowdown, per case"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<NcclInterferenceModel::Sample> s;
  for (const auto& p : points) {
    s.push_back(
        {small_int(p.inputs[0], "case"), small_int(p.inputs[1], "kernel"), p.inputs[2], p.inputs[3], p.time.median_s});
  }
  const auto m = NcclInterferenceModel::fit(s);
  std::vector<double> cases(m.cases.begin(), m.cases.end());
  return round_all({cases, m.gemm_tiles, m.gemm_factor, m.attention_factor, m.memory_factor});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  const auto c = static_cast<NcclResidentCase>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 1));
  const auto k = static_cast<ComputeClass>(std::clamp<std::int64_t>(as_int(p.inputs[1]), 0, 2));
  return p.inputs[3] * nccl_interference_of(spec, params).factor(c, k, p.inputs[2]);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  const auto& c = a("cases");
  if (c.empty()) return "'cases' needs at least one case";
  for (const char* k : {"attention_factor", "memory_factor"}) {
    if (a(k).size() != c.size()) return std::string("'") + k + "' must have one entry per case";
  }
  const auto& t = a("gemm_tiles");
  if (t.empty()) return "'gemm_tiles' needs at least one tile count";
  for (std::size_t j = 0; j < t.size(); ++j) {
    if (!(t[j] > 0) || (j > 0 && !(t[j] > t[j - 1]))) return "'gemm_tiles' entries must be > 0, increasing";
  }
  if (a("gemm_factor").size() != c.size() * t.size()) {
    return "'gemm_factor' must have " + std::to_string(c.size() * t.size()) +
           " entries (one per case and gemm_tiles entry, case-major)";
  }
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] < 0 || c[i] > 1 || (i > 0 && !(c[i] > c[i - 1]))) {
      return "'cases' entries must be 0 (pending) or 1 (transfer), increasing";
    }
    for (const char* k : {"attention_factor", "memory_factor"}) {
      if (!(a(k)[i] > 0)) return std::string("'") + k + "' entries must be > 0";
    }
  }
  for (const double g : a("gemm_factor")) {
    if (!(g > 0)) return "'gemm_factor' entries must be > 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.nccl_interference = nccl_interference_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& nccl_interference_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
