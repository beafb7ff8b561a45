#pragma once
// Tiny kernels the calibration needs besides the backend's own: a blocking kernel that holds a
// stream while the host enqueues a batch of runs (nvbench's technique: the batch then runs back to
// back, not at the host's launch rate), and a counting kernel that stands for "an empty kernel"
// while letting the host check that every launch ran.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace threewalls::calibration::bench::kernels {

// Spins until *release != 0 (host-mapped memory written by the host) or `timeout_ns` of GPU time
// passed; then *timed_out = 1.
void launch_blocker(const volatile int* release, int* timed_out, std::uint64_t timeout_ns, cudaStream_t s);
// One thread adds 1 to *counter.
void launch_count(int* counter, cudaStream_t s);

}  // namespace threewalls::calibration::bench::kernels
