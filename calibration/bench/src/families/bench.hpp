#pragma once
// The benchmark of one calibrate group (CUDA builds only), in the manner of nccl-tests: one file
// per group (families/<group>.cpp: the setup of a section, and per op of the group the run, its
// timing and its correctness check) and one driver (gpu_runner.cpp) that walks the sections. The
// groups are those of the family table (families.def); group_bench() finds a group's benchmark.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../gpu_internal.hpp"
#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/calibration/bench/gpu_runner.hpp"

namespace threewalls::calibration::bench::detail {

// What every group's benchmark gets from the driver: the options, the clock of the stop rule, the
// measuring stream (GPU 0), its batch timer and the cuBLASLt handle (its plan cache lives as long as
// the driver). The pointers outlive the benchmark.
struct BenchContext {
  GpuRunnerOptions options;
  Clock clock;
  cudaStream_t stream = nullptr;
  Timer* timer = nullptr;
  backend::CublasLt* lt = nullptr;
};

// One section of a group: constructed and `begin` when the driver begins the section, destroyed
// (every buffer, handle and communicator released) when it ends.
class GroupBench {
 public:
  explicit GroupBench(const BenchContext& ctx) : ctx_(ctx) {}
  virtual ~GroupBench() = default;
  GroupBench(const GroupBench&) = delete;
  GroupBench& operator=(const GroupBench&) = delete;

  // Buffers, handles and communicators for the section's points. Throwing fails the section.
  virtual void begin(const std::vector<PointSpec>& points) = 0;
  // Measures `r.point` under `rule`: fills samples_s, reps, stop, rel_ci and check (and may complete
  // r.point.inputs). Throws on failure, including a failed correctness check.
  virtual void measure(const StopRule& rule, Record& r) = 0;

 protected:
  [[nodiscard]] cudaStream_t s() const { return ctx_.stream; }
  [[nodiscard]] const GpuRunnerOptions& opt() const { return ctx_.options; }
  void sync() const;
  // measure_device on the context's stream and timer.
  void device(const Work& w, bool batch, const StopRule& rule, Record& r) const;

  BenchContext ctx_;
};

using GroupBenchFactory = std::unique_ptr<GroupBench> (*)(const BenchContext& ctx);

// One factory per calibrate group of the family table (a group shared by several rows is declared
// once per row: the same function).
#define THREEWALLS_CALIBRATION_FAMILY(module, group) \
  std::unique_ptr<GroupBench> make_##group##_bench(const BenchContext&);
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY

// The benchmark of a calibrate group; nullptr for a group the table does not have.
GroupBenchFactory group_bench(std::string_view group);

// ---- what several groups' benchmarks share ----

inline std::size_t sz(double v) { return static_cast<std::size_t>(std::max(0.0, v)); }
inline std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(std::max<std::int64_t>(0, v)); }

// A device buffer of `elements` seeded random bf16 values (at least one element).
backend::DeviceBuffer random_bf16(std::size_t elements, std::uint64_t seed, cudaStream_t s);

// Checks C = op(A) op(B) at a few elements against a double-precision dot product of the stored
// (bf16 or e4m3) inputs. Bound per element: 2% of the L2 norm of the products plus 1% of the value
// (bf16 output rounding); a wrong layout or garbage misses by about the norm itself.
std::string check_gemm(const backend::GemmShape& g, const void* a, const void* b, const void* c, bool fp8);

// Attention reference for query row `row` of (batch 0, head 0): o = softmax(q K^T / sqrt(d)) V over
// the visible keys, in double from the stored bf16 inputs.
struct AttnRef {
  std::vector<double> p;  // probabilities over keys (0 where masked)
  std::vector<double> o;
};
AttnRef attention_row(const backend::AttentionShape& s, const void* q, const void* k, const void* v, std::int64_t row);

// Copies of an operand inside a larger buffer, used in turn by consecutive runs so that a small
// GEMM does not find its operands in the L2 cache (50 MB on H100/H200): in a training step the next
// GEMM reads other weights. As many copies as fit, up to what makes one round of runs touch
// kRotationBytes, at most `max_copies`.
inline constexpr std::size_t kRotationBytes = std::size_t{256} << 20;
inline constexpr std::size_t kMaxGemmCopies = 256;
inline constexpr std::size_t kMaxGroupedCopies = 16;

class Rotation {
 public:
  Rotation(const backend::DeviceBuffer& buf, std::size_t bytes, std::size_t run_bytes,
           std::size_t max_copies = kMaxGemmCopies);
  [[nodiscard]] void* at(std::size_t i) const { return base_ + (i % count_) * stride_; }
  [[nodiscard]] std::size_t count() const { return count_; }

 private:
  char* base_;
  std::size_t stride_;
  std::size_t count_ = 1;
};
std::string rotation_note(const Rotation& a, const Rotation& b, const Rotation& c);

// A device counter the counting kernel (bench_kernels.cuh) adds to, for checks that every launch ran.
class LaunchCounter {
 public:
  explicit LaunchCounter(cudaStream_t s);  // zeroed on `s`
  [[nodiscard]] int* device() const { return buf_.as<int>(); }
  // The count once `s` drained.
  [[nodiscard]] int read(cudaStream_t s) const;
  // "passed: all N counting kernels ran (what)" when the count grew by `launched` since `before`;
  // throws "correctness check failed: ..." otherwise.
  [[nodiscard]] std::string expect(cudaStream_t s, int before, long long launched, const char* what) const;

 private:
  backend::DeviceBuffer buf_;
};

}  // namespace threewalls::calibration::bench::detail
