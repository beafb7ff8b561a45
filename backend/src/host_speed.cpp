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

std::vector<std::uint32_t> random_cycle(std::uint32_t lines, std::uint64_t seed) {
  std::vector<std::uint32_t> order(lines);
  for (std::uint32_t i = 0; i < lines; ++i) order[i] = i;
  std::uint64_t x = seed;
  for (std::uint32_t i = lines; i > 1; --i) {  // Sattolo: j < i - 1 makes one cycle
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto j = static_cast<std::uint32_t>((x >> 33) % (i - 1));
    std::swap(order[i - 1], order[j]);
  }
  std::vector<std::uint32_t> next(lines);
  for (std::uint32_t i = 0; i < lines; ++i) next[order[i]] = order[(i + 1) % lines];
  return next;
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
  // The walk: one 4-byte index per 64-byte line of 32 MiB, in an order no prefetcher follows, so every
  // load misses the core's own caches (L1, L2) and goes to the shared L3 or to memory.
  constexpr std::uint32_t kLine = 16;  // uint32 per cache line
  constexpr std::uint32_t kLines = (std::uint32_t{32} << 20) / 64;
  const std::vector<std::uint32_t> next = random_cycle(kLines, 0x9e3779b97f4a7c15ULL);
  std::vector<std::uint32_t> walk(static_cast<std::size_t>(kLines) * kLine, 0);
  for (std::uint32_t i = 0; i < kLines; ++i) walk[static_cast<std::size_t>(i) * kLine] = next[i] * kLine;
  std::uint32_t at = 0;
  for (int i = 0; i < kWalkLoads; ++i) at = walk[at];  // warm the page tables
  std::vector<double> load;
  for (int s = 0; s < samples; ++s) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kWalkLoads; ++i) at = walk[at];
    load.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kWalkLoads);
  }
  g_sink = g_sink + at;
  out.chain_us = median(chain);
  out.copy_GBps = median(copy);
  out.load_ns = median(load);
  return out;
}

}  // namespace threewalls::backend
