// Each shipped example scenario is also a test: one test per scenarios/examples/*.toml, listed at
// run time, so a new example is covered without touching this file.
#include <gtest/gtest.h>

#include "test_support.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::scenarios {
namespace {

class ExampleScenario : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(ExampleScenario, LoadsAndValidates) {
  const auto& file = GetParam();
  LoadedScenario loaded;
  try {
    loaded = load_scenario_file(file);
  } catch (const ScenarioError& e) {
    FAIL() << e.what();
  }
  const Scenario& s = loaded.scenario;
  EXPECT_EQ(s.schema_version, 1);
  EXPECT_FALSE(s.name.empty());
  EXPECT_EQ(s.source_path, file.string());
  EXPECT_EQ(s.content_hash.size(), 16U);
  EXPECT_NE(s.train.has_value(), s.infer.has_value());
  // Derived values are always filled in and consistent.
  const auto& p = s.parallel;
  EXPECT_GE(p.dp, 1);
  EXPECT_GE(p.edp, 1);
  EXPECT_EQ(p.tp * p.cp * p.pp * p.dp, s.world_size());
  EXPECT_EQ(p.etp * p.ep * p.pp * p.edp, s.world_size());
  EXPECT_GE(s.model.kv_channels, 1);
  EXPECT_GE(s.model.num_query_groups, 1);
  EXPECT_GT(s.cluster.gpu_memory.value, 0.0);
  if (s.train) {
    EXPECT_EQ(s.train->num_microbatches * s.train->micro_batch_size * p.dp, s.train->global_batch_size);
  }
  // Every key the file writes has a location in the file.
  for (const auto& [key, where] : loaded.locations) {
    EXPECT_EQ(where.file, file.string()) << key;
    EXPECT_GE(where.line, 1) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, ExampleScenario,
                         ::testing::ValuesIn(testing::toml_files(testing::source_dir() / "scenarios/examples")),
                         testing::FileParamName());

TEST(ExampleScenarios, FolderIsNotEmpty) {
  EXPECT_GE(testing::toml_files(testing::source_dir() / "scenarios/examples").size(), 1U);
}

}  // namespace
}  // namespace threewalls::scenarios
