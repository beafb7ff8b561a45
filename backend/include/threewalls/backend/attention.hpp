#pragma once
// Attention, forward and backward, unfused: cuBLASLt strided-batched GEMMs for Q K^T, P V and the
// backward products, and our masked-softmax kernels between them (docs/backend.md says why and what
// it costs). Correct for any (batch, seq_q, seq_kv, heads, head_dim_qk, head_dim_v), causal or not,
// including decode (seq_q = 1, long seq_kv).
//
// Layout: q [batch, heads, seq_q, dqk], k [batch, heads, seq_kv, dqk], v [batch, heads, seq_kv, dv],
// o / do [batch, heads, seq_q, dv], all bf16; lse [batch, heads, seq_q] fp32 (log-sum-exp of each
// scaled score row, saved by forward for backward).
// Causal mask, bottom-right aligned (as with a KV cache): query i sees keys j <= i + seq_kv - seq_q;
// a sliding window w > 0 also hides keys j <= i + seq_kv - seq_q - w, so each query sees at most w
// keys (core/attention_mask.hpp owns the rule). Scores are scaled by 1/sqrt(dqk).
//
// Memory: the score matrix is materialised in bf16, one block of query rows for a chunk of
// (batch x head) at a time, inside a workspace of fixed size (forward: one score buffer, backward:
// two). For causal masks, each query block only multiplies the keys it can see, so about half of
// the full S = Q K^T work is skipped: a block of rows [q0, q1) computes the keys from its first row's
// window start (0 without a window) to its last row's diagonal, [lo, q1 + seq_kv - seq_q) with
// lo = clamp(q0 + seq_kv - seq_q + 1 - w, 0, seq_kv) (calibration's attention_computed_pairs).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/handles.hpp"

namespace threewalls::backend {

struct AttentionShape {
  std::int64_t batch = 1, seq_q = 1, seq_kv = 1, heads = 1, head_dim_qk = 64, head_dim_v = 64;
  bool causal = false;
  // Key/value heads; 0 means `heads` (MHA). Fewer (GQA) only in FusedAttention and decode attention:
  // Attention (unfused) reads one key/value head per query head.
  std::int64_t kv_heads = 0;
  // Sliding window (causal only): each query sees at most this many keys, itself included; 0: none.
  std::int64_t window = 0;
  [[nodiscard]] std::int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
};

// "b2 sq4096 skv4096 h16 kv16 dqk128 dv128 causal", with " w128" for a window (for messages and bench
// output; fused_attention.hpp's users see it too).
[[nodiscard]] std::string describe(const AttentionShape& s);

// Throws InputError (message prefixed with `who`) for non-positive dimensions, heads not a
// multiple of kv_heads, causal with seq_kv < seq_q, a negative window, or a window without causal.
void validate_attention(const AttentionShape& s, const char* who);

// Model FLOPs of the attention products (the convention of FlashAttention's benchmarks):
// forward 2 * b * h * sq * skv * (dqk + dv), for causal masks counting only the visible (query, key)
// pairs (threewalls::causal_pairs: about half without a window, about sq * w with one); backward
// 2.5 times forward (five products instead of two).
[[nodiscard]] double attention_flops(const AttentionShape& s, bool backward);

class Attention {
 public:
  static constexpr std::size_t kDefaultWorkspace = std::size_t{512} << 20;
  explicit Attention(CublasLt& lt, std::size_t workspace_bytes = kDefaultWorkspace);

  // Throws InputError for the shapes validate_attention refuses.
  void forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
               cudaStream_t stream);
  // dq, dk, dv written (dk, dv are zeroed on the stream first, then accumulated over query blocks).
  void backward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                const float* lse, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream);
  // Allocates what forward/backward of `s` need beyond the fixed workspace (the per-row dot(dO, O)
  // buffer) so that later calls allocate nothing (graph capture). Synchronous.
  void reserve(const AttentionShape& s);

 private:
  struct Plan {
    std::int64_t q_block = 0;   // query rows per chunk
    std::int64_t bh_chunk = 0;  // (batch x head) matrices per chunk
  };
  [[nodiscard]] Plan plan(const AttentionShape& s, int buffers) const;

  CublasLt* lt_;
  DeviceBuffer workspace_;
  DeviceBuffer row_dot_;  // backward: D[i] = dot(dO_i, O_i), fp32 [batch*heads*seq_q]
};

// Kernels behind Attention (attention_kernels.cu). Rows are `rows_per_head` query rows of
// `bh` matrices, each row `kv_len` long with stride `kv_len`; query row r of a head is query index
// q0 + r, column c is key kv0 + c; a key is visible when !causal or threewalls::causal_key_range of
// the query (seq_q, seq_kv, window) holds it.
struct ScoreBlock {
  std::int64_t bh = 0, rows_per_head = 0, kv_len = 0, q0 = 0, kv0 = 0, seq_q = 0, seq_kv = 0, window = 0;
  bool causal = false;
};
// In place: scores -> probabilities P (bf16), lse[h * seq_q + q0 + r] written (fp32).
void attention_softmax_fwd(bf16* scores, float* lse, const ScoreBlock& b, cudaStream_t s);
// In place: scores -> P = exp(score - lse) (masked entries 0).
void attention_probs_from_lse(bf16* scores, const float* lse, const ScoreBlock& b, cudaStream_t s);
// In place: dP -> dS = P * (dP - D[row]).
void attention_dscores(const bf16* probs, bf16* dprobs, const float* row_dot, const ScoreBlock& b, cudaStream_t s);
// D[i] = sum_d dO[i, d] * O[i, d] for `rows` rows of `dv`.
void attention_row_dot(const bf16* d_o, const bf16* o, float* row_dot, std::int64_t rows, std::int64_t dv,
                       cudaStream_t s);

}  // namespace threewalls::backend
