// Masked softmax kernels between the attention GEMMs (see attention.hpp for the block layout).
#include <cstdint>

#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/core/attention_mask.hpp"

namespace threewalls::backend {
namespace {

constexpr int kThreads = 256;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}

// The columns [lo, hi) of row r that the mask keeps (causal: the query's keys, causal_key_range,
// shifted by the block's first key kv0).
__device__ inline KeyRange visible(const ScoreBlock& b, std::int64_t r_in_head) {
  if (!b.causal) return {0, b.kv_len};
  const KeyRange keys = causal_key_range(b.q0 + r_in_head, b.seq_q, b.seq_kv, b.window);
  const std::int64_t lo = keys.lo - b.kv0, hi = keys.hi - b.kv0;
  return {lo < 0 ? 0 : (lo > b.kv_len ? b.kv_len : lo), hi < 0 ? 0 : (hi > b.kv_len ? b.kv_len : hi)};
}

// One block per score row: online max/sum per thread, combined over the block, then P written.
__global__ void softmax_fwd_kernel(bf16* scores, float* lse, ScoreBlock b) {
  __shared__ float sm[32];
  __shared__ float ss[32];
  const std::int64_t rows = b.bh * b.rows_per_head;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t h = row / b.rows_per_head;
    const std::int64_t r = row - h * b.rows_per_head;
    bf16* s = scores + row * b.kv_len;
    const KeyRange vis = visible(b, r);
    float m = -INFINITY;
    float sum = 0.0F;
    for (std::int64_t j = vis.lo + threadIdx.x; j < vis.hi; j += blockDim.x) {
      const float x = __bfloat162float(s[j]);
      if (x > m) {
        sum = sum * __expf(m - x) + 1.0F;
        m = x;
      } else {
        sum += __expf(x - m);
      }
    }
    // Combine (m, sum) pairs: first over the warp, then over warps.
    for (int o = 16; o > 0; o >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffU, m, o);
      const float os = __shfl_xor_sync(0xffffffffU, sum, o);
      const float nm = fmaxf(m, om);
      sum = (m == -INFINITY ? 0.0F : sum * __expf(m - nm)) + (om == -INFINITY ? 0.0F : os * __expf(om - nm));
      m = nm;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      sm[threadIdx.x / 32] = m;
      ss[threadIdx.x / 32] = sum;
    }
    __syncthreads();
    float gm = -INFINITY;
    const int warps = static_cast<int>(blockDim.x / 32);
    for (int w = 0; w < warps; ++w) gm = fmaxf(gm, sm[w]);
    float gs = 0.0F;
    for (int w = 0; w < warps; ++w) gs += sm[w] == -INFINITY ? 0.0F : ss[w] * __expf(sm[w] - gm);
    const float inv = gs > 0.0F ? 1.0F / gs : 0.0F;
    for (std::int64_t j = threadIdx.x; j < b.kv_len; j += blockDim.x) {
      const float p = j >= vis.lo && j < vis.hi ? __expf(__bfloat162float(s[j]) - gm) * inv : 0.0F;
      s[j] = __float2bfloat16(p);
    }
    if (threadIdx.x == 0) lse[h * b.seq_q + b.q0 + r] = vis.hi > vis.lo ? gm + logf(gs) : -INFINITY;
  }
}

__global__ void probs_from_lse_kernel(bf16* scores, const float* lse, ScoreBlock b) {
  const std::int64_t rows = b.bh * b.rows_per_head;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t h = row / b.rows_per_head;
    const std::int64_t r = row - h * b.rows_per_head;
    bf16* s = scores + row * b.kv_len;
    const KeyRange vis = visible(b, r);
    const float l = lse[h * b.seq_q + b.q0 + r];
    for (std::int64_t j = threadIdx.x; j < b.kv_len; j += blockDim.x) {
      s[j] = __float2bfloat16(j >= vis.lo && j < vis.hi ? __expf(__bfloat162float(s[j]) - l) : 0.0F);
    }
  }
}

__global__ void dscores_kernel(const bf16* probs, bf16* dprobs, const float* row_dot, ScoreBlock b) {
  const std::int64_t rows = b.bh * b.rows_per_head;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t h = row / b.rows_per_head;
    const std::int64_t r = row - h * b.rows_per_head;
    const float d = row_dot[h * b.seq_q + b.q0 + r];
    const bf16* p = probs + row * b.kv_len;
    bf16* dp = dprobs + row * b.kv_len;
    for (std::int64_t j = threadIdx.x; j < b.kv_len; j += blockDim.x) {
      dp[j] = __float2bfloat16(__bfloat162float(p[j]) * (__bfloat162float(dp[j]) - d));
    }
  }
}

// One warp per row.
__global__ void row_dot_kernel(const bf16* d_o, const bf16* o, float* row_dot, std::int64_t rows, std::int64_t dv) {
  const std::int64_t warps = blockDim.x / 32;
  for (std::int64_t row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += static_cast<std::int64_t>(gridDim.x) * warps) {
    float acc = 0.0F;
    for (std::int64_t j = threadIdx.x % 32; j < dv; j += 32) {
      acc += __bfloat162float(d_o[row * dv + j]) * __bfloat162float(o[row * dv + j]);
    }
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) row_dot[row] = acc;
  }
}

int row_blocks(std::int64_t rows) {
  return static_cast<int>(rows < 1 ? 1 : (rows > 65535LL * 8 ? 65535LL * 8 : rows));
}

}  // namespace

void attention_softmax_fwd(bf16* scores, float* lse, const ScoreBlock& b, cudaStream_t s) {
  softmax_fwd_kernel<<<row_blocks(b.bh * b.rows_per_head), kThreads, 0, s>>>(scores, lse, b);
  TW_CUDA_CHECK_LAUNCH("softmax_fwd_kernel");
}
void attention_probs_from_lse(bf16* scores, const float* lse, const ScoreBlock& b, cudaStream_t s) {
  probs_from_lse_kernel<<<row_blocks(b.bh * b.rows_per_head), kThreads, 0, s>>>(scores, lse, b);
  TW_CUDA_CHECK_LAUNCH("probs_from_lse_kernel");
}
void attention_dscores(const bf16* probs, bf16* dprobs, const float* row_dot, const ScoreBlock& b, cudaStream_t s) {
  dscores_kernel<<<row_blocks(b.bh * b.rows_per_head), kThreads, 0, s>>>(probs, dprobs, row_dot, b);
  TW_CUDA_CHECK_LAUNCH("dscores_kernel");
}
void attention_row_dot(const bf16* d_o, const bf16* o, float* row_dot, std::int64_t rows, std::int64_t dv,
                       cudaStream_t s) {
  if (rows <= 0) return;
  row_dot_kernel<<<row_blocks((rows + 7) / 8), kThreads, 0, s>>>(d_o, o, row_dot, rows, dv);
  TW_CUDA_CHECK_LAUNCH("row_dot_kernel");
}

}  // namespace threewalls::backend
