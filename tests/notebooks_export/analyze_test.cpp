#include "threewalls/notebooks_export/analyze.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"

using namespace threewalls;
using namespace threewalls::notebooks_export;
using threewalls::notebooks_export::testing::synthetic;

namespace {

SyntheticSpec slow_spec() {
  SyntheticSpec s;
  s.ranks = 8;
  s.steps = 10;
  s.layers = 3;
  s.microbatches = 2;
  s.slow_rank = 5;
  s.slow_phase = "moe_experts_fwd";
  s.slow_factor = 2.0;
  s.slow_from = 3;
  s.slow_to = 6;
  return s;
}

}  // namespace

TEST(Analyze, FindsTheSlowRankItsPhaseAndItsStepRange) {
  auto run = synthetic(slow_spec(), "");
  Analysis a = analyze_run(run);
  ASSERT_EQ(a.slow_ranks.size(), 1U) << format_analysis_text(a);
  const SlowRank* s = find_slow_rank(a, 5);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->slow_steps, (std::vector<int>{3, 4, 5, 6}));
  EXPECT_EQ(s->first_slow_step, 3);
  EXPECT_EQ(s->last_slow_step, 6);
  EXPECT_FALSE(s->persistent);
  ASSERT_FALSE(s->phases.empty());
  EXPECT_EQ(s->phases.front().phase, "moe_experts_fwd");
  EXPECT_NEAR(*s->phases.front().excess_pct, 100.0, 1e-6);  // factor 2
  EXPECT_EQ(a.collective_pairing, "group_id");
  auto text = format_analysis_text(a);
  EXPECT_NE(text.find("rank 5 (stage 0)"), std::string::npos) << text;
  EXPECT_NE(text.find("bounded to steps 3..6: slow in 4 of 10 recorded steps"), std::string::npos) << text;
  EXPECT_NE(text.find("in moe_experts_fwd (compute)"), std::string::npos) << text;
}

TEST(Analyze, OthersWaitForTheSlowRankInCollectives) {
  auto run = synthetic(slow_spec(), "");
  Analysis a = analyze_run(run);
  ASSERT_FALSE(a.waits.empty());
  // The slow rank waits least (everyone waits for it) ...
  EXPECT_EQ(a.waits.back().rank, 5);
  // ... and is the one the EP group waits for.
  const GroupWait* ep = nullptr;
  for (const auto& g : a.groups) {
    if (g.group == "ep") ep = &g;
  }
  ASSERT_NE(ep, nullptr);
  ASSERT_TRUE(ep->most_waited_for.has_value());
  EXPECT_EQ(*ep->most_waited_for, 5);
  // Without noise, only the slow steps make anybody wait: 7 ranks x the slowed time per step.
  double total = 0;
  for (const auto& w : a.waits) total += w.total_wait_us;
  const double slowed = 250.0 * (2.0 - 1.0) * 3 /*layers*/ * 2 /*micro-batches*/;  // per slow step
  EXPECT_NEAR(total, 7 * slowed * 4 /*slow steps*/, 1e-3 * total);
}

TEST(Analyze, PersistentSlownessIsCalledPersistent) {
  auto spec = slow_spec();
  spec.slow_from = 0;
  spec.slow_to = -1;
  spec.slow_phase.clear();  // every compute op
  spec.slow_factor = 1.3;
  Analysis a = analyze_run(synthetic(spec, ""));
  const SlowRank* s = find_slow_rank(a, 5);
  ASSERT_NE(s, nullptr) << format_analysis_text(a);
  EXPECT_TRUE(s->persistent);
  EXPECT_EQ(s->slow_steps.size(), 10U);
  EXPECT_NE(format_analysis_text(a).find("persistent: slow in 10 of 10 recorded steps"), std::string::npos);
}

TEST(Analyze, FindsTheSlowRankThroughNoise) {
  auto spec = slow_spec();
  spec.noise = 0.03;
  spec.slow_factor = 1.6;
  spec.seed = 11;
  Analysis a = analyze_run(synthetic(spec, ""));
  ASSERT_FALSE(a.slow_ranks.empty()) << format_analysis_text(a);
  EXPECT_EQ(a.slow_ranks.front().rank, 5) << format_analysis_text(a);
  EXPECT_EQ(a.slow_ranks.front().phases.front().phase, "moe_experts_fwd");
  EXPECT_EQ(a.slow_ranks.front().first_slow_step, 3);
  EXPECT_EQ(a.slow_ranks.front().last_slow_step, 6);
}

TEST(Analyze, ANoisyBalancedRunHasNoSlowRank) {
  auto spec = slow_spec();
  spec.slow_rank = -1;
  spec.noise = 0.03;
  spec.seed = 5;
  Analysis a = analyze_run(synthetic(spec, ""));
  EXPECT_TRUE(a.slow_ranks.empty()) << format_analysis_text(a);
  EXPECT_NE(format_analysis_text(a).find("none: no rank's own time stands out"), std::string::npos);
}

TEST(Analyze, WithoutGroupIdInstancesArePairedByEndTime) {
  auto spec = slow_spec();
  spec.write_group_id = false;
  Analysis a = analyze_run(synthetic(spec, ""));
  EXPECT_EQ(a.collective_pairing, "end time");
  ASSERT_NE(find_slow_rank(a, 5), nullptr);
  EXPECT_EQ(find_slow_rank(a, 5)->slow_steps, (std::vector<int>{3, 4, 5, 6}));
  bool noted = false;
  for (const auto& n : a.notes) noted |= n.find("no group_id") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Analyze, PeersAreTheRanksOfTheSamePipelineStage) {
  auto spec = slow_spec();
  spec.stages = 2;  // ranks 0-3 stage 0, ranks 4-7 stage 1
  Analysis a = analyze_run(synthetic(spec, ""));
  ASSERT_EQ(a.slow_ranks.size(), 1U);
  EXPECT_EQ(a.slow_ranks.front().rank, 5);
  EXPECT_EQ(a.slow_ranks.front().stage, 1);
  for (const auto& r : a.ranks) EXPECT_EQ(r.stage, r.rank / 4);
}

TEST(Analyze, OneRecordedRankPerStageIsComparedAcrossStages) {
  auto spec = slow_spec();
  spec.ranks = 4;
  spec.stages = 4;  // one recorded rank per stage, as a simulation records its class representatives
  spec.slow_rank = 2;
  spec.slow_from = 0;
  spec.slow_to = 9;
  Analysis a = analyze_run(synthetic(spec, ""));
  EXPECT_EQ(a.peers, "other stages");
  EXPECT_TRUE(a.slow_ranks.empty());  // a stage is not a slow GPU: no finding without a same-stage peer
  ASSERT_EQ(a.ranks.size(), 4U);
  for (const auto& r : a.ranks) ASSERT_TRUE(r.own_vs_peers_pct.has_value()) << r.rank;
  for (const auto& r : a.ranks) {
    if (r.rank != 2) {
      EXPECT_LT(*r.own_vs_peers_pct, *a.ranks[2].own_vs_peers_pct) << r.rank;
    }
  }
  bool noted = false;
  for (const auto& n : a.notes) {
    EXPECT_EQ(n.find("no peers to compare"), std::string::npos) << n;
    noted |= n.find("compares each stage with the other stages") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  const std::string text = format_analysis_text(a);
  EXPECT_NE(text.find("peers = the other pipeline stages"), std::string::npos) << text;
  // Durations carry units: no bare microsecond counts such as 19133547.1 in the tables.
  EXPECT_EQ(text.find("step us"), std::string::npos) << text;
  EXPECT_NE(text.find(" ms"), std::string::npos) << text;
}

TEST(Analyze, ASingleRankRunSaysItHasNoPeers) {
  SyntheticSpec spec;
  spec.ranks = 1;
  spec.steps = 3;
  Analysis a = analyze_run(synthetic(spec, ""));
  EXPECT_TRUE(a.slow_ranks.empty());
  ASSERT_EQ(a.ranks.size(), 1U);
  bool noted = false;
  for (const auto& n : a.notes) noted |= n.find("one rank recorded") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_EQ(a.collective_pairing, "group_id");  // collectives are recorded, but have one member
  EXPECT_TRUE(a.waits.empty());
}

TEST(Analyze, WaitIsTheLastArrivalMinusOwnArrival) {
  // Three ranks, one all-reduce; arrivals (epoch + start) 110, 220, 550: waits 440, 330, 0.
  profiler::RunData run;
  run.header = profiler::make_header("real", 3);
  run.header.ranks = {0, 1, 2};
  auto ph = run.names.phases.intern("grad_allreduce");
  auto st = run.names.streams.intern("dp_comm");
  auto g = run.names.groups.intern("dp");
  const double epoch[3] = {100, 200, 500};
  const double start[3] = {10, 20, 50};
  for (int r = 0; r < 3; ++r) {
    run.steps.push_back({0, r, epoch[r], 1000});
    profiler::PhaseRecord p;
    p.rank = r;
    p.phase = ph;
    p.stream = st;
    p.wall = profiler::Wall::communication;
    p.group = g;
    p.group_id = 0;
    p.start_us = start[r];
    p.dur_us = 600 - epoch[r] - start[r];  // all end at 600
    run.phases.push_back(p);
  }
  Analysis a = analyze_run(run);
  ASSERT_EQ(a.waits.size(), 3U);
  EXPECT_EQ(a.waits[0].rank, 0);
  EXPECT_DOUBLE_EQ(a.waits[0].total_wait_us, 440);
  EXPECT_EQ(a.waits[1].rank, 1);
  EXPECT_DOUBLE_EQ(a.waits[1].total_wait_us, 330);
  EXPECT_EQ(a.waits[2].rank, 2);
  EXPECT_DOUBLE_EQ(a.waits[2].total_wait_us, 0);
  EXPECT_EQ(a.waits[2].last_arrivals, 1U);
  ASSERT_EQ(a.groups.size(), 1U);
  EXPECT_EQ(*a.groups[0].most_waited_for, 2);
  // Own time = step time - wait.
  EXPECT_DOUBLE_EQ(a.ranks[0].median_own_us, 1000 - 440);
  // Pipeline p2p (group pp) and records with a peer are not collectives.
  for (auto& p : run.phases) p.peer = 1;
  EXPECT_TRUE(analyze_run(run).waits.empty());
}

TEST(Analyze, JsonCarriesFindingsTablesAndThePerStepMatrix) {
  Analysis a = analyze_run(synthetic(slow_spec(), ""));
  auto j = analysis_json(a);
  EXPECT_EQ(j["slow_ranks"][0]["rank"], 5);
  EXPECT_EQ(j["slow_ranks"][0]["phases"][0]["phase"], "moe_experts_fwd");
  EXPECT_EQ(j["slow_ranks"][0]["persistent"], false);
  EXPECT_EQ(j["ranks"].size(), 8U);
  EXPECT_EQ(j["own_excess_pct"].size(), 8U);
  EXPECT_EQ(j["own_excess_pct"][5].size(), 10U);
  EXPECT_GT(j["own_excess_pct"][5][4].get<double>(), 5.0);
  EXPECT_EQ(j["groups"][0]["group"], "ep");
}
