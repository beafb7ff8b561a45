// Memory-bound kernels: random init, residual add, SwiGLU, RMSNorm/LayerNorm, embedding,
// vocab-parallel cross-entropy pieces, AdamW. Contracts in kernels.hpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::backend {
namespace {

constexpr int kThreads = 256;

int grid_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535LL * 16 ? 65535LL * 16 : blocks));
}

void check_rows(std::int64_t rows, const char* what) {
  if (rows > 2147483647LL) throw InputError(rank_prefix() + what + ": more than 2^31-1 rows");
}

// splitmix64 finaliser of (seed, index): counter-based, so the value at i does not depend on the
// launch configuration.
__host__ __device__ inline std::uint64_t mix(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

__host__ __device__ inline float random_at(std::uint64_t seed, std::uint64_t i, float scale) {
  const std::uint64_t h = mix(seed, i);
  const float u = static_cast<float>(h >> 40) * (1.0F / 16777216.0F);  // [0, 1), 24 bits
  const float mag = fmaf(0.75F, u, 0.25F) * scale;
  return (h & 1U) != 0U ? -mag : mag;
}

template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline bf16 from_float<bf16>(float x) { return __float2bfloat16(x); }
template <>
__device__ inline fp8 from_float<fp8>(float x) { return fp8(x); }

template <class T>
__global__ void fill_random_kernel(T* x, std::int64_t n, std::uint64_t seed, float scale, bool positive) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = random_at(seed, static_cast<std::uint64_t>(i), scale);
    x[i] = from_float<T>(positive ? fabsf(v) : v);
  }
}

__global__ void fill_ids_kernel(std::int32_t* x, std::int64_t n, std::uint64_t seed, std::int32_t range) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = static_cast<std::int32_t>(mix(seed, static_cast<std::uint64_t>(i)) % static_cast<std::uint64_t>(range));
  }
}

// ---- block reductions ----
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  return v;
}
// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  float t = lane < warps ? scratch[lane] : 0.0F;
  return warp_sum(t);
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  float t = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

// ---- element-wise ----
__global__ void add_kernel(const bf16* a, const bf16* b, bf16* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t start = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const bool vec = (reinterpret_cast<std::uintptr_t>(a) % 16 == 0) && (reinterpret_cast<std::uintptr_t>(b) % 16 == 0) &&
                   (reinterpret_cast<std::uintptr_t>(out) % 16 == 0);
  std::int64_t done = 0;
  if (vec) {  // 8 bf16 (16 bytes) per access
    const std::int64_t n8 = n / 8;
    for (std::int64_t i = start; i < n8; i += stride) {
      const uint4 va = reinterpret_cast<const uint4*>(a)[i];
      const uint4 vb = reinterpret_cast<const uint4*>(b)[i];
      uint4 vo;
      const auto* pa = reinterpret_cast<const __nv_bfloat162*>(&va);
      const auto* pb = reinterpret_cast<const __nv_bfloat162*>(&vb);
      auto* po = reinterpret_cast<__nv_bfloat162*>(&vo);
#pragma unroll
      for (int j = 0; j < 4; ++j) po[j] = __hadd2(pa[j], pb[j]);
      reinterpret_cast<uint4*>(out)[i] = vo;
    }
    done = n8 * 8;
  }
  for (std::int64_t i = done + start; i < n; i += stride) out[i] = __hadd(a[i], b[i]);
}

// Element i of a SwiGLU output [rows, h] and its inputs in x [rows, 2h] (each row's gate columns,
// then its up columns): the index of its gate input (its up input is h further), the gate and the up.
struct SwigluInputs {
  std::int64_t gate_index;
  float gate;
  float up;
};
__device__ inline SwigluInputs swiglu_inputs(const bf16* x, std::int64_t i, std::int64_t h) {
  const std::int64_t r = i / h;
  const std::int64_t gi = r * 2 * h + (i - r * h);
  return {gi, __bfloat162float(x[gi]), __bfloat162float(x[gi + h])};
}

__global__ void swiglu_fwd_kernel(const bf16* x, bf16* y, std::int64_t rows, std::int64_t h) {
  const std::int64_t n = rows * h;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto [gi, g, u] = swiglu_inputs(x, i, h);
    const float silu = g / (1.0F + __expf(-g));
    y[i] = __float2bfloat16(silu * u);
  }
}

__global__ void swiglu_bwd_kernel(const bf16* dy, const bf16* x, bf16* dx, std::int64_t rows, std::int64_t h) {
  const std::int64_t n = rows * h;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto [gi, g, u] = swiglu_inputs(x, i, h);
    const float d = __bfloat162float(dy[i]);
    const float sig = 1.0F / (1.0F + __expf(-g));
    const float silu = g * sig;
    const float dsilu = sig * (1.0F + g * (1.0F - sig));
    dx[gi] = __float2bfloat16(d * u * dsilu);
    dx[gi + h] = __float2bfloat16(d * silu);
  }
}

// ---- fp8 quantisation ----
// amax of non-negative floats: their bit patterns order as ints.
__device__ inline void atomic_max_nonneg(float* a, float v) { atomicMax(reinterpret_cast<int*>(a), __float_as_int(v)); }

// Blocks of the reductions into one amax: each ends in one atomicMax on the same word, so their
// number is capped (a grid-stride loop does the rest).
constexpr int kAmaxBlocks = 2048;

// 8 bf16 (16 bytes) per load when x is 16-byte aligned; the tail one by one.
__global__ void amax_kernel(const bf16* x, float* amax, std::int64_t n) {
  __shared__ float scratch[32];
  float m = 0.0F;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t start = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  std::int64_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
    const std::int64_t n8 = n / 8;
    for (std::int64_t i = start; i < n8; i += stride) {
      const uint4 v = reinterpret_cast<const uint4*>(x)[i];
      const auto* pv = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(pv[j]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
    done = n8 * 8;
  }
  for (std::int64_t i = done + start; i < n; i += stride) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

// 32 x 32 tiles, 256 threads (8 rows of 32 per pass): the rowwise copy is written as read, the
// columnwise one from the tile in shared memory, so both are coalesced. Grid-stride over tiles.
// Also the transpose of an fp8 tensor (In = fp8, no rowwise output: y null, scale 1).
constexpr int kQuantTile = 32;
__device__ inline float to_float(bf16 v) { return __bfloat162float(v); }
__device__ inline float to_float(fp8 v) { return static_cast<float>(v); }
template <class In>
__global__ void quantize_fp8_kernel(const In* x, float scale, fp8* y, fp8* yt, float* amax, std::int64_t rows,
                                    std::int64_t cols) {
  __shared__ float tile[kQuantTile][kQuantTile + 1];
  __shared__ float scratch[32];
  const int tx = static_cast<int>(threadIdx.x % kQuantTile);
  const int ty = static_cast<int>(threadIdx.x / kQuantTile);
  const int step = static_cast<int>(blockDim.x / kQuantTile);
  const std::int64_t tiles_c = (cols + kQuantTile - 1) / kQuantTile;
  const std::int64_t tiles = tiles_c * ((rows + kQuantTile - 1) / kQuantTile);
  float m = 0.0F;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r0 = (t / tiles_c) * kQuantTile;
    const std::int64_t c0 = (t % tiles_c) * kQuantTile;
    __syncthreads();  // the previous tile's transposed writes are done
    for (int i = ty; i < kQuantTile; i += step) {
      const std::int64_t r = r0 + i;
      const std::int64_t c = c0 + tx;
      float v = 0.0F;
      if (r < rows && c < cols) {
        v = to_float(x[r * cols + c]);
        m = fmaxf(m, fabsf(v));
        if (y != nullptr) y[r * cols + c] = fp8(v * scale);
      }
      tile[i][tx] = v * scale;
    }
    if (yt == nullptr) continue;  // uniform over the block
    __syncthreads();
    for (int i = ty; i < kQuantTile; i += step) {
      const std::int64_t c = c0 + i;
      const std::int64_t r = r0 + tx;
      if (r < rows && c < cols) yt[c * rows + r] = fp8(tile[tx][i]);
    }
  }
  if (amax != nullptr) {
    m = block_max(m, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
  }
}

// The cast's fast path: 64 x 64 tiles when rows and cols are multiples of 64 and the buffers 16-byte
// aligned. A thread loads 8 bf16 of a row (16 bytes) and stores their 8 fp8 (8 bytes); the columnwise
// copy is written 16 fp8 (16 bytes) of a column at a time from the tile in shared memory.
constexpr int kQuantVecTile = 64;
__global__ void quantize_fp8_vec_kernel(const bf16* x, float scale, fp8* y, fp8* yt, float* amax, std::int64_t rows,
                                        std::int64_t cols) {
  __shared__ float tile[kQuantVecTile][kQuantVecTile + 1];
  __shared__ float scratch[32];
  const int t = static_cast<int>(threadIdx.x);  // 256 threads
  const int lr = t / 8, lc = (t % 8) * 8;       // load: rows lr and lr + 32, columns lc .. lc + 7
  const int wc = t / 4, wr = (t % 4) * 16;      // columnwise store: column wc, rows wr .. wr + 15
  const std::int64_t tiles_c = cols / kQuantVecTile;
  const std::int64_t tiles = tiles_c * (rows / kQuantVecTile);
  float m = 0.0F;
  for (std::int64_t tt = blockIdx.x; tt < tiles; tt += gridDim.x) {
    const std::int64_t r0 = (tt / tiles_c) * kQuantVecTile;
    const std::int64_t c0 = (tt % tiles_c) * kQuantVecTile;
    __syncthreads();  // the previous tile's columnwise stores have read the tile
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int r = lr + 32 * p;
      const std::int64_t off = (r0 + r) * cols + c0 + lc;
      const uint4 v = *reinterpret_cast<const uint4*>(x + off);
      const auto* pv = reinterpret_cast<const __nv_bfloat162*>(&v);
      uint2 packed;
      auto* b = reinterpret_cast<unsigned char*>(&packed);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float2 f = __bfloat1622float2(pv[j]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
        f.x *= scale;
        f.y *= scale;
        tile[r][lc + 2 * j] = f.x;
        tile[r][lc + 2 * j + 1] = f.y;
        b[2 * j] = fp8(f.x).__x;
        b[2 * j + 1] = fp8(f.y).__x;
      }
      if (y != nullptr) *reinterpret_cast<uint2*>(y + off) = packed;
    }
    if (yt == nullptr) continue;  // uniform over the block
    __syncthreads();
    uint4 packed;
    auto* b = reinterpret_cast<unsigned char*>(&packed);
#pragma unroll
    for (int j = 0; j < 16; ++j) b[j] = fp8(tile[wr + j][wc]).__x;
    *reinterpret_cast<uint4*>(yt + (c0 + wc) * rows + r0 + wr) = packed;
  }
  if (amax != nullptr) {
    m = block_max(m, scratch);
    if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
  }
}

// ---- norms: one block per row (grid-stride over rows) ----
__global__ void rmsnorm_fwd_kernel(const bf16* x, const bf16* gamma, bf16* y, float* rstd, std::int64_t rows,
                                   std::int64_t hidden, float eps) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16* xr = x + r * hidden;
    float ss = 0.0F;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float v = __bfloat162float(xr[j]);
      ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float rs = rsqrtf(ss / static_cast<float>(hidden) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      y[r * hidden + j] = __float2bfloat16(__bfloat162float(xr[j]) * rs * __bfloat162float(gamma[j]));
    }
  }
}

// dgamma partials in dynamic shared memory (hidden floats), flushed with one atomicAdd per column
// per block.
__global__ void rmsnorm_bwd_kernel(const bf16* dy, const bf16* x, const bf16* gamma, const float* rstd, bf16* dx,
                                   float* dgamma, std::int64_t rows, std::int64_t hidden) {
  extern __shared__ float dg[];
  __shared__ float scratch[32];
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) dg[j] = 0.0F;
  __syncthreads();
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float rs = rstd[r];
    float dot = 0.0F;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float g = __bfloat162float(gamma[j]);
      const float d = __bfloat162float(dy[r * hidden + j]);
      const float xv = __bfloat162float(x[r * hidden + j]);
      dot += d * g * xv;
      dg[j] += d * xv * rs;
    }
    dot = block_sum(dot, scratch);
    const float c = dot * rs * rs * rs / static_cast<float>(hidden);
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float g = __bfloat162float(gamma[j]);
      const float d = __bfloat162float(dy[r * hidden + j]);
      const float xv = __bfloat162float(x[r * hidden + j]);
      dx[r * hidden + j] = __float2bfloat16(rs * g * d - xv * c);
    }
  }
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) atomicAdd(&dgamma[j], dg[j]);
}

__global__ void layernorm_fwd_kernel(const bf16* x, const bf16* gamma, const bf16* beta, bf16* y, float* mean,
                                     float* rstd, std::int64_t rows, std::int64_t hidden, float eps) {
  __shared__ float scratch[32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16* xr = x + r * hidden;
    float s = 0.0F;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) s += __bfloat162float(xr[j]);
    const float mu = block_sum(s, scratch) / static_cast<float>(hidden);
    float ss = 0.0F;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float d = __bfloat162float(xr[j]) - mu;
      ss += d * d;
    }
    const float rs = rsqrtf(block_sum(ss, scratch) / static_cast<float>(hidden) + eps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float xh = (__bfloat162float(xr[j]) - mu) * rs;
      y[r * hidden + j] = __float2bfloat16(xh * __bfloat162float(gamma[j]) + __bfloat162float(beta[j]));
    }
  }
}

// dx = rstd * (g dy - mean(g dy) - xhat * mean(g dy xhat)); dgamma += dy xhat; dbeta += dy.
__global__ void layernorm_bwd_kernel(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean,
                                     const float* rstd, bf16* dx, float* dgamma, float* dbeta, std::int64_t rows,
                                     std::int64_t hidden) {
  extern __shared__ float dgb[];  // [2 * hidden]: dgamma then dbeta partials
  __shared__ float scratch[32];
  for (std::int64_t j = threadIdx.x; j < 2 * hidden; j += blockDim.x) dgb[j] = 0.0F;
  __syncthreads();
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float mu = mean[r];
    const float rs = rstd[r];
    float s1 = 0.0F;
    float s2 = 0.0F;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float d = __bfloat162float(dy[r * hidden + j]);
      const float xh = (__bfloat162float(x[r * hidden + j]) - mu) * rs;
      const float gd = __bfloat162float(gamma[j]) * d;
      s1 += gd;
      s2 += gd * xh;
      dgb[j] += d * xh;
      dgb[hidden + j] += d;
    }
    const float m1 = block_sum(s1, scratch) / static_cast<float>(hidden);
    const float m2 = block_sum(s2, scratch) / static_cast<float>(hidden);
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const float d = __bfloat162float(dy[r * hidden + j]);
      const float xh = (__bfloat162float(x[r * hidden + j]) - mu) * rs;
      const float gd = __bfloat162float(gamma[j]) * d;
      dx[r * hidden + j] = __float2bfloat16(rs * (gd - m1 - xh * m2));
    }
  }
  __syncthreads();
  for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    atomicAdd(&dgamma[j], dgb[j]);
    atomicAdd(&dbeta[j], dgb[hidden + j]);
  }
}

// ---- embedding ----
__global__ void embedding_fwd_kernel(const std::int32_t* ids, const bf16* table, bf16* out, std::int64_t tokens,
                                     std::int64_t hidden, std::int64_t vocab) {
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= vocab) {  // a caller bug made visible: the row becomes NaN
      for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) out[t * hidden + j] = __float2bfloat16(NAN);
      continue;
    }
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) out[t * hidden + j] = table[id * hidden + j];
  }
}

__global__ void embedding_bwd_kernel(const std::int32_t* ids, const bf16* dout, float* dtable, std::int64_t tokens,
                                     std::int64_t hidden, std::int64_t vocab) {
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= vocab) continue;
    for (std::int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      atomicAdd(&dtable[id * hidden + j], __bfloat162float(dout[t * hidden + j]));
    }
  }
}

// ---- cross-entropy pieces: one block per token row ----
__global__ void xent_max_kernel(const bf16* logits, float* row_max, std::int64_t tokens, std::int64_t shard) {
  __shared__ float scratch[32];
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float m = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < shard; j += blockDim.x) m = fmaxf(m, __bfloat162float(logits[t * shard + j]));
    m = block_max(m, scratch);
    if (threadIdx.x == 0) row_max[t] = m;
  }
}

__global__ void xent_sum_exp_kernel(const bf16* logits, const float* row_max, const std::int32_t* targets,
                                    std::int64_t vocab_start, float* sum_exp, float* target_logit, std::int64_t tokens,
                                    std::int64_t shard) {
  __shared__ float scratch[32];
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const float m = row_max[t];
    float s = 0.0F;
    for (std::int64_t j = threadIdx.x; j < shard; j += blockDim.x) s += __expf(__bfloat162float(logits[t * shard + j]) - m);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
      sum_exp[t] = s;
      const std::int64_t local = static_cast<std::int64_t>(targets[t]) - vocab_start;
      target_logit[t] = (local >= 0 && local < shard) ? __bfloat162float(logits[t * shard + local]) : 0.0F;
    }
  }
}

__global__ void xent_loss_kernel(const float* row_max, const float* sum_exp, const float* target_logit, float* loss,
                                 std::int64_t tokens) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    loss[t] = logf(sum_exp[t]) + row_max[t] - target_logit[t];
  }
}

__global__ void xent_bwd_kernel(const bf16* logits, const float* row_max, const float* sum_exp,
                                const std::int32_t* targets, std::int64_t vocab_start, const float* dloss,
                                bf16* dlogits, std::int64_t tokens, std::int64_t shard) {
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const float m = row_max[t];
    const float inv = 1.0F / sum_exp[t];
    const float g = dloss[t];
    const std::int64_t local = static_cast<std::int64_t>(targets[t]) - vocab_start;
    for (std::int64_t j = threadIdx.x; j < shard; j += blockDim.x) {
      const float p = __expf(__bfloat162float(logits[t * shard + j]) - m) * inv;
      dlogits[t * shard + j] = __float2bfloat16(g * (p - (j == local ? 1.0F : 0.0F)));
    }
  }
}

// ---- AdamW ----
__global__ void adam_kernel(float* master, const float* grad, float* m, float* v, bf16* weight, std::int64_t n,
                            float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0F - beta1) * g;
    const float vi = beta2 * v[i] + (1.0F - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float w = master[i];
    const float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * w;
    const float nw = w - lr * upd;
    master[i] = nw;
    if (weight != nullptr) weight[i] = __float2bfloat16(nw);
  }
}

int rows_grid(std::int64_t rows) {
  return static_cast<int>(rows < 1 ? 1 : (rows > 65535LL * 4 ? 65535LL * 4 : rows));
}

// Blocks for the backward norms: each block keeps a [hidden] partial of dgamma in shared memory.
int norm_bwd_grid(std::int64_t rows) {
  int dev = 0;
  int sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) static_cast<void>(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::int64_t g = 2LL * sms;
  return static_cast<int>(rows < g ? (rows < 1 ? 1 : rows) : g);
}

// Launches fill_random_kernel over x[0, n) on `s`; false (nothing launched) when n <= 0. The caller
// checks the launch with its kernel's name.
template <class T>
bool launch_fill_random(T* x, std::int64_t n, std::uint64_t seed, float scale, bool positive, cudaStream_t s) {
  if (n <= 0) return false;
  fill_random_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, seed, scale, positive);
  return true;
}

template <class Kernel>
void set_smem(Kernel kernel, std::size_t bytes, const char* what) {
  if (bytes > 48U * 1024U) {
    int dev = 0;
    int max_optin = 0;
    TW_CUDA_CHECK(cudaGetDevice(&dev));
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes + 32 * sizeof(float) > static_cast<std::size_t>(max_optin)) {
      throw InputError(rank_prefix() + what + ": hidden size too large for the shared-memory gradient partials (" +
                       std::to_string(bytes) + " bytes > " + std::to_string(max_optin) + ")");
    }
    TW_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

}  // namespace

float random_value(std::uint64_t seed, std::int64_t i, float scale) {
  return random_at(seed, static_cast<std::uint64_t>(i), scale);
}

void fill_random(bf16* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  if (launch_fill_random(x, n, seed, scale, false, s)) TW_CUDA_CHECK_LAUNCH("fill_random_kernel<bf16>");
}
void fill_random(float* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  if (launch_fill_random(x, n, seed, scale, false, s)) TW_CUDA_CHECK_LAUNCH("fill_random_kernel<float>");
}
void fill_random_positive(float* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  if (launch_fill_random(x, n, seed, scale, true, s)) TW_CUDA_CHECK_LAUNCH("fill_random_kernel<float, positive>");
}
void fill_random(fp8* x, std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  if (launch_fill_random(x, n, seed, scale, false, s)) TW_CUDA_CHECK_LAUNCH("fill_random_kernel<fp8>");
}
void fill_random_ids(std::int32_t* x, std::int64_t n, std::uint64_t seed, std::int32_t range, cudaStream_t s) {
  if (range <= 0) throw InputError(rank_prefix() + "fill_random_ids: range must be positive");
  if (n <= 0) return;
  fill_ids_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, seed, range);
  TW_CUDA_CHECK_LAUNCH("fill_ids_kernel");
}

void add(const bf16* a, const bf16* b, bf16* out, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n / 8 + 1), kThreads, 0, s>>>(a, b, out, n);
  TW_CUDA_CHECK_LAUNCH("add_kernel");
}

void amax_bf16(const bf16* x, float* amax, std::int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  amax_kernel<<<std::min(grid_for(n / 8 + 1), kAmaxBlocks), kThreads, 0, s>>>(x, amax, n);
  TW_CUDA_CHECK_LAUNCH("amax_kernel");
}

void quantize_fp8(const bf16* x, float scale, fp8* y, fp8* yt, float* amax, std::int64_t rows, std::int64_t cols,
                  cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (rows % kQuantVecTile == 0 && cols % kQuantVecTile == 0 && aligned(x) && aligned(y) && aligned(yt)) {
    const std::int64_t tiles = (rows / kQuantVecTile) * (cols / kQuantVecTile);
    quantize_fp8_vec_kernel<<<static_cast<int>(std::min<std::int64_t>(tiles, kAmaxBlocks)), kThreads, 0, s>>>(
        x, scale, y, yt, amax, rows, cols);
    TW_CUDA_CHECK_LAUNCH("quantize_fp8_vec_kernel");
    return;
  }
  const std::int64_t tiles = ((rows + kQuantTile - 1) / kQuantTile) * ((cols + kQuantTile - 1) / kQuantTile);
  const int grid = static_cast<int>(std::min<std::int64_t>(tiles, kAmaxBlocks));
  quantize_fp8_kernel<bf16><<<grid, kThreads, 0, s>>>(x, scale, y, yt, amax, rows, cols);
  TW_CUDA_CHECK_LAUNCH("quantize_fp8_kernel<bf16>");
}

void transpose_fp8(const fp8* x, fp8* yt, std::int64_t rows, std::int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t tiles = ((rows + kQuantTile - 1) / kQuantTile) * ((cols + kQuantTile - 1) / kQuantTile);
  const int grid = static_cast<int>(tiles < 65535LL * 16 ? tiles : 65535LL * 16);
  quantize_fp8_kernel<fp8><<<grid, kThreads, 0, s>>>(x, 1.0F, nullptr, yt, nullptr, rows, cols);
  TW_CUDA_CHECK_LAUNCH("quantize_fp8_kernel<fp8>");
}

void swiglu_fwd(const bf16* x, bf16* y, std::int64_t rows, std::int64_t h, cudaStream_t s) {
  if (rows * h <= 0) return;
  swiglu_fwd_kernel<<<grid_for(rows * h), kThreads, 0, s>>>(x, y, rows, h);
  TW_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}
void swiglu_bwd(const bf16* dy, const bf16* x, bf16* dx, std::int64_t rows, std::int64_t h, cudaStream_t s) {
  if (rows * h <= 0) return;
  swiglu_bwd_kernel<<<grid_for(rows * h), kThreads, 0, s>>>(dy, x, dx, rows, h);
  TW_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

void rmsnorm_fwd(const bf16* x, const bf16* gamma, bf16* y, float* rstd, std::int64_t rows, std::int64_t hidden,
                 float eps, cudaStream_t s) {
  check_rows(rows, "rmsnorm_fwd");
  if (rows <= 0 || hidden <= 0) return;
  rmsnorm_fwd_kernel<<<rows_grid(rows), kThreads, 0, s>>>(x, gamma, y, rstd, rows, hidden, eps);
  TW_CUDA_CHECK_LAUNCH("rmsnorm_fwd_kernel");
}
void rmsnorm_bwd(const bf16* dy, const bf16* x, const bf16* gamma, const float* rstd, bf16* dx, float* dgamma,
                 std::int64_t rows, std::int64_t hidden, cudaStream_t s) {
  check_rows(rows, "rmsnorm_bwd");
  if (rows <= 0 || hidden <= 0) return;
  const std::size_t smem = static_cast<std::size_t>(hidden) * sizeof(float);
  set_smem(rmsnorm_bwd_kernel, smem, "rmsnorm_bwd");
  rmsnorm_bwd_kernel<<<norm_bwd_grid(rows), kThreads, smem, s>>>(dy, x, gamma, rstd, dx, dgamma, rows, hidden);
  TW_CUDA_CHECK_LAUNCH("rmsnorm_bwd_kernel");
}
void layernorm_fwd(const bf16* x, const bf16* gamma, const bf16* beta, bf16* y, float* mean, float* rstd,
                   std::int64_t rows, std::int64_t hidden, float eps, cudaStream_t s) {
  check_rows(rows, "layernorm_fwd");
  if (rows <= 0 || hidden <= 0) return;
  layernorm_fwd_kernel<<<rows_grid(rows), kThreads, 0, s>>>(x, gamma, beta, y, mean, rstd, rows, hidden, eps);
  TW_CUDA_CHECK_LAUNCH("layernorm_fwd_kernel");
}
void layernorm_bwd(const bf16* dy, const bf16* x, const bf16* gamma, const float* mean, const float* rstd, bf16* dx,
                   float* dgamma, float* dbeta, std::int64_t rows, std::int64_t hidden, cudaStream_t s) {
  check_rows(rows, "layernorm_bwd");
  if (rows <= 0 || hidden <= 0) return;
  const std::size_t smem = 2 * static_cast<std::size_t>(hidden) * sizeof(float);
  set_smem(layernorm_bwd_kernel, smem, "layernorm_bwd");
  layernorm_bwd_kernel<<<norm_bwd_grid(rows), kThreads, smem, s>>>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows,
                                                                    hidden);
  TW_CUDA_CHECK_LAUNCH("layernorm_bwd_kernel");
}

void embedding_fwd(const std::int32_t* ids, const bf16* table, bf16* out, std::int64_t tokens, std::int64_t hidden,
                   std::int64_t vocab, cudaStream_t s) {
  if (tokens <= 0) return;
  embedding_fwd_kernel<<<rows_grid(tokens), kThreads, 0, s>>>(ids, table, out, tokens, hidden, vocab);
  TW_CUDA_CHECK_LAUNCH("embedding_fwd_kernel");
}
void embedding_bwd(const std::int32_t* ids, const bf16* dout, float* dtable, std::int64_t tokens, std::int64_t hidden,
                   std::int64_t vocab, cudaStream_t s) {
  if (tokens <= 0) return;
  embedding_bwd_kernel<<<rows_grid(tokens), kThreads, 0, s>>>(ids, dout, dtable, tokens, hidden, vocab);
  TW_CUDA_CHECK_LAUNCH("embedding_bwd_kernel");
}

void xent_max(const bf16* logits, float* row_max, std::int64_t tokens, std::int64_t shard, cudaStream_t s) {
  if (tokens <= 0) return;
  xent_max_kernel<<<rows_grid(tokens), kThreads, 0, s>>>(logits, row_max, tokens, shard);
  TW_CUDA_CHECK_LAUNCH("xent_max_kernel");
}
void xent_sum_exp(const bf16* logits, const float* row_max, const std::int32_t* targets, std::int64_t vocab_start,
                  float* sum_exp, float* target_logit, std::int64_t tokens, std::int64_t shard, cudaStream_t s) {
  if (tokens <= 0) return;
  xent_sum_exp_kernel<<<rows_grid(tokens), kThreads, 0, s>>>(logits, row_max, targets, vocab_start, sum_exp,
                                                             target_logit, tokens, shard);
  TW_CUDA_CHECK_LAUNCH("xent_sum_exp_kernel");
}
void xent_loss(const float* row_max, const float* sum_exp, const float* target_logit, float* loss, std::int64_t tokens,
               cudaStream_t s) {
  if (tokens <= 0) return;
  xent_loss_kernel<<<grid_for(tokens), kThreads, 0, s>>>(row_max, sum_exp, target_logit, loss, tokens);
  TW_CUDA_CHECK_LAUNCH("xent_loss_kernel");
}
void xent_bwd(const bf16* logits, const float* row_max, const float* sum_exp, const std::int32_t* targets,
              std::int64_t vocab_start, const float* dloss, bf16* dlogits, std::int64_t tokens, std::int64_t shard,
              cudaStream_t s) {
  if (tokens <= 0) return;
  xent_bwd_kernel<<<rows_grid(tokens), kThreads, 0, s>>>(logits, row_max, sum_exp, targets, vocab_start, dloss, dlogits,
                                                         tokens, shard);
  TW_CUDA_CHECK_LAUNCH("xent_bwd_kernel");
}

void adam_step(float* master, const float* grad, float* m, float* v, bf16* weight, std::int64_t n, const AdamParams& p,
               cudaStream_t s) {
  if (n <= 0) return;
  if (p.step < 1) throw InputError(rank_prefix() + "adam_step: step must be >= 1 (bias correction)");
  const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), p.step));
  const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), p.step));
  adam_kernel<<<grid_for(n), kThreads, 0, s>>>(master, grad, m, v, weight, n, p.lr, p.beta1, p.beta2, p.eps,
                                               p.weight_decay, bc1, bc2);
  TW_CUDA_CHECK_LAUNCH("adam_kernel");
}

}  // namespace threewalls::backend
