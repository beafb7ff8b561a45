// The table of family modules (families.def) and the dispatch through it, with the helpers the
// modules share.
#include <array>
#include <cmath>
#include <stdexcept>

#include "decoded.hpp"
#include "module.hpp"
#include "threewalls/calibration/fit.hpp"

namespace threewalls::calibration::detail {

namespace {

const std::array<const FamilyModule*, kModelKinds>& table() {
  static const std::array<const FamilyModule*, kModelKinds> modules = {
#define THREEWALLS_CALIBRATION_FAMILY(module, group) &module##_module(),
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY
  };
  return modules;
}

std::size_t index_of(const FamilySpec& spec, std::string_view key) {
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    if (spec.params[i].key == key) return i;
  }
  throw std::logic_error("family " + spec.name + " has no parameter " + std::string(key));
}

}  // namespace

const FamilyModule& module_of(const FamilySpec& spec) { return *table().at(idx(spec.kind)); }

namespace {

std::vector<FamilySpec> specs_of_rows(bool older) {
  std::vector<FamilySpec> specs;
  for (std::size_t row = 0; row < table().size(); ++row) {
    const std::size_t first = specs.size();
    const auto add = older ? table()[row]->add_older_specs : table()[row]->add_specs;
    if (add == nullptr) continue;
    add(specs);
    for (std::size_t i = first; i < specs.size(); ++i) {
      specs[i].kind = static_cast<ModelKind>(row);
      specs[i].fit_stage = table()[row]->fit_stage;
    }
  }
  return specs;
}

}  // namespace

std::vector<FamilySpec> table_specs() { return specs_of_rows(false); }

std::vector<FamilySpec> older_table_specs() { return specs_of_rows(true); }

Params fit_params(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) {
  return module_of(spec).fit(spec, points, ctx);
}

double predict(const FamilySpec& spec, const Params& params, const Point& point, const Hardware& hw) {
  return module_of(spec).predict(spec, params, point, hw);
}

std::optional<std::string> check_params(const FamilySpec& spec, const Params& params) {
  if (params.size() != spec.params.size()) return "expected " + std::to_string(spec.params.size()) + " parameters";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& ps = spec.params[i];
    if (!ps.array && params[i].size() != 1) return "'" + ps.key + "' must be a single number";
    for (double v : params[i]) {
      if (!std::isfinite(v)) return "'" + ps.key + "' must be finite";
      if (ps.integer && v != std::floor(v)) return "'" + ps.key + "' must be an integer";
    }
  }
  return module_of(spec).check(spec, params);
}

double measured_value(const FamilySpec& spec, const Point& p) {
  const auto measured = module_of(spec).measured;
  return measured ? measured(p) : p.time.median_s;
}

void store_model(const Family& f, const Hardware& hw, DecodedModels& models) {
  module_of(f.spec()).store(f, hw, models);
}

std::int64_t as_int(double v) { return static_cast<std::int64_t>(std::llround(v)); }

double scalar(const FamilySpec& spec, const Params& p, std::string_view key) { return p.at(index_of(spec, key)).at(0); }

const std::vector<double>& array(const FamilySpec& spec, const Params& p, std::string_view key) {
  return p.at(index_of(spec, key));
}

std::vector<double>& array_ref(const FamilySpec& spec, Params& p, std::string_view key) {
  return p.at(index_of(spec, key));
}

DeviceConstants device_of(const Hardware& hw, DType dt) { return {hw.sm_count, hw.peak_flop_per_s(dt)}; }

double round_param(double v) { return fit::round_significant(v, kParamDigits); }

Params round_all(Params p) {
  for (auto& v : p) {
    for (double& x : v) x = round_param(x);
  }
  return p;
}

std::vector<double> measured_medians(const std::vector<Point>& pts) {
  std::vector<double> y;
  y.reserve(pts.size());
  for (const auto& p : pts) y.push_back(p.time.median_s);
  return y;
}

int small_int(double v, const char* what) {
  if (!(v >= 0 && v <= kMaxRanks)) throw FitImpossible(std::string(what) + " must be between 0 and 1048576");
  return static_cast<int>(as_int(v));
}

bool increasing_counts(const std::vector<double>& n) {
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) return false;
  }
  return true;
}

double memory_bandwidth(const FitContext& ctx) {
  if (ctx.find) {
    if (const Family* d2d = ctx.find(copy_family(CopyKind::d2d)); d2d && !d2d->params.empty()) {
      return 2.0 * decode_linear(*d2d).asymptotic_bandwidth_bytes_per_s();
    }
  }
  return ctx.hardware->hbm_bandwidth_datasheet_bytes_per_s;
}

}  // namespace threewalls::calibration::detail
