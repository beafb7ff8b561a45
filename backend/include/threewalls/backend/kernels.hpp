#pragma once
// Memory-bound kernels of a MoE transformer step, each a host function taking device pointers,
// shapes and a stream (asynchronous; launch errors throw DeviceError). Tensors are row-major;
// activations bf16, statistics and optimizer state fp32. Every kernel reads and writes exactly the
// tensors named in its signature, so its traffic is the op's `bytes`.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace threewalls::backend {

using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

// ---- random initialisation (seeded, never zero) ----
// x[i] = sign * scale * (0.25 + 0.75 u), u uniform in [0,1) from a counter-based hash of (seed, i):
// deterministic for a seed, independent of the launch shape, |x| in [0.25 scale, scale).
void fill_random(bf16* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s);
void fill_random(float* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s);
// |x| of the above: for tensors that must stay positive (Adam's second moment).
void fill_random_positive(float* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s);
void fill_random(fp8* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s);
// Integer ids uniform in [0, range): token ids, targets.
void fill_random_ids(std::int32_t* x, std::int64_t n, std::uint64_t seed, std::int32_t range, cudaStream_t s);
// The value fill_random writes at index i (host side, for tests).
[[nodiscard]] float random_value(std::uint64_t seed, std::int64_t i, float scale);

// ---- element-wise ----
// out = a + b (residual add; out may alias a or b).
void add(const bf16* a, const bf16* b, bf16* out, std::int64_t n, cudaStream_t s);
// SwiGLU on x[rows, 2h] = [gate | up]: y[r, j] = silu(gate[r, j]) * up[r, j], y [rows, h].
void swiglu_fwd(const bf16* x, bf16* y, std::int64_t rows, std::int64_t h, cudaStream_t s);
// dx[rows, 2h] from dy[rows, h] and x.
void swiglu_bwd(const bf16* dy, const bf16* x, bf16* dx, std::int64_t rows, std::int64_t h, cudaStream_t s);

// ---- fp8 quantisation (Transformer Engine's per-tensor scaling: cast and cast-transpose) ----
// amax[0] = max(amax[0], max_i |x[i]|) over x[n]; amax[0] must hold a value >= 0 (e.g. 0).
void amax_bf16(const bf16* x, float* amax, std::int64_t n, cudaStream_t s);
// y[r, c] = e4m3(scale x[r, c]) (saturating to +-448) over x[rows, cols]; when `yt` is not null also
// yt[c, r] = y[r, c] (the columnwise copy the backward GEMMs read); when `amax` is not null,
// amax[0] = max(amax[0], max |x|) (delayed scaling records it in the cast). Traffic: 2 bytes read, 1
// (2 with yt) written per element.
void quantize_fp8(const bf16* x, float scale, fp8* y, fp8* yt, float* amax, std::int64_t rows, std::int64_t cols,
                  cudaStream_t s);
// yt[c, r] = x[r, c] over fp8 x[rows, cols]: the columnwise copy of a weight kept in fp8 (1 byte read,
// 1 written per element).
void transpose_fp8(const fp8* x, fp8* yt, std::int64_t rows, std::int64_t cols, cudaStream_t s);

// ---- normalisation (one row of `hidden` per token) ----
// RMSNorm: y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); rstd [rows] saved for backward.
void rmsnorm_fwd(const bf16* x, const bf16* gamma, bf16* y, float* rstd, std::int64_t rows, std::int64_t hidden,
                 float eps, cudaStream_t s);
// dx [rows, hidden]; dgamma [hidden] fp32 is accumulated (+=): zero it first for a fresh gradient.
void rmsnorm_bwd(const bf16* dy, const bf16* x, const bf16* gamma, const float* rstd, bf16* dx, float* dgamma,
                 std::int64_t rows, std::int64_t hidden, cudaStream_t s);
// LayerNorm: y = (x - mean) * rstd * gamma + beta; mean, rstd [rows] saved.
void layernorm_fwd(const bf16* x, const bf16* gamma, const bf16* beta, bf16* y, float* mean, float* rstd,
                   std::int64_t rows, std::int64_t hidden, float eps, cudaStream_t s);
// dgamma, dbeta [hidden] fp32 accumulated (+=).
void layernorm_bwd(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd, bf16* dx,
                   float* dgamma, float* dbeta, std::int64_t rows, std::int64_t hidden, cudaStream_t s);

// ---- embedding ----
// out[t, :] = table[ids[t], :]; table [vocab, hidden]. Ids outside [0, vocab) are a caller bug; their
// rows are written as NaN (visible, never silently skipped); embedding_bwd skips them.
void embedding_fwd(const std::int32_t* ids, const bf16* table, bf16* out, std::int64_t tokens, std::int64_t hidden,
                   std::int64_t vocab, cudaStream_t s);
// dtable[ids[t], :] += dout[t, :] (fp32 gradient, atomics: repeated ids accumulate).
void embedding_bwd(const std::int32_t* ids, const bf16* dout, float* dtable, std::int64_t tokens, std::int64_t hidden,
                   std::int64_t vocab, cudaStream_t s);

// ---- vocab-parallel cross-entropy (Megatron's pieces; the TP all-reduces between them are
// separate collective ops) ----
// Shard: logits [tokens, shard] hold vocabulary entries [vocab_start, vocab_start + shard).
// 1) local row max:                          row_max[t] = max_j logits[t, j]
void xent_max(const bf16* logits, float* row_max, std::int64_t tokens, std::int64_t shard, cudaStream_t s);
// 2) after all-reduce(max): local sum of exp and the target's logit (0 where the target is not in
//    this shard):   sum_exp[t] = sum_j exp(logits[t,j] - row_max[t]);  target_logit[t]
void xent_sum_exp(const bf16* logits, const float* row_max, const std::int32_t* targets, std::int64_t vocab_start,
                  float* sum_exp, float* target_logit, std::int64_t tokens, std::int64_t shard, cudaStream_t s);
// 3) after all-reduce(sum) of sum_exp and target_logit: loss[t] = log(sum_exp) + row_max - target_logit
void xent_loss(const float* row_max, const float* sum_exp, const float* target_logit, float* loss,
               std::int64_t tokens, cudaStream_t s);
// backward: dlogits[t, j] = dloss[t] * (softmax[t, j] - [j == target - vocab_start]).
void xent_bwd(const bf16* logits, const float* row_max, const float* sum_exp, const std::int32_t* targets,
              std::int64_t vocab_start, const float* dloss, bf16* dlogits, std::int64_t tokens, std::int64_t shard,
              cudaStream_t s);

// ---- optimizer ----
struct AdamParams {
  float lr = 1e-4F, beta1 = 0.9F, beta2 = 0.95F, eps = 1e-8F, weight_decay = 0.1F;
  int step = 1;  // 1-based, for bias correction
};
// AdamW over a parameter shard: fp32 master weights, gradient, m and v updated in place; bf16 copy
// of the new weights written to `weight` (may be null to skip). Traffic: 4 fp32 reads, 3 fp32
// writes, 1 bf16 write per parameter.
void adam_step(float* master, const float* grad, float* m, float* v, bf16* weight, std::int64_t n,
               const AdamParams& p, cudaStream_t s);

// ---- MoE routing ----
// Router scores -> softmax over experts -> top-k per token (ties: lower expert id first):
//   ids[t, i], probs[t, i] (fp32; renormalised over the k chosen when `renormalize`), and
//   counts[e] = tokens routed to expert e (zeroed and filled by this call). experts <= 1024, k <= 32.
void softmax_topk(const bf16* logits, std::int32_t* ids, float* probs, std::int32_t* counts, std::int64_t tokens,
                  int experts, int k, bool renormalize, cudaStream_t s);
// Router backward through the softmax (not through the top-k renormalisation): with p the softmax
// of logits[t, :] and dp[e] = dprobs[t, i] where ids[t, i] == e (else 0):
//   dlogits[t, e] = p[e] * (dp[e] - sum_i p[ids[t,i]] * dprobs[t,i])
void softmax_topk_bwd(const bf16* logits, const std::int32_t* ids, const float* dprobs, bf16* dlogits,
                      std::int64_t tokens, int experts, int k, cudaStream_t s);
// Destination rows in expert-contiguous order: offsets[e] = exclusive prefix sum of counts
// ([experts + 1]), row_map[t * k + i] = the row of (token t, choice i) in the permuted tensor. Rows
// inside one expert's segment are in an unspecified (atomic) order. `cursor` is [experts] scratch.
void build_row_map(const std::int32_t* ids, const std::int32_t* counts, std::int32_t* offsets, std::int32_t* cursor,
                   std::int32_t* row_map, std::int64_t tokens, int experts, int k, cudaStream_t s);
// permute forward: out[row_map[t*k+i], :] = x[t, :]   (out [tokens * k, hidden])
void permute_fwd(const bf16* x, const std::int32_t* row_map, bf16* out, std::int64_t tokens, int k,
                 std::int64_t hidden, cudaStream_t s);
// permute backward: dx[t, :] = sum_i dout[row_map[t*k+i], :]
void permute_bwd(const bf16* dout, const std::int32_t* row_map, bf16* dx, std::int64_t tokens, int k,
                 std::int64_t hidden, cudaStream_t s);
// unpermute forward (the weighted scatter-add back, written as a gather so it is deterministic):
//   y[t, :] = sum_i probs[t, i] * expert_out[row_map[t*k+i], :]
void unpermute_fwd(const bf16* expert_out, const std::int32_t* row_map, const float* probs, bf16* y,
                   std::int64_t tokens, int k, std::int64_t hidden, cudaStream_t s);
// unpermute backward: d_expert_out[row_map[t*k+i], :] = probs[t,i] * dy[t, :];
//   dprobs[t, i] = dot(dy[t, :], expert_out[row_map[t*k+i], :])  (dprobs may be null)
void unpermute_bwd(const bf16* dy, const bf16* expert_out, const std::int32_t* row_map, const float* probs,
                   bf16* d_expert_out, float* dprobs, std::int64_t tokens, int k, std::int64_t hidden, cudaStream_t s);

}  // namespace threewalls::backend
