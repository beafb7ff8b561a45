// Split-KV decode attention kernels (see decode_attention.hpp).
//
// Kernel 1, one block per (split, kv head, sequence), 4 warps. The query heads that share the kv head
// (GQA) are staged in shared memory (fp32, pre-scaled); the warps take the split's keys in chunks of
// 32, one key per lane: a lane reads its key row whole and forms the scores of every query head of the
// group (no cross-lane reduction per key), the warp then updates an online softmax per head in the log2
// domain (one max and one sum across lanes per head and chunk) and accumulates sum p v with the lanes
// owning the value dims (each value row read once, coalesced, for all the group's heads). Each K and V
// row is read from memory once per kv head. The block combines its warps through shared memory and
// writes (m, l, acc) per query head.
#include <cstdint>

#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/core/decode_attention_geometry.hpp"

namespace threewalls::backend::detail {
namespace {

constexpr int kWarps = static_cast<int>(kDecodeWarps);
constexpr float kLog2e = 1.4426950408889634F;
constexpr float kLn2 = 0.6931471805599453F;

// N contiguous bf16 (N even) from `p` (aligned to 2 N bytes when N is 2, 4 or 8) as floats.
template <int N>
__device__ inline void load_row(const bf16* p, float (&out)[N]) {
  if constexpr (N == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else if constexpr (N == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(p);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

__device__ inline float warp_allsum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}

__device__ inline float warp_allmax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  return v;
}

// Keys per chunk: one per lane.
constexpr int kChunk = static_cast<int>(kDecodeChunkKeys);
static_assert(kChunk == 32, "one key per lane of a warp");

// Floats of dynamic shared memory the split kernel uses: the staged queries and each warp's chunk of
// probabilities while the keys are read, then (reused) each warp's (m, l, acc) per head to combine.
template <int QK, int VD, int G>
constexpr std::size_t split_smem_floats() {
  const std::size_t loop = static_cast<std::size_t>(G) * QK * 32 + static_cast<std::size_t>(kWarps) * kChunk * G;
  const std::size_t combine = static_cast<std::size_t>(kWarps) * G * (2 + VD * 32);
  return loop > combine ? loop : combine;
}

// QK = dqk / 32, VD = dv / 32 elements per lane of a value row; G >= heads / kv_heads query heads per kv
// head (a multiple of 4 when above 2, so a chunk's probabilities of one key are read as float4s).
template <int QK, int VD, int G>
__global__ void __launch_bounds__(kWarps * 32) decode_split_kernel(DecodeLaunch l, float scale_log2) {
  constexpr int kDqk = QK * 32;
  constexpr int kDv = VD * 32;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* sq = smem;             // [G][kDqk] scaled queries
  float* sp = smem + G * kDqk;  // [kWarps][kChunk][G] probabilities of the warp's chunk
  const int split = static_cast<int>(blockIdx.x);
  const std::int64_t kvh = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group = static_cast<int>(l.heads / l.kv_heads);
  const std::int64_t chunk = (l.seq_kv + l.splits - 1) / l.splits;
  const std::int64_t j0 = split * chunk;
  const std::int64_t j1 = j0 + chunk < l.seq_kv ? j0 + chunk : l.seq_kv;

  const bf16* qbase = l.q + (b * l.heads + kvh * group) * kDqk;
  for (int idx = static_cast<int>(threadIdx.x); idx < G * kDqk; idx += kWarps * 32) {
    sq[idx] = idx < group * kDqk ? __bfloat162float(qbase[idx]) * scale_log2 : 0.0F;
  }
  __syncthreads();

  float m[G], sum[G], acc[G][VD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    sum[g] = 0.0F;
#pragma unroll
    for (int i = 0; i < VD; ++i) acc[g][i] = 0.0F;
  }
  const bf16* kbase = l.k + (b * l.kv_heads + kvh) * l.capacity * kDqk;
  const bf16* vbase = l.v + (b * l.kv_heads + kvh) * l.capacity * kDv + lane * VD;
  float* wp = sp + warp * kChunk * G;
  for (std::int64_t c0 = j0 + warp * kChunk; c0 < j1; c0 += kWarps * kChunk) {
    const std::int64_t j = c0 + lane;
    const bool valid = j < j1;
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.0F;
    if (valid) {
      const bf16* kr = kbase + j * kDqk;
#pragma unroll
      for (int d = 0; d < kDqk; d += 8) {
        float kf[8];
        load_row<8>(kr + d, kf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float4 a = *reinterpret_cast<const float4*>(sq + g * kDqk + d);
          const float4 c = *reinterpret_cast<const float4*>(sq + g * kDqk + d + 4);
          s[g] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + c.x * kf[4] + c.y * kf[5] + c.z * kf[6] +
                  c.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g < group) {
        const float sg = valid ? s[g] : -INFINITY;
        const float mn = fmaxf(m[g], warp_allmax(sg));  // lane 0's key is valid: finite
        const float c = exp2f(m[g] - mn);
        const float p = valid ? exp2f(sg - mn) : 0.0F;
        sum[g] = sum[g] * c + warp_allsum(p);
#pragma unroll
        for (int i = 0; i < VD; ++i) acc[g][i] *= c;
        m[g] = mn;
        wp[lane * G + g] = p;
      }
    }
    __syncwarp();
    const int n = j1 - c0 < kChunk ? static_cast<int>(j1 - c0) : kChunk;
#pragma unroll 4
    for (int t = 0; t < n; ++t) {
      float vf[VD];
      load_row<VD>(vbase + (c0 + t) * kDv, vf);
      float p[G];
      if constexpr (G >= 4) {
#pragma unroll
        for (int g = 0; g < G; g += 4) {
          const float4 f = *reinterpret_cast<const float4*>(wp + t * G + g);
          p[g] = f.x;
          p[g + 1] = f.y;
          p[g + 2] = f.z;
          p[g + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int g = 0; g < G; ++g) p[g] = wp[t * G + g];
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g < group) {
#pragma unroll
          for (int i = 0; i < VD; ++i) acc[g][i] += p[g] * vf[i];
        }
      }
    }
    __syncwarp();
  }
  __syncthreads();  // the loop's shared memory is reused below
  // Combine the warps.
  const int row = 2 + static_cast<int>(l.dv);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < group) {
      float* w = smem + (warp * G + g) * row;
      if (lane == 0) {
        w[0] = m[g];
        w[1] = sum[g];
      }
#pragma unroll
      for (int i = 0; i < VD; ++i) w[2 + lane * VD + i] = acc[g][i];
    }
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < group * (static_cast<int>(l.dv) + 1); idx += kWarps * 32) {
    const int g = idx / (static_cast<int>(l.dv) + 1);
    const int d = idx % (static_cast<int>(l.dv) + 1) - 1;  // -1: the (m, l) pair
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, smem[(w * G + g) * row]);
    const std::int64_t h = kvh * group + g;
    float* out = l.partial + ((b * l.heads + h) * l.splits + split) * row;
    float total = 0.0F;
    for (int w = 0; w < kWarps; ++w) {
      const float* src = smem + (w * G + g) * row;
      const float f = mx == -INFINITY ? 0.0F : exp2f(src[0] - mx);
      total += f * (d < 0 ? src[1] : src[2 + d]);
    }
    if (d < 0) {
      out[0] = mx;
      out[1] = total;
    } else {
      out[2 + d] = total;
    }
  }
}

__global__ void decode_combine_kernel(DecodeLaunch l) {
  const std::int64_t bh = blockIdx.x;
  const int row = 2 + static_cast<int>(l.dv);
  const float* part = l.partial + bh * l.splits * row;
  float mx = -INFINITY;
  for (int s = 0; s < l.splits; ++s) mx = fmaxf(mx, part[s * row]);
  float total = 0.0F;
  for (int s = 0; s < l.splits; ++s) {
    if (part[s * row] != -INFINITY) total += part[s * row + 1] * exp2f(part[s * row] - mx);
  }
  for (int d = static_cast<int>(threadIdx.x); d < l.dv; d += static_cast<int>(blockDim.x)) {
    float o = 0.0F;
    for (int s = 0; s < l.splits; ++s) {
      if (part[s * row] != -INFINITY) o += part[s * row + 2 + d] * exp2f(part[s * row] - mx);
    }
    l.o[bh * l.dv + d] = __float2bfloat16(o / total);
  }
  if (threadIdx.x == 0 && l.lse != nullptr) l.lse[bh] = (mx + log2f(total)) * kLn2;
}

template <int QK, int VD, int G>
void launch(const DecodeLaunch& l, cudaStream_t stream) {
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(l.dqk));
  const dim3 grid(static_cast<unsigned>(l.splits), static_cast<unsigned>(l.kv_heads), static_cast<unsigned>(l.batch));
  constexpr std::size_t smem = sizeof(float) * split_smem_floats<QK, VD, G>();
  static_assert(smem <= 48 * 1024, "the split kernel's shared memory fits the default limit");
  decode_split_kernel<QK, VD, G><<<grid, kWarps * 32, smem, stream>>>(l, scale_log2);
  TW_CUDA_CHECK_LAUNCH("decode_split_kernel");
}

template <int QK, int VD>
void launch_group(const DecodeLaunch& l, cudaStream_t stream) {
  const std::int64_t group = l.heads / l.kv_heads;
  if (group <= 1) return launch<QK, VD, 1>(l, stream);
  if (group <= 2) return launch<QK, VD, 2>(l, stream);
  if (group <= 4) return launch<QK, VD, 4>(l, stream);
  if (group <= 8) return launch<QK, VD, 8>(l, stream);
  if constexpr (QK <= 4 && VD <= 4) return launch<QK, VD, 16>(l, stream);
}

}  // namespace

void launch_decode_attention(const DecodeLaunch& l, cudaStream_t stream) {
  if (l.dqk == 64 && l.dv == 64) {
    launch_group<2, 2>(l, stream);
  } else if (l.dqk == 128 && l.dv == 128) {
    launch_group<4, 4>(l, stream);
  } else if (l.dqk == 192 && l.dv == 128) {
    launch_group<6, 4>(l, stream);
  } else if (l.dqk == 256 && l.dv == 256) {
    launch_group<8, 8>(l, stream);
  } else if (l.dqk == 128 && l.dv == 64) {
    launch_group<4, 2>(l, stream);
  } else {
    return;  // DecodeAttention validated the dims
  }
  decode_combine_kernel<<<static_cast<unsigned>(l.batch * l.heads), 128, 0, stream>>>(l);
  TW_CUDA_CHECK_LAUNCH("decode_combine_kernel");
}

}  // namespace threewalls::backend::detail
