#pragma once
// Internals shared by the GPU runner's files: the batch timer (events + blocking kernel), device
// downloads for the correctness checks, and the collective team.
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

// ---- collectives ----
class CollectiveBench {
 public:
  CollectiveBench(std::uint64_t seed, Clock clock);
  ~CollectiveBench();
  CollectiveBench(const CollectiveBench&) = delete;
  CollectiveBench& operator=(const CollectiveBench&) = delete;
  // Sets up the team for the point's group size if needed (communicators, buffers of `max_bytes`),
  // then measures and checks the point.
  void measure(const StopRule& rule, double max_bytes, Record& r);

 private:
  struct Team;
  std::unique_ptr<Team> team_;
  std::uint64_t seed_;
  Clock clock_;
};

// ---- compute beside resident NCCL kernels; NCCL memory (gpu_interference.cpp) ----
// GPU 0 measured, GPU 1 the NCCL peer (a thread of its own). Construction measures the NCCL memory
// stages on a fresh communicator pair (cudaMemGetInfo on both GPUs) and keeps the pair.
class InterferenceBench {
 public:
  struct MemoryStage {
    std::string what;
    double bytes = 0.0;       // allocated on GPU 0 (the measured rank) by the stage
    double peer_bytes = 0.0;  // allocated on GPU 1
    double seconds = 0.0;     // host time of the stage
  };
  // Throws when fewer than 2 GPUs are visible or a stage fails.
  InterferenceBench(std::uint64_t seed, Clock clock);
  ~InterferenceBench();
  InterferenceBench(const InterferenceBench&) = delete;
  InterferenceBench& operator=(const InterferenceBench&) = delete;
  // Stage 0 communicator init, 1 first collectives, 2 first send/recv both directions.
  [[nodiscard]] const MemoryStage& stage(int i) const;
  // Samples of `work` (one run of the kernel on the given stream, GPU 0) while an NCCL kernel is
  // resident (kase 0: pending receive, 1: 1 GiB all-reduce transferring), each paired with a sample
  // alone. Fills r.samples_s (with NCCL), reps, stop, rel_ci and r.check; returns the alone median
  // (seconds per run).
  double measure(const StopRule& rule, int kase, const Work& work, Record& r);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace threewalls::calibration::bench::detail
