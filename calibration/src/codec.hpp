#pragma once
// Internal: between the generic Family (points and parameter arrays, as in the file) and the typed
// models of models.hpp. Used by the reader (parameter checks), the builder (fits, leave-one-out)
// and the CostModel (decoding once at construction).
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration::detail {

// Significant digits fitted parameters are stored with (the stored value is the model).
inline constexpr int kParamDigits = 7;
// Significant digits of the fit-error statistics.
inline constexpr int kErrorDigits = 4;

using Params = std::vector<std::vector<double>>;

// What a fit may need beyond its own points: the hardware and families fitted before it.
struct FitContext {
  const Hardware* hardware = nullptr;
  std::function<const Family*(std::string_view)> find;
};

// HBM bandwidth (read + write) the compute models use for their memory-bound limit: twice the
// large-size bandwidth of copy.d2d (a copy of S bytes reads S and writes S) when the profile has
// it, else the datasheet bandwidth.
double memory_bandwidth(const FitContext& ctx);

// Fits the family's parameters from its points, rounded to kParamDigits. Throws FitImpossible.
Params fit_params(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx);

// Whether the family's fit adds the optional residual correction (models.hpp ShapeCorrection):
// gemm.fp8 and grouped_gemm.*.
bool shape_correction_fitted(const FamilySpec& spec);

// The model's prediction of a point's median time.
double predict(const FamilySpec& spec, const Params& params, const Point& point, const Hardware& hw);

// Whether the parameters have the shape and ranges the model needs; a description of the first
// problem otherwise (the reader reports it with the file location).
std::optional<std::string> check_params(const FamilySpec& spec, const Params& params);

// Typed models of a checked family.
GemmModel decode_gemm(const Family& f, const Hardware& hw);
GroupedGemmModel decode_grouped_gemm(const Family& f, const Hardware& hw);
AttentionModel decode_attention(const Family& f, const Hardware& hw);
LinearModel decode_linear(const Family& f);
KernelTermsModel decode_kernel_terms(const Family& f);
CollectiveModel decode_collective(const Family& f);
ConstantModel decode_constant(const Family& f);
StreamCycleModel decode_stream_cycle(const Family& f);
GemmCallModel decode_gemm_call(const Family& f);
GroupedCallModel decode_grouped_call(const Family& f);
ConcurrencyModel decode_concurrency(const Family& f);
NcclInterferenceModel decode_nccl_interference(const Family& f, const Hardware& hw);
NcclMemoryModel decode_nccl_memory(const Family& f);

// The quantity a point measures and predict() predicts: its median time, except for nccl.memory,
// whose points measure bytes (input `bytes`).
double measured_value(const FamilySpec& spec, const Point& p);

}  // namespace threewalls::calibration::detail
