#include "threewalls/backend/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "threewalls/backend/error.hpp"
#include "threewalls/core/attention_mask.hpp"

namespace threewalls::backend {
namespace {

void validate(const AttentionShape& s) {
  validate_attention(s, "attention");
  if (s.kv_head_count() != s.heads) {
    throw InputError(rank_prefix() + "attention (unfused): kv_heads (" + std::to_string(s.kv_heads) + ") != heads (" +
                     std::to_string(s.heads) +
                     ") is not supported; expand K and V to every query head, or use fused attention");
  }
}

// The keys query rows [q0, q0 + qb) of a head multiply: from the first row's window start (0 without
// a window) to the last row's diagonal; every key without a causal mask.
KeyRange block_keys(const AttentionShape& s, std::int64_t q0, std::int64_t qb) {
  if (!s.causal) return {0, s.seq_kv};
  return {causal_key_range(q0, s.seq_q, s.seq_kv, s.window).lo,
          causal_key_range(q0 + qb - 1, s.seq_q, s.seq_kv, s.window).hi};
}

// The most keys a block of `qb` query rows multiplies: seq_kv, or qb - 1 + window with a window.
std::int64_t max_block_keys(const AttentionShape& s, std::int64_t qb) {
  return s.causal && s.window > 0 ? std::min(s.seq_kv, qb - 1 + s.window) : s.seq_kv;
}

// The block's score rows for the kernels (its keys from `keys.lo`).
ScoreBlock score_block(const AttentionShape& s, std::int64_t bc, std::int64_t qb, std::int64_t q0, KeyRange keys) {
  return ScoreBlock{.bh = bc,
                    .rows_per_head = qb,
                    .kv_len = keys.hi - keys.lo,
                    .q0 = q0,
                    .kv0 = keys.lo,
                    .seq_q = s.seq_q,
                    .seq_kv = s.seq_kv,
                    .window = s.window,
                    .causal = s.causal};
}

// Causal masks: query blocks of this many rows skip the keys they cannot see.
constexpr std::int64_t kCausalBlock = 512;

// S = Q K^T / sqrt(head_dim_qk) for `qb` query rows against their `kv` visible keys, for `bc`
// (batch, head) pairs at once: Q and K rows of head_dim_qk elements, one pair's Q every seq_q rows and
// K every seq_kv rows; S packed, qb x kv per pair. The forward scores and the backward's
// probabilities both start from it.
GemmShape scores_gemm(const AttentionShape& s, std::int64_t bc, std::int64_t qb, std::int64_t kv) {
  const std::int64_t dqk = s.head_dim_qk;
  return GemmShape{.ta = Trans::n,
                   .tb = Trans::t,
                   .m = qb,
                   .n = kv,
                   .k = dqk,
                   .batch = bc,
                   .lda = dqk,
                   .ldb = dqk,
                   .ldc = kv,
                   .stride_a = s.seq_q * dqk,
                   .stride_b = s.seq_kv * dqk,
                   .stride_c = qb * kv,
                   .alpha = 1.0F / std::sqrt(static_cast<float>(dqk))};
}

}  // namespace

std::string describe(const AttentionShape& s) {
  std::string d;
  for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"b", s.batch},
                                    {" sq", s.seq_q},
                                    {" skv", s.seq_kv},
                                    {" h", s.heads},
                                    {" kv", s.kv_head_count()},
                                    {" dqk", s.head_dim_qk},
                                    {" dv", s.head_dim_v}}) {
    d.append(name).append(std::to_string(value));
  }
  d.append(s.causal ? " causal" : " full");
  if (s.window != 0) d.append(" w").append(std::to_string(s.window));
  return d;
}

void validate_attention(const AttentionShape& s, const char* who) {
  if (s.batch <= 0 || s.seq_q <= 0 || s.seq_kv <= 0 || s.heads <= 0 || s.head_dim_qk <= 0 || s.head_dim_v <= 0 ||
      s.kv_heads < 0) {
    throw InputError(rank_prefix() + who +
                     ": batch, seq_q, seq_kv, heads, head_dim_qk, head_dim_v must be positive (kv_heads >= 0)");
  }
  if (s.heads % s.kv_head_count() != 0) {
    throw InputError(rank_prefix() + who + ": heads (" + std::to_string(s.heads) + ") is not a multiple of kv_heads (" +
                     std::to_string(s.kv_heads) + ")");
  }
  if (s.causal && s.seq_kv < s.seq_q) {
    throw InputError(rank_prefix() + who + ": causal with seq_kv (" + std::to_string(s.seq_kv) + ") < seq_q (" +
                     std::to_string(s.seq_q) + ") leaves queries without keys");
  }
  if (s.window < 0) {
    throw InputError(rank_prefix() + who + ": window " + std::to_string(s.window) + " (" + describe(s) +
                     ") is negative; a window is the keys each query sees (0: none)");
  }
  if (s.window > 0 && !s.causal) {
    throw InputError(rank_prefix() + who + ": window " + std::to_string(s.window) + " without a causal mask (" +
                     describe(s) + "); a sliding window needs causal attention");
  }
}

double attention_flops(const AttentionShape& s, bool backward) {
  // Visible (query, key) pairs per head.
  const double pairs = s.causal ? causal_pairs(s.seq_q, s.seq_kv, s.window)
                                : static_cast<double>(s.seq_q) * static_cast<double>(s.seq_kv);
  const double fwd = 2.0 * static_cast<double>(s.batch * s.heads) * pairs *
                     static_cast<double>(s.head_dim_qk + s.head_dim_v);
  return backward ? 2.5 * fwd : fwd;
}

Attention::Attention(CublasLt& lt, std::size_t workspace_bytes) : lt_(&lt), workspace_(workspace_bytes) {}

Attention::Plan Attention::plan(const AttentionShape& s, int buffers) const {
  const std::size_t cap = workspace_.size() / static_cast<std::size_t>(buffers);
  Plan p;
  p.q_block = s.causal ? std::min(s.seq_q, kCausalBlock) : s.seq_q;
  // The last query block sees the most keys: seq_kv (for causal masks too: seq_q + seq_kv - seq_q),
  // with a window at most qb - 1 + window.
  auto per_matrix = [&](std::int64_t qb) {
    return static_cast<std::size_t>(qb) * static_cast<std::size_t>(max_block_keys(s, qb)) * sizeof(bf16);
  };
  // Shrink the query block until one matrix fits.
  while (p.q_block > 1 && per_matrix(p.q_block) > cap) p.q_block = (p.q_block + 1) / 2;
  if (per_matrix(p.q_block) > cap) {
    throw DeviceError(rank_prefix() + "attention: workspace of " + format_size(workspace_.size()) +
                      " cannot hold one score row of " + std::to_string(max_block_keys(s, 1)) + " keys");
  }
  const std::size_t fit = cap / per_matrix(p.q_block);
  p.bh_chunk = std::clamp<std::int64_t>(static_cast<std::int64_t>(fit), 1, s.batch * s.heads);
  return p;
}

void Attention::reserve(const AttentionShape& s) {
  const std::size_t need = static_cast<std::size_t>(s.batch * s.heads * s.seq_q) * sizeof(float);
  if (row_dot_.size() < need) row_dot_ = DeviceBuffer(need);
}

void Attention::forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                        cudaStream_t stream) {
  validate(s);
  const Plan p = plan(s, 1);
  const std::int64_t bh = s.batch * s.heads;
  const std::int64_t dqk = s.head_dim_qk;
  const std::int64_t dv = s.head_dim_v;
  auto* scores = workspace_.as<bf16>();
  for (std::int64_t h0 = 0; h0 < bh; h0 += p.bh_chunk) {
    const std::int64_t bc = std::min(p.bh_chunk, bh - h0);
    for (std::int64_t q0 = 0; q0 < s.seq_q; q0 += p.q_block) {
      const std::int64_t qb = std::min(p.q_block, s.seq_q - q0);
      const KeyRange keys = block_keys(s, q0, qb);
      const std::int64_t kv = keys.hi - keys.lo;
      // S[bc, qb, kv] = scale * Q K[keys]^T
      lt_->gemm(scores_gemm(s, bc, qb, kv), q + (h0 * s.seq_q + q0) * dqk, k + (h0 * s.seq_kv + keys.lo) * dqk, scores,
                stream);
      attention_softmax_fwd(scores, lse + h0 * s.seq_q, score_block(s, bc, qb, q0, keys), stream);
      // O[h, q0:q0+qb, :] = P V
      const GemmShape g2{.ta = Trans::n,
                         .tb = Trans::n,
                         .m = qb,
                         .n = dv,
                         .k = kv,
                         .batch = bc,
                         .lda = kv,
                         .ldb = dv,
                         .ldc = dv,
                         .stride_a = qb * kv,
                         .stride_b = s.seq_kv * dv,
                         .stride_c = s.seq_q * dv};
      lt_->gemm(g2, scores, v + (h0 * s.seq_kv + keys.lo) * dv, o + (h0 * s.seq_q + q0) * dv, stream);
    }
  }
}

void Attention::backward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                         const bf16* d_o, const float* lse, bf16* dq, bf16* dk, bf16* dv_out, cudaStream_t stream) {
  validate(s);
  const Plan p = plan(s, 2);
  const std::int64_t bh = s.batch * s.heads;
  const std::int64_t dqk = s.head_dim_qk;
  const std::int64_t dv = s.head_dim_v;
  const float scale = 1.0F / std::sqrt(static_cast<float>(dqk));
  reserve(s);  // no-op when reserved beforehand
  attention_row_dot(d_o, o, row_dot_.as<float>(), bh * s.seq_q, dv, stream);
  TW_CUDA_CHECK(cudaMemsetAsync(dk, 0, static_cast<std::size_t>(bh * s.seq_kv * dqk) * sizeof(bf16), stream));
  TW_CUDA_CHECK(cudaMemsetAsync(dv_out, 0, static_cast<std::size_t>(bh * s.seq_kv * dv) * sizeof(bf16), stream));
  const std::size_t half = workspace_.size() / 2 / sizeof(bf16);
  auto* probs = workspace_.as<bf16>();
  bf16* dprobs = probs + half;
  for (std::int64_t h0 = 0; h0 < bh; h0 += p.bh_chunk) {
    const std::int64_t bc = std::min(p.bh_chunk, bh - h0);
    for (std::int64_t q0 = 0; q0 < s.seq_q; q0 += p.q_block) {
      const std::int64_t qb = std::min(p.q_block, s.seq_q - q0);
      const KeyRange keys = block_keys(s, q0, qb);
      const std::int64_t kv = keys.hi - keys.lo;
      const bf16* qp = q + (h0 * s.seq_q + q0) * dqk;
      const bf16* kp = k + (h0 * s.seq_kv + keys.lo) * dqk;  // the block's first key
      const bf16* vp = v + (h0 * s.seq_kv + keys.lo) * dv;
      const bf16* dop = d_o + (h0 * s.seq_q + q0) * dv;
      const ScoreBlock blk = score_block(s, bc, qb, q0, keys);
      // P = exp(scale Q K^T - lse)
      lt_->gemm(scores_gemm(s, bc, qb, kv), qp, kp, probs, stream);
      attention_probs_from_lse(probs, lse + h0 * s.seq_q, blk, stream);
      // dV[h, keys] += P^T dO
      const GemmShape gv{.ta = Trans::t,
                         .tb = Trans::n,
                         .m = kv,
                         .n = dv,
                         .k = qb,
                         .batch = bc,
                         .lda = kv,
                         .ldb = dv,
                         .ldc = dv,
                         .stride_a = qb * kv,
                         .stride_b = s.seq_q * dv,
                         .stride_c = s.seq_kv * dv,
                         .beta = 1.0F};
      lt_->gemm(gv, probs, dop, dv_out + (h0 * s.seq_kv + keys.lo) * dv, stream);
      // dP = dO V^T
      const GemmShape gp{.ta = Trans::n,
                         .tb = Trans::t,
                         .m = qb,
                         .n = kv,
                         .k = dv,
                         .batch = bc,
                         .lda = dv,
                         .ldb = dv,
                         .ldc = kv,
                         .stride_a = s.seq_q * dv,
                         .stride_b = s.seq_kv * dv,
                         .stride_c = qb * kv};
      lt_->gemm(gp, dop, vp, dprobs, stream);
      // dS = P (dP - D)
      attention_dscores(probs, dprobs, row_dot_.as<float>() + h0 * s.seq_q, blk, stream);
      // dQ[h, q0:q0+qb] = scale dS K
      const GemmShape gq{.ta = Trans::n,
                         .tb = Trans::n,
                         .m = qb,
                         .n = dqk,
                         .k = kv,
                         .batch = bc,
                         .lda = kv,
                         .ldb = dqk,
                         .ldc = dqk,
                         .stride_a = qb * kv,
                         .stride_b = s.seq_kv * dqk,
                         .stride_c = s.seq_q * dqk,
                         .alpha = scale};
      lt_->gemm(gq, dprobs, kp, dq + (h0 * s.seq_q + q0) * dqk, stream);
      // dK[h, keys] += scale dS^T Q
      const GemmShape gk{.ta = Trans::t,
                         .tb = Trans::n,
                         .m = kv,
                         .n = dqk,
                         .k = qb,
                         .batch = bc,
                         .lda = kv,
                         .ldb = dqk,
                         .ldc = dqk,
                         .stride_a = qb * kv,
                         .stride_b = s.seq_q * dqk,
                         .stride_c = s.seq_kv * dqk,
                         .alpha = scale,
                         .beta = 1.0F};
      lt_->gemm(gk, dprobs, qp, dk + (h0 * s.seq_kv + keys.lo) * dqk, stream);
    }
  }
}

}  // namespace threewalls::backend
