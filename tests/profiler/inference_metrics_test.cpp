// Inference and expert-offload metrics of summary.json (summary.hpp, InferenceStep): a hand-built
// decode step whose expert wait, bubble ratio, sync overhead, bytes and hit rate are known.
#include <gtest/gtest.h>

#include "threewalls/profiler/summary.hpp"

using namespace threewalls;
using namespace threewalls::profiler;

namespace {

struct Step {
  Names names;
  std::vector<StepRecord> steps;
  std::vector<PhaseRecord> phases;

  void add(int step, const char* phase, const char* stream, Wall wall, int layer, double start, double end,
           double bytes = 0.0) {
    PhaseRecord p;
    p.step = step;
    p.rank = 0;
    p.phase = names.phases.intern(phase);
    p.stream = names.streams.intern(stream);
    p.wall = wall;
    p.layer = layer;
    p.start_us = start;
    p.dur_us = end - start;
    p.bytes = bytes;
    phases.push_back(p);
  }
};

// One decode step of 200 us on one rank (the numbers in the comments are the expected metrics):
//   layer 1: routing decided at 25; its two experts arrive at 70 and 110; the GPU runs nothing else
//            meanwhile: expert wait [25, 110) = 85 us
//   layer 2: its expert was prefetched (copy ends at 80, before its router at 135): no wait
//   layer 3: routing at 145, expert arrives at 160, a shared expert runs [145, 150): wait 10 us
//   syncs:   routing read 5 + fetch sync 2 + expert barrier 1 + sampled-token read 5 = 13 us
Step decode_step() {
  Step s;
  s.steps = {{0, 0, 0, 200}, {1, 0, 200, 100}};
  s.add(0, "host_to_device", "copy", Wall::memory, -1, 0, 2, 64);
  s.add(0, "attn_core_fwd", "compute", Wall::compute, 1, 2, 20);
  s.add(0, "router_topk_fwd", "compute", Wall::memory, 1, 20, 25);
  s.add(0, "moe_routing_stats_read_fwd", "host", Wall::host, 1, 25, 30);
  s.add(0, "expert_fetch_h2d", "copy", Wall::memory, 1, 30, 70, 1000);
  s.add(0, "expert_fetch_h2d", "copy", Wall::memory, 1, 70, 110, 1000);
  s.add(0, "expert_fetch_sync", "host", Wall::host, 1, 110, 112);
  s.add(0, "expert_wait", "host", Wall::host, 1, 112, 113);
  s.add(0, "expert_fc1_fwd", "compute", Wall::compute, 1, 115, 130);
  s.add(0, "expert_fetch_disk", "disk", Wall::memory, 2, 50, 60, 500);
  s.add(0, "expert_fetch_h2d", "copy_1", Wall::memory, 2, 60, 80, 1000);
  s.add(0, "router_topk_fwd", "compute", Wall::memory, 2, 130, 135);
  s.add(0, "router_topk_fwd", "compute", Wall::memory, 3, 140, 145);
  s.add(0, "expert_fetch_h2d", "copy", Wall::memory, 3, 145, 160, 1000);
  s.add(0, "shared_expert_fc1_fwd", "compute", Wall::compute, 3, 145, 150);
  s.add(0, "expert_fc1_fwd", "compute", Wall::compute, 3, 162, 180);
  s.add(0, "sampled_token_read", "host", Wall::host, -1, 190, 195);
  // Step 1: a prefill without fetches.
  s.add(1, "attn_core_fwd", "compute", Wall::compute, 1, 0, 90);
  s.add(1, "sampled_token_read", "host", Wall::host, -1, 90, 100);
  return s;
}

SummaryInputs inputs() {
  SummaryInputs in;
  in.tokens_per_step = 1e9;  // replaced per step by inference_steps
  InferenceStepInput d;
  d.kind = "decode";
  d.tokens = 8;
  d.by_rank[0] = {10, 6};
  InferenceStepInput p;
  p.kind = "prefill";
  p.tokens = 2048;
  p.by_rank[0] = {30, 30};
  in.inference_steps = {{0, d}, {1, p}};
  return in;
}

}  // namespace

TEST(InferenceMetrics, ExpertWaitIsTheGpuIdleBetweenRoutingAndTheExpertsArrival) {
  const Step s = decode_step();
  const Summary sum = summarize(s.steps, s.phases, s.names);
  ASSERT_TRUE(sum.steps[0].inference.has_value());
  const InferenceStep& m = *sum.steps[0].inference;
  EXPECT_DOUBLE_EQ(m.expert_wait_us, 95);
  EXPECT_DOUBLE_EQ(m.bubble_ratio, 95.0 / 200.0);
  EXPECT_DOUBLE_EQ(m.sync_overhead_us, 13);
  EXPECT_DOUBLE_EQ(m.sync_overhead_share, 13.0 / 200.0);
  EXPECT_DOUBLE_EQ(m.bytes_fetched_h2d, 4000);
  EXPECT_DOUBLE_EQ(m.bytes_fetched_disk, 500);
  EXPECT_EQ(m.experts_fetched, 4);
  // Records cannot carry activations: without the executor's inputs the hit rate is unknown.
  EXPECT_FALSE(m.cache_hit_rate.has_value());
  EXPECT_DOUBLE_EQ(sum.steps[1].inference->expert_wait_us, 0);
}

TEST(InferenceMetrics, ComputeOverlappingAFetchIsNotWaiting) {
  // The same layer 1, but the GPU runs a 60 us kernel while the experts are copied: only [85, 110)
  // of the copy is waited for.
  Step s = decode_step();
  s.add(0, "shared_expert_fc1_fwd", "shared_expert", Wall::compute, 1, 25, 85);
  const Summary sum = summarize(s.steps, s.phases, s.names);
  EXPECT_DOUBLE_EQ(sum.steps[0].inference->expert_wait_us, 95 - 60);
}

TEST(InferenceMetrics, HitRateKindAndTokensComeFromTheExecutorAndAggregateAsRatiosOfSums) {
  const Step s = decode_step();
  const RunHeader h = make_header("sim", 1);
  const SummaryBuilder b(h, inputs());
  const Summary sum = b.build(s.steps, s.phases, s.names);
  const InferenceStep& d = *sum.steps[0].inference;
  EXPECT_EQ(d.kind, "decode");
  EXPECT_EQ(d.experts_activated, 10);
  EXPECT_EQ(d.cache_hits, 6);
  EXPECT_DOUBLE_EQ(*d.cache_hit_rate, 0.6);
  EXPECT_DOUBLE_EQ(sum.steps[0].tokens_per_s, 8 / 200e-6);
  EXPECT_DOUBLE_EQ(sum.steps[1].tokens_per_s, 2048 / 100e-6);
  ASSERT_EQ(sum.inference.size(), 3U);
  EXPECT_EQ(sum.inference[0].first, "all");
  EXPECT_EQ(sum.inference[1].first, "decode");
  EXPECT_EQ(sum.inference[2].first, "prefill");
  const InferenceAggregate& all = sum.inference[0].second;
  EXPECT_EQ(all.steps, 2U);
  EXPECT_DOUBLE_EQ(all.bubble_ratio, 95.0 / 300.0);
  EXPECT_DOUBLE_EQ(all.sync_overhead_share, (13.0 + 10.0) / 300.0);
  EXPECT_DOUBLE_EQ(*all.cache_hit_rate, 36.0 / 40.0);
  EXPECT_DOUBLE_EQ(all.tokens_per_s, 2056 / 300e-6);
  EXPECT_DOUBLE_EQ(all.bytes_fetched_h2d_mean, 2000);
  const InferenceAggregate& dec = sum.inference[1].second;
  EXPECT_EQ(dec.steps, 1U);
  EXPECT_DOUBLE_EQ(dec.bubble_ratio, 95.0 / 200.0);
  EXPECT_DOUBLE_EQ(dec.tokens_per_s, 8 / 200e-6);
}

TEST(InferenceMetrics, JsonCarriesPerStepAndAggregatedMetrics) {
  const Step s = decode_step();
  const RunHeader h = make_header("sim", 1);
  const SummaryBuilder b(h, inputs());
  const OrderedJson j = b.json(s.steps, s.phases, s.names);
  const OrderedJson& st = j.at("steps").at(0).at("inference");
  EXPECT_EQ(st.at("kind"), "decode");
  EXPECT_DOUBLE_EQ(st.at("expert_wait_us").get<double>(), 95);
  EXPECT_DOUBLE_EQ(st.at("bubble_ratio").get<double>(), 0.475);
  EXPECT_DOUBLE_EQ(st.at("bytes_fetched").at("disk").get<double>(), 500);
  EXPECT_DOUBLE_EQ(st.at("cache_hit_rate").get<double>(), 0.6);
  const OrderedJson& agg = j.at("inference");
  EXPECT_TRUE(agg.contains("all"));
  EXPECT_TRUE(agg.contains("decode"));
  EXPECT_TRUE(agg.contains("prefill"));
  EXPECT_DOUBLE_EQ(agg.at("decode").at("bubble_ratio").get<double>(), 0.475);
}

TEST(InferenceMetrics, TrainingRunsHaveNoInferenceBlock) {
  Names names;
  std::vector<StepRecord> steps = {{0, 0, 0, 100}};
  PhaseRecord p;
  p.phase = names.phases.intern("attn_qkv_fwd");
  p.stream = names.streams.intern("compute");
  p.dur_us = 100;
  std::vector<PhaseRecord> phases = {p};
  const RunHeader h = make_header("sim", 1);
  const OrderedJson j = SummaryBuilder(h, SummaryInputs{}).json(steps, phases, names);
  EXPECT_FALSE(j.contains("inference"));
  EXPECT_FALSE(j.at("steps").at(0).contains("inference"));
}
