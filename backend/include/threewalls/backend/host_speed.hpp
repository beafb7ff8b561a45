#pragma once
// The CPU's own speed in this process, measured beside the host probe's library calls.
// On the GPU VMs a launch-bound step runs at one of two speeds, decided per process (sometimes
// changing inside one), and the host probe (CudaDevice::probe_host) sees it in the time of an op
// launch and a cuBLASLt call. These figures tell whether the CPU itself is slower then (a dependent
// integer chain: the core's clock and its share of the core), its memory system (a 16 MiB copy:
// bandwidth; a walk of dependent loads through 32 MiB in random order: latency past the core's own
// caches) or only the path into
// the driver and the GPU. Host-only code; no device needed.
#include <cstdint>
#include <vector>

namespace threewalls::backend {

struct CpuSpeed {
  double chain_us = 0.0;   // one chain of kChainSteps dependent multiply-xor steps, median
  double copy_GBps = 0.0;  // memcpy of 16 MiB between buffers touched beforehand, median
  double load_ns = 0.0;    // one dependent load of a random walk through 32 MiB (a cache line each), median
};

inline constexpr int kChainSteps = 2048;
inline constexpr int kWalkLoads = 16384;

// Median of `samples` samples: `reps` chains back to back per sample, one copy and kWalkLoads loads
// of the walk per sample. About 20 ms with the defaults (most of it building the walk).
CpuSpeed measure_cpu_speed(int samples = 7, int reps = 32);

// One chain from `seed` (a pure function: what the timing runs, exposed for the test).
std::uint64_t cpu_chain(std::uint64_t seed);

// The walk's order: next[i] for `lines` slots, one cycle through all of them (Sattolo's shuffle,
// seeded), so a walk from any slot visits every slot before it returns.
std::vector<std::uint32_t> random_cycle(std::uint32_t lines, std::uint64_t seed);

}  // namespace threewalls::backend
