#pragma once
// Timing device work with CUDA events: warm-up, then repeated runs each bracketed by its own event
// pair, until the sample budget or the time budget is spent. Raw samples are kept (fits need
// distributions, not means). Used by kernel_bench and, later, the calibration drivers.
#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

namespace threewalls::backend {

struct TimingOptions {
  int warmup = 3;
  int min_reps = 5;
  int max_reps = 50;
  double max_seconds = 2.0;  // stop adding samples after this much measured time (once min_reps are in)
};

struct TimingResult {
  std::vector<double> samples_ms;  // one per run, in order
  [[nodiscard]] double median_ms() const;
  [[nodiscard]] double min_ms() const;
  // (max - min) / median: a spread indicator for the report.
  [[nodiscard]] double spread() const;
};

// Runs `work(stream)` options.warmup times, then times each further run with events on `stream`.
TimingResult time_device(const std::function<void(cudaStream_t)>& work, cudaStream_t stream,
                         const TimingOptions& options = {});

}  // namespace threewalls::backend
