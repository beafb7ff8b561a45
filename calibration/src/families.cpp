// The registry of model families (names, frozen model ids, point columns, parameters: each family
// module's entries, in the order of the table families.def) and small value helpers. Names and model
// ids written to profile files are frozen: add, never rename.
#include <algorithm>
#include <stdexcept>

#include "families/module.hpp"
#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration {

std::string gemm_family(DType dt) { return std::string("gemm.") + to_string(dt); }
std::string grouped_gemm_family(DType dt) { return std::string("grouped_gemm.") + to_string(dt); }
std::string attention_family(bool backward) { return backward ? "attention.bwd" : "attention.fwd"; }
std::string attention_fused_family(bool backward) { return backward ? "attention_fused.bwd" : "attention_fused.fwd"; }
std::string copy_family(CopyKind dir) { return std::string("copy.") + to_string(dir); }
std::string collective_family(Collective kind, LinkScope scope) {
  return std::string("collective.") + to_string(kind) + "." + to_string(scope);
}
std::string host_family(std::string_view what) { return "host." + std::string(what); }

const std::vector<std::string>& known_gpu_kinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> v;
    for (GpuKind g : kGpuKinds) v.emplace_back(to_string(g));
    return v;
  }();
  return kinds;
}

const std::vector<FamilySpec>& family_specs() {
  static const std::vector<FamilySpec> specs = detail::table_specs();
  return specs;
}

const FamilySpec* find_family_spec(std::string_view name) {
  for (const auto& s : family_specs()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const std::vector<FamilySpec>& older_family_specs() {
  static const std::vector<FamilySpec> specs = detail::older_table_specs();
  return specs;
}

const FamilySpec* find_family_spec(std::string_view name, std::string_view model) {
  const FamilySpec* current = find_family_spec(name);
  if (current == nullptr || model.empty() || current->model == model) return current;
  for (const auto& s : older_family_specs()) {
    if (s.name == name && s.model == model) return &s;
  }
  return nullptr;
}

Measurement Measurement::from_samples(std::vector<double> samples_s) {
  if (samples_s.empty()) throw std::invalid_argument("Measurement::from_samples: no samples");
  Measurement m;
  m.median_s = fit::median(samples_s);
  m.p10_s = fit::quantile(samples_s, 0.10);
  m.p90_s = fit::quantile(samples_s, 0.90);
  m.count = static_cast<std::int64_t>(samples_s.size());
  m.samples_s = std::move(samples_s);
  return m;
}

Measurement Measurement::single(double seconds) {
  Measurement m;
  m.median_s = m.p10_s = m.p90_s = seconds;
  m.count = 1;
  return m;
}

const FamilySpec& Family::spec() const {
  const auto* s = find_family_spec(name, model);
  if (!s) {
    throw std::logic_error("unknown calibration family '" + name + "'" +
                           (model.empty() ? std::string() : " with model '" + model + "'"));
  }
  return *s;
}

namespace {
std::size_t param_index(const Family& f, std::string_view key) {
  const auto& spec = f.spec();
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    if (spec.params[i].key == key) {
      if (i >= f.params.size()) break;
      return i;
    }
  }
  throw std::logic_error("calibration family '" + f.name + "' has no parameter '" + std::string(key) + "'");
}
}  // namespace

double Family::param(std::string_view key) const {
  const auto& v = params[param_index(*this, key)];
  if (v.size() != 1) throw std::logic_error("parameter '" + std::string(key) + "' of '" + name + "' is not a scalar");
  return v[0];
}

const std::vector<double>& Family::param_array(std::string_view key) const { return params[param_index(*this, key)]; }

double Hardware::peak_flop_per_s(DType dt) const {
  switch (dt) {
    case DType::bf16: return peak_bf16_flop_per_s;
    case DType::fp8: return peak_fp8_flop_per_s;
    case DType::fp32: return peak_fp32_flop_per_s;
  }
  return 0.0;
}

}  // namespace threewalls::calibration
