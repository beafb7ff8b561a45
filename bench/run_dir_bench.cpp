// Prints how long the run-directory writer and reader take for N phase records (default one million),
// in one file and spread over 8 rank files. Not a test: run by hand.
//   run_dir_bench [records] [dir]
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>

#include "threewalls/profiler/run_dir.hpp"

namespace tp = threewalls::profiler;
namespace fs = std::filesystem;

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run(std::size_t records, int ranks, const fs::path& dir) {
  fs::remove_all(dir);
  tp::SamplingConfig cfg;
  cfg.record_every_n_steps = 1;
  tp::RunHeader h = tp::make_header("sim", ranks);
  h.scenario.name = "bench";
  tp::WriterOptions opts;
  opts.keep_records = false;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(1.0, 500.0);
  const std::size_t per_step = 2000;  // ops per rank and step

  double c0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  {
    tp::RunDirWriter w(dir, h, tp::SamplingPolicy(cfg, ranks), opts);
    std::uint32_t phases[8];
    const char* names[8] = {"attn_qkv_fwd", "attn_core_fwd", "attn_proj_fwd", "moe_router_fwd",
                            "moe_dispatch_fwd", "moe_experts_fwd", "moe_combine_fwd", "dp_grad_reduce_scatter"};
    for (int i = 0; i < 8; ++i) phases[i] = w.phase_id(names[i]);
    auto compute = w.stream_id("compute");
    auto ep = w.group_id("ep");
    std::size_t n = 0;
    for (int step = 0; n < records; ++step) {
      for (int r = 0; r < ranks && n < records; ++r) {
        double t = 0;
        for (std::size_t i = 0; i < per_step && n < records; ++i, ++n) {
          tp::PhaseRecord p;
          p.step = step;
          p.rank = r;
          p.phase = phases[i % 8];
          p.stream = compute;
          p.layer = static_cast<int>(i / 16);
          p.microbatch = static_cast<int>(i % 4);
          p.start_us = t;
          p.dur_us = u(rng);
          t += p.dur_us;
          p.bytes = 1.5e8 * p.dur_us;
          p.flops = 4.5e11 * p.dur_us;
          p.wall = i % 8 == 4 ? tp::Wall::communication : tp::Wall::compute;
          if (i % 8 == 4) {
            p.group = ep;
            p.tokens = 4096;
          }
          w.add(p);
        }
        w.add(tp::StepRecord{step, r, step * 1e6, t});
      }
      w.end_step(step);
    }
    w.close();
  }
  double write_s = seconds_since(t0);
  double write_cpu = cpu_seconds() - c0;
  std::uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) bytes += e.file_size();

  t0 = std::chrono::steady_clock::now();
  tp::RunData d = tp::RunDirReader::read(dir);
  double read_s = seconds_since(t0);
  c0 = cpu_seconds();
  t0 = std::chrono::steady_clock::now();
  tp::ReadOptions one;
  one.threads = 1;
  tp::RunData d1 = tp::RunDirReader::read(dir, one);
  double read1_s = seconds_since(t0);
  double read1_cpu = cpu_seconds() - c0;
  std::cout << "records " << d.phases.size() << " in " << ranks << " file(s), " << bytes / 1e6 << " MB: write "
            << write_s << " s (" << write_s / static_cast<double>(records) * 1e9 << " ns/record), read " << read_s
            << " s (one thread: " << read1_s << " s); cpu: write " << write_cpu << " s, read " << read1_cpu
            << " s (the record generator is inside the write time)\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t records = argc > 1 ? std::stoul(argv[1]) : 1000000;
  fs::path dir = argc > 2 ? fs::path(argv[2]) : fs::temp_directory_path() / "tw_run_dir_bench";
  run(records, 1, dir);
  run(records, 8, dir);
  fs::remove_all(dir);
  return 0;
}
