// Prints how long `threewalls compare` takes on two runs of about a million phase records each
// (target: <= 5 s on the 2-core CI machine): read both run directories, match and aggregate, format
// the text and the JSON. Not a test: run by hand.
//   compare_bench [records_per_run] [dir]
#include <chrono>
#include <filesystem>
#include <iostream>

#include "threewalls/notebooks_export/analyze.hpp"
#include "threewalls/notebooks_export/compare.hpp"
#include "threewalls/notebooks_export/synthetic.hpp"

namespace fs = std::filesystem;
namespace ne = threewalls::notebooks_export;

namespace {
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const long long target = argc > 1 ? std::stoll(argv[1]) : 1000000;
  const fs::path dir = argc > 2 ? fs::path(argv[2]) : fs::temp_directory_path() / "tw_compare_bench";
  fs::remove_all(dir);
  ne::SyntheticSpec s;
  s.ranks = 8;
  s.layers = 32;
  s.microbatches = 8;
  const long long per_step = s.ranks * ne::synthetic_records_per_rank_step(s);
  s.steps = static_cast<int>((target + per_step - 1) / per_step);
  s.noise = 0.02;
  auto t0 = std::chrono::steady_clock::now();
  ne::write_synthetic_run(dir / "a", s);
  s.source = "real";
  s.time_scale = 1.07;
  s.seed = 2;
  ne::write_synthetic_run(dir / "b", s);
  std::cout << "generated 2 runs of " << per_step * s.steps << " records in " << since(t0) << " s\n";

  t0 = std::chrono::steady_clock::now();
  auto a = threewalls::profiler::RunDirReader::read(dir / "a");
  auto b = threewalls::profiler::RunDirReader::read(dir / "b");
  const double read_s = since(t0);
  auto t1 = std::chrono::steady_clock::now();
  auto r = ne::compare_runs(a, b);
  const double compare_s = since(t1);
  t1 = std::chrono::steady_clock::now();
  auto text = ne::format_compare_text(r);
  auto json = ne::compare_json(r).dump();
  const double format_s = since(t1);
  const double total = since(t0);
  std::cout << "compare of " << a.phases.size() << " + " << b.phases.size() << " records: read " << read_s
            << " s, match+aggregate " << compare_s << " s, text+json " << format_s << " s, total " << total
            << " s (target <= 5 s); step-time error " << *r.step_time_error_pct << " %\n";
  t1 = std::chrono::steady_clock::now();
  auto an = ne::analyze_run(a);
  std::cout << "analyze of " << a.phases.size() << " records: " << since(t1) << " s (" << an.slow_ranks.size()
            << " slow ranks)\n";
  fs::remove_all(dir);
  return text.empty() || json.empty();
}
