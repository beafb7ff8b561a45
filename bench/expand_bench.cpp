// Expansion speed: how long scenarios::expand takes per example scenario (median of several runs)
// and the ops it produces. Target (issue "Foundation"): DeepSeek-V3 on 2,048 GPUs in under 1 s on a
// 2-core machine. Prints figures; never fails a build.
//   usage: expand_bench [scenario.toml ...]   (default: every scenarios/examples/*.toml)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) files.emplace_back(argv[i]);
  if (files.empty()) {
    for (const auto& e : fs::directory_iterator(fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "examples")) {
      if (e.path().extension() == ".toml") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  }
  std::printf("%-30s %7s %8s %10s %12s %12s\n", "scenario", "GPUs", "classes", "ops", "median_s", "min_s");
  for (const auto& f : files) {
    auto s = threewalls::scenarios::load_scenario(f);
    std::vector<double> t;
    std::size_t ops = 0;
    std::size_t classes = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      auto g = threewalls::scenarios::expand(s, 0);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      ops = g.total_ops();
      classes = g.classes.size();
    }
    std::sort(t.begin(), t.end());
    std::printf("%-30s %7d %8zu %10zu %12.4f %12.4f\n", s.name.c_str(), s.world_size(), classes, ops, t[t.size() / 2],
                t.front());
  }
  return 0;
}
