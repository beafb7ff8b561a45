// Family module: copies, copy.<direction>, model linear_v1 (linear.cpp). copy.d2d is also the
// measured HBM bandwidth of the compute models (memory_bandwidth, fitted first).
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

void add_specs(std::vector<FamilySpec>& out) {
  for (CopyKind d : {CopyKind::h2d_pinned, CopyKind::h2d_pageable, CopyKind::d2h_pinned, CopyKind::d2h_pageable,
                     CopyKind::d2d, CopyKind::disk_read}) {
    out.push_back(linear_spec(copy_family(d), std::string("copy ") + to_string(d) + " (bytes copied)", "bytes copied"));
  }
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  for (std::size_t d = 0; d < models.copy.size(); ++d) {
    if (f.name == copy_family(static_cast<CopyKind>(d))) models.copy[d] = decode_linear(f);
  }
}

}  // namespace

const FamilyModule& copy_module() {
  static const FamilyModule m{0, add_specs, fit_linear, predict_linear, check_linear, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
