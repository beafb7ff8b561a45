// Calibrate group "grouped" (family grouped_gemm.bf16): GroupedGemm (OpRunner's default
// implementation) over expert_rows(total, groups, max_rows), operands rotating through copies, checked
// at rows of the hot and the last expert against a CPU dot product.
#include <tuple>

#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/op_runner.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

class GroupedBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    double x = 1, w = 1, y = 1;
    for (const auto& p : points) {
      x = std::max(x, p.param("total_rows") * p.param("k"));
      w = std::max(w, p.param("groups") * p.param("n") * p.param("k"));
      y = std::max(y, p.param("total_rows") * p.param("n"));
    }
    const double floor_elems = static_cast<double>(kRotationBytes) / 2.0;
    buf_[0] = random_bf16(sz(std::max(x, floor_elems)), opt().seed + 41, s());
    buf_[1] = random_bf16(sz(std::max(w, floor_elems)), opt().seed + 42, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(y, floor_elems)) * 2);
  }

  void measure(const StopRule& rule, Record& r) override {
    const std::int64_t groups = r.point.iparam("groups"), total = r.point.iparam("total_rows");
    const std::int64_t max_rows = r.point.iparam("max_rows"), n = r.point.iparam("n"), k = r.point.iparam("k");
    const std::vector<std::int64_t> rows = be::expert_rows(total, groups, max_rows);
    const std::size_t run_bytes = sz(total * k + groups * n * k + total * n) * 2;
    const Rotation rx(buf_[0], sz(total * k) * 2, run_bytes, kMaxGroupedCopies),
        rw(buf_[1], sz(groups * n * k) * 2, run_bytes, kMaxGroupedCopies),
        ry(buf_[2], sz(total * n) * 2, run_bytes, kMaxGroupedCopies);
    // One prepared GroupedGemm per copy of the operands (pointer arrays are built at construction).
    std::vector<std::unique_ptr<be::GroupedGemm>> plans;
    const std::size_t copies = std::max({rx.count(), rw.count(), ry.count()});
    for (std::size_t c = 0; c < copies; ++c) {
      plans.push_back(std::make_unique<be::GroupedGemm>(
          *ctx_.lt, be::GemmLayout::forward, rows, n, k, static_cast<const be::bf16*>(rx.at(c)),
          static_cast<const be::bf16*>(rw.at(c)), static_cast<be::bf16*>(ry.at(c)), be::OpRunnerConfig{}.grouped_impl));
    }
    std::size_t turn = 0;
    device([&](cudaStream_t st) { plans[turn++ % plans.size()]->run(st); }, true, rule, r);
    const be::bf16* x = static_cast<const be::bf16*>(rx.at(0));
    const be::bf16* w = static_cast<const be::bf16*>(rw.at(0));
    be::bf16* y = static_cast<be::bf16*>(ry.at(0));
    TW_CUDA_CHECK(cudaMemsetAsync(y, 0xFF, sz(total * n) * 2, s()));
    plans[0]->run(s());
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    // Y_e = X_e W_e^T at the first and last row of the hot expert and of the last non-empty expert.
    CheckLog log(std::string("grouped Y_e = X_e W_e^T against a CPU dot product (") +
                 be::to_string(be::OpRunnerConfig{}.grouped_impl) + ")");
    std::int64_t off = 0, last_e = 0, last_off = 0;
    for (std::size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] > 0) {
        last_e = static_cast<std::int64_t>(e);
        last_off = off;
      }
      off += rows[e];
    }
    for (const auto& [e, row_off, nrows] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {0, 0, rows[0]}, {last_e, last_off, rows[sz(last_e)]}}) {
      if (nrows <= 0) continue;
      for (const auto& [i, j] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {nrows - 1, n - 1}}) {
        const auto xv = download_bf16(x, (row_off + i) * k, k);
        const auto wv = download_bf16(w, e * n * k + j * k, k);
        double ref = 0.0, norm = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          ref += xv[sz(l)] * wv[sz(l)];
          norm += (xv[sz(l)] * wv[sz(l)]) * (xv[sz(l)] * wv[sz(l)]);
        }
        log.expect_near(download_bf16(y, (row_off + i) * n + j, 1)[0], ref,
                        0.02 * std::sqrt(norm) + 0.01 * std::fabs(ref),
                        "expert " + std::to_string(e) + " row " + std::to_string(i) + " col " + std::to_string(j));
      }
    }
    r.check = log.passed() + rotation_note(rx, rw, ry);
  }

 private:
  be::DeviceBuffer buf_[3];  // X, W, Y
};

}  // namespace

std::unique_ptr<GroupBench> make_grouped_bench(const BenchContext& ctx) { return std::make_unique<GroupedBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
