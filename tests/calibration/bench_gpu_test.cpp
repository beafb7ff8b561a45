// The GPU runner on a real device: one small point of every op of the table (quick grid), each
// measured and checked. Skips with a one-line reason without a CUDA device.
#include <gtest/gtest.h>

#include <map>

#include "threewalls/backend/handles.hpp"
#include "threewalls/calibration/bench/driver.hpp"
#include "threewalls/calibration/bench/gpu_runner.hpp"

using namespace threewalls::calibration::bench;

TEST(CalibrationGpu, EveryOpMeasuresAndPassesItsCheckOnASmallPoint) {
  std::string reason;
  const int gpus = threewalls::backend::device_count(&reason);
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  const MachineIdentity id = detect_machine(std::min(gpus, 2), "");
  EXPECT_GT(id.hardware.sm_count, 0);
  EXPECT_FALSE(id.hardware.links_seen.empty());
  PlanOptions po;
  po.mode = Mode::quick;
  po.gpus = std::min(gpus, 2);
  // The smallest point of each op (by bytes, then FLOPs), in plan order.
  std::map<std::string, PointSpec> smallest;
  std::vector<std::string> order;
  for (const auto& p : make_plan(po)) {
    auto it = smallest.find(p.op);
    if (it == smallest.end()) {
      order.push_back(p.op);
      smallest[p.op] = p;
    } else if (p.bytes + p.flops < it->second.bytes + it->second.flops) {
      it->second = p;
    }
  }
  std::vector<PointSpec> plan;
  for (const auto& op : order) plan.push_back(smallest[op]);
  if (gpus == 1) {
    // One GPU has no group of 2: run the collective team on one-rank communicators instead, so the
    // threads, barrier, blocking kernels, timeouts and checks still run for real.
    for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}) {
      PointSpec p;
      p.op = op;
      p.family = std::string("collective.") + op + ".nvlink";
      p.group_size = 1;
      p.bytes = 1 << 20;
      p.params = {{"group_size", 1}, {"bytes", p.bytes}};
      p.inputs = {1, p.bytes};
      plan.push_back(p);
    }
  }
  GpuRunnerOptions ro;
  ro.mode = Mode::quick;
  ro.gpus = po.gpus;
  ro.sm_count = id.hardware.sm_count;
  const auto runner = make_gpu_runner(ro);
  Budget budget(60.0, sections_of(plan), 0.02, 0.2);
  const auto records = run_points(plan, *runner, budget, default_stop_rule(Mode::quick), steady_clock());
  ASSERT_EQ(records.size(), plan.size());
  for (const auto& r : records) {
    EXPECT_EQ(r.status, Status::ok) << r.point.label() << ": " << r.error;
    if (r.status != Status::ok) continue;
    EXPECT_EQ(r.check.rfind("passed", 0), 0U) << r.point.label() << ": " << r.check;
    EXPECT_GT(r.median_s(), 0.0) << r.point.label();
  }
}
