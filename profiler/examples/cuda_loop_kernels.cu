// Stand-in work for the CUDA profiler example (cuda_loop.cpp): a compute-bound and a memory-bound kernel.
#include <cuda_runtime.h>

namespace {

__global__ void fma_loop(float* x, int n, int iters) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  for (int k = 0; k < iters; ++k) v = v * 0.999F + 0.001F;
  x[i] = v;
}

__global__ void scale_copy(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 0.5F * in[i];
}

}  // namespace

// FLOPs: 2 * n * iters.
void example_compute(float* x, int n, int iters, cudaStream_t s) {
  fma_loop<<<(n + 255) / 256, 256, 0, s>>>(x, n, iters);
}

// Bytes: 8 * n (read + write).
void example_copy(const float* in, float* out, int n, cudaStream_t s) {
  scale_copy<<<(n + 255) / 256, 256, 0, s>>>(in, out, n);
}
