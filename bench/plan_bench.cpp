// Planner sweep speed and memory (docs/planner.md, "Speed and memory"): a sweep of more than 100,000
// configurations of DeepSeek-V3 on 1,024 H100 (or the scenario and search given), analytic
// estimator only (no flow re-simulation). Prints configurations per minute and the peak RSS.
//   plan_bench [SCENARIO] [GPUS] [SEARCH]
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/resolve.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/planner.hpp"

int main(int argc, char** argv) {
  using namespace threewalls;
  const std::string scenario =
      argc > 1 ? argv[1] : std::string(THREEWALLS_SOURCE_DIR) + "/scenarios/examples/deepseek_v3_1024gpu.toml";
  const int gpus = argc > 2 ? std::stoi(argv[2]) : 1024;
  const std::string search =
      argc > 3 ? argv[3]
               : "tp=1,2,4,8;cp=1,2;pp=1..16;vpp=1,2,4;ep=8,16,32,64,128,256;etp=1;mbs=1,2;"
                 "recompute=none,selective,full;dispatcher=alltoall,flex;cuda_graphs=none,attn+moe_router;"
                 "precision=bf16,fp8";
  try {
    const auto base = scenarios::load_scenario_file(scenario);
    const auto resolved = calibration::resolve_profile("auto", scenarios::to_string(base.scenario.cluster.gpu), {});
    const auto profile = calibration::Profile::load(resolved.path);
    const calibration::CostModel model(profile);
    const sim::CostModelCoster coster(model);
    sim::PlanOptions o;
    o.gpus = gpus;
    o.search = sim::parse_search(search, sim::default_search(base.scenario, gpus));
    const sim::PlanResult r = sim::run_plan(base, coster, o);
    const auto& c = r.counters;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("scenario %s, %d GPUs, profile %s\n", base.scenario.name.c_str(), gpus, profile.id().c_str());
    std::printf("configurations %llu (estimated %llu, out of memory %llu, pruned by rules %llu), reduced simulations %llu\n",
                static_cast<unsigned long long>(c.enumerated), static_cast<unsigned long long>(c.estimated),
                static_cast<unsigned long long>(c.oom),
                static_cast<unsigned long long>(c.enumerated - c.estimated - c.oom),
                static_cast<unsigned long long>(c.reduced_simulations));
    std::printf("wall %.2f s: %.0f configurations/min (%.0f estimated/min)\n", c.wall_s,
                60.0 * static_cast<double>(c.enumerated) / c.wall_s, 60.0 * static_cast<double>(c.estimated) / c.wall_s);
    std::printf("peak RSS %.1f MiB\n", static_cast<double>(ru.ru_maxrss) / 1024.0);
    if (!r.top.empty()) {
      std::printf("best: %s, %s: %.3f s per step, MFU %.1f%%\n", r.top[0].cand.layout().c_str(),
                  r.top[0].cand.options().c_str(), r.top[0].step_time_us * 1e-6, 100.0 * r.top[0].mfu);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
