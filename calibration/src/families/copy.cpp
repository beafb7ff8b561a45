// Family module: copies, copy.<direction>, model linear_v1 (linear.cpp). copy.d2d is also the
// measured HBM bandwidth of the compute models (memory_bandwidth, fitted first).
#include "decoded.hpp"
#include "grid_common.hpp"
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

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void plan_copies(GridPlan& p) {
  struct C {
    CopyKind kind;
    double max_bytes;
  };
  const double pageable_max = p.full() ? 256 * kMiB : 128 * kMiB;
  const std::vector<C> copies{{CopyKind::h2d_pinned, kGiB},
                              {CopyKind::d2h_pinned, kGiB},
                              {CopyKind::h2d_pageable, pageable_max},
                              {CopyKind::d2h_pageable, pageable_max},
                              {CopyKind::d2d, kGiB}};
  for (const auto& c : copies) {
    for (const double pow2 : sizes(4 * kKiB, c.max_bytes, p.full() ? 4.0 : 8.0)) {
      const double bytes = pow2 + 512;  // off the powers of two (no validation scenario's exact size)
      PointSpec s;
      s.op = copy_op_name(c.kind);
      s.family = copy_family(c.kind);
      s.params = {{"bytes", bytes}};
      s.bytes = bytes;
      s.inputs = {bytes};
      p.points.push_back(std::move(s));
    }
  }
  if (p.full()) {  // disk tier: O_DIRECT file reads into pinned memory (slow: full mode only)
    // Factors of 2 (with factors of 4 the 1/4/16/64 MiB fit was 9.5% fast at 16 MiB, the size
    // of one DeepSeek-V2-Lite expert the NVMe offload scenarios read).
    for (const double pow2 : sizes(kMiB, 64 * kMiB, 2.0)) {
      const double bytes = pow2 + 4096;  // O_DIRECT needs 4 KiB multiples
      PointSpec s;
      s.op = copy_op_name(CopyKind::disk_read);
      s.family = copy_family(CopyKind::disk_read);
      s.params = {{"bytes", bytes}};
      s.bytes = bytes;
      s.inputs = {bytes};
      p.points.push_back(std::move(s));
    }
  }
}

// The copies, named after their kind (op_name "copy_h2d_pinned", family "copy.h2d_pinned").
void add_ops(std::vector<OpInfo>& out) {
  const auto copy_row = [&out](CopyKind k, const char* what, const char* definition) {
    out.push_back({copy_op_name(k), "", copy_family(k), what, definition});
  };
  copy_row(CopyKind::h2d_pinned, "backend::copy_h2d from pinned memory", "bytes copied");
  copy_row(CopyKind::d2h_pinned, "backend::copy_d2h to pinned memory", "bytes copied");
  copy_row(CopyKind::h2d_pageable, "backend::copy_h2d from pageable memory", "bytes copied");
  copy_row(CopyKind::d2h_pageable, "backend::copy_d2h to pageable memory", "bytes copied");
  copy_row(CopyKind::d2d, "backend::copy_d2d", "bytes copied (HBM traffic is twice that)");
  copy_row(CopyKind::disk_read, "backend::read_file_into a pinned buffer (O_DIRECT when possible)",
           "bytes read (host time of the synchronous read)");
}

void plan(GridPlan& p, int /*part*/) { plan_copies(p); }

}  // namespace

const ModuleGrid& copy_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
