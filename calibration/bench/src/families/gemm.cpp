// Calibrate group "gemm" (families gemm.bf16, gemm.fp8): CublasLt::gemm on linear_gemm(layout, m, n,
// k) with operands rotating through copies (cold L2), checked against a CPU dot product.
#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

be::GemmLayout layout_of(int code) {
  return code == kLayoutDgrad   ? be::GemmLayout::dgrad
         : code == kLayoutWgrad ? be::GemmLayout::wgrad
                                : be::GemmLayout::forward;
}

class GemmBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    double a = 1, b = 1, c = 1, a8 = 0, b8 = 0;
    for (const auto& p : points) {
      const double m = p.param("m"), n = p.param("n"), k = p.param("k");
      if (p.op == "gemm_fp8") {
        a8 = std::max(a8, m * k);
        b8 = std::max(b8, k * n);
      } else {
        a = std::max(a, m * k);
        b = std::max(b, k * n);
      }
      c = std::max(c, m * n);
    }
    // At least kRotationBytes per operand, so that small GEMMs rotate through many copies (cold L2).
    const double floor_elems = static_cast<double>(kRotationBytes) / 2.0;
    buf_[0] = random_bf16(sz(std::max(a, floor_elems)), opt().seed + 31, s());
    buf_[1] = random_bf16(sz(std::max(b, floor_elems)), opt().seed + 32, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(c, floor_elems)) * 2);
    if (a8 > 0) {
      buf_[3] = be::DeviceBuffer(sz(std::max(a8, 2 * floor_elems)));
      buf_[4] = be::DeviceBuffer(sz(std::max(b8, 2 * floor_elems)));
      be::fill_random(buf_[3].as<be::fp8>(), static_cast<std::int64_t>(buf_[3].size()), opt().seed + 33, 1.0F, s());
      be::fill_random(buf_[4].as<be::fp8>(), static_cast<std::int64_t>(buf_[4].size()), opt().seed + 34, 1.0F, s());
    }
  }

  void measure(const StopRule& rule, Record& r) override {
    const bool fp8 = r.point.op == "gemm_fp8";
    const be::GemmShape g =
        be::linear_gemm(layout_of(static_cast<int>(r.point.iparam("layout"))), r.point.iparam("m"), r.point.iparam("n"),
                        r.point.iparam("k"), fp8 ? be::GemmType::e4m3 : be::GemmType::bfloat16);
    const std::size_t in = fp8 ? 1 : 2;
    const be::DeviceBuffer& abuf = fp8 ? buf_[3] : buf_[0];
    const be::DeviceBuffer& bbuf = fp8 ? buf_[4] : buf_[1];
    const std::size_t run_bytes = sz(g.m * g.k) * in + sz(g.k * g.n) * in + sz(g.m * g.n) * 2;
    const Rotation ra(abuf, sz(g.m * g.k) * in, run_bytes), rb(bbuf, sz(g.k * g.n) * in, run_bytes),
        rc(buf_[2], sz(g.m * g.n) * 2, run_bytes);
    be::CublasLt& lt = *ctx_.lt;
    std::size_t i = 0;
    device(
        [&](cudaStream_t st) {
          lt.gemm(g, ra.at(i), rb.at(i), rc.at(i), st);
          ++i;
        },
        true, rule, r);
    // The check: one more run on the first copies, into a C poisoned with NaN.
    TW_CUDA_CHECK(cudaMemsetAsync(rc.at(0), 0xFF, sz(g.m * g.n) * 2, s()));
    lt.gemm(g, ra.at(0), rb.at(0), rc.at(0), s());
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    r.check = check_gemm(g, ra.at(0), rb.at(0), rc.at(0), fp8) + rotation_note(ra, rb, rc);
  }

 private:
  be::DeviceBuffer buf_[5];  // A, B, C (bf16); A, B (e4m3)
};

}  // namespace

std::unique_ptr<GroupBench> make_gemm_bench(const BenchContext& ctx) { return std::make_unique<GemmBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
