#pragma once
// Internal: what the dense (gemm.cpp) and grouped (grouped_gemm.cpp) GEMM modules share: the
// parameters of the wave model, their checks, and the optional residual correction in log-shape
// space (models.hpp ShapeCorrection) with its parameters.
#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "module.hpp"

namespace threewalls::calibration::detail {

// tile_m, tile_n, efficiency_max, k_half, overhead_s, memory_bandwidth_bytes_per_s.
std::vector<ParamSpec> gemm_wave_params();
// The optional correction's parameters: the centres' shape arrays correction_<key> (in feature
// order), their log factors, the bandwidth and the prior weight. Absent: no correction.
std::vector<ParamSpec> correction_params(const std::vector<std::pair<std::string, std::string>>& shape);

// Whether the family's fit adds the residual correction: gemm.fp8 and grouped_gemm.* (dense bf16 is
// left without, its held-out errors grew with it on every data set; docs/calibration.md).
bool shape_correction_fitted(const FamilySpec& spec);

// The checks of the wave parameters: tile, efficiency and k_half (`head`); overhead and bandwidth
// (`tail`); the optional correction, all keys or none (`correction`).
std::optional<std::string> check_gemm_head(const FamilySpec& spec, const Params& params);
std::optional<std::string> check_gemm_tail(const FamilySpec& spec, const Params& params);
std::optional<std::string> check_correction(const FamilySpec& spec, const Params& params);

// The fitted correction's log factors (rounded like every parameter), bandwidth and prior weight.
void put_correction(const FamilySpec& spec, Params& out, const ShapeCorrection& c);

// The optional residual correction of a family: centres from the shape arrays `keys` (in the order
// of the features), log factors, bandwidth and prior weight; empty when absent.
template <std::size_t D, typename Features>
ShapeCorrection correction_of(const FamilySpec& s, const Params& p, const std::array<const char*, D>& keys,
                              Features features) {
  ShapeCorrection c;
  const auto& r = array(s, p, "correction_log_factor");
  if (r.empty()) return c;
  c.dims = D;
  c.log_factor = r;
  c.bandwidth = array(s, p, "correction_bandwidth").at(0);
  c.prior_weight = array(s, p, "correction_prior_weight").at(0);
  c.features.reserve(r.size() * D);
  for (std::size_t j = 0; j < r.size(); ++j) {
    std::array<std::int64_t, D> shape{};
    for (std::size_t d = 0; d < D; ++d) shape[d] = as_int(array(s, p, std::string("correction_") + keys[d]).at(j));
    const auto x = std::apply(features, shape);
    c.features.insert(c.features.end(), x.begin(), x.end());
  }
  return c;
}

// Fits the residual correction over a family's fit points and stores it with the centres' shapes:
// `shape_of(x)` gives the values of `keys` for sample x, `features_of(x)` its log features and
// `model_s(x)` the stored (rounded) parametric time. Nothing is stored when "no correction" wins.
template <std::size_t D, class Sample, class ShapeOf, class FeaturesOf, class ModelS>
void fit_correction(const FamilySpec& spec, Params& out, const std::vector<Sample>& s,
                    const std::array<const char*, D>& keys, ShapeOf shape_of, FeaturesOf features_of, ModelS model_s) {
  std::vector<double> features, residuals;
  for (const auto& x : s) {
    const auto f = features_of(x);
    features.insert(features.end(), f.begin(), f.end());
    residuals.push_back(std::log(x.seconds / model_s(x)));
  }
  const auto c = ShapeCorrection::fit(D, features, residuals);
  if (c.empty()) return;
  for (const auto& x : s) {
    const std::array<double, D> v = shape_of(x);
    for (std::size_t i = 0; i < D; ++i) array_ref(spec, out, std::string("correction_") + keys[i]).push_back(v[i]);
  }
  put_correction(spec, out, c);
}

}  // namespace threewalls::calibration::detail
