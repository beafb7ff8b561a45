#pragma once
// Internal: what the family modules' benchmark grids share (threewalls/calibration/grid.hpp): the
// size units, the caps that keep one point affordable, the deterministic random numbers of the
// held-out and off-grid shapes, and size ladders.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "threewalls/calibration/grid.hpp"

namespace threewalls::calibration::detail {

using bench::collective_ops;
using bench::GridPlan;
using bench::kConcurrencySectionExperts;
using bench::kLayoutForward;
using bench::OpInfo;
using bench::PointSpec;

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * kKiB;
inline constexpr double kGiB = 1024.0 * kMiB;

// Caps that keep one point affordable in the time budget (a run of at most a few milliseconds at
// the H100/H200 rates) and its buffers well inside 80 GB.
inline constexpr double kMaxOperandBytes = kGiB;     // any one GEMM operand
inline constexpr double kMaxGemmFlopsFull = 4.5e12;  // ~6 ms of bf16 at 750 TFLOP/s
inline constexpr double kMaxGemmFlopsQuick = 1.2e12;
inline constexpr double kMaxGroupedWeightBytes = 2.0 * kGiB;
inline constexpr double kMaxAttentionFlops = 4.0e11;  // forward FLOPs (backward is 2.5x)
// Fused attention runs 5-7 times as fast as the unfused kernel: the same milliseconds allow more.
inline constexpr double kMaxFusedAttentionFlops = 2.5e12;
inline constexpr double kMaxKvBytes = 4.0 * kGiB;

// Deterministic uniform numbers in [0, 1): splitmix64. (std:: distributions are not specified
// bit-exactly, and the held-out grid must be the same on every machine.)
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  double uniform() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  // Log-uniform in [lo, hi], rounded to a multiple of `step` (at least step).
  std::int64_t log_uniform(double lo, double hi, std::int64_t step) {
    const double v = std::exp(std::log(lo) + uniform() * (std::log(hi) - std::log(lo)));
    const auto r = static_cast<std::int64_t>(std::llround(v / static_cast<double>(step))) * step;
    return std::max(r, step);
  }

 private:
  std::uint64_t s_;
};

inline double d(std::int64_t v) { return static_cast<double>(v); }

// lo, lo * factor, ... up to hi (hi included up to rounding).
inline std::vector<double> sizes(double lo, double hi, double factor) {
  std::vector<double> v;
  for (double s = lo; s <= hi * 1.0000001; s *= factor) v.push_back(s);
  return v;
}

}  // namespace threewalls::calibration::detail
