#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/scenarios/stepper.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

// Everything an executor reads from a graph, class by class, as text (the dependency lists included).
std::string fingerprint(const StepGraph& g) {
  std::string out = g.step_kind + " " + std::to_string(g.step) + "\n";
  for (const auto& rc : g.classes) {
    out += rc.label + " activated " + std::to_string(rc.experts_activated) + " hits " +
           std::to_string(rc.experts_cache_hits) + "\n";
    for (const auto& op : rc.ops) {
      out += g.phase_name(op) + " " + g.stream_name(op) + " l" + std::to_string(op.layer) + " e" +
             std::to_string(op.expert) + " b" + std::to_string(op.bytes) + " f" + std::to_string(op.flops);
      for (auto x : op.shape) out += " " + std::to_string(x);
      for (std::size_t d = 0; d < rc.num_deps(op); ++d) out += " <" + std::to_string(rc.deps_of(op)[d]);
      out += "\n";
    }
  }
  return out;
}

Scenario offload_example() {
  return load_scenario(test::source_dir() / "scenarios" / "examples" / "deepseek_v2_lite_offload.toml");
}

}  // namespace

TEST(Stepper, StepsInOrderGiveTheGraphsOfFreshExpansions) {
  const Scenario s = offload_example();
  Stepper stepper(s);
  bool any_miss = false;
  for (int k = 0; k < 6; ++k) {
    SCOPED_TRACE(k);
    const StepGraph g = stepper.expand(k);
    EXPECT_EQ(fingerprint(g), fingerprint(expand(s, k)));
    any_miss = any_miss || g.classes[0].experts_cache_hits < g.classes[0].experts_activated;
  }
  EXPECT_TRUE(any_miss) << "the example should exercise the expert cache";
}

TEST(Stepper, AnEarlierStepStartsAgainFromStepZero) {
  const Scenario s = offload_example();
  Stepper stepper(s);
  (void)stepper.expand(4);
  EXPECT_EQ(fingerprint(stepper.expand(2)), fingerprint(expand(s, 2)));
  EXPECT_EQ(fingerprint(stepper.expand(3)), fingerprint(expand(s, 3)));
}

TEST(Stepper, ExpansionDependsOnlyOnTheScenarioItIsGiven) {
  // Two scenarios with the same file, content hash and seed but a different expert cache: each
  // expansion sees its own cache, whatever was expanded before it.
  const Scenario big = offload_example();
  Scenario small = big;
  small.infer->expert_offload.cache_experts_per_layer = 1;
  const StepGraph from_big = expand(big, 3);
  const StepGraph from_small = expand(small, 3);
  EXPECT_LT(from_small.classes[0].experts_cache_hits, from_big.classes[0].experts_cache_hits);
  EXPECT_EQ(fingerprint(expand(small, 3)), fingerprint(from_small));
  EXPECT_EQ(fingerprint(expand(big, 3)), fingerprint(from_big));
}

TEST(Stepper, TrainingStepsAreOneGraphNumberedByStep) {
  const Scenario s = test::scenario_from(test::small_moe("ep = 2", "", 2));
  Stepper stepper(s);
  const StepGraph g0 = stepper.expand(0);
  const StepGraph g3 = stepper.expand(3);
  EXPECT_FALSE(g0.varies_per_step);
  EXPECT_EQ(g3.step, 3);
  EXPECT_EQ(fingerprint(g0).substr(fingerprint(g0).find('\n')), fingerprint(g3).substr(fingerprint(g3).find('\n')));
}

// An eager framework's fused attention builds a plan at each shape the process has not run: in the
// first sequence (prefill, then one more key per decode step) the first forward attention of each
// shape in a step is flagged kNewShape; the second sequence repeats the lengths and none is flagged;
// the C++ executor's scenarios never are.
TEST(Stepper, APyTorchDecodeStepsAttentionBuildsAPlanOncePerNewShape) {
  const std::string text = test::small_moe("", "", 1);
  const std::string infer = text.substr(0, text.find("[train]")) +
                            "[infer]\nbatch_size = 4\nprompt_length = 64\ngenerate_tokens = 3\n" +
                            text.substr(text.find("[cluster]"));
  const Scenario cpp = test::scenario_from(infer);
  const Scenario eager = test::scenario_from(infer + "[run]\nframework = \"pytorch_eager\"\n");
  auto flagged = [](const StepGraph& g) {
    int n = 0, attention = 0;
    for (const Op& op : g.classes[0].ops) {
      if (op.kind != OpKind::attention) continue;
      ++attention;
      if ((op.flags & kNewShape) != 0) ++n;
    }
    EXPECT_EQ(attention, 4) << "one per layer";
    return n;
  };
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(flagged(expand(cpp, step)), 0);
    EXPECT_EQ(flagged(expand(eager, step)), step < 4 ? 1 : 0);  // a cycle is 1 + generate_tokens steps
  }
}
