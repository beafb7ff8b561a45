#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "bench_kernels.cuh"
#include "gpu_internal.hpp"
#include "threewalls/backend/error.hpp"

namespace threewalls::calibration::bench::detail {

namespace {
constexpr std::uint64_t kBlockerTimeoutNs = 2'000'000'000ULL;  // the host enqueues a batch in far less
constexpr double kTargetSampleS = 4e-4;  // a sample lasts about this long (batches of small kernels)
constexpr int kMaxReps = 64;
}  // namespace

Timer::Timer(cudaStream_t stream) : stream_(stream) {
  TW_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_flags_), 2 * sizeof(int), cudaHostAllocMapped));
  host_flags_[0] = host_flags_[1] = 0;
  TW_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flags_), host_flags_, 0));
}

Timer::~Timer() {
  if (host_flags_) {
    host_flags_[0] = 1;  // never leave a blocker spinning
    static_cast<void>(cudaFreeHost(host_flags_));
  }
}

void Timer::begin(bool blocker) {
  blocked_ = blocker;
  if (blocker) {
    volatile int* f = host_flags_;
    f[0] = 0;
    f[1] = 0;
    kernels::launch_blocker(dev_flags_, dev_flags_ + 1, kBlockerTimeoutNs, stream_);
  }
  start_.record(stream_);
}

void Timer::end() { stop_.record(stream_); }

void Timer::release() {
  if (!blocked_) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  volatile int* f = host_flags_;
  f[0] = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

double Timer::elapsed_s() const {
  const volatile int* f = host_flags_;
  if (blocked_ && f[1] != 0) {
    throw BlockerTimeout(backend::rank_prefix() +
                         "the blocking kernel timed out after 2 s: the host did not enqueue the batch in time");
  }
  return static_cast<double>(backend::Event::elapsed_ms(start_, stop_)) * 1e-3;
}

double Timer::batch(const Work& work, int reps, bool blocker) {
  begin(blocker);
  try {
    for (int i = 0; i < reps; ++i) work(stream_);
  } catch (...) {
    release();
    static_cast<void>(cudaStreamSynchronize(stream_));
    throw;
  }
  end();
  release();
  stop_.synchronize();
  return elapsed_s() / reps;
}

void measure_device(const StopRule& rule, const Clock& clock, Timer& timer, cudaStream_t stream, const Work& work,
                    bool allow_batch, Record& r) {
  work(stream);  // warm-up: plans, heuristics, first-touch, clocks
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double t1 = std::min(timer.batch(work, 1, false), timer.batch(work, 1, false));
  const int reps = allow_batch ? reps_per_sample(t1, kTargetSampleS, kMaxReps) : 1;
  bool blocker = reps > 1;
  if (blocker) {
    try {
      static_cast<void>(timer.batch(work, reps, true));
    } catch (const BlockerTimeout&) {
      blocker = false;  // something in the batch waits for the device: batches without the blocker
    }
  }
  const Sampling s = sample_until(rule, clock, [&] { return timer.batch(work, reps, blocker); });
  r.samples_s = s.samples;
  r.reps = reps;
  r.stop = std::string(to_string(s.reason)) + (reps > 1 && !blocker ? " (batches without the blocking kernel)" : "");
  r.rel_ci = s.rel_ci;
}

void measure_host(const StopRule& rule, const Clock& clock, int calls, const std::function<void()>& fn, Record& r,
                  const std::function<void()>& after) {
  for (int i = 0; i < std::max(2, calls / 4); ++i) fn();  // warm-up
  if (after) after();
  const Sampling s = sample_until(rule, clock, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    if (after) after();
    return t;
  });
  r.samples_s = s.samples;
  r.reps = calls;
  r.stop = to_string(s.reason);
  r.rel_ci = s.rel_ci;
}

// ---- downloads ----

namespace {
template <class T>
std::vector<T> download(const void* base, std::int64_t first, std::int64_t count, std::int64_t stride) {
  std::vector<T> h(static_cast<std::size_t>(count));
  if (count == 0) return h;
  const auto* src = static_cast<const T*>(base) + first;
  if (stride == 1) {
    TW_CUDA_CHECK(cudaMemcpy(h.data(), src, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  } else {
    TW_CUDA_CHECK(cudaMemcpy2D(h.data(), sizeof(T), src, static_cast<std::size_t>(stride) * sizeof(T), sizeof(T),
                               h.size(), cudaMemcpyDeviceToHost));
  }
  return h;
}
}  // namespace

std::vector<double> download_bf16(const void* base, std::int64_t first, std::int64_t count, std::int64_t stride) {
  const auto h = download<__nv_bfloat16>(base, first, count, stride);
  std::vector<double> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = static_cast<double>(__bfloat162float(h[i]));
  return out;
}

std::vector<double> download_fp8(const void* base, std::int64_t first, std::int64_t count, std::int64_t stride) {
  const auto h = download<__nv_fp8_e4m3>(base, first, count, stride);
  std::vector<double> out(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) out[i] = static_cast<double>(static_cast<float>(h[i]));
  return out;
}

std::vector<double> download_f32(const void* base, std::int64_t first, std::int64_t count) {
  const auto h = download<float>(base, first, count, 1);
  return {h.begin(), h.end()};
}

double bf16_round(double v) { return static_cast<double>(__bfloat162float(__float2bfloat16(static_cast<float>(v)))); }

void CheckLog::expect_near(double got, double want, double bound, const std::string& where) {
  ++checked_;
  const double err = std::fabs(got - want);
  if (!std::isfinite(got) || !(err <= bound)) {
    char buf[256];
    std::snprintf(buf, sizeof buf, ": got %.6g, expected %.6g (allowed error %.3g)", got, want, bound);
    throw std::runtime_error("correctness check failed: " + what_ + " at " + where + buf);
  }
  if (bound > 0.0) worst_ = std::max(worst_, err / bound);
}

std::string CheckLog::passed() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, ": %d values, worst error %.0f%% of its bound", checked_, 100.0 * worst_);
  return "passed: " + what_ + buf;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace threewalls::calibration::bench::detail
