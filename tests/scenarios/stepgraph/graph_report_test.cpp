// The graph report (`threewalls graph`): JSON, text and dot of an expanded step.
#include "threewalls/scenarios/graph_report.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"
#include "threewalls/core/error.hpp"

namespace threewalls::scenarios {
namespace {

StepGraph expand_small(Scenario& s) {
  s = test::scenario_from(test::small_moe("", "", 1));
  return expand(s, 0);
}

TEST(GraphReport, JsonCountsEveryOpOfTheStepOnce) {
  Scenario s;
  const StepGraph g = expand_small(s);
  const OrderedJson doc = graph_json(s, g, {}, 0.5);
  EXPECT_EQ(doc["rank_classes"].get<std::size_t>(), g.classes.size());
  ASSERT_EQ(doc["classes"].size(), g.classes.size());
  std::size_t ops = 0;
  std::size_t phase_ops = 0;
  for (const auto& c : doc["classes"]) {
    ops += c["ops"].get<std::size_t>();
    for (const auto& p : c["phases"]) phase_ops += p["count"].get<std::size_t>();
  }
  EXPECT_EQ(ops, g.total_ops());
  EXPECT_EQ(phase_ops, g.total_ops());
  EXPECT_DOUBLE_EQ(doc["expand_seconds"].get<double>(), 0.5);
  const std::string text = graph_text(g, doc);
  EXPECT_NE(text.find("rank classes"), std::string::npos) << text;
  EXPECT_NE(text.find("class 0"), std::string::npos) << text;
}

TEST(GraphReport, LayerSelectionKeepsOnlyThatLayer) {
  Scenario s;
  const StepGraph g = expand_small(s);
  GraphSelection sel;
  sel.layer = 1;
  const OrderedJson doc = graph_json(s, g, sel, 0.0);
  for (const auto& c : doc["classes"]) {
    ASSERT_EQ(c["ops_per_layer"].size(), 1u) << c.dump();
    EXPECT_TRUE(c["ops_per_layer"].contains("1"));
  }
}

TEST(GraphReport, AClassThatDoesNotExistIsAnInputError) {
  Scenario s;
  const StepGraph g = expand_small(s);
  GraphSelection sel;
  sel.cls = static_cast<int>(g.classes.size());
  EXPECT_THROW(graph_json(s, g, sel, 0.0), InputError);
  EXPECT_THROW(graph_dot("t", g, sel), InputError);
}

TEST(GraphReport, DotDrawsTheSelectedOpsAndRefusesTooMany) {
  Scenario s;
  const StepGraph g = expand_small(s);
  GraphSelection sel;
  sel.layer = 0;
  sel.microbatch = 0;
  const std::string dot = graph_dot("small", g, sel);
  EXPECT_EQ(dot.rfind("digraph \"small class 0\" {", 0), 0u) << dot;
  EXPECT_NE(dot.find(" -> "), std::string::npos);
  EXPECT_EQ(dot.back(), '\n');
  sel.max_ops = 1;
  try {
    graph_dot("small", g, sel);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--max-ops 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace threewalls::scenarios
