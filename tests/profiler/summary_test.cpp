#include "threewalls/profiler/summary.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"
#include "threewalls/profiler/run_dir.hpp"

using namespace threewalls;
using namespace threewalls::profiler;

namespace {

struct Builder {
  Names names;
  std::vector<StepRecord> steps;
  std::vector<PhaseRecord> phases;

  void phase(int step, int rank, const char* name, Wall wall, double start, double dur, const char* group = nullptr,
             CoarseView coarse = CoarseView::none) {
    PhaseRecord p;
    p.step = step;
    p.rank = rank;
    p.phase = names.phases.intern(name);
    p.stream = names.streams.intern("compute");
    p.wall = wall;
    p.start_us = start;
    p.dur_us = dur;
    if (group) p.group = names.groups.intern(group);
    p.coarse = coarse;
    phases.push_back(p);
  }
};

void expect_near_json(const OrderedJson& a, const OrderedJson& b, double abs_tol, const std::string& path) {
  ASSERT_EQ(a.type(), b.type()) << path;
  if (a.is_object()) {
    ASSERT_EQ(a.size(), b.size()) << path;
    for (auto it = a.begin(); it != a.end(); ++it) expect_near_json(it.value(), b.at(it.key()), abs_tol, path + "." + it.key());
  } else if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << path;
    for (std::size_t i = 0; i < a.size(); ++i) expect_near_json(a[i], b[i], abs_tol, path + "[" + std::to_string(i) + "]");
  } else if (a.is_number_float()) {
    EXPECT_NEAR(a.get<double>(), b.get<double>(), abs_tol) << path;
  } else {
    EXPECT_EQ(a, b) << path;
  }
}

}  // namespace

TEST(Aggregate, MedianAndP95InterpolateLinearly) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  auto a = aggregate(v);
  EXPECT_EQ(a.count, 100U);
  EXPECT_DOUBLE_EQ(a.median, 50.5);
  EXPECT_DOUBLE_EQ(a.p95, 95.05);
  EXPECT_DOUBLE_EQ(a.min, 1);
  EXPECT_DOUBLE_EQ(a.max, 100);
  EXPECT_DOUBLE_EQ(a.mean, 50.5);
  EXPECT_DOUBLE_EQ(a.total, 5050);
  std::vector<double> empty;
  EXPECT_EQ(aggregate(empty).count, 0U);
}

TEST(Summary, WallsComeFromTheCriticalRankOfEachStep) {
  Builder b;
  // Step 0: rank 1 is longest (120 us): 100 compute then a 20 us pipeline wait.
  b.steps = {{0, 0, 0, 100}, {0, 1, 0, 120}, {1, 0, 1000, 90}, {1, 1, 1000, 80}};
  b.phase(0, 0, "fwd", Wall::compute, 0, 100);
  b.phase(0, 1, "fwd", Wall::compute, 0, 100);
  b.phase(0, 1, "pp_recv", Wall::communication, 100, 20, "pp");
  b.phase(1, 0, "fwd", Wall::compute, 0, 60);
  b.phase(1, 0, "a2a", Wall::communication, 60, 30, "ep");
  b.phase(1, 1, "fwd", Wall::compute, 0, 80);
  Summary s = summarize(b.steps, b.phases, b.names);
  ASSERT_EQ(s.steps.size(), 2U);
  EXPECT_EQ(s.steps[0].critical_rank, 1);
  EXPECT_DOUBLE_EQ(s.steps[0].step_time_us, 120);
  EXPECT_DOUBLE_EQ(s.steps[0].walls->compute_us, 100);
  EXPECT_DOUBLE_EQ(s.steps[0].walls->bubble_us, 20);
  EXPECT_EQ(s.steps[1].critical_rank, 0);
  EXPECT_DOUBLE_EQ(s.steps[1].walls->communication_us, 30);
  EXPECT_DOUBLE_EQ(s.steps[1].walls->exposed_comm_us, 30);
  EXPECT_DOUBLE_EQ(s.walls_mean->compute_us, 80);
  EXPECT_DOUBLE_EQ(s.walls_mean->total_us(), 105);
  EXPECT_DOUBLE_EQ(s.step_time_us.median, 105);
  ASSERT_EQ(s.phases.size(), 3U);
  EXPECT_EQ(s.phases[0].phase, "fwd");
  EXPECT_EQ(s.phases[0].dur_us.count, 4U);
  EXPECT_DOUBLE_EQ(s.phases[0].dur_us.total, 340);
}

TEST(Summary, ThroughputAndMfuFollowTheDocumentedFormulas) {
  Builder b;
  b.steps = {{0, 0, 0, 1e6}, {0, 1, 0, 0.5e6}};  // 1 s step on the critical rank
  b.phase(0, 0, "fwd", Wall::compute, 0, 1e6);
  RunHeader h = make_header("sim", 2);
  SummaryInputs in;
  in.model_flops_per_step = Flops(2 * 494.5e12);  // 494.5 TFLOP per GPU in 1 s = half of 989
  in.tokens_per_step = 8192;
  in.gpu = "h100";
  in.gpu_peak = FlopsPerSecond(989e12);
  SummaryBuilder sb(h, in);
  Summary s = sb.build(b.steps, b.phases, b.names);
  EXPECT_DOUBLE_EQ(s.steps[0].tokens_per_s, 8192);
  EXPECT_DOUBLE_EQ(s.steps[0].tflops_per_gpu, 494.5);
  EXPECT_DOUBLE_EQ(s.steps[0].mfu, 0.5);
}

TEST(Summary, CoarseViewSumsTaggedOpsAndTakesTheWorstRank) {
  Builder b;
  b.steps = {{0, 0, 0, 2000}, {0, 1, 0, 1500}};
  b.phase(0, 0, "h2d_tokens", Wall::memory, 0, 100, nullptr, CoarseView::host_to_device);
  b.phase(0, 0, "h2d_labels", Wall::memory, 100, 50, nullptr, CoarseView::host_to_device);
  b.phase(0, 1, "h2d_tokens", Wall::memory, 0, 400, nullptr, CoarseView::host_to_device);
  b.phase(0, 1, "loss_allreduce", Wall::communication, 1400, 100, "dp", CoarseView::training_metrics);
  Summary s = summarize(b.steps, b.phases, b.names);
  EXPECT_DOUBLE_EQ(s.steps[0].coarse.host_to_device_ms, 0.4);
  EXPECT_DOUBLE_EQ(s.steps[0].coarse.training_metrics_ms, 0.1);
  EXPECT_DOUBLE_EQ(s.steps[0].coarse.training_step_ms, 2.0);
  // Only coarse-view records: walls cannot be computed and are absent, not invented.
  EXPECT_FALSE(s.steps[0].walls.has_value());
  EXPECT_FALSE(s.walls_mean.has_value());
}

TEST(Summary, JsonFollowsTheRunDirFormat) {
  Builder b;
  b.steps = {{0, 0, 0, 100}};
  b.phase(0, 0, "fwd", Wall::compute, 0, 100);
  RunHeader h = make_header("real", 1);
  h.scenario.name = "tiny";
  SummaryInputs in;
  in.gpu = "h200";
  in.gpu_memory = gibibytes(141);
  in.memory_classes.push_back(MemoryClass{0, "stage 0", 1, gibibytes(10), {{"weights", gibibytes(4)}}});
  in.measured_peak_by_rank[0] = gibibytes(9);
  SummaryBuilder sb(h, in);
  OrderedJson j = sb.json(b.steps, b.phases, b.names);
  EXPECT_EQ(j["schema"], "threewalls.run_dir");
  EXPECT_EQ(j["schema_version"], "1.2");
  EXPECT_EQ(j["source"], "real");
  EXPECT_EQ(j["scenario"]["name"], "tiny");
  EXPECT_EQ(j["steps"][0]["walls_us"]["compute"], 100.0);
  EXPECT_EQ(j["steps"][0]["coarse"]["training_step"]["duration_ms"], 0.1);
  EXPECT_EQ(j["walls_us"]["bubble"], 0.0);
  EXPECT_EQ(j["phases"][0]["median_us"], 100.0);
  EXPECT_EQ(j["memory"]["classes"][0]["breakdown_bytes"]["weights"], 4.0 * (1ULL << 30));
  EXPECT_EQ(j["memory"]["measured_peak_bytes_by_rank"]["0"], 9.0 * (1ULL << 30));
  EXPECT_EQ(j["memory"]["gpu_memory_bytes"], 141.0 * (1ULL << 30));
}

TEST(Summary, ReadBackRunGivesTheSameSummaryAsTheWritersKeptRecords) {
  auto dir = threewalls::profiler::testing::fresh_dir();
  SamplingConfig c;
  c.record_every_n_steps = 1;
  RunHeader h = make_header("sim", 2);
  RunDirWriter w(dir, h, SamplingPolicy(c, 2));
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < 2; ++r) {
      PhaseRecord p;
      p.step = s;
      p.rank = r;
      p.phase = w.phase_id("fwd");
      p.stream = w.stream_id("compute");
      p.start_us = 1.0 / 3.0;
      p.dur_us = 10.0 * (s + 1) + r / 7.0;
      w.add(p);
      w.add(StepRecord{s, r, s * 100.0, p.end_us() + 1});
    }
    w.end_step(s);
  }
  w.close();
  SummaryBuilder sb(w.header(), SummaryInputs{});
  auto a = sb.json(w.kept_steps(), w.kept_phases(), w.names());
  RunData d = RunDirReader::read(dir);
  auto b2 = sb.json(d.steps, d.phases, d.names);
  // Times are written rounded to the nanosecond: equal up to that rounding.
  expect_near_json(a, b2, 1e-3, "");
}
