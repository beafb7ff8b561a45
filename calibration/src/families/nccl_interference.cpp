// Family module: compute kernels beside a resident NCCL kernel, nccl.interference, model
// nccl_resident_v1 (models.hpp NcclInterferenceModel; optional, absent: no slowdown).
#include <algorithm>

#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

NcclInterferenceModel nccl_interference_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  NcclInterferenceModel m;
  m.sm_count = hw.sm_count;
  for (double v : array(s, p, "cases")) m.cases.push_back(static_cast<int>(as_int(v)));
  m.held_sms = array(s, p, "held_sms");
  m.gemm_factor = array(s, p, "gemm_factor");
  m.attention_factor = array(s, p, "attention_factor");
  m.memory_factor = array(s, p, "memory_factor");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.name = std::string(kNcclInterferenceFamily);
  s.model = "nccl_resident_v1";
  s.description =
      "compute kernels while an NCCL kernel is resident on the GPU (case 0: a receive waiting for its peer, 1: a "
      "large all-reduce transferring): GEMM t = alone g_c ceil(T/(S-H_c))/ceil(T/S), attention t = alone a_c, "
      "memory-bound t = alone b_c";
  s.inputs = {{"case", true, "0: pending receive (spinning), 1: all-reduce transferring"},
              {"kernel", true, "0: GEMM, 1: attention, 2: memory-bound kernel"},
              {"tiles", true, "128 x 128 output tiles of a GEMM (0 for other kernels)"},
              {"alone_s", false, "the kernel's time with no NCCL kernel resident, seconds"}};
  s.params = {{"cases", true, true, "measured cases, increasing"},
              {"held_sms", true, true, "H_c: SMs the NCCL kernel holds (wave model of the GEMMs), per case"},
              {"gemm_factor", false, true, "g_c: GEMM slowdown besides the waves, per case"},
              {"attention_factor", false, true, "a_c: attention slowdown, per case"},
              {"memory_factor", false, true, "b_c: memory-bound kernel slowdown, per case"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& ctx) {
  std::vector<NcclInterferenceModel::Sample> s;
  for (const auto& p : points) {
    s.push_back(
        {small_int(p.inputs[0], "case"), small_int(p.inputs[1], "kernel"), p.inputs[2], p.inputs[3], p.time.median_s});
  }
  const auto m = NcclInterferenceModel::fit(s, ctx.hardware->sm_count);
  std::vector<double> cases(m.cases.begin(), m.cases.end());
  return round_all({cases, m.held_sms, m.gemm_factor, m.attention_factor, m.memory_factor});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  const auto c = static_cast<NcclResidentCase>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 1));
  const auto k = static_cast<ComputeClass>(std::clamp<std::int64_t>(as_int(p.inputs[1]), 0, 2));
  return p.inputs[3] * nccl_interference_of(spec, params, hw).factor(c, k, p.inputs[2]);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  const auto& c = a("cases");
  if (c.empty()) return "'cases' needs at least one case";
  for (const char* k : {"held_sms", "gemm_factor", "attention_factor", "memory_factor"}) {
    if (a(k).size() != c.size()) return std::string("'") + k + "' must have one entry per case";
  }
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] < 0 || c[i] > 1 || (i > 0 && !(c[i] > c[i - 1]))) {
      return "'cases' entries must be 0 (pending) or 1 (transfer), increasing";
    }
    if (a("held_sms")[i] < 0) return "'held_sms' entries must be >= 0";
    for (const char* k : {"gemm_factor", "attention_factor", "memory_factor"}) {
      if (!(a(k)[i] > 0)) return std::string("'") + k + "' entries must be > 0";
    }
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.nccl_interference = nccl_interference_of(f.spec(), f.params, hw);
}

}  // namespace

const FamilyModule& nccl_interference_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
