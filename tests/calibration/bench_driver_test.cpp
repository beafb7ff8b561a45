// The calibration driver's host logic: stop rule, time budget, the driver loop (error and skipped
// records, metrics) and the raw output round trip, with fake runners and a fake clock.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "threewalls/calibration/bench/budget.hpp"
#include "threewalls/calibration/bench/driver.hpp"
#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/bench/stop_rule.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"

using namespace threewalls;
using namespace threewalls::calibration::bench;

// ---- stop rule ----

TEST(StopRule, MedianCiOfIdenticalSamplesIsZeroAndOfFewSamplesIsTheRange) {
  EXPECT_EQ(median_ci_rel_half_width({2.0, 2.0, 2.0, 2.0, 2.0, 2.0}), 0.0);
  EXPECT_TRUE(std::isinf(median_ci_rel_half_width({1.0})));
  // Three samples: the CI is [min, max]: (1.2 - 1.0) / (2 * 1.1).
  EXPECT_NEAR(median_ci_rel_half_width({1.0, 1.1, 1.2}), 0.2 / 2.2, 1e-12);
}

TEST(StopRule, ConvergesOnQuietSamplesAfterTheMinimum) {
  StopRule r;
  r.min_samples = 5;
  r.target_rel_ci = 0.01;
  r.time_bound_s = 10.0;
  std::vector<double> s{1.0, 1.001, 0.999, 1.0};
  EXPECT_EQ(should_stop(r, s, 0.0), StopReason::keep_going);  // below the minimum
  s.push_back(1.0005);
  EXPECT_EQ(should_stop(r, s, 0.0), StopReason::converged);
}

TEST(StopRule, NoisySamplesRunUntilTheTimeBoundOrTheMaximum) {
  StopRule r;
  r.min_samples = 5;
  r.max_samples = 40;
  r.target_rel_ci = 0.01;
  r.time_bound_s = 1.0;
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  std::vector<double> s;
  for (int i = 0; i < 10; ++i) s.push_back(u(gen));
  EXPECT_EQ(should_stop(r, s, 0.5), StopReason::keep_going);
  EXPECT_EQ(should_stop(r, s, 1.0), StopReason::time_bound);
  while (s.size() < 40) s.push_back(u(gen));
  EXPECT_EQ(should_stop(r, s, 0.5), StopReason::max_samples);
  // The time bound never cuts below the minimum sample count.
  EXPECT_EQ(should_stop(r, {1.0, 2.0}, 100.0), StopReason::keep_going);
}

TEST(StopRule, SmallKernelsAreTimedInBatches) {
  EXPECT_EQ(reps_per_sample(5e-6, 4e-4, 64), 64);  // 80 wanted, capped
  EXPECT_EQ(reps_per_sample(1e-4, 4e-4, 64), 4);
  EXPECT_EQ(reps_per_sample(1e-3, 4e-4, 64), 1);
  EXPECT_EQ(reps_per_sample(0.0, 4e-4, 64), 1);  // no estimate: one run
  EXPECT_EQ(reps_per_sample(5e-6, 4e-4, 1), 1);  // batching not allowed
}

TEST(StopRule, SampleUntilStopsOnTheFakeClock) {
  double now = 0.0;
  const Clock clock = [&] { return now; };
  StopRule r;
  r.min_samples = 3;
  r.max_samples = 1000;
  r.target_rel_ci = 1e-9;  // never converges: alternating samples
  r.time_bound_s = 1.0;
  int i = 0;
  const Sampling s = sample_until(r, clock, [&] {
    now += 0.125;
    return (i++ % 2) ? 1.0 : 2.0;
  });
  EXPECT_EQ(s.reason, StopReason::time_bound);
  EXPECT_EQ(s.samples.size(), 8U);  // 8 x 0.125 s reaches the 1 s bound
}

// ---- budget ----

TEST(Budget, SectionsGetTheirShareAndUnusedTimeFlowsOn) {
  Budget b(100.0, {{"a", 1, 10}, {"b", 1, 10}, {"c", 2, 10}}, 0.01, 100.0);
  b.begin("a");
  EXPECT_DOUBLE_EQ(b.allocated("a"), 25.0);
  EXPECT_DOUBLE_EQ(b.point_bound(), 2.5);
  b.spend(5.0, true);  // a uses only 5 s of its 25
  b.begin("b");
  EXPECT_DOUBLE_EQ(b.allocated("b"), 95.0 / 3.0);  // the rest of 95 s by share 1 : 2
  b.spend(95.0 / 3.0, true);
  b.begin("c");
  EXPECT_NEAR(b.allocated("c"), 95.0 - 95.0 / 3.0, 1e-9);
  EXPECT_THROW(b.begin("a"), std::logic_error);
}

TEST(Budget, PointBoundShrinksAsTheSectionSpendsAndIsClamped) {
  Budget b(10.0, {{"a", 1, 4}}, 0.5, 3.0);
  b.begin("a");
  EXPECT_DOUBLE_EQ(b.point_bound(), 2.5);
  b.spend(7.0, true);                      // one expensive point
  EXPECT_DOUBLE_EQ(b.point_bound(), 1.0);  // 3 s left over 3 points
  b.spend(2.9, true);
  EXPECT_DOUBLE_EQ(b.point_bound(), 0.5);  // clamped to the minimum
}

TEST(Budget, OverrunningSectionIsSkippedAndSoIsEverythingAfterTheHardLimit) {
  Budget b(100.0, {{"a", 1, 10}, {"b", 1, 10}}, 0.01, 100.0, 1.15);
  b.begin("a");
  EXPECT_EQ(b.skip_reason(), "");
  b.spend(74.0, true);  // 1.48 x its 50 s
  EXPECT_EQ(b.skip_reason(), "");
  b.spend(2.0, true);
  EXPECT_NE(b.skip_reason().find("section 'a' spent 76.0 s of its 50.0 s"), std::string::npos) << b.skip_reason();
  b.begin("b");
  EXPECT_EQ(b.skip_reason(), "");
  b.spend(40.0, true);  // 116 s in all: past 1.15 x 100
  EXPECT_NE(b.skip_reason().find("time budget is spent"), std::string::npos) << b.skip_reason();
}

// ---- driver ----

namespace {

PointSpec point(const std::string& op, const std::string& family, double bytes, double flops = 0.0) {
  PointSpec p;
  p.op = op;
  p.family = family;
  p.params = {{"bytes", bytes}};
  p.inputs = {bytes};
  p.bytes = bytes;
  p.flops = flops;
  return p;
}

class FakeRunner : public PointRunner {
 public:
  std::vector<std::string> log;
  std::string fail_section;
  double fail_bytes = -1;
  double* now = nullptr;
  double seconds_per_point = 0.0;

  void begin_section(const std::string& s, const std::vector<PointSpec>& pts) override {
    log.push_back("begin " + s + " " + std::to_string(pts.size()));
    if (s == fail_section) throw std::runtime_error("no device memory");
  }
  void end_section(const std::string& s) override { log.push_back("end " + s); }
  void measure(const StopRule& rule, Record& r) override {
    if (r.point.bytes == fail_bytes) throw std::runtime_error("correctness check failed: bytes differ");
    if (now) *now += seconds_per_point;
    r.samples_s = {1e-3, 1.1e-3, 0.9e-3};
    r.stop = "converged";
    r.check = "passed";
    log.push_back("measure " + r.point.label() + " bound " + std::to_string(rule.time_bound_s));
  }
};

}  // namespace

TEST(CalibrationDriver, FailedPointIsAnErrorRecordAndTheSweepGoesOn) {
  const std::vector<PointSpec> plan{point("copy_d2d", "copy.d2d", 4096), point("copy_d2d", "copy.d2d", 8192),
                                    point("copy_d2d", "copy.d2d", 16384)};
  FakeRunner runner;
  runner.fail_bytes = 8192;
  Budget budget(10.0, sections_of(plan), 0.01, 1.0);
  double now = 0.0;
  const auto records = run_points(plan, runner, budget, default_stop_rule(Mode::quick), [&] { return now; });
  ASSERT_EQ(records.size(), 3U);
  EXPECT_EQ(records[0].status, Status::ok);
  EXPECT_EQ(records[1].status, Status::error);
  EXPECT_EQ(records[1].error, "correctness check failed: bytes differ");
  EXPECT_TRUE(records[1].samples_s.empty());
  EXPECT_EQ(records[2].status, Status::ok);
  // Metrics from the op's definitions: 16384 bytes in 1 ms.
  ASSERT_EQ(records[2].metrics.size(), 1U);
  EXPECT_EQ(records[2].metrics[0].key, "gb_per_s");
  EXPECT_NEAR(records[2].metrics[0].value, 16384 / 1e-3 / 1e9, 1e-12);
  EXPECT_EQ(runner.log.front(), "begin copy 3");
  EXPECT_EQ(runner.log.back(), "end copy");
}

TEST(CalibrationDriver, SectionThatCannotBeSetUpFailsItsPointsOnly) {
  std::vector<PointSpec> plan{point("copy_d2d", "copy.d2d", 4096), point("elementwise_add", "elementwise", 6144)};
  plan[1].params = {{"elements", 1024}};
  FakeRunner runner;
  runner.fail_section = "copy";
  Budget budget(10.0, sections_of(plan), 0.01, 1.0);
  const auto records = run_points(plan, runner, budget, default_stop_rule(Mode::quick), steady_clock());
  ASSERT_EQ(records.size(), 2U);
  EXPECT_EQ(records[0].status, Status::error);
  EXPECT_EQ(records[0].error, "section 'copy' could not be set up: no device memory");
  EXPECT_EQ(records[1].status, Status::ok);
}

TEST(CalibrationDriver, PointsPastTheBudgetAreSkippedRecords) {
  std::vector<PointSpec> plan;
  for (int i = 0; i < 10; ++i) plan.push_back(point("copy_d2d", "copy.d2d", 4096.0 * (i + 1)));
  FakeRunner runner;
  double now = 0.0;
  runner.now = &now;
  runner.seconds_per_point = 4.0;  // far more than the 10 s budget allows for 10 points
  Budget budget(10.0, sections_of(plan), 0.01, 1.0);
  const auto records = run_points(plan, runner, budget, default_stop_rule(Mode::quick), [&] { return now; });
  int ok = 0, skipped = 0;
  for (const auto& r : records) {
    if (r.status == Status::ok) ++ok;
    if (r.status == Status::skipped) {
      ++skipped;
      EXPECT_NE(r.error.find("skipped:"), std::string::npos) << r.error;
    }
  }
  EXPECT_EQ(ok + skipped, 10);
  EXPECT_EQ(ok, 3);  // after 3 x 4 s = 12 s the calibration is past 1.15 x its 10 s
}

TEST(CalibrationDriver, SectionsFollowThePlanOrderWithTheirShares) {
  std::vector<PointSpec> plan{point("copy_d2d", "copy.d2d", 1), point("copy_d2d", "copy.d2d", 2),
                              point("all_reduce", "collective.all_reduce.nvlink", 3)};
  const auto s = sections_of(plan);
  ASSERT_EQ(s.size(), 2U);
  EXPECT_EQ(s[0].name, "copy");
  EXPECT_EQ(s[0].points, 2);
  EXPECT_EQ(s[1].name, "collective");
  EXPECT_GT(s[1].share, s[0].share);
  EXPECT_LE(default_budget_s(Mode::quick), 90.0);
  EXPECT_LE(default_budget_s(Mode::full), 300.0);
}

// ---- raw output ----

TEST(CalibrationRaw, RecordsRoundTripThroughTheRawFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("tw_calib_raw_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  RawHeader h;
  h.tool_version = "0.1.0";
  h.git_sha = "abc";
  h.mode = "quick";
  h.started = "2026-11-22T00:00:00Z";
  h.argv = {"threewalls", "calibrate"};
  h.hardware.gpu_name = "NVIDIA H100 80GB HBM3";
  h.hardware.gpu_kind = "h100";
  h.hardware.sm_count = 132;
  h.hardware.links_seen = {"NV18 (NVLink, 18 links): 1 GPU pair"};
  h.gpus_used = 2;
  Record ok;
  ok.point = point("all_reduce", "collective.all_reduce.nvlink", 1 << 20);
  ok.point.group_size = 2;
  ok.point.inputs = {2, 1 << 20};
  ok.samples_s = {1e-5, 1.2e-5, 1.1e-5};
  ok.reps = 8;
  ok.stop = "converged";
  ok.rel_ci = 0.004;
  ok.check = "passed";
  ok.metrics = derived_metrics(ok.point, ok.median_s());
  Record bad;
  bad.point = point("copy_d2d", "copy.d2d", 4096);
  bad.status = Status::error;
  bad.error = "rank 0: out of memory";
  {
    JsonlWriter w(dir / "points.jsonl");
    w.write(to_json(h));
    w.write(to_json(ok));
    w.write(to_json(bad));
  }
  const RawFile back = read_raw(dir / "points.jsonl");
  EXPECT_EQ(back.header.hardware.gpu_name, h.hardware.gpu_name);
  EXPECT_EQ(back.header.gpus_used, 2);
  ASSERT_EQ(back.records.size(), 2U);
  EXPECT_EQ(back.records[0].samples_s, ok.samples_s);
  EXPECT_EQ(back.records[0].point.inputs, ok.point.inputs);
  EXPECT_EQ(back.records[0].point.group_size, 2);
  EXPECT_EQ(back.records[0].reps, 8);
  EXPECT_EQ(back.records[1].status, Status::error);
  EXPECT_EQ(back.records[1].error, bad.error);
  // busbw of a 1 MiB all-reduce on 2 GPUs in 11 us: algbw = busbw.
  EXPECT_NEAR(ok.metrics[1].value, (1 << 20) / 1.1e-5 / 1e9, 1e-9);
  std::filesystem::remove_all(dir);
}

TEST(CalibrationRaw, BadLinesAreInputErrorsNamingFileLineAndKey) {
  const auto path = std::filesystem::temp_directory_path() / ("tw_calib_bad_" + std::to_string(::getpid()) + ".jsonl");
  auto write = [&](const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  auto error_of = [&] {
    try {
      (void)read_raw(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  write("{\"format\": \"threewalls.calibration_raw\", \"format_version\": \"2.0\"}\n");
  EXPECT_NE(
      error_of().find(":1: 'format_version' = \"2.0\": this threewalls reads threewalls.calibration_raw 1.x only"),
      std::string::npos)
      << error_of();
  write("{\"format\": \"something_else\"}\n");
  EXPECT_NE(error_of().find("'format' = \"something_else\""), std::string::npos) << error_of();
  write("");
  EXPECT_NE(error_of().find("empty file"), std::string::npos) << error_of();
  std::filesystem::remove(path);
}

// calibrate --host-processes: each host point keeps the record of the process whose median
// is the median over the processes; other groups, and points only one process measured, stay; a
// refit finds the child processes' raw folders next to points.jsonl and merges them the same way.
TEST(CalibrationRaw, HostPointsKeepTheMedianProcessAndOtherGroupsStay) {
  auto rec = [](const char* op, const char* family, double median) {
    Record r;
    r.point = point(op, family, 0);
    r.samples_s = {0.9 * median, median, 1.1 * median};
    r.check = "passed";
    return r;
  };
  std::vector<Record> main{rec("host_kernel_launch", "host.kernel_launch", 3.0e-6),
                           rec("host_event_record", "host.event_record", 1.0e-6),
                           rec("copy_d2d", "copy.d2d", 5.0e-6)};
  std::vector<std::vector<Record>> others{
      {rec("host_kernel_launch", "host.kernel_launch", 5.0e-6), rec("copy_d2d", "copy.d2d", 9.0e-6)},
      {rec("host_kernel_launch", "host.kernel_launch", 4.0e-6)},
      {rec("host_kernel_launch", "host.kernel_launch", 6.0e-6)},
      {rec("host_kernel_launch", "host.kernel_launch", 4.5e-6)}};
  // A point with parameters, listed in another order by the other process (a raw file read back
  // orders them by key): the same point.
  auto gemm = [&](double median, bool reversed) {
    Record r = rec("host_gemm_launch", "host.gemm_call", median);
    r.point.params = reversed ? std::vector<Param>{{"n", 2560}, {"m", 64}, {"k", 640}}
                              : std::vector<Param>{{"m", 64}, {"n", 2560}, {"k", 640}};
    return r;
  };
  main.push_back(gemm(6.0e-6, false));
  others[0].push_back(gemm(9.0e-6, true));
  others[1].push_back(gemm(7.0e-6, true));
  EXPECT_EQ(merge_host_processes(main, others), 2U);
  EXPECT_DOUBLE_EQ(main[0].median_s(), 4.5e-6);  // of 3, 5, 4, 6, 4.5 us
  EXPECT_DOUBLE_EQ(main[3].median_s(), 7.0e-6);  // of 6, 9, 7 us
  EXPECT_NE(main[0].check.find("5 processes"), std::string::npos) << main[0].check;
  EXPECT_DOUBLE_EQ(main[1].median_s(), 1.0e-6);  // no other process measured it
  EXPECT_DOUBLE_EQ(main[2].median_s(), 5.0e-6);  // not a host point
  // The refit's side: RAW/host_process_1/points.jsonl, RAW/host_process_2/points.jsonl.
  const auto dir = std::filesystem::temp_directory_path() / ("tw_host_processes_" + std::to_string(::getpid()));
  RawHeader h;
  h.mode = "full";
  h.hardware.gpu_kind = "h100";
  for (int i = 1; i <= 2; ++i) {
    std::filesystem::create_directories(dir / ("host_process_" + std::to_string(i)));
    JsonlWriter w(dir / ("host_process_" + std::to_string(i)) / "points.jsonl");
    w.write(to_json(h));
    w.write(to_json(rec("host_event_record", "host.event_record", i == 1 ? 2.0e-6 : 3.0e-6)));
  }
  EXPECT_EQ(host_process_dirs(dir).size(), 2U);
  std::vector<Record> refit{rec("host_event_record", "host.event_record", 1.0e-6)};
  EXPECT_EQ(merge_host_process_dirs(dir, refit), 3);
  EXPECT_DOUBLE_EQ(refit[0].median_s(), 2.0e-6);  // of 1, 2, 3 us
  std::vector<Record> none{rec("host_event_record", "host.event_record", 1.0e-6)};
  EXPECT_EQ(merge_host_process_dirs(dir / "absent", none), 1);
  EXPECT_DOUBLE_EQ(none[0].median_s(), 1.0e-6);
  std::filesystem::remove_all(dir);
}
