// Calibrate group "attention" (families attention.fwd, attention.bwd): Attention::forward and
// backward (the backend's unfused attention), checked at rows of (batch 0, head 0) against a CPU
// softmax(Q K^T) V, and the backward's dQ rows.
#include <cmath>

#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/op_runner.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

class AttentionBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    double q = 1, kv_qk = 1, kv_v = 1, o = 1, rows = 1;
    for (const auto& p : points) {
      const double bh = p.param("batch") * p.param("heads");
      q = std::max(q, bh * p.param("seq_q") * p.param("head_dim_qk"));
      kv_qk = std::max(kv_qk, bh * p.param("seq_kv") * p.param("head_dim_qk"));
      kv_v = std::max(kv_v, bh * p.param("seq_kv") * p.param("head_dim_v"));
      o = std::max(o, bh * p.param("seq_q") * p.param("head_dim_v"));
      rows = std::max(rows, bh * p.param("seq_q"));
    }
    buf_[0] = random_bf16(sz(q), opt().seed + 51, s());
    buf_[1] = random_bf16(sz(kv_qk), opt().seed + 52, s());
    buf_[2] = random_bf16(sz(kv_v), opt().seed + 53, s());
    buf_[3] = be::DeviceBuffer(sz(o) * 2);
    buf_[4] = random_bf16(sz(o), opt().seed + 54, s());  // dO
    buf_[5] = be::DeviceBuffer(sz(rows) * 4);            // lse
    buf_[6] = be::DeviceBuffer(sz(q) * 2);               // dQ
    buf_[7] = be::DeviceBuffer(sz(kv_qk) * 2);           // dK
    buf_[8] = be::DeviceBuffer(sz(kv_v) * 2);            // dV
    attention_ = std::make_unique<be::Attention>(*ctx_.lt, be::OpRunnerConfig{}.attention_workspace);
  }

  void measure(const StopRule& rule, Record& r) override {
    const auto& p = r.point;
    const be::AttentionShape sh{p.iparam("batch"),      p.iparam("seq_q"),       p.iparam("seq_kv"),
                                p.iparam("heads"),      p.iparam("head_dim_qk"), p.iparam("head_dim_v"),
                                p.iparam("causal") != 0};
    auto* q = buf_[0].as<be::bf16>();
    auto* k = buf_[1].as<be::bf16>();
    auto* v = buf_[2].as<be::bf16>();
    auto* o = buf_[3].as<be::bf16>();
    auto* d_o = buf_[4].as<be::bf16>();
    auto* lse = buf_[5].as<float>();
    attention_->reserve(sh);
    attention_->forward(sh, q, k, v, o, lse, s());  // backward consumes a real O and log-sum-exp
    const bool bwd = p.op == "attention_bwd";
    if (bwd) {
      device(
          [&](cudaStream_t st) {
            attention_->backward(sh, q, k, v, o, d_o, lse, buf_[6].as<be::bf16>(), buf_[7].as<be::bf16>(),
                                 buf_[8].as<be::bf16>(), st);
          },
          true, rule, r);
    } else {
      device([&](cudaStream_t st) { attention_->forward(sh, q, k, v, o, lse, st); }, true, rule, r);
    }
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    CheckLog log(bwd ? "attention backward dQ rows of (batch 0, head 0) against a CPU reference (relative L2)"
                     : "attention forward rows of (batch 0, head 0) against a CPU reference (relative L2)");
    const auto kv = download_bf16(k, 0, sh.seq_kv * sh.head_dim_qk);
    const auto vv = download_bf16(v, 0, sh.seq_kv * sh.head_dim_v);
    for (const std::int64_t row : {sh.seq_q - 1, sh.seq_q / 2}) {
      const AttnRef ref = attention_row(sh, q, k, v, row);
      if (!bwd) {
        log.expect_near(rel_l2(download_bf16(o, row * sh.head_dim_v, sh.head_dim_v), ref.o), 0.0, 0.03,
                        "row " + std::to_string(row));
        continue;
      }
      // dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j, dP_ij = dO_i . V_j, D_i = dO_i . O_i (the GPU's O).
      const auto dov = download_bf16(d_o, row * sh.head_dim_v, sh.head_dim_v);
      const auto ov = download_bf16(o, row * sh.head_dim_v, sh.head_dim_v);
      double dd = 0.0;
      for (std::int64_t t = 0; t < sh.head_dim_v; ++t) dd += dov[sz(t)] * ov[sz(t)];
      std::vector<double> dq(sz(sh.head_dim_qk), 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(sh.head_dim_qk));
      for (std::int64_t j = 0; j < sh.seq_kv; ++j) {
        if (ref.p[sz(j)] == 0.0) continue;
        double dp = 0.0;
        for (std::int64_t t = 0; t < sh.head_dim_v; ++t) dp += dov[sz(t)] * vv[sz(j * sh.head_dim_v + t)];
        const double ds = ref.p[sz(j)] * (dp - dd);
        for (std::int64_t t = 0; t < sh.head_dim_qk; ++t) dq[sz(t)] += scale * ds * kv[sz(j * sh.head_dim_qk + t)];
      }
      log.expect_near(rel_l2(download_bf16(buf_[6].data(), row * sh.head_dim_qk, sh.head_dim_qk), dq), 0.0, 0.1,
                      "dQ row " + std::to_string(row));
    }
    r.check = log.passed();
  }

 private:
  std::unique_ptr<be::Attention> attention_;
  be::DeviceBuffer buf_[9];  // Q, K, V, O, dO, lse, dQ, dK, dV
};

}  // namespace

std::unique_ptr<GroupBench> make_attention_bench(const BenchContext& ctx) {
  return std::make_unique<AttentionBench>(ctx);
}

}  // namespace threewalls::calibration::bench::detail
