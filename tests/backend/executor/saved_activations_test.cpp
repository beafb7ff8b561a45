// backend/saved_activations.hpp: every hold is given back within the step, and the bytes held at once
// in issue order (the pipeline schedule's micro-batches in flight, for real) are the memory model's
// activations; on the fake device the executor reports the caching allocator's peaks in summary.json
// and an allocation the device cannot serve fails naming the rank and the bytes.
#include "threewalls/backend/saved_activations.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "threewalls/backend/executor.hpp"
#include "threewalls/backend/fake_device.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/stepper.hpp"
#include "threewalls/sim/memory_model.hpp"

namespace threewalls::backend {
namespace {

namespace fs = std::filesystem;

// The most bytes the plan holds at once, walking the class's ops in issue order.
double planned_peak(const SavedActivationPlan& plan, std::size_t ops, double* left = nullptr) {
  std::vector<double> held(plan.slots, 0.0);
  double now = 0.0;
  double peak = 0.0;
  std::size_t h = 0;
  std::size_t r = 0;
  for (std::uint32_t i = 0; i < ops; ++i) {
    for (; h < plan.holds.size() && plan.holds[h].op == i; ++h) {
      held[plan.holds[h].slot] += static_cast<double>(plan.holds[h].bytes);
      now += static_cast<double>(plan.holds[h].bytes);
    }
    peak = std::max(peak, now);
    for (; r < plan.releases.size() && plan.releases[r].op == i; ++r) {
      now -= held[plan.releases[r].slot];
      held[plan.releases[r].slot] = 0.0;
    }
  }
  if (left != nullptr) *left = now;
  return peak;
}

fs::path fidelity(const std::string& name) {
  return fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "validation" / "fidelity" / (name + ".toml");
}

TEST(SavedActivations, HeldAtOnceInIssueOrderAreTheMemoryModelsActivations) {
  for (const auto& entry :
       fs::directory_iterator(fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "validation" / "fidelity")) {
    if (entry.path().extension() != ".toml") continue;
    const scenarios::Scenario s = scenarios::load_scenario(entry.path().string());
    scenarios::Stepper stepper(s);
    const scenarios::StepGraph g = stepper.expand(0);
    const sim::MemoryReport model = sim::memory_model(s, g);
    for (std::size_t c = 0; c < g.classes.size(); ++c) {
      const scenarios::RankClass& rc = g.classes[c];
      const SavedActivationPlan plan = plan_saved_activations(s, rc);
      double left = -1.0;
      const double peak = planned_peak(plan, rc.ops.size(), &left);
      EXPECT_EQ(left, 0.0) << entry.path().filename() << " class " << c << ": not all given back";
      const double modelled = model.classes[c].breakdown.activations.value;
      const double err = (modelled - peak) / peak;
      std::printf("%-40s class %zu: held %.4g GiB, model %.4g GiB, error %+.2f%%\n",
                  entry.path().stem().string().c_str(), c, peak / (1 << 30), modelled / (1 << 30), 100.0 * err);
      EXPECT_LT(std::abs(err), 0.005) << entry.path().filename() << " class " << c;
    }
  }
}

TEST(SavedActivations, TheExecutorReportsTheAllocatorsPeaksAndFailsCleanlyWhenTheDeviceIsFull) {
  const scenarios::Scenario s = scenarios::load_scenario(fidelity("f10_moe32_pp2_2gpu").string());
  scenarios::Stepper stepper(s);
  const scenarios::StepGraph g = stepper.expand(0);
  double planned = 0.0;
  for (const auto& rc : g.classes)
    planned = std::max(planned, planned_peak(plan_saved_activations(s, rc), rc.ops.size()));
  ASSERT_GT(planned, 0.0);
  for (const bool fits : {true, false}) {
    const fs::path dir =
        fs::temp_directory_path() / ("tw_saved_" + std::to_string(::getpid()) + (fits ? "_fits" : "_oom"));
    fs::remove_all(dir);
    FakeDeviceOptions fo;
    fo.max_op_us = 5.0;
    fo.memory_bytes = fits ? 0 : static_cast<std::size_t>(planned / 2);
    FakeFabric fabric(fo);
    ProcessContext pc;
    for (int r = 0; r < s.world_size(); ++r) pc.local_ranks.push_back(r);
    pc.make_comm_ids = [&fabric](std::size_t n) { return fabric.make_ids(n); };
    ExecutorOptions eo;
    eo.steps = 1;
    eo.warmup_steps = 1;
    eo.out_dir = dir;
    auto run = [&] {
      return execute(
          s, pc, [&fabric](int rank, int) { return std::make_unique<FakeDevice>(fabric, rank); }, eo);
    };
    if (fits) {
      const RunResult res = run();
      const auto& mem = res.summary_json["memory"];
      ASSERT_TRUE(mem.contains("peak_allocated_bytes_by_rank"));
      const double alloc0 = mem["peak_allocated_bytes_by_rank"]["0"].get<double>();
      const double reserved0 = mem["peak_reserved_bytes_by_rank"]["0"].get<double>();
      // Stage 0 holds the most (two micro-batches in flight); blocks are rounded up to 512 bytes.
      EXPECT_GE(alloc0, planned);
      EXPECT_LT(alloc0, planned * 1.01);
      EXPECT_GE(reserved0, alloc0);
    } else {
      try {
        run();
        ADD_FAILURE() << "expected an out-of-memory failure";
      } catch (const SystemError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("rank "), std::string::npos) << msg;
        EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
        EXPECT_NE(msg.find("saved activations of"), std::string::npos) << msg;
      }
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace threewalls::backend
