// Calibrate group "attention": Attention::forward and backward (the backend's unfused attention;
// families attention.fwd, attention.bwd), FusedAttention::forward and backward (attention_fused.fwd,
// attention_fused.bwd) and DecodeAttention::forward (attention_decode), each checked at rows of
// (batch 0, head 0) against a CPU softmax(Q K^T) V, and the backwards' dQ rows.
#include <cmath>
#include <string>

#include "bench.hpp"
#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/fused_attention.hpp"
#include "threewalls/backend/op_runner.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

enum class Kernel { unfused, fused, decode };

Kernel kernel_of(const PointSpec& p) {
  if (p.op == "attention_decode") return Kernel::decode;
  if (p.op == "attention_fused_fwd" || p.op == "attention_fused_bwd") return Kernel::fused;
  return Kernel::unfused;
}

// The backend shape of a point: the unfused ops have one key/value head per query head (no
// kv_heads parameter), decode points one query per sequence (every cached key visible).
be::AttentionShape shape_of(const PointSpec& p) {
  be::AttentionShape sh;
  sh.batch = p.iparam("batch");
  sh.heads = p.iparam("heads");
  sh.seq_kv = p.iparam("seq_kv");
  sh.head_dim_qk = p.iparam("head_dim_qk");
  sh.head_dim_v = p.iparam("head_dim_v");
  switch (kernel_of(p)) {
    case Kernel::decode:
      sh.seq_q = 1;
      sh.causal = true;
      sh.kv_heads = p.iparam("kv_heads");
      break;
    case Kernel::fused:
      sh.seq_q = p.iparam("seq_q");
      sh.causal = p.iparam("causal") != 0;
      sh.kv_heads = p.iparam("kv_heads");
      break;
    case Kernel::unfused:
      sh.seq_q = p.iparam("seq_q");
      sh.causal = p.iparam("causal") != 0;
      break;
  }
  return sh;
}

class AttentionBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    double q = 1, kv_qk = 1, kv_v = 1, o = 1, rows = 1;
    for (const auto& p : points) {
      const be::AttentionShape sh = shape_of(p);
      const double bh = static_cast<double>(sh.batch * sh.heads);
      const double bkv = static_cast<double>(sh.batch * sh.kv_head_count());
      q = std::max(q, bh * static_cast<double>(sh.seq_q * sh.head_dim_qk));
      kv_qk = std::max(kv_qk, bkv * static_cast<double>(sh.seq_kv * sh.head_dim_qk));
      kv_v = std::max(kv_v, bkv * static_cast<double>(sh.seq_kv * sh.head_dim_v));
      o = std::max(o, bh * static_cast<double>(sh.seq_q * sh.head_dim_v));
      rows = std::max(rows, bh * static_cast<double>(sh.seq_q));
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
  }

  void measure(const StopRule& rule, Record& r) override {
    const auto& p = r.point;
    const be::AttentionShape sh = shape_of(p);
    const Kernel kernel = kernel_of(p);
    auto* q = buf_[0].as<be::bf16>();
    auto* k = buf_[1].as<be::bf16>();
    auto* v = buf_[2].as<be::bf16>();
    auto* o = buf_[3].as<be::bf16>();
    auto* d_o = buf_[4].as<be::bf16>();
    auto* lse = buf_[5].as<float>();
    auto* dq = buf_[6].as<be::bf16>();
    auto* dk = buf_[7].as<be::bf16>();
    auto* dv = buf_[8].as<be::bf16>();
    const bool bwd = p.op == "attention_bwd" || p.op == "attention_fused_bwd";
    // Each kernel is created when a point first needs it (no cuDNN handle for unfused points).
    switch (kernel) {
      case Kernel::unfused: {
        if (!unfused_) unfused_ = std::make_unique<be::Attention>(*ctx_.lt, be::OpRunnerConfig{}.attention_workspace);
        unfused_->reserve(sh);
        unfused_->forward(sh, q, k, v, o, lse, s());  // backward consumes a real O and log-sum-exp
        if (bwd) {
          device([&](cudaStream_t st) { unfused_->backward(sh, q, k, v, o, d_o, lse, dq, dk, dv, st); }, true, rule, r);
        } else {
          device([&](cudaStream_t st) { unfused_->forward(sh, q, k, v, o, lse, st); }, true, rule, r);
        }
        break;
      }
      case Kernel::fused: {
        if (!fused_) fused_ = std::make_unique<be::FusedAttention>();
        fused_->reserve(sh, bwd);
        fused_->forward(sh, q, k, v, o, lse, s());
        if (bwd) {
          device([&](cudaStream_t st) { fused_->backward(sh, q, k, v, o, d_o, lse, dq, dk, dv, st); }, true, rule, r);
        } else {
          device([&](cudaStream_t st) { fused_->forward(sh, q, k, v, o, lse, st); }, true, rule, r);
        }
        break;
      }
      case Kernel::decode: {
        if (!decode_) decode_ = std::make_unique<be::DecodeAttention>();
        decode_->reserve(sh);
        device([&](cudaStream_t st) { decode_->forward(sh, q, k, v, o, lse, st); }, true, rule, r);
        break;
      }
    }
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    const std::string what = kernel == Kernel::fused    ? "fused attention"
                             : kernel == Kernel::decode ? "decode attention"
                                                        : "attention";
    CheckLog log(what + (bwd ? " backward dQ rows of (batch 0, head 0) against a CPU reference (relative L2)"
                             : " forward rows of (batch 0, head 0) against a CPU reference (relative L2)"));
    const auto kv = download_bf16(k, 0, sh.seq_kv * sh.head_dim_qk);
    const auto vv = download_bf16(v, 0, sh.seq_kv * sh.head_dim_v);
    std::vector<std::int64_t> check_rows{sh.seq_q - 1};
    if (sh.seq_q > 1) check_rows.push_back(sh.seq_q / 2);
    for (const std::int64_t row : check_rows) {
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
      std::vector<double> dq_ref(sz(sh.head_dim_qk), 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(sh.head_dim_qk));
      for (std::int64_t j = 0; j < sh.seq_kv; ++j) {
        if (ref.p[sz(j)] == 0.0) continue;
        double dp = 0.0;
        for (std::int64_t t = 0; t < sh.head_dim_v; ++t) dp += dov[sz(t)] * vv[sz(j * sh.head_dim_v + t)];
        const double ds = ref.p[sz(j)] * (dp - dd);
        for (std::int64_t t = 0; t < sh.head_dim_qk; ++t) dq_ref[sz(t)] += scale * ds * kv[sz(j * sh.head_dim_qk + t)];
      }
      log.expect_near(rel_l2(download_bf16(dq, row * sh.head_dim_qk, sh.head_dim_qk), dq_ref), 0.0, 0.1,
                      "dQ row " + std::to_string(row));
    }
    r.check = log.passed();
  }

 private:
  std::unique_ptr<be::Attention> unfused_;
  std::unique_ptr<be::FusedAttention> fused_;
  std::unique_ptr<be::DecodeAttention> decode_;
  be::DeviceBuffer buf_[9];  // Q, K, V, O, dO, lse, dQ, dK, dV
};

}  // namespace

std::unique_ptr<GroupBench> make_attention_bench(const BenchContext& ctx) {
  return std::make_unique<AttentionBench>(ctx);
}

}  // namespace threewalls::calibration::bench::detail
