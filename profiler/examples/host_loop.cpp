// A training loop instrumented with threewalls' host profiler API (docs/profiler.md): no CUDA, no
// StepGraph, just records timed with std::chrono around CPU work standing in for a model.
//
//   threewalls_host_loop_example OUT_DIR [steps]
//
// writes OUT_DIR/run.json, phases_rank_0.jsonl and summary.json, readable by
// `threewalls analyze|export OUT_DIR`.
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "threewalls/core/error.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/summary.hpp"

namespace tp = threewalls::profiler;

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - t0).count();
}

// Stand-ins for a model: a small matrix product (compute), a large copy (memory).
double matmul(std::vector<float>& c, const std::vector<float>& a, const std::vector<float>& b, int n) {
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      float aik = a[static_cast<std::size_t>(i * n + k)];
      for (int j = 0; j < n; ++j) c[static_cast<std::size_t>(i * n + j)] += aik * b[static_cast<std::size_t>(k * n + j)];
    }
  }
  return 2.0 * n * n * n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " OUT_DIR [steps]\n";
    return 2;
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 20;
  try {
    // 1. What to record: every 5th step from step 0, rank 0 of a 1-rank world, per phase.
    tp::SamplingConfig cfg;
    cfg.record_every_n_steps = 5;
    cfg.flush_every_n_steps = 10;
    tp::SamplingPolicy policy(cfg, /*world_size=*/1);

    // 2. Who wrote the run.
    tp::RunHeader header = tp::make_header("real", 1);
    header.scenario = {"host_loop_example", "", ""};
    header.device = "host CPU";
    header.argv.assign(argv, argv + argc);
    header.settings["steps"] = steps;

    tp::RunDirWriter writer(argv[1], header, policy);
    // 3. Intern names once; records carry ids.
    const auto fwd = writer.phase_id("mlp_fwd");
    const auto copy = writer.phase_id("activation_copy");
    const auto optim = writer.phase_id("optimizer");
    const auto compute = writer.stream_id("compute");

    constexpr int kN = 96;
    std::vector<float> a(kN * kN, 1.0F), b(kN * kN, 0.5F), c(kN * kN, 0.0F);
    std::vector<char> src(8 << 20, 1), dst(8 << 20);
    const auto run_start = Clock::now();

    for (int step = 0; step < steps; ++step) {
      const bool rec = writer.records(step, /*rank=*/0);  // one branch when not sampled
      const auto t0 = Clock::now();
      auto timed = [&](std::uint32_t phase, tp::Wall wall, double bytes, auto&& work) {
        const auto s = Clock::now();
        double flops = work();
        const auto e = Clock::now();
        if (rec) {
          tp::PhaseRecord r;
          r.step = step;
          r.rank = 0;
          r.phase = phase;
          r.stream = compute;
          r.layer = 0;
          r.start_us = us_since(t0, s);
          r.dur_us = us_since(s, e);
          r.wall = wall;
          r.bytes = bytes;
          r.flops = flops;
          writer.add(r);
        }
      };
      timed(fwd, tp::Wall::compute, 3.0 * kN * kN * 4, [&] { return matmul(c, a, b, kN); });
      timed(copy, tp::Wall::memory, 2.0 * static_cast<double>(src.size()), [&] {
        std::memcpy(dst.data(), src.data(), src.size());
        return 0.0;
      });
      timed(optim, tp::Wall::memory, 3.0 * kN * kN * 4, [&] {
        for (auto& x : a) x -= 1e-6F;
        return 0.0;
      });
      if (rec) writer.add(tp::StepRecord{step, 0, us_since(run_start, t0), us_since(t0, Clock::now())});
      writer.end_step(step);
    }
    writer.close();

    // 4. summary.json from the kept records plus what only the loop knows.
    tp::SummaryInputs in;
    in.model_flops_per_step = threewalls::Flops(2.0 * kN * kN * kN);
    in.tokens_per_step = 1;
    in.gpu = "host CPU";
    tp::SummaryBuilder builder(writer.header(), in);
    writer.write_summary(builder.json(writer.kept_steps(), writer.kept_phases(), writer.names()));
    std::cout << "wrote " << writer.phase_records_written() << " phase records to " << argv[1] << "\n";
  } catch (const threewalls::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
