#include "threewalls/profiler/sampling.hpp"

#include <gtest/gtest.h>

#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::profiler;

namespace {

SamplingPolicy policy(int start, int end, int every, int flush, std::vector<int> ranks = {}, int world = 8,
                      Granularity g = Granularity::layer) {
  SamplingConfig c;
  c.start_step = start;
  c.end_step = end;
  c.record_every_n_steps = every;
  c.flush_every_n_steps = flush;
  c.ranks = std::move(ranks);
  c.granularity = g;
  return SamplingPolicy(c, world);
}

std::vector<int> recorded_steps(const SamplingPolicy& p, int upto) {
  std::vector<int> out;
  for (int s = 0; s < upto; ++s) {
    if (p.records(s)) out.push_back(s);
  }
  return out;
}

std::string error_of(const SamplingConfig& c, int world) {
  try {
    SamplingPolicy p(c, world);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SamplingPolicy, RecordsEveryNthStepFromStartStep) {
  EXPECT_EQ(recorded_steps(policy(3, -1, 10, 10), 40), (std::vector<int>{3, 13, 23, 33}));
  EXPECT_EQ(recorded_steps(policy(0, -1, 1, 1), 4), (std::vector<int>{0, 1, 2, 3}));
}

TEST(SamplingPolicy, EndStepIsInclusive) {
  EXPECT_EQ(recorded_steps(policy(2, 8, 3, 10), 40), (std::vector<int>{2, 5, 8}));
  EXPECT_EQ(recorded_steps(policy(2, 7, 3, 10), 40), (std::vector<int>{2, 5}));
}

TEST(SamplingPolicy, DefaultRecordsEveryTenthStepOfEveryRank) {
  SamplingPolicy p(SamplingConfig{}, 4);
  EXPECT_EQ(recorded_steps(p, 25), (std::vector<int>{0, 10, 20}));
  EXPECT_EQ(p.recording_ranks(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(SamplingPolicy, RanksListSelectsRanks) {
  auto p = policy(0, -1, 1, 1, {5, 1});
  EXPECT_EQ(p.recording_ranks(), (std::vector<int>{1, 5}));
  EXPECT_TRUE(p.records_rank(1));
  EXPECT_TRUE(p.records_rank(5));
  EXPECT_FALSE(p.records_rank(0));
  EXPECT_FALSE(p.records_rank(7));
  EXPECT_FALSE(p.records_rank(8));
  EXPECT_FALSE(p.records_rank(-1));
}

TEST(SamplingPolicy, CoarseGranularityKeepsOnlyCoarseViewOps) {
  auto coarse = policy(0, -1, 1, 1, {}, 8, Granularity::coarse);
  EXPECT_FALSE(coarse.records_phase(CoarseView::none));
  EXPECT_TRUE(coarse.records_phase(CoarseView::host_to_device));
  EXPECT_TRUE(coarse.records_phase(CoarseView::training_metrics));
  auto layer = policy(0, -1, 1, 1);
  EXPECT_TRUE(layer.records_phase(CoarseView::none));
  EXPECT_TRUE(layer.records_phase(CoarseView::host_to_device));
}

TEST(SamplingPolicy, FlushAfterEveryNStepsCountedFromStartAndAtEndStep) {
  auto p = policy(2, 12, 1, 4);
  std::vector<int> flushed;
  for (int s = 0; s < 20; ++s) {
    if (p.flush_after(s)) flushed.push_back(s);
  }
  EXPECT_EQ(flushed, (std::vector<int>{5, 9, 12, 13, 17}));
}

TEST(SamplingPolicy, DisabledRecordsNothing) {
  SamplingConfig c;
  c.enabled = false;
  SamplingPolicy p(c, 4);
  EXPECT_FALSE(p.enabled());
  EXPECT_TRUE(recorded_steps(p, 100).empty());
  EXPECT_FALSE(p.records_rank(0));
  EXPECT_FALSE(p.flush_after(9));
  EXPECT_TRUE(p.recording_ranks().empty());
  EXPECT_FALSE(SamplingPolicy().enabled());
}

TEST(SamplingPolicy, BadKnobsAreErrorsNamingTheKnobAndAllowedValues) {
  SamplingConfig c;
  c.ranks = {0, 9};
  auto e = error_of(c, 8);
  EXPECT_NE(e.find("profiler.ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("0..7"), std::string::npos) << e;
  c.ranks = {1, 1};
  EXPECT_NE(error_of(c, 8).find("listed twice"), std::string::npos);
  c = SamplingConfig{};
  c.record_every_n_steps = 0;
  EXPECT_NE(error_of(c, 8).find("profiler.record_every_n_steps"), std::string::npos);
  c = SamplingConfig{};
  c.flush_every_n_steps = 0;
  EXPECT_NE(error_of(c, 8).find("profiler.flush_every_n_steps"), std::string::npos);
  c = SamplingConfig{};
  c.start_step = 5;
  c.end_step = 4;
  e = error_of(c, 8);
  EXPECT_NE(e.find("profiler.end_step"), std::string::npos) << e;
  c = SamplingConfig{};
  c.start_step = -1;
  EXPECT_NE(error_of(c, 8).find("profiler.start_step"), std::string::npos);
  EXPECT_EQ(error_of(SamplingConfig{}, 8), "");
}

TEST(SamplingPolicy, EffectiveKnobsGoIntoJson) {
  auto j = policy(1, 9, 2, 3, {4, 2}, 8, Granularity::coarse).to_json();
  EXPECT_EQ(j["start_step"], 1);
  EXPECT_EQ(j["end_step"], 9);
  EXPECT_EQ(j["record_every_n_steps"], 2);
  EXPECT_EQ(j["flush_every_n_steps"], 3);
  EXPECT_EQ(j["recorded_ranks"], 2);
  EXPECT_FALSE(j.contains("ranks"));  // the list is run.json's alone: a header does not grow with the world
  EXPECT_EQ(j["granularity"], "coarse");
  EXPECT_EQ(policy(0, -1, 1, 1, {}, 70000, Granularity::layer).to_json().dump().size(),
            policy(0, -1, 1, 1, {}, 7, Granularity::layer).to_json().dump().size() + 4);
}
