// The CPU's own speed in this process (host_speed.hpp).
#include "threewalls/backend/host_speed.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace threewalls::backend {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Keeps the compiler from dropping work whose result nothing reads.
volatile std::uint64_t g_sink = 0;

}  // namespace

std::uint64_t cpu_chain(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (int i = 0; i < kChainSteps; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // each step needs the previous one
    x ^= x >> 29;
  }
  return x;
}

CpuSpeed measure_cpu_speed(int samples, int reps) {
  if (samples < 1 || reps < 1) throw std::invalid_argument("measure_cpu_speed: samples and reps must be >= 1");
  CpuSpeed out;
  std::vector<double> chain;
  std::uint64_t x = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  (void)cpu_chain(x);  // warm
  for (int s = 0; s < samples; ++s) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) x = cpu_chain(x);
    chain.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps);
  }
  g_sink = x;
  constexpr std::size_t kCopyBytes = std::size_t{16} << 20;
  std::vector<unsigned char> src(kCopyBytes, 1), dst(kCopyBytes, 0);  // both touched: no page faults timed
  std::memcpy(dst.data(), src.data(), kCopyBytes);
  std::vector<double> copy;
  for (int s = 0; s < samples; ++s) {
    src[static_cast<std::size_t>(s) * 4096] = static_cast<unsigned char>(s);
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), kCopyBytes);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    g_sink = g_sink + dst[static_cast<std::size_t>(s) * 4096];
    copy.push_back(static_cast<double>(kCopyBytes) / sec / 1e9);
  }
  out.chain_us = median(chain);
  out.copy_GBps = median(copy);
  return out;
}

}  // namespace threewalls::backend
