// Calibrate group "memory" (families elementwise, norm, the per-kernel memory-bound fits and the
// norms' kernel.* fits): OpRunner's element-wise kernels and RMSNorm / LayerNorm forward and
// backward, checked against CPU references.
#include <cmath>

#include "bench.hpp"
#include "threewalls/backend/copies.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

// CPU references of one row of the norms (eps 1e-5): forward y, or backward dx from dy.
std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& dy,
                                      const std::vector<double>& g, bool backward) {
  const double n = static_cast<double>(x.size());
  double ss = 0.0;
  for (const double v : x) ss += v * v;
  const double rs = 1.0 / std::sqrt(ss / n + 1e-5);
  std::vector<double> want(x.size());
  double dot = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) dot += dy[j] * g[j] * x[j];
  const double cc = dot * rs * rs * rs / n;
  for (std::size_t j = 0; j < x.size(); ++j) want[j] = backward ? rs * g[j] * dy[j] - x[j] * cc : x[j] * rs * g[j];
  return want;
}

// LayerNorm with beta = gamma (as OpRunner runs it); backward dx = rstd (g dy - mean(g dy) - xhat
// mean(g dy xhat)).
std::vector<double> layernorm_reference(const std::vector<double>& x, const std::vector<double>& dy,
                                        const std::vector<double>& g, bool backward) {
  const double n = static_cast<double>(x.size());
  double mu = 0.0;
  for (const double v : x) mu += v;
  mu /= n;
  double var = 0.0;
  for (const double v : x) var += (v - mu) * (v - mu);
  const double rs = 1.0 / std::sqrt(var / n + 1e-5);
  double m1 = 0.0, m2 = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    m1 += g[j] * dy[j] / n;
    m2 += g[j] * dy[j] * (x[j] - mu) * rs / n;
  }
  std::vector<double> want(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double xh = (x[j] - mu) * rs;
    want[j] = backward ? rs * (g[j] * dy[j] - m1 - xh * m2) : xh * g[j] + g[j];
  }
  return want;
}

class MemoryBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    std::size_t need[3] = {1, 1, 1};
    std::int64_t max_rows = 1, max_hidden = 1;
    for (const auto& p : points) {
      if (p.op.rfind("norm_", 0) == 0) {
        const auto e = sz(p.iparam("rows") * p.iparam("hidden"));
        for (auto& n : need) n = std::max(n, e);
        max_rows = std::max(max_rows, p.iparam("rows"));
        max_hidden = std::max(max_hidden, p.iparam("hidden"));
      } else {
        const auto e = sz(p.iparam("elements"));
        // swiglu: x [2e] in slot 0 or 1; dx [2e] in slot 2 (slot sizes: OpRunner's elementwise need).
        need[0] = std::max(need[0], 2 * e);
        need[1] = std::max(need[1], 2 * e);
        need[2] = std::max(need[2], 2 * e);
      }
    }
    buf_[0] = random_bf16(need[0], opt().seed + 21, s());
    buf_[1] = random_bf16(need[1], opt().seed + 22, s());
    buf_[2] = be::DeviceBuffer(need[2] * 2);
    buf_[3] = random_bf16(sz(max_hidden), opt().seed + 23, s());  // gamma
    buf_[4] = be::DeviceBuffer(sz(max_rows) * 4);                 // rstd
    buf_[5] = be::DeviceBuffer(sz(max_hidden) * 2 * 4);           // dgamma, then dbeta (LayerNorm)
    buf_[6] = be::DeviceBuffer(sz(max_rows) * 4);                 // mean (LayerNorm)
    TW_CUDA_CHECK(cudaMemsetAsync(buf_[5].data(), 0, buf_[5].size(), s()));
  }

  void measure(const StopRule& rule, Record& r) override {
    const std::string& op = r.point.op;
    auto* a = buf_[0].as<be::bf16>();
    auto* b = buf_[1].as<be::bf16>();
    auto* c = buf_[2].as<be::bf16>();
    const std::vector<std::int64_t> picks = [&] {
      const std::int64_t e = op.rfind("norm_", 0) == 0 ? r.point.iparam("rows") : r.point.iparam("elements");
      return std::vector<std::int64_t>{0, e / 3, e / 2, e - 1};
    }();
    if (op == "elementwise_add") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::add(a, b, c, e, st); }, true, rule, r);
      CheckLog log("out = a + b");
      for (const auto i : picks) {
        const double want = bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
        log.expect_near(download_bf16(c, i, 1)[0], want, 0.01 * std::fabs(want) + 1e-6, "element " + std::to_string(i));
      }
      r.check = log.passed();
    } else if (op == "elementwise_copy") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::copy_d2d(c, a, sz(e) * 2, st); }, true, rule, r);
      CheckLog log("copy equals its source");
      for (const auto i : picks)
        log.expect_near(download_bf16(c, i, 1)[0], download_bf16(a, i, 1)[0], 1e-30, "element " + std::to_string(i));
      r.check = log.passed();
    } else if (op == "elementwise_swiglu") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::swiglu_fwd(a, c, 1, e, st); }, true, rule, r);
      CheckLog log("y = silu(gate) up");
      for (const auto j : picks) {
        const double g = download_bf16(a, j, 1)[0], u = download_bf16(a, e + j, 1)[0];
        const double want = g / (1.0 + std::exp(-g)) * u;
        log.expect_near(download_bf16(c, j, 1)[0], want, 0.01 * std::fabs(want) + 1e-3, "element " + std::to_string(j));
      }
      r.check = log.passed();
    } else if (op == "elementwise_swiglu_bwd") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::swiglu_bwd(b, a, c, 1, e, st); }, true, rule, r);
      CheckLog log("SwiGLU backward (d gate, d up)");
      for (const auto j : picks) {
        const double g = download_bf16(a, j, 1)[0], u = download_bf16(a, e + j, 1)[0], d = download_bf16(b, j, 1)[0];
        const double sig = 1.0 / (1.0 + std::exp(-g));
        const double dgate = d * u * sig * (1.0 + g * (1.0 - sig)), dup = d * g * sig;
        log.expect_near(download_bf16(c, j, 1)[0], dgate, 0.01 * std::fabs(dgate) + 1e-3,
                        "d gate " + std::to_string(j));
        log.expect_near(download_bf16(c, e + j, 1)[0], dup, 0.01 * std::fabs(dup) + 1e-3, "d up " + std::to_string(j));
      }
      r.check = log.passed();
    } else {
      measure_norm(rule, r);
    }
  }

 private:
  // RMSNorm or LayerNorm as OpRunner runs them (LayerNorm: gamma and beta are one buffer).
  void measure_norm(const StopRule& rule, Record& r) {
    const std::string& op = r.point.op;
    auto* a = buf_[0].as<be::bf16>();
    auto* b = buf_[1].as<be::bf16>();
    auto* c = buf_[2].as<be::bf16>();
    const bool ln = op.rfind("norm_layernorm", 0) == 0;
    const bool bwd = op == "norm_rmsnorm_bwd" || op == "norm_layernorm_bwd";
    const std::int64_t rows = r.point.iparam("rows"), h = r.point.iparam("hidden");
    auto* gamma = buf_[3].as<be::bf16>();
    auto* rstd = buf_[4].as<float>();
    auto* dgamma = buf_[5].as<float>();  // LayerNorm: dbeta follows at + h
    auto* mean = buf_[6].as<float>();
    auto forward = [&](cudaStream_t st) {
      if (ln) {
        be::layernorm_fwd(a, gamma, gamma, c, mean, rstd, rows, h, 1e-5F, st);
      } else {
        be::rmsnorm_fwd(a, gamma, c, rstd, rows, h, 1e-5F, st);
      }
    };
    forward(s());  // the statistics the backward reads
    if (bwd && ln) {
      device([&](cudaStream_t st) { be::layernorm_bwd(b, a, gamma, mean, rstd, c, dgamma, dgamma + h, rows, h, st); },
             true, rule, r);
    } else if (bwd) {
      device([&](cudaStream_t st) { be::rmsnorm_bwd(b, a, gamma, rstd, c, dgamma, rows, h, st); }, true, rule, r);
    } else {
      device(forward, true, rule, r);
    }
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    CheckLog log(std::string(ln ? "LayerNorm" : "RMSNorm") + (bwd ? " backward dx" : " forward") +
                 " of a row (relative L2)");
    const auto g = download_bf16(gamma, 0, h);
    for (const std::int64_t row : {std::int64_t{0}, rows - 1}) {
      const auto x = download_bf16(a, row * h, h);
      const auto dy = download_bf16(b, row * h, h);
      const auto want = ln ? layernorm_reference(x, dy, g, bwd) : rmsnorm_reference(x, dy, g, bwd);
      log.expect_near(rel_l2(download_bf16(c, row * h, h), want), 0.0, 0.02, "row " + std::to_string(row));
    }
    r.check = log.passed();
  }

  be::DeviceBuffer buf_[7];
};

}  // namespace

std::unique_ptr<GroupBench> make_memory_bench(const BenchContext& ctx) { return std::make_unique<MemoryBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
