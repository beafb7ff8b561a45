#pragma once
// Fused attention, forward and backward, through cuDNN 9's scaled-dot-product-attention operation
// graph (the graph its flash-attention engines recognise: Q K^T, scale, optional causal mask,
// softmax with its log-sum-exp statistics, P V; and the matching backward graph). The scores never
// reach memory.
//
// Layout and semantics are those of Attention (attention.hpp): q [batch, heads, seq_q, dqk],
// k [batch, kv_heads, seq_kv, dqk], v [batch, kv_heads, seq_kv, dv], o / do [batch, heads, seq_q, dv]
// bf16; lse [batch, heads, seq_q] fp32 (natural log-sum-exp of each scaled score row, written by
// forward and read by backward: the two implementations' lse are interchangeable). Scores are scaled
// by 1/sqrt(dqk); the causal mask is bottom-right aligned (query i sees keys j <= i + seq_kv - seq_q),
// and a sliding window w also hides keys j <= i + seq_kv - seq_q - w (core/attention_mask.hpp), built
// into the graph as WindowMask says.
// Head layouts: MHA (kv_heads = heads), GQA (heads a multiple of kv_heads; query head h reads kv head
// h / (heads / kv_heads)), MLA (dqk != dv, e.g. 192 and 128).
//
// Plans: the first call for a shape (batch, seq_q, seq_kv, heads, kv_heads, dqk, dv, causal, window,
// direction) builds cuDNN's operation graph, asks its heuristics for engine configurations and keeps
// the first that finalises; later calls reuse it. reserve() builds the plan and sizes the workspace
// ahead of time, so that forward/backward allocate nothing (CUDA graph capture). The workspace is one
// device buffer owned by this object, grown to the largest plan's need.
//
// Errors: a build without cuDNN throws DeviceError at construction, naming what is missing and the
// unfused alternative; a shape no cuDNN engine supports throws DeviceError naming the shape; bad
// dimensions throw InputError.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "threewalls/backend/attention.hpp"

namespace threewalls::backend {

// Whether this build can run fused attention (built with cuDNN). When not, `reason` says why.
[[nodiscard]] bool fused_attention_built(std::string* reason = nullptr);

// How the graph masks a sliding window; both keep the same (query, key) pairs. `band`: the subgraph
// cudnn-frontend emits for a sliding window in cuDNN's SDPA graphs: the causal select, then a second
// select keeping col + w - (seq_kv - seq_q) > row. `conjunction`: one select on (row' >= col) AND
// (col + w > row'), row' = row + seq_kv - seq_q. A windowed plan tries the preferred form, then the
// other, and is unsupported when cuDNN plans neither.
enum class WindowMask : std::uint8_t { band, conjunction };
[[nodiscard]] const char* window_mask_name(WindowMask m);  // "band", "conjunction"

class FusedAttention {
 public:
  explicit FusedAttention(WindowMask preferred = WindowMask::band);
  ~FusedAttention();
  FusedAttention(const FusedAttention&) = delete;
  FusedAttention& operator=(const FusedAttention&) = delete;

  // dq, dk, dv are written (not accumulated).
  void forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
               cudaStream_t stream);
  void backward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                const float* lse, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream);
  // Builds the plan for `s` (forward, and backward when `backward`) and grows the workspace to fit.
  // Synchronous.
  void reserve(const AttentionShape& s, bool backward);

  [[nodiscard]] std::size_t workspace_bytes() const;
  [[nodiscard]] std::size_t plans() const;  // plans built so far (for tests: caching works)
  // The window form the plan built for (s, backward) masks with; nullopt when that plan has no window
  // (or is not built yet).
  [[nodiscard]] std::optional<WindowMask> window_mask(const AttentionShape& s, bool backward) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace threewalls::backend
