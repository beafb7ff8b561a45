// StepRecorder and RecordSink (profiler/cuda, generic part) with a hand-driven clock: sampling,
// non-blocking harvest in step order, host-clock alignment, flushes once every rank is done.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include <unistd.h>

#include "threewalls/profiler/record_sink.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/step_recorder.hpp"

namespace threewalls::profiler {
namespace {

// Markers whose completion and time the test sets by hand.
struct ManualClock {
  using Stream = int;
  struct Marker {
    int id = -1;
    friend bool operator==(Marker a, Marker b) { return a.id == b.id; }
  };
  std::map<int, double> time;  // done markers and their time (us)
  std::map<int, int> live;     // marker -> stream, until released
  int next = 0;
  Marker mark(int s) {
    live[next] = s;
    return Marker{next++};
  }
  bool done(Marker m) { return m.id < 0 || time.count(m.id) != 0; }
  double elapsed_us(Marker a, Marker b) { return time.at(b.id) - time.at(a.id); }
  void release(Marker m) { live.erase(m.id); }
};

SamplingPolicy policy(int every, int world = 1, std::vector<int> ranks = {}) {
  SamplingConfig c;
  c.record_every_n_steps = every;
  c.flush_every_n_steps = 1;
  c.ranks = std::move(ranks);
  return SamplingPolicy(c, world);
}

TEST(StepRecorder, RecordsOnlySampledStepsAndCostsNoMarkerOtherwise) {
  ManualClock clock;
  StepRecorder<ManualClock> rec(clock, policy(2), 0, nullptr);
  EXPECT_TRUE(rec.begin_step(0, 0));
  rec.end_step(clock.mark(0));
  EXPECT_FALSE(rec.begin_step(1, 0));
  EXPECT_FALSE(rec.recording());
  rec.end_step({});
  EXPECT_EQ(clock.next, 2) << "an unsampled step records no marker";
}

TEST(StepRecorder, HarvestIsNonBlockingAndKeepsStepOrder) {
  ManualClock clock;
  StepRecorder<ManualClock> rec(clock, policy(1), 0, nullptr);
  const auto anchor = clock.mark(0);
  clock.time[anchor.id] = 0.0;
  rec.set_anchor(anchor, 1000.0);  // device time 0 = host time 1000 us
  PhaseRecord tmpl;
  tmpl.phase = 7;
  // Step 0: epoch at device 10, one phase 12..20, host phase at host 1025..1030, end at 30.
  const int epoch0 = clock.next;
  rec.begin_step(0, 0);
  const auto a = clock.mark(0);
  const auto b = clock.mark(0);
  rec.device_phase(tmpl, a, b);
  rec.host_phase(tmpl, 1025.0, 1030.0);
  const auto z0 = clock.mark(0);
  rec.end_step(z0);
  // Step 1 recorded too, finished first on the "device" (it cannot be harvested before step 0).
  rec.begin_step(1, 0);
  const int epoch1 = clock.next - 1;
  const auto z1 = clock.mark(0);
  rec.end_step(z1);
  clock.time[epoch1] = 40.0;
  clock.time[z1.id] = 50.0;
  EXPECT_EQ(rec.harvest(), 0U) << "step 0 is not finished: nothing is harvested, nothing waits";
  clock.time[epoch0] = 10.0;
  clock.time[a.id] = 12.0;
  clock.time[b.id] = 20.0;
  clock.time[z0.id] = 30.0;
  EXPECT_EQ(rec.harvest(), 2U);
  ASSERT_EQ(rec.kept_steps().size(), 2U);
  EXPECT_DOUBLE_EQ(rec.kept_steps()[0].epoch_us, 1010.0);
  EXPECT_DOUBLE_EQ(rec.kept_steps()[0].dur_us, 20.0);
  EXPECT_DOUBLE_EQ(rec.kept_steps()[1].epoch_us, 1040.0) << "the previous epoch is the new anchor";
  ASSERT_EQ(rec.kept_phases().size(), 2U);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[0].start_us, 2.0);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[0].dur_us, 8.0);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[1].start_us, 15.0) << "host phases are placed through the anchor";
  EXPECT_DOUBLE_EQ(rec.kept_phases()[1].dur_us, 5.0);
  EXPECT_EQ(rec.kept_phases()[0].phase, 7U);
  // Every marker went back to the clock except the current anchor (step 1's epoch).
  EXPECT_EQ(clock.live.size(), 1U);
  EXPECT_EQ(clock.live.count(epoch1), 1U);
}

TEST(StepRecorder, AHostPhaseThatWaitedStartsWhenTheDeviceWorkWasDone) {
  ManualClock clock;
  StepRecorder<ManualClock> rec(clock, policy(1), 0, nullptr);
  const auto anchor = clock.mark(0);
  clock.time[anchor.id] = 0.0;
  rec.set_anchor(anchor, 1000.0);
  PhaseRecord tmpl;
  const int epoch = clock.next;
  rec.begin_step(0, 0);
  const auto behind = clock.mark(0);  // the device work the host waits for ends at device 25
  // The host arrived at 1015 (5 us after the epoch), woke up and went on at 1032.
  rec.host_phase_after(tmpl, {behind}, 1015.0, 1032.0);
  // A host phase whose device work was done before the host arrived starts on arrival.
  const auto early = clock.mark(0);
  rec.host_phase_after(tmpl, {early}, 1040.0, 1041.0);
  const auto z = clock.mark(0);
  rec.end_step(z);
  clock.time[epoch] = 10.0;
  clock.time[behind.id] = 25.0;
  clock.time[early.id] = 26.0;
  clock.time[z.id] = 50.0;
  ASSERT_EQ(rec.harvest(), 1U);
  ASSERT_EQ(rec.kept_phases().size(), 2U);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[0].start_us, 15.0);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[0].dur_us, 7.0);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[1].start_us, 30.0);
  EXPECT_DOUBLE_EQ(rec.kept_phases()[1].dur_us, 1.0);
  EXPECT_EQ(clock.live.size(), 1U) << "the markers behind the waits went back to the clock";
}

TEST(StepRecorder, ARankThatDoesNotRecordIsDisabled) {
  ManualClock clock;
  StepRecorder<ManualClock> rec(clock, policy(1, 2, {1}), 0, nullptr);
  EXPECT_FALSE(rec.enabled());
  EXPECT_FALSE(rec.begin_step(0, 0));
  EXPECT_EQ(clock.next, 0);
}

TEST(RecordSink, FlushesAStepOnceEveryLocalRankFinishedIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("tw_sink_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  RunHeader h = make_header("real", 2);
  h.scenario = {"sink", "", ""};
  SamplingConfig c;
  c.record_every_n_steps = 1;
  c.flush_every_n_steps = 1;
  RunDirWriter writer(dir, h, SamplingPolicy(c, 2));
  {
    RecordSink sink(&writer, {0, 1});
    PhaseRecord p;
    p.phase = sink.phase_id("fwd");
    p.stream = sink.stream_id("compute");
    p.rank = 0;
    sink.submit(StepRecord{0, 0, 0.0, 5.0}, {p});
    sink.step_done(0, 0);
    p.rank = 1;
    sink.submit(StepRecord{0, 1, 0.0, 6.0}, {p});
    sink.step_done(1, 0);
    sink.close();
    EXPECT_EQ(sink.submitted_records(), 2U);
  }
  writer.close();
  const RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.phases.size(), 2U);
  EXPECT_EQ(d.steps.size(), 2U);
  std::filesystem::remove_all(dir);
}

TEST(RecordSink, WithoutAWriterAcceptsNothing) {
  RecordSink sink(nullptr, {0});
  EXPECT_FALSE(sink.enabled());
  sink.submit(StepRecord{}, {PhaseRecord{}});
  sink.step_done(0, 0);
  sink.close();
  EXPECT_EQ(sink.submitted_records(), 0U);
}

}  // namespace
}  // namespace threewalls::profiler
