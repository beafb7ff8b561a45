// Microbenchmark: device time added per kernel by the profiler's timing markers.
//
// `threewalls run` brackets every op it records with two CUDA events on the op's stream
// (executor.cpp issue_op: mark, launch, mark). The calibration's kernel benchmarks time batches of
// back-to-back kernels without such events, so their per-kernel time does not contain what the two
// event records cost the stream on the device. This program measures it: N kernels back to back
// (A) against the same N kernels each between two event records (B), on one stream, with kernels
// long enough that the host runs ahead (the device is the bottleneck in both). gap = (B - A) / N.
// Also prints the median start(i+1) - end(i) between the markers of consecutive kernels in B.
//   nvcc -O2 -o timed_op_gap timed_op_gap.cu && ./timed_op_gap
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>

__global__ void add_kernel(const float* a, const float* b, float* c, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) c[i] = a[i] + b[i];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA error %s at %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  const int N = 3000;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> ev(2 * N + 2);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (long elems : {1L << 20, 1L << 21, 1L << 22}) {
    float *a, *b, *c;
    CK(cudaMalloc(&a, elems * 4)); CK(cudaMalloc(&b, elems * 4)); CK(cudaMalloc(&c, elems * 4));
    CK(cudaMemset(a, 0, elems * 4)); CK(cudaMemset(b, 0, elems * 4));
    const int grid = (int)std::min<long>((elems + 255) / 256, 65535L * 16);
    for (int rep = 0; rep < 3; ++rep) {
      // A: back to back
      CK(cudaEventRecord(ev[2 * N], s));
      for (int i = 0; i < N; ++i) add_kernel<<<grid, 256, 0, s>>>(a, b, c, elems);
      CK(cudaEventRecord(ev[2 * N + 1], s));
      CK(cudaStreamSynchronize(s));
      float ta = 0; CK(cudaEventElapsedTime(&ta, ev[2 * N], ev[2 * N + 1]));
      // B: each kernel between two event records (as a recorded step of threewalls run)
      for (int i = 0; i < N; ++i) {
        CK(cudaEventRecord(ev[2 * i], s));
        add_kernel<<<grid, 256, 0, s>>>(a, b, c, elems);
        CK(cudaEventRecord(ev[2 * i + 1], s));
      }
      CK(cudaStreamSynchronize(s));
      float tb = 0; CK(cudaEventElapsedTime(&tb, ev[0], ev[2 * N - 1]));
      std::vector<float> dur, gap;
      for (int i = 0; i < N; ++i) { float d; CK(cudaEventElapsedTime(&d, ev[2 * i], ev[2 * i + 1])); dur.push_back(d * 1e3f); }
      for (int i = 0; i + 1 < N; ++i) { float g; CK(cudaEventElapsedTime(&g, ev[2 * i + 1], ev[2 * i + 2])); gap.push_back(g * 1e3f); }
      std::sort(dur.begin(), dur.end()); std::sort(gap.begin(), gap.end());
      std::printf("{\"gpu\":\"%s\",\"bytes\":%ld,\"rep\":%d,\"per_kernel_untimed_us\":%.3f,\"per_kernel_timed_us\":%.3f,"
                  "\"extra_per_timed_kernel_us\":%.3f,\"median_timed_dur_us\":%.3f,\"median_gap_between_markers_us\":%.3f}\n",
                  p.name, elems * 12, rep, ta * 1e3 / N, tb * 1e3 / N, (tb - ta) * 1e3 / N, dur[N / 2], gap[gap.size() / 2]);
    }
    cudaFree(a); cudaFree(b); cudaFree(c);
  }
  return 0;
}
