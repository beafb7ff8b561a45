#include "threewalls/backend/recording_path.hpp"

#include <chrono>

#include "threewalls/profiler/cuda_profiler.hpp"
#include "threewalls/profiler/step_recorder.hpp"

namespace threewalls::backend {

namespace {
using Clock = profiler::cuda::CudaEventClock;
using Recorder = profiler::StepRecorder<Clock>;

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

profiler::SamplingPolicy every_step() {
  profiler::SamplingConfig c;
  c.record_every_n_steps = 1;
  return profiler::SamplingPolicy(c, 1);
}
}  // namespace

struct RecordedLaunches::Impl {
  cudaStream_t stream;
  Clock clock;
  Recorder recorder;
  int steps = 0;
  Impl(cudaStream_t s, std::size_t reserve) : stream(s), clock(reserve), recorder(clock, every_step(), 0, nullptr) {
    recorder.set_anchor(clock.mark(stream), now_us());
  }
};

RecordedLaunches::RecordedLaunches(cudaStream_t stream, std::size_t reserve)
    : impl_(std::make_unique<Impl>(stream, reserve)) {}
RecordedLaunches::~RecordedLaunches() = default;

void RecordedLaunches::step(int n, const std::function<void()>& launch) {
  Impl& m = *impl_;
  m.recorder.begin_step(m.steps++, m.stream);
  const profiler::PhaseRecord tmpl{};
  Clock::Marker prev{};
  for (int i = 0; i < n; ++i) {
    // As executor.cpp issue_op: share the previous end marker while the stream has not reached it.
    const auto [start, owns] = m.recorder.start_after(m.stream, prev);
    launch();
    const double launched = now_us();
    const Clock::Marker end = m.clock.mark(m.stream);
    m.recorder.device_phase(tmpl, start, end, owns, launched);
    prev = end;
  }
  m.recorder.end_step(m.clock.mark(m.stream));
}

std::size_t RecordedLaunches::harvest(bool* negative) {
  impl_->recorder.harvest();
  const auto& phases = impl_->recorder.kept_phases();
  if (negative != nullptr) {
    *negative = false;
    for (const auto& p : phases) *negative = *negative || !(p.start_us >= 0.0) || !(p.dur_us >= 0.0);
  }
  return phases.size();
}

int RecordedLaunches::steps() const { return impl_->steps; }

}  // namespace threewalls::backend
