// Family module: kernels whose time is not a function of bytes alone, kernel.*, model
// kernel_terms_v1 (kernel_terms.hpp: the table of kernels, their inputs and terms).
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

// The terms' factors from the kernel table; parameters overhead_s, then one coefficient per term
// (none when `p` is empty: the fit only needs the factors).
KernelTermsModel kernel_terms_of(const FamilySpec& s, const Params& p) {
  const KernelTermsFamily* k = find_kernel_terms_family(s.name);
  if (!k) throw std::logic_error("family " + s.name + " is not in the kernel_terms table");
  KernelTermsModel m;
  for (const auto& t : k->terms) m.factors.push_back(t.factors);
  if (p.empty()) return m;
  m.overhead_s = scalar(s, p, "overhead_s");
  for (const auto& t : k->terms) m.coefficients_s.push_back(scalar(s, p, t.param));
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  for (const KernelTermsFamily& k : kernel_terms_families()) {
    FamilySpec s;
    s.name = k.name;
    s.model = "kernel_terms_v1";
    std::string eq = "t = t0";
    for (const auto& in : k.inputs) s.inputs.push_back({in.key, true, in.description});
    s.params.push_back({"overhead_s", false, false, "t0: fixed time of the launch sequence, seconds"});
    for (const auto& t : k.terms) {
      s.params.push_back({t.param, false, false, t.description + ", seconds"});
      eq += " + " + t.param;
      for (const int i : t.factors) eq += " " + k.inputs[static_cast<std::size_t>(i)].key;
    }
    s.description = k.what + ": " + eq;
    out.push_back(s);
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<KernelTermsModel::Sample> s;
  for (const auto& p : points) s.push_back({p.inputs, p.time.median_s});
  const auto m = KernelTermsModel::fit(kernel_terms_of(spec, {}).factors, s);
  Params out{{m.overhead_s}};
  for (const double c : m.coefficients_s) out.push_back({c});
  return round_all(out);
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return kernel_terms_of(spec, params).time_s(p.inputs);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  for (const auto& ps : spec.params) {
    if (!(scalar(spec, params, ps.key) >= 0)) return "'" + ps.key + "' must be >= 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.kernel_terms.insert_or_assign(f.name, kernel_terms_of(f.spec(), f.params));
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  const auto t = cm.fitted_kernel(spec.name, in);
  if (!t) return std::nullopt;
  return t->value;
}

}  // namespace

const FamilyModule& kernel_terms_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost};
  return m;
}

}  // namespace threewalls::calibration::detail
