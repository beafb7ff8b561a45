// Calibrate group "concurrency" (family concurrency): 64 expert sections of a Switch-like layer
// through one OpRunner per stream, spread round-robin over n streams and forked / joined by events,
// against the same ops on one stream; checked by a counting kernel per stream before the join.
#include <cstdlib>
#include <map>
#include <tuple>

#include "../bench_kernels.cuh"
#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

class ConcurrencyBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    int streams = 1;
    for (const auto& p : points) streams = std::max(streams, static_cast<int>(p.iparam("streams")));
    for (int i = 0; i < streams; ++i) side_streams_.push_back(std::make_unique<be::Stream>());
    sections_.clear();
  }

  // Experts round-robin over n streams (expert e on stream e mod n, its five ops in order), issued
  // expert by expert as the executor issues a streams:N section, forked from the main stream by one
  // event and joined back by one event per stream. Each stream has its own OpRunner (own cuBLASLt
  // handle, workspace and buffers) prepared with its experts' ops, as threewalls run's CudaDevice
  // has one per stream; the serial time runs all the ops back to back on the main stream with one.
  // Both behind the blocker (the device's time, not the host's).
  void measure(const StopRule& rule, Record& r) override {
    const int n = static_cast<int>(r.point.iparam("streams"));
    Section& sec = section_of(r.point);
    Record serial;
    serial.point = r.point;
    device_blocked(
        [&](cudaStream_t st) {
          for (const auto& op : sec.ops) sec.serial->run(op, st);
        },
        rule, serial);
    std::vector<std::unique_ptr<be::OpRunner>> runners;
    for (int i = 0; i < n; ++i) {
      std::vector<scenarios::Op> mine;
      for (const auto& op : sec.ops) {
        if (op.expert % n == i) mine.push_back(op);
      }
      runners.push_back(std::make_unique<be::OpRunner>(be::OpRunnerConfig{}));
      runners.back()->prepare(mine);
    }
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    be::Event fork(false);
    std::vector<be::Event> join;
    for (int i = 0; i < n; ++i) join.emplace_back(false);
    const auto side = [&](int i) { return side_streams_[sz(static_cast<std::int64_t>(i))]->get(); };
    const auto concurrent = [&](cudaStream_t st, bool count) {
      fork.record(st);
      for (int i = 0; i < n; ++i) TW_CUDA_CHECK(cudaStreamWaitEvent(side(i), fork.get(), 0));
      for (const auto& op : sec.ops)
        runners[sz(static_cast<std::int64_t>(op.expert % n))]->run(op, side(op.expert % n));
      for (int i = 0; i < n; ++i) {
        if (count) kernels::launch_count(counter_.device(), side(i));
        join[sz(static_cast<std::int64_t>(i))].record(side(i));
        TW_CUDA_CHECK(cudaStreamWaitEvent(st, join[sz(static_cast<std::int64_t>(i))].get(), 0));
      }
    };
    device_blocked([&](cudaStream_t st) { concurrent(st, false); }, rule, r);
    r.point.inputs = {static_cast<double>(n), mean_sm_fraction(sec.ops, opt().sm_count), serial.median_s()};
    // Every stream reached its end before the join released the main stream: one counting kernel
    // per stream after its sections, read once the main stream drained.
    const int before = counter();
    concurrent(s(), true);
    // Streams past the hardware work queues share them: record the setting this ran under
    // (the backend does not set the variable; CUDA's default is 8 connections).
    const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    r.check = expect_count(before, n, "one per stream after its sections, before the join") + "; " +
              std::to_string(sec.ops.size()) + " ops, one OpRunner per stream; CUDA_DEVICE_MAX_CONNECTIONS=" +
              (conns ? std::string(conns) : std::string("unset (CUDA default 8)"));
    TW_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  // Like device(), but always behind the blocking kernel, also when one run makes a sample: the runs
  // are enqueued before the device starts them, so a sample is the device's time, not the host's
  // launch rate (on a 4 x H200 host 64 GEMM launches took ~0.6 ms, longer than the GPU needs for
  // them, and device() takes one unblocked run per sample past 0.4 ms). Falls back to
  // device() if the blocker times out.
  void device_blocked(const Work& w, const StopRule& rule, Record& rec) {
    w(s());  // warm-up
    sync();
    try {
      const double t1 = ctx_.timer->batch(w, 1, true);
      const int reps = reps_per_sample(t1, 4e-4, 16);
      const Sampling smp = sample_until(rule, ctx_.clock, [&] { return ctx_.timer->batch(w, reps, true); });
      rec.samples_s = smp.samples, rec.reps = reps, rec.stop = to_string(smp.reason), rec.rel_ci = smp.rel_ci;
    } catch (const BlockerTimeout&) {
      device(w, true, rule, rec);
    }
  }

  struct Section {
    std::vector<scenarios::Op> ops;
    std::unique_ptr<be::OpRunner> serial;  // all of the ops, for the one-stream time
  };

  Section& section_of(const PointSpec& p) {
    const auto key = std::make_tuple(p.iparam("rows"), p.iparam("hidden"), p.iparam("ffn"));
    auto it = sections_.find(key);
    if (it != sections_.end()) return it->second;
    Section sec;
    sec.ops = concurrency_section_ops(std::get<0>(key), std::get<1>(key), std::get<2>(key));
    sec.serial = std::make_unique<be::OpRunner>(be::OpRunnerConfig{});
    sec.serial->prepare(sec.ops);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    return sections_.emplace(key, std::move(sec)).first->second;
  }

  int counter() const { return counter_.read(s()); }
  std::string expect_count(int before, long long launched, const char* what) const {
    return counter_.expect(s(), before, launched, what);
  }

  // Released in reverse order: the counter, the sections (their OpRunners), the streams.
  std::vector<std::unique_ptr<be::Stream>> side_streams_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, Section> sections_;  // by shape
  LaunchCounter counter_{s()};  // the counting kernels' counter (the join check)
};

}  // namespace

std::unique_ptr<GroupBench> make_concurrency_bench(const BenchContext& ctx) {
  return std::make_unique<ConcurrencyBench>(ctx);
}

}  // namespace threewalls::calibration::bench::detail
