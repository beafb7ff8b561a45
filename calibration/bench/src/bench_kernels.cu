#include "bench_kernels.cuh"
#include "threewalls/backend/error.hpp"

namespace threewalls::calibration::bench::kernels {

namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void blocker_kernel(const volatile int* release, int* timed_out, std::uint64_t timeout_ns) {
  const std::uint64_t t0 = global_timer_ns();
  while (*release == 0) {
    if (global_timer_ns() - t0 > timeout_ns) {
      *timed_out = 1;
      break;
    }
  }
}

__global__ void count_kernel(int* counter) { atomicAdd(counter, 1); }

}  // namespace

void launch_blocker(const volatile int* release, int* timed_out, std::uint64_t timeout_ns, cudaStream_t s) {
  blocker_kernel<<<1, 1, 0, s>>>(release, timed_out, timeout_ns);
  TW_CUDA_CHECK_LAUNCH("blocker_kernel");
}

void launch_count(int* counter, cudaStream_t s) {
  count_kernel<<<1, 1, 0, s>>>(counter);
  TW_CUDA_CHECK_LAUNCH("count_kernel");
}

}  // namespace threewalls::calibration::bench::kernels
