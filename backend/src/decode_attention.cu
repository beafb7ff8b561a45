// Split-KV decode attention kernels (see decode_attention.hpp).
//
// Kernel 1, one block per (split, kv head, sequence): 4 warps take the split's keys in turn; a warp
// reads a key row and a value row whole (each lane its dqk/32 and dv/32 contiguous elements,
// coalesced), forms the scores of the kv head's query heads (a warp all-reduce per head) and keeps
// an online softmax per head in the log2 domain (running max m, sum l, accumulator acc = sum p v).
// The block combines its warps through shared memory and writes (m, l, acc) per query head.
// Kernel 2, one block per (sequence, query head): combines the splits into O = sum acc e^(m - M) /
// sum l e^(m - M) and lse = M + log(sum l e^(m - M)).
#include <cstdint>

#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/error.hpp"

namespace threewalls::backend::detail {
namespace {

constexpr int kWarps = 4;
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

// One key/value row into the online softmax of each of the `group` query heads (log2 domain).
template <int QK, int VD, int G>
__device__ __forceinline__ void attend(const float (&q)[G][QK], const float (&kf)[QK], const float (&vf)[VD], int group,
                                       float (&m)[G], float (&sum)[G], float (&acc)[G][VD]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < group) {
      float dot = 0.0F;
#pragma unroll
      for (int i = 0; i < QK; ++i) dot += q[g][i] * kf[i];
      const float s = warp_allsum(dot);
      const float mn = fmaxf(m[g], s);
      const float c = exp2f(m[g] - mn);
      const float p = exp2f(s - mn);
      sum[g] = sum[g] * c + p;
#pragma unroll
      for (int i = 0; i < VD; ++i) acc[g][i] = acc[g][i] * c + p * vf[i];
      m[g] = mn;
    }
  }
}

// Rows a warp loads before using them (memory-level parallelism: a bandwidth-bound kernel needs
// several row reads in flight per warp).
constexpr int kUnroll = 4;

// QK = dqk / 32, VD = dv / 32 elements per lane; G >= heads / kv_heads query heads per kv head.
template <int QK, int VD, int G>
__global__ void __launch_bounds__(kWarps * 32) decode_split_kernel(DecodeLaunch l, float scale_log2) {
  extern __shared__ float smem[];  // [kWarps][G][2 + dv]: m, l, acc
  const int split = static_cast<int>(blockIdx.x);
  const std::int64_t kvh = blockIdx.y;
  const std::int64_t b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group = static_cast<int>(l.heads / l.kv_heads);
  const std::int64_t chunk = (l.seq_kv + l.splits - 1) / l.splits;
  const std::int64_t j0 = split * chunk;
  const std::int64_t j1 = j0 + chunk < l.seq_kv ? j0 + chunk : l.seq_kv;

  float q[G][QK];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < group) {
      const std::int64_t h = kvh * group + g;
      load_row<QK>(l.q + (b * l.heads + h) * l.dqk + lane * QK, q[g]);
#pragma unroll
      for (int i = 0; i < QK; ++i) q[g][i] *= scale_log2;
    }
  }
  float m[G], sum[G], acc[G][VD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    sum[g] = 0.0F;
#pragma unroll
    for (int i = 0; i < VD; ++i) acc[g][i] = 0.0F;
  }
  const bf16* kbase = l.k + (b * l.kv_heads + kvh) * l.capacity * l.dqk + lane * QK;
  const bf16* vbase = l.v + (b * l.kv_heads + kvh) * l.capacity * l.dv + lane * VD;
  // Fewer rows in flight where the per-head state already takes most registers.
  constexpr int kRows = G * (QK + VD) > 64 ? 2 : kUnroll;
  std::int64_t j = j0 + warp;
  for (; j + (kRows - 1) * kWarps < j1; j += kRows * kWarps) {
    float kf[kRows][QK], vf[kRows][VD];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      load_row<QK>(kbase + (j + u * kWarps) * l.dqk, kf[u]);
      load_row<VD>(vbase + (j + u * kWarps) * l.dv, vf[u]);
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) attend<QK, VD, G>(q, kf[u], vf[u], group, m, sum, acc);
  }
  for (; j < j1; j += kWarps) {
    float kf[QK], vf[VD];
    load_row<QK>(kbase + j * l.dqk, kf);
    load_row<VD>(vbase + j * l.dv, vf);
    attend<QK, VD, G>(q, kf, vf, group, m, sum, acc);
  }
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
  const std::size_t smem = sizeof(float) * kWarps * G * (2 + static_cast<std::size_t>(l.dv));
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
