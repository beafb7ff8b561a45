// The layer-to-stage split (scenarios/stages.hpp) and its use by the expansion.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/stages.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

Scenario pipeline(int layers, int pp, int vpp) {
  Scenario s;
  s.model.num_layers = layers;
  s.parallel.pp = pp;
  s.parallel.vpp = vpp;
  return s;
}

TEST(StageSplit, EvenSplitNumbersChunksStageMajor) {
  const StageSplit split(pipeline(8, 2, 2));
  EXPECT_EQ(split.virtual_stages(), 4);
  EXPECT_EQ(split.stage_layers(0), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(split.stage_layers(1), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(split.chunk_layers(1, 1), (std::vector<int>{6, 7}));
  EXPECT_TRUE(split.is_first_vstage(0, 0));
  EXPECT_TRUE(split.is_last_vstage(1, 1));
  EXPECT_FALSE(split.is_last_vstage(0, 1));
}

TEST(StageSplit, FirstAndLastStageLayersSplitTheRestEvenly) {
  Scenario s = pipeline(8, 4, 1);
  s.parallel.first_stage_layers = 1;
  s.parallel.last_stage_layers = 1;
  const StageSplit split(s);
  EXPECT_EQ(split.stage_layers(0), (std::vector<int>{0}));
  EXPECT_EQ(split.stage_layers(1), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(split.stage_layers(2), (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(split.stage_layers(3), (std::vector<int>{7}));
}

TEST(StageSplit, ExplicitSplitMayLeaveAChunkEmpty) {
  Scenario s = pipeline(8, 2, 2);
  s.parallel.layers_per_stage = {2, 0, 3, 3};
  const StageSplit split(s);
  EXPECT_EQ(split.stage_layers(0), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(split.chunk_layers(1, 0).empty());
  EXPECT_EQ(split.stage_layers(1), (std::vector<int>{5, 6, 7}));
}

TEST(StageSplit, ExplicitSplitOfTheWrongLengthThrows) {
  Scenario s = pipeline(8, 2, 2);
  s.parallel.layers_per_stage = {4, 4};
  EXPECT_THROW((void)StageSplit(s), Error);
}

// Every training class of every example holds its stage's layers of the split, in chunk order.
TEST(StageSplit, TheExpansionPlacesLayersByTheSplit) {
  for (const auto& f : test::example_scenarios()) {
    const Scenario s = load_scenario(f);
    if (!s.train) continue;
    const StageSplit split(s);
    const StepGraph g = expand(s, 0);
    for (const auto& rc : g.classes) EXPECT_EQ(rc.layers, split.stage_layers(rc.pp_stage)) << f << " " << rc.label;
  }
}

}  // namespace
