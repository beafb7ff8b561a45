#pragma once
// The executor's recording path around a launch, on its own (calibration host.record_op):
// what issue_op (executor.cpp) does on a recorded step for an eager op besides the launch: a
// non-blocking query of the previous op's end marker on the stream (shared as this op's start while
// the stream has not reached it, else a start marker of its own), the launch, a host clock read, an
// end marker and the record, with the profiler's CudaEventClock and StepRecorder. The calibration
// times a step of n recorded launches against the same launches unrecorded.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace threewalls::backend {

class RecordedLaunches {
 public:
  // Markers and records on `stream`; `reserve`: markers created up front.
  RecordedLaunches(cudaStream_t stream, std::size_t reserve);
  ~RecordedLaunches();
  RecordedLaunches(const RecordedLaunches&) = delete;
  RecordedLaunches& operator=(const RecordedLaunches&) = delete;

  // One recorded step of `n` calls of `launch` (which enqueues on the stream), each inside the
  // recording path. Returns at once (nothing waits for the device).
  void step(int n, const std::function<void()>& launch);
  // After the stream has finished: converts every ended step into records; returns the records
  // harvested so far, and whether any had a negative start or duration in `negative`.
  std::size_t harvest(bool* negative);
  [[nodiscard]] int steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace threewalls::backend
