// Family module: memory-bound kernels, elementwise, norm and the per-kernel fits of
// kMemoryKernelFamilies, model linear_v1 (linear.cpp).
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

void add_specs(std::vector<FamilySpec>& out) {
  out.push_back(linear_spec(std::string(kElementwiseFamily), "memory-bound element-wise kernels (bytes read + written)",
                            "bytes read + written"));
  out.push_back(
      linear_spec(std::string(kNormFamily), "normalisation kernels (bytes read + written)", "bytes read + written"));
  for (std::string_view k : kMemoryKernelFamilies) {
    out.push_back(linear_spec(
        std::string(k), "one memory-bound kernel, the calibration benchmark of the same name (bytes read + written)",
        "bytes read + written"));
  }
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  const LinearModel m = decode_linear(f);
  if (f.name == kElementwiseFamily) {
    models.elementwise = m;
  } else if (f.name == kNormFamily) {
    models.norm = m;
  } else {
    models.kernels.insert_or_assign(f.name, m);
  }
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  if (spec.name == kElementwiseFamily) return cm.elementwise(Bytes(in[0])).value;
  if (spec.name == kNormFamily) return cm.norm(Bytes(in[0])).value;
  return cm.memory_kernel(spec.name, Bytes(in[0])).value;
}

}  // namespace

const FamilyModule& memory_module() {
  static const FamilyModule m{0, add_specs, fit_linear, predict_linear, check_linear, store, nullptr, cost};
  return m;
}

}  // namespace threewalls::calibration::detail
