#pragma once
// Decode attention over a KV cache (one new query per sequence), flash-decoding style: the cache is
// split along its length, each split computes a partial softmax-weighted sum (its running max and
// sum of exponentials kept in fp32), and a reduction kernel combines the splits into O and the
// log-sum-exp. Memory bound: each key/value row is read once per key/value head, shared by the
// heads / kv_heads query heads that read it (GQA).
//
// Layout: q [batch, heads, 1, dqk]; the cache k [batch, kv_heads, capacity, dqk] and
// v [batch, kv_heads, capacity, dv] of which the first seq_kv rows are valid; o [batch, heads, 1, dv]
// bf16; lse [batch, heads] fp32 (natural log, same convention as Attention). Every cached key is
// visible (the causal mask of a single query at the end of the sequence; a sliding window shorter
// than seq_kv is refused: the cache passed is the window's keys). Scores scaled by 1/sqrt(dqk).
// Supported head dims (dqk, dv): (64, 64), (128, 128), (128, 64), (192, 128), (256, 256); query heads per
// kv head (heads / kv_heads) up to 16, up to 8 when dqk > 128.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/handles.hpp"

namespace threewalls::backend {

class DecodeAttention {
 public:
  DecodeAttention();

  // Throws InputError for seq_q != 1, a window < seq_kv, unsupported head dims or group size,
  // capacity < seq_kv.
  // capacity = 0 means seq_kv (a cache filled to its end).
  void forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
               cudaStream_t stream, std::int64_t capacity = 0);
  // Sizes the partial-result workspace for `s` so that forward allocates nothing. Synchronous.
  void reserve(const AttentionShape& s);
  // Splits along the cache that forward uses for `s` (exposed for tests and the bench).
  [[nodiscard]] int splits(const AttentionShape& s) const;
  [[nodiscard]] std::size_t workspace_bytes() const { return partial_.size(); }

 private:
  int sm_count_ = 0;
  DeviceBuffer partial_;  // per (batch, head, split): max, sum, then dv accumulators (fp32)
};

// Throws InputError naming the shape when DecodeAttention cannot run it (see forward). Needs no GPU.
void validate_decode_attention(const AttentionShape& s, std::int64_t capacity = 0);
// Whether DecodeAttention runs `s` (a cache filled to its end); when not, `why` says why.
[[nodiscard]] bool decode_attention_supports(const AttentionShape& s, std::string* why = nullptr);

// Bytes of K and V a decode step reads: batch * kv_heads * seq_kv * (dqk + dv) * 2.
[[nodiscard]] double decode_kv_bytes(const AttentionShape& s);

namespace detail {
struct DecodeLaunch {
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr;
  bf16* o = nullptr;
  float* lse = nullptr;
  float* partial = nullptr;
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_kv = 0, capacity = 0, dqk = 0, dv = 0;
  int splits = 1;
};
void launch_decode_attention(const DecodeLaunch& l, cudaStream_t stream);
}  // namespace detail

}  // namespace threewalls::backend
