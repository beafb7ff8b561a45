#pragma once
// Internals shared by the GPU runner's files: the batch timer (events + blocking kernel), the
// sampling loops, and device downloads for the correctness checks.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "threewalls/backend/handles.hpp"
#include "threewalls/calibration/bench/driver.hpp"

namespace threewalls::calibration::bench::detail {

using Work = std::function<void(cudaStream_t)>;

// The blocking kernel gave up waiting for the host (the batch did not run back to back). Not a
// device failure: the caller measures without the blocker instead.
class BlockerTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Times batches of back-to-back runs on one stream with a CUDA event pair. With the blocker, a
// blocking kernel holds the stream until the whole batch is enqueued, so the runs execute back to
// back at device speed (not at the host's launch rate); the start event is recorded after it.
class Timer {
 public:
  explicit Timer(cudaStream_t stream);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Step by step (the collective team synchronises ranks between the steps):
  void begin(bool blocker);  // [blocker], start event
  void end();                // stop event
  void release();            // lets the blocker go (no-op without one)
  // Seconds between start and stop after the stream reached stop (call after synchronising).
  // Throws BlockerTimeout when the blocker timed out (the batch did not run back to back).
  [[nodiscard]] double elapsed_s() const;

  // begin, `reps` x work, end, release, synchronise: seconds per run.
  double batch(const Work& work, int reps, bool blocker);

 private:
  cudaStream_t stream_;
  backend::Event start_{true};
  backend::Event stop_{true};
  int* host_flags_ = nullptr;  // [0] release, [1] timed out (host-mapped)
  int* dev_flags_ = nullptr;
  bool blocked_ = false;
};

// Warm-up, a first estimate, the batch size, then samples until the stop rule says stop. Fills
// r.samples_s, reps, stop, rel_ci. `allow_batch` false: one run per sample (host-synchronous work).
void measure_device(const StopRule& rule, const Clock& clock, Timer& timer, cudaStream_t stream, const Work& work,
                    bool allow_batch, Record& r);
// Samples of host time per call: each sample times `calls` calls of `fn` (steady clock); `after`
// (if set) runs after each sample, outside the timing (e.g. to let the device drain its queue).
void measure_host(const StopRule& rule, const Clock& clock, int calls, const std::function<void()>& fn, Record& r,
                  const std::function<void()>& after);

// ---- downloads for checks ----
// `count` elements starting at element `first`, `stride` elements apart.
std::vector<double> download_bf16(const void* base, std::int64_t first, std::int64_t count, std::int64_t stride = 1);
std::vector<double> download_fp8(const void* base, std::int64_t first, std::int64_t count, std::int64_t stride = 1);
std::vector<double> download_f32(const void* base, std::int64_t first, std::int64_t count);
double bf16_round(double v);

// "passed: <what>, worst <x> of its bound" or throws std::runtime_error("correctness check failed: ...").
class CheckLog {
 public:
  explicit CheckLog(std::string what) : what_(std::move(what)) {}
  // |got - want| <= bound (bound > 0); non-finite `got` fails.
  void expect_near(double got, double want, double bound, const std::string& where);
  [[nodiscard]] std::string passed() const;

 private:
  std::string what_;
  double worst_ = 0.0;
  int checked_ = 0;
};

// Relative L2 error of two vectors (inf when `got` has a non-finite entry).
double rel_l2(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace threewalls::calibration::bench::detail
