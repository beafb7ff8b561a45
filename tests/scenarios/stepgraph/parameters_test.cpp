// Parameter counts (scenarios/parameters.hpp) and the expansion's use of them.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/stages.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

// A GPT with MHA, a GeLU MLP of 4h and LayerNorm on `gpus` GPUs.
std::string gpt(const std::string& parallel, int gpus, bool untie) {
  return "schema_version = 1\n[model]\nnum_layers = 4\nhidden_size = 1024\nnum_attention_heads = 16\n"
         "ffn_hidden_size = 4096\nvocab_size = 32000\nswiglu = false\nnormalization = \"layernorm\"\n"
         "untie_embeddings_and_output_weights = " +
         std::string(untie ? "true" : "false") + "\n[parallel]\n" + parallel +
         "\n[train]\nmicro_batch_size = 1\nglobal_batch_size = 8\nseq_length = 1024\n"
         "[cluster]\ngpu = \"h100\"\ngpus_per_node = " +
         std::to_string(gpus) + "\nnodes = 1\n";
}

// LayerNorm has a weight and a bias (2h per norm).
TEST(Parameters, LayerNormCountsWeightAndBias) {
  const Scenario s = test::scenario_from(gpt("", 1, false));
  const double h = 1024;
  const double layer = 4 * h * h + 2 * h * 4 * h + 2 * (2 * h);  // Q, K, V, O; fc1, fc2; two norms
  EXPECT_EQ(layer_parameters(s, 0).dense, layer);
  EXPECT_EQ(layer_parameters(s, 0).expert, 0.0);
  EXPECT_EQ(model_parameters(s.model), 4 * layer + 32000 * h + 2 * h);  // tied output layer, final norm
}

// Without tensor parallelism the stages' shares add up to the model, untied; tied, the last stage
// holds a second copy of the embedding.
TEST(Parameters, StagesAddUpToTheModel) {
  for (bool untie : {true, false}) {
    const Scenario s = test::scenario_from(gpt("pp = 2", 2, untie));
    const StageSplit split(s);
    const double stages = rank_parameters(s, split.stage_layers(0), true, false).total() +
                          rank_parameters(s, split.stage_layers(1), false, true).total();
    EXPECT_EQ(stages, model_parameters(s.model) + (untie ? 0.0 : embedding_parameters(s))) << untie;
  }
}

// Tensor and expert parallelism shard the layers: tp ranks together hold a dense layer's sharded
// part once; ep ranks together hold every routed expert once.
TEST(Parameters, ShardsOfAnMoeLayer) {
  const Scenario one = test::scenario_from(test::small_moe("", "", 1));
  const Scenario ep4 = test::scenario_from(test::small_moe("ep = 4", "", 4));
  EXPECT_EQ(layer_parameters(ep4, 0).expert * 4, layer_parameters(one, 0).expert);
  EXPECT_EQ(layer_parameters(ep4, 0).dense, layer_parameters(one, 0).dense);
  EXPECT_GT(layer_parameters(one, 0).expert, 0.0);
}

// A PyTorch program with master weights (run.framework = "pytorch_eager") copies autograd's bf16
// gradients into its fp32 main-gradient buffers after the backward (main_grad_copy, an op on the
// parameter state), and holds both until then; Megatron-Core's executor (cpp) does neither.
TEST(Parameters, APyTorchProgramCopiesAndHoldsAutogradsGradients) {
  const std::string text = test::small_moe("", "", 1);
  const Scenario cpp = test::scenario_from(text);
  const Scenario eager = test::scenario_from(text + "[run]\nframework = \"pytorch_eager\"\n");
  const StageSplit split(cpp);
  const double params = rank_parameters(cpp, split.stage_layers(0), true, true).total();
  auto copies = [](const Scenario& s) {
    std::vector<Op> out;
    const StepGraph g = expand(s);
    for (const auto& rc : g.classes) {
      for (const Op& op : rc.ops) {
        if (g.phases[op.phase] == "main_grad_copy") out.push_back(op);
      }
    }
    return out;
  };
  EXPECT_TRUE(copies(cpp).empty());
  const auto c = copies(eager);
  ASSERT_EQ(c.size(), 1U);
  EXPECT_EQ(c[0].kind, OpKind::elementwise);
  EXPECT_EQ(c[0].elementwise_kind(), ElementwiseKind::copy);
  EXPECT_DOUBLE_EQ(c[0].bytes, params * (2.0 + 4.0));  // bf16 read, fp32 written
  EXPECT_TRUE(works_on_parameter_state(c[0]));
  const Layout layout(cpp);
  const auto a = training_parameter_state(cpp, layout, split.stage_layers(0), true, true);
  const auto b = training_parameter_state(eager, layout, split.stage_layers(0), true, true);
  EXPECT_DOUBLE_EQ(b.gradients - a.gradients, 2.0 * params);
  EXPECT_DOUBLE_EQ(b.weights, a.weights);
  EXPECT_DOUBLE_EQ(b.optimizer, a.optimizer);
}

}  // namespace
