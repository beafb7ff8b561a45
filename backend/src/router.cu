// MoE routing: softmax + top-k, expert-contiguous row map, permute / unpermute forward and backward.
// Contracts in kernels.hpp.
#include <cstdint>
#include <string>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::backend {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kPerLane = kMaxExperts / 32;
constexpr int kMaxTopk = 32;

// One warp per token: each lane keeps experts lane, lane+32, ... in registers (compile-time indices
// only, so the array stays in registers).
__global__ void softmax_topk_kernel(const bf16* logits, std::int32_t* ids, float* probs, std::int32_t* counts,
                                    std::int64_t tokens, int experts, int k, bool renormalize) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t t = blockIdx.x * warps_per_block + threadIdx.x / 32; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    float v[kPerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = j * 32 + lane;
      v[j] = e < experts ? __bfloat162float(logits[t * experts + e]) : -INFINITY;
      mx = fmaxf(mx, v[j]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, o));
    float sum = 0.0F;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = j * 32 + lane;
      v[j] = e < experts ? __expf(v[j] - mx) : -1.0F;  // probabilities are >= 0; -1 marks "not an expert"
      if (e < experts) sum += v[j];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, o);
    const float inv = 1.0F / sum;
    float chosen_sum = 0.0F;
    float my_prob = 0.0F;  // lane i < k keeps choice i
    int my_id = 0;
    for (int i = 0; i < k; ++i) {
      float best = -2.0F;
      int best_e = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int e = j * 32 + lane;
        if (v[j] > best) {  // strict: the lowest index wins ties inside a lane
          best = v[j];
          best_e = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffU, best, o);
        const int oe = __shfl_xor_sync(0xffffffffU, best_e, o);
        if (ob > best || (ob == best && oe < best_e)) {
          best = ob;
          best_e = oe;
        }
      }
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (j * 32 + lane == best_e) v[j] = -2.0F;  // taken
      }
      const float p = best * inv;
      chosen_sum += p;
      if (lane == i) {
        my_prob = p;
        my_id = best_e;
      }
    }
    if (lane < k) {
      ids[t * k + lane] = my_id;
      probs[t * k + lane] = renormalize ? my_prob / chosen_sum : my_prob;
      atomicAdd(&counts[my_id], 1);
    }
  }
}

__global__ void softmax_topk_bwd_kernel(const bf16* logits, const std::int32_t* ids, const float* dprobs,
                                        bf16* dlogits, std::int64_t tokens, int experts, int k) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t t = blockIdx.x * warps_per_block + threadIdx.x / 32; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    float p[kPerLane];
    float dp[kPerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = j * 32 + lane;
      p[j] = e < experts ? __bfloat162float(logits[t * experts + e]) : -INFINITY;
      dp[j] = 0.0F;
      mx = fmaxf(mx, p[j]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, o));
    float sum = 0.0F;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      p[j] = (j * 32 + lane) < experts ? __expf(p[j] - mx) : 0.0F;
      sum += p[j];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, o);
    const float inv = 1.0F / sum;
    float dot = 0.0F;
    for (int i = 0; i < k; ++i) {
      const int id = ids[t * k + i];
      const float g = dprobs[t * k + i];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (j * 32 + lane == id) {
          dp[j] += g;
          dot += p[j] * inv * g;
        }
      }
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffU, dot, o);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = j * 32 + lane;
      if (e < experts) dlogits[t * experts + e] = __float2bfloat16(p[j] * inv * (dp[j] - dot));
    }
  }
}

// offsets = exclusive scan of counts (one block, experts <= 1024), cursor = offsets.
__global__ void scan_counts_kernel(const std::int32_t* counts, std::int32_t* offsets, std::int32_t* cursor,
                                   int experts) {
  __shared__ std::int32_t buf[kMaxExperts];
  const int i = threadIdx.x;
  buf[i] = i < experts ? counts[i] : 0;
  __syncthreads();
  for (int d = 1; d < kMaxExperts; d <<= 1) {  // Hillis-Steele inclusive scan
    const std::int32_t add = i >= d ? buf[i - d] : 0;
    __syncthreads();
    buf[i] += add;
    __syncthreads();
  }
  if (i < experts) {
    const std::int32_t excl = buf[i] - counts[i];
    offsets[i] = excl;
    cursor[i] = excl;
  }
  if (i == experts - 1) offsets[experts] = buf[i];
}

__global__ void assign_rows_kernel(const std::int32_t* ids, std::int32_t* cursor, std::int32_t* row_map,
                                   std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    row_map[i] = atomicAdd(&cursor[ids[i]], 1);
  }
}

// Row copies use 16-byte vectors when every row start is 16-byte aligned (hidden % 8 == 0).
__global__ void permute_fwd_kernel(const bf16* x, const std::int32_t* row_map, bf16* out, std::int64_t tokens, int k,
                                   std::int64_t hidden) {
  const bool vec = hidden % 8 == 0;
  for (std::int64_t tk = blockIdx.x; tk < tokens * k; tk += gridDim.x) {
    const std::int64_t t = tk / k;
    const std::int64_t dst = row_map[tk];
    if (vec) {
      const auto* src = reinterpret_cast<const uint4*>(x + t * hidden);
      auto* d = reinterpret_cast<uint4*>(out + dst * hidden);
      for (std::int64_t j = threadIdx.x; j < hidden / 8; j += blockDim.x) d[j] = src[j];
    } else {
      for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) out[dst * hidden + j] = x[t * hidden + j];
    }
  }
}

// y[t] = sum_i w_i * rows[row_map[t*k+i]] with w_i = probs[t,i] (or 1 when probs is null).
__global__ void gather_sum_kernel(const bf16* rows, const std::int32_t* row_map, const float* probs, bf16* y,
                                  std::int64_t tokens, int k, std::int64_t hidden) {
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      float acc = 0.0F;
      for (int i = 0; i < k; ++i) {
        const std::int64_t r = row_map[t * k + i];
        const float w = probs != nullptr ? probs[t * k + i] : 1.0F;
        acc += w * __bfloat162float(rows[r * hidden + j]);
      }
      y[t * hidden + j] = __float2bfloat16(acc);
    }
  }
}

__global__ void unpermute_bwd_kernel(const bf16* dy, const bf16* expert_out, const std::int32_t* row_map,
                                     const float* probs, bf16* d_expert_out, float* dprobs, std::int64_t tokens, int k,
                                     std::int64_t hidden) {
  __shared__ float scratch[32];
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int i = 0; i < k; ++i) {
      const std::int64_t r = row_map[t * k + i];
      const float p = probs[t * k + i];
      float dot = 0.0F;
      for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
        const float g = __bfloat162float(dy[t * hidden + j]);
        d_expert_out[r * hidden + j] = __float2bfloat16(p * g);
        if (dprobs != nullptr) dot += g * __bfloat162float(expert_out[r * hidden + j]);
      }
      if (dprobs != nullptr) {
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffU, dot, o);
        __syncthreads();
        if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = dot;
        __syncthreads();
        if (threadIdx.x == 0) {
          float s = 0.0F;
          for (unsigned w = 0; w < blockDim.x / 32; ++w) s += scratch[w];
          dprobs[t * k + i] = s;
        }
      }
    }
  }
}

int blocks_for_rows(std::int64_t rows) {
  return static_cast<int>(rows < 1 ? 1 : (rows > 65535LL * 4 ? 65535LL * 4 : rows));
}

void check_routing(int experts, int k, const char* what) {
  if (experts < 1 || experts > kMaxExperts || k < 1 || k > kMaxTopk || k > experts) {
    throw InputError(rank_prefix() + what + ": experts = " + std::to_string(experts) + ", topk = " + std::to_string(k) +
                     ": supported are 1 <= experts <= " + std::to_string(kMaxExperts) + " and 1 <= topk <= min(" +
                     std::to_string(kMaxTopk) + ", experts)");
  }
}

}  // namespace

void softmax_topk(const bf16* logits, std::int32_t* ids, float* probs, std::int32_t* counts, std::int64_t tokens,
                  int experts, int k, bool renormalize, cudaStream_t s) {
  check_routing(experts, k, "softmax_topk");
  TW_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(experts) * sizeof(std::int32_t), s));
  if (tokens <= 0) return;
  constexpr int kWarps = 8;
  const std::int64_t blocks = (tokens + kWarps - 1) / kWarps;
  softmax_topk_kernel<<<blocks_for_rows(blocks), kWarps * 32, 0, s>>>(logits, ids, probs, counts, tokens, experts, k,
                                                                      renormalize);
  TW_CUDA_CHECK_LAUNCH("softmax_topk_kernel");
}

void softmax_topk_bwd(const bf16* logits, const std::int32_t* ids, const float* dprobs, bf16* dlogits,
                      std::int64_t tokens, int experts, int k, cudaStream_t s) {
  check_routing(experts, k, "softmax_topk_bwd");
  if (tokens <= 0) return;
  constexpr int kWarps = 8;
  const std::int64_t blocks = (tokens + kWarps - 1) / kWarps;
  softmax_topk_bwd_kernel<<<blocks_for_rows(blocks), kWarps * 32, 0, s>>>(logits, ids, dprobs, dlogits, tokens,
                                                                          experts, k);
  TW_CUDA_CHECK_LAUNCH("softmax_topk_bwd_kernel");
}

void build_row_map(const std::int32_t* ids, const std::int32_t* counts, std::int32_t* offsets, std::int32_t* cursor,
                   std::int32_t* row_map, std::int64_t tokens, int experts, int k, cudaStream_t s) {
  check_routing(experts, k, "build_row_map");
  scan_counts_kernel<<<1, kMaxExperts, 0, s>>>(counts, offsets, cursor, experts);
  TW_CUDA_CHECK_LAUNCH("scan_counts_kernel");
  const std::int64_t n = tokens * k;
  if (n <= 0) return;
  assign_rows_kernel<<<blocks_for_rows((n + 255) / 256), 256, 0, s>>>(ids, cursor, row_map, n);
  TW_CUDA_CHECK_LAUNCH("assign_rows_kernel");
}

void permute_fwd(const bf16* x, const std::int32_t* row_map, bf16* out, std::int64_t tokens, int k,
                 std::int64_t hidden, cudaStream_t s) {
  if (tokens <= 0 || hidden <= 0) return;
  permute_fwd_kernel<<<blocks_for_rows(tokens * k), 128, 0, s>>>(x, row_map, out, tokens, k, hidden);
  TW_CUDA_CHECK_LAUNCH("permute_fwd_kernel");
}

void permute_bwd(const bf16* dout, const std::int32_t* row_map, bf16* dx, std::int64_t tokens, int k,
                 std::int64_t hidden, cudaStream_t s) {
  if (tokens <= 0 || hidden <= 0) return;
  gather_sum_kernel<<<blocks_for_rows(tokens), 256, 0, s>>>(dout, row_map, nullptr, dx, tokens, k, hidden);
  TW_CUDA_CHECK_LAUNCH("gather_sum_kernel (permute_bwd)");
}

void unpermute_fwd(const bf16* expert_out, const std::int32_t* row_map, const float* probs, bf16* y,
                   std::int64_t tokens, int k, std::int64_t hidden, cudaStream_t s) {
  if (tokens <= 0 || hidden <= 0) return;
  gather_sum_kernel<<<blocks_for_rows(tokens), 256, 0, s>>>(expert_out, row_map, probs, y, tokens, k, hidden);
  TW_CUDA_CHECK_LAUNCH("gather_sum_kernel (unpermute_fwd)");
}

void unpermute_bwd(const bf16* dy, const bf16* expert_out, const std::int32_t* row_map, const float* probs,
                   bf16* d_expert_out, float* dprobs, std::int64_t tokens, int k, std::int64_t hidden, cudaStream_t s) {
  if (tokens <= 0 || hidden <= 0) return;
  unpermute_bwd_kernel<<<blocks_for_rows(tokens), 256, 0, s>>>(dy, expert_out, row_map, probs, d_expert_out, dprobs,
                                                               tokens, k, hidden);
  TW_CUDA_CHECK_LAUNCH("unpermute_bwd_kernel");
}

}  // namespace threewalls::backend
