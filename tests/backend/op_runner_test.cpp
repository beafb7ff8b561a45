// OpRunner: every op kind runs on real buffers; unsupported combinations are clear errors; the ops
// of a shipped example scenario run end to end on one GPU.
// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <utility>

#include "gpu_test_util.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;
using scenarios::Op;
using scenarios::OpKind;

Op make(OpKind kind, scenarios::OpShape shape, std::uint8_t flags = 0, double bytes = 0.0) {
  Op op;
  op.kind = kind;
  op.shape = shape;
  op.flags = flags;
  op.bytes = bytes;
  return op;
}

std::vector<Op> one_of_each_kind() {
  using scenarios::kBackward;
  using scenarios::kCausal;
  using scenarios::kWgrad;
  std::vector<Op> ops;
  ops.push_back(make(OpKind::gemm, {256, 512, 128, 1, 0, 0}));
  ops.push_back(make(OpKind::gemm, {256, 128, 512, 1, 0, 0}, kBackward));
  ops.push_back(make(OpKind::gemm, {128, 512, 256, 1, 0, 0}, kBackward | kWgrad));
  Op f8 = make(OpKind::gemm, {256, 512, 128, 1, 0, 0});
  f8.dtype = scenarios::DType::fp8;
  ops.push_back(f8);
  ops.push_back(make(OpKind::grouped_gemm, {1000, 256, 128, 8, 300, 0}));
  ops.push_back(make(OpKind::grouped_gemm, {1000, 128, 256, 8, 300, 0}, kBackward));
  ops.push_back(make(OpKind::grouped_gemm, {1000, 256, 128, 8, 300, 1}, kBackward | kWgrad));
  // Attention on each of its kernels (scenarios::attention_kernel): fused (the default), the
  // split-KV decode kernel (one query), and unfused; with a sliding window (shape[7]) too.
  for (const auto impl : {scenarios::AttentionImpl::fused, scenarios::AttentionImpl::unfused}) {
    for (Op a : {make(OpKind::attention, {2, 256, 256, 4, 64, 64}, kCausal),
                 make(OpKind::attention, {2, 256, 256, 4, 64, 64}, kCausal | kBackward),
                 make(OpKind::attention, {2, 256, 256, 4, 64, 64, 0, 64}, kCausal),
                 make(OpKind::attention, {2, 256, 256, 4, 64, 64, 0, 64}, kCausal | kBackward),
                 make(OpKind::attention, {4, 1, 2048, 8, 128, 128}, kCausal)}) {
      a.sub = static_cast<std::uint8_t>(impl);
      ops.push_back(a);
    }
  }
  ops.push_back(make(OpKind::elementwise, {100000, 0, 0, 0, 0, 0}, 0, 3 * 2 * 100000.0));
  ops.push_back(make(OpKind::elementwise, {100000, 0, 0, 0, 0, 0}, 0, 2 * 2 * 100000.0));
  ops.push_back(make(OpKind::elementwise, {100000, 0, 0, 0, 0, 0}, kBackward, 5 * 2 * 100000.0));
  // The fp8 quantisation: the cast with its transpose, the cast alone, an fp8 weight's transpose, amax.
  for (const auto& [columnwise, dtype] : {std::pair<int, scenarios::DType>{1, scenarios::DType::bf16},
                                          {0, scenarios::DType::bf16},
                                          {1, scenarios::DType::fp8}}) {
    Op q = make(OpKind::elementwise, {333 * 300, 333, 300, columnwise, 0, 0}, 0, 4.0 * 333 * 300);
    q.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::quantize);
    q.dtype = dtype;
    ops.push_back(q);
  }
  Op amax = make(OpKind::elementwise, {100000, 0, 0, 0, 0, 0}, 0, 2 * 100000.0);
  amax.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::amax);
  ops.push_back(amax);
  ops.push_back(make(OpKind::norm, {512, 1024, 0, 0, 0, 0}));
  ops.push_back(make(OpKind::norm, {512, 1024, 0, 0, 0, 0}, kBackward));
  ops.push_back(make(OpKind::softmax_topk, {512, 64, 6, 0, 0, 0}));
  ops.push_back(make(OpKind::softmax_topk, {512, 64, 6, 0, 0, 0}, kBackward));
  Op perm = make(OpKind::permute, {3072, 1024, 0, 0, 0, 0});
  perm.tokens = 512;  // topk 6
  ops.push_back(perm);
  Op unperm = make(OpKind::unpermute, {3072, 1024, 0, 0, 0, 0});
  unperm.tokens = 512;
  ops.push_back(unperm);
  unperm.flags = kBackward;
  ops.push_back(unperm);
  perm.flags = kBackward;
  ops.push_back(perm);
  ops.push_back(make(OpKind::embedding, {512, 1024, 0, 0, 0, 0}));
  ops.push_back(make(OpKind::embedding, {512, 1024, 0, 0, 0, 0}, kBackward));
  ops.push_back(make(OpKind::cross_entropy, {512, 4000, 0, 0, 0, 0}));
  ops.push_back(make(OpKind::cross_entropy, {512, 4000, 0, 0, 0, 0}, kBackward));
  ops.push_back(make(OpKind::optimizer, {1 << 20, 0, 0, 0, 0, 0}));
  for (const auto kind : {scenarios::CopyKind::h2d_pinned, scenarios::CopyKind::h2d_pageable, scenarios::CopyKind::d2h_pinned,
                          scenarios::CopyKind::d2h_pageable, scenarios::CopyKind::d2d, scenarios::CopyKind::disk_read}) {
    Op c = make(OpKind::copy, {1 << 20, 0, 0, 0, 0, 0}, 0, 1 << 20);
    c.sub = static_cast<std::uint8_t>(kind);
    ops.push_back(c);
  }
  return ops;
}

TEST(OpRunner, RunsOneOpOfEveryComputeMemoryAndCopyKind) {
  TW_REQUIRE_GPU();
  OpRunnerConfig cfg;
  cfg.embedding_rows = 4096;
  OpRunner runner(cfg);
  const auto ops = one_of_each_kind();
  runner.prepare(ops);
  EXPECT_GT(runner.device_bytes(), 0U);
  Stream s;
  for (int rep = 0; rep < 2; ++rep) {
    for (const Op& op : ops) runner.run(op, s);
  }
  s.synchronize();
  runner.gpu_read(s);
}

TEST(OpRunner, PrepareLeavesNoGemmPlanToTheSteps) {
  TW_REQUIRE_GPU();
  OpRunner runner(OpRunnerConfig{});
  std::vector<Op> ops;
  for (const Op& op : one_of_each_kind()) {
    if (op.kind == OpKind::gemm || op.kind == OpKind::grouped_gemm) ops.push_back(op);
  }
  // Per-expert GEMMs with a new row count each, as inference routing gives from step to step.
  for (std::int64_t rows = 17; rows < 40; rows += 7) ops.push_back(make(OpKind::gemm, {rows, 256, 128, 1, 0, 0}));
  runner.prepare(ops);
  const std::size_t planned = runner.blas().cached_plans();
  EXPECT_GE(planned, 8U);
  Stream s;
  for (const Op& op : ops) runner.run(op, s);
  s.synchronize();
  EXPECT_EQ(runner.blas().cached_plans(), planned) << "a step had to plan a GEMM that prepare() left out";
  // A new shape prepared later (the next step's graph) is planned by prepare, not by run.
  runner.prepare({make(OpKind::gemm, {53, 256, 128, 1, 0, 0})});
  EXPECT_EQ(runner.blas().cached_plans(), planned + 1);
}

TEST(OpRunner, EveryExpertReadsItsOwnWeights) {
  TW_REQUIRE_GPU();
  OpRunner runner(OpRunnerConfig{});
  std::vector<Op> ops;
  for (std::int32_t e = 0; e < 4; ++e) {
    Op fwd = make(OpKind::gemm, {16, 4096, 1024, 1, 0, 0});
    fwd.expert = e;
    ops.push_back(fwd);
  }
  Op dgrad = make(OpKind::gemm, {16, 1024, 4096, 1, 0, 0}, scenarios::kBackward);
  dgrad.expert = 2;
  ops.push_back(dgrad);
  runner.prepare(ops);
  std::set<void*> places;
  for (std::size_t i = 0; i < 4; ++i) places.insert(runner.weight_ptr(ops[i]));
  EXPECT_EQ(places.size(), 4U);
  EXPECT_EQ(places.count(nullptr), 0U);
  EXPECT_EQ(runner.weight_ptr(dgrad), runner.weight_ptr(ops[2]));  // expert 2's W, read by its dgrad
  EXPECT_EQ(runner.weight_tensors(), 4U);
  EXPECT_GE(runner.weight_bytes(), 4U * 4096U * 1024U * 2U);
  const void* before = runner.weight_ptr(ops[0]);
  Op late = ops[0];
  late.expert = 9;  // not prepared: placed on the spot, and nothing placed before moves
  Stream s;
  runner.run(late, s.get());
  s.synchronize();
  EXPECT_NE(runner.weight_ptr(late), nullptr);
  EXPECT_EQ(runner.weight_ptr(ops[0]), before);
  EXPECT_EQ(runner.weight_tensors(), 5U);
}

// A training rank's parameter state at the memory model's bytes: weights and fp32 gradients resident
// in two buffers (each tensor distinct, a gradient owning 4 bytes per parameter), shared by the rank's
// runners; the runner of the optimizer holds Adam's master weights and moments, and no weight copy or
// gradient slot; the data-parallel all-reduce runs in place on the gradients (no slot either).
TEST(OpRunner, TrainingRunnersShareTheParameterStateAtTheModelsBytes) {
  TW_REQUIRE_GPU();
  constexpr std::int64_t kParams = 3 * 4096 * 1024;  // more than the GEMM tensors below (embedding, norms)
  std::vector<Op> ops;
  for (std::int32_t l = 0; l < 2; ++l) {
    Op fwd = make(OpKind::gemm, {64, 4096, 1024, 1, 0, 0});
    fwd.layer = l;
    ops.push_back(fwd);
    Op wgrad = make(OpKind::gemm, {1024, 4096, 64, 1, 0, 0}, scenarios::kBackward | scenarios::kWgrad);
    wgrad.layer = l;
    ops.push_back(wgrad);
  }
  Op reduce = make(OpKind::collective, {}, 0, 4.0 * kParams);
  reduce.sub = static_cast<std::uint8_t>(scenarios::Collective::all_reduce);
  reduce.group = scenarios::Group::dp_cp;
  reduce.group_size = 1;
  ops.push_back(reduce);
  Op norm = make(OpKind::elementwise, {kParams, 0, 0, 0, 0, 0}, 0, 4.0 * kParams);
  norm.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::reduce);
  ops.push_back(norm);
  ops.push_back(make(OpKind::optimizer, {kParams, 0, 0, 0, 0, 0}, 0, 30.0 * kParams));
  const ParameterState state(ops, 2 * kParams, 4 * kParams, 7);
  EXPECT_EQ(state.bytes(), static_cast<std::size_t>(6 * kParams));
  EXPECT_EQ(state.tensors(), 4U);  // two weights, two gradients
  OpRunnerConfig cfg;
  cfg.parameter_state = &state;
  OpRunner runner(cfg);
  const OpRunner::Need reduce_need = OpRunner::need_of(reduce, cfg);
  EXPECT_EQ(reduce_need.bf16[0] + reduce_need.bf16[1], 0U);
  std::vector<Op> local(ops.begin(), ops.end());
  local.erase(local.begin() + 4);  // no communicator here: the all-reduce is checked by need_of above
  runner.prepare(local);
  EXPECT_EQ(runner.weight_bytes(), 0U);  // every tensor is the state's
  auto* w0 = static_cast<char*>(runner.weight_ptr(ops[0]));
  auto* g0 = static_cast<char*>(runner.weight_ptr(ops[1]));
  EXPECT_EQ(w0, static_cast<char*>(state.weights()));
  EXPECT_EQ(g0, static_cast<char*>(state.gradients()));
  EXPECT_EQ(static_cast<char*>(runner.weight_ptr(ops[2])) - w0, 4096 * 1024 * 2);
  EXPECT_EQ(static_cast<char*>(runner.weight_ptr(ops[3])) - g0, 4096 * 1024 * 4);
  // Slots: master, m, v of the shard (fp32) and the GEMMs' activations.
  const std::size_t slots = runner.device_bytes() - runner.blas().workspace_size();
  EXPECT_GE(slots, static_cast<std::size_t>(12 * kParams));
  EXPECT_LT(slots, static_cast<std::size_t>(12 * kParams + (64 << 20)));
  Stream s;
  for (const Op& op : local) runner.run(op, s.get());
  s.synchronize();
}

TEST(OpRunner, PreparedOpsCaptureIntoACudaGraph) {
  TW_REQUIRE_GPU();
  OpRunner runner(OpRunnerConfig{});
  std::vector<Op> ops = one_of_each_kind();
  // Host-synchronous copies cannot be captured; keep device work only.
  std::erase_if(ops, [](const Op& op) { return op.kind == OpKind::copy && op.copy_kind() != scenarios::CopyKind::d2d &&
                                               op.copy_kind() != scenarios::CopyKind::h2d_pinned &&
                                               op.copy_kind() != scenarios::CopyKind::d2h_pinned; });
  runner.prepare(ops);
  Stream s;
  for (const Op& op : ops) runner.run(op, s);  // warm-up: plans and heuristics
  s.synchronize();
  CudaGraph::begin_capture(s);
  for (const Op& op : ops) runner.run(op, s);
  CudaGraph g = CudaGraph::end_capture(s);
  GraphExec exec(g);
  exec.launch(s);
  s.synchronize();
  EXPECT_GT(g.num_nodes(), ops.size() / 2);
}

TEST(OpRunner, UnsupportedCombinationsAreClearErrors) {
  TW_REQUIRE_GPU();
  OpRunner runner(OpRunnerConfig{});
  Stream s;
  Op host = make(OpKind::host, {0, 0, 0, 0, 0, 0});
  EXPECT_THROW(runner.run(host, s), InputError);
  Op g8 = make(OpKind::grouped_gemm, {1000, 256, 128, 8, 300, 0});
  g8.dtype = scenarios::DType::fp8;
  try {
    runner.run(g8, s);
    FAIL() << "fp8 grouped GEMM ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("grouped_gemm"), std::string::npos) << e.what();
  }
  Op coll = make(OpKind::collective, {0, 0, 0, 0, 0, 0}, 0, 1 << 20);
  coll.group = scenarios::Group::tp;
  EXPECT_THROW(runner.run(coll, s), InputError);  // no CommTable
  EXPECT_THROW(runner.run(make(OpKind::gemm, {0, 10, 10, 1, 0, 0}), s), InputError);
  // A sliding window needs a causal mask.
  try {
    runner.run(make(OpKind::attention, {1, 128, 128, 2, 64, 64, 0, 32}), s);
    FAIL() << "windowed full attention ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
}

TEST(OpRunner, CollectiveOnASingleRankGroupRuns) {
  TW_REQUIRE_GPU();
  const scenarios::Layout layout(1, 1, 1, 1, 1, 1, 1, 1);
  const std::vector<scenarios::Group> groups{scenarios::Group::dp, scenarios::Group::ep};
  CommTable table = CommTable::create(layout, 0, UniqueIdTable::create(layout, groups), groups);
  OpRunner runner(OpRunnerConfig{}, &table);
  Stream s;
  for (const auto c : {scenarios::Collective::all_reduce, scenarios::Collective::all_gather,
                       scenarios::Collective::reduce_scatter, scenarios::Collective::all_to_all,
                       scenarios::Collective::broadcast}) {
    Op op = make(OpKind::collective, {0, 0, 0, 0, 0, 0}, 0, 1 << 20);
    op.sub = static_cast<std::uint8_t>(c);
    op.group = c == scenarios::Collective::all_to_all ? scenarios::Group::ep : scenarios::Group::dp;
    op.group_size = 1;
    runner.run(op, s);
  }
  table.comm(scenarios::Group::dp).wait_stream(s, "collectives");
}

TEST(OpRunner, RunsTheComputeOpsOfTheSmallExampleScenario) {
  TW_REQUIRE_GPU();
  const std::filesystem::path root = source_root();
  const std::filesystem::path path = root / "scenarios/examples/small_moe_1gpu.toml";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "example scenario not found: " << path;
  const scenarios::Scenario sc = scenarios::load_scenario(path);
  const scenarios::StepGraph graph = scenarios::expand(sc, 0);
  ASSERT_FALSE(graph.classes.empty());
  std::vector<Op> ops;
  for (const Op& op : graph.classes.front().ops) {
    if (op.kind == OpKind::host || op.is_comm()) continue;
    ops.push_back(op);
  }
  ASSERT_FALSE(ops.empty());
  OpRunner runner(OpRunnerConfig{});
  runner.prepare(ops);
  Stream s;
  for (const Op& op : ops) runner.run(op, s);
  s.synchronize();
}

}  // namespace
}  // namespace threewalls::backend

namespace threewalls::backend {
namespace {

// Host-only (runs without a GPU): every compute, memory and copy op that the shipped example
// scenarios expand to maps onto a backend kernel (need_of throws InputError otherwise).
TEST(OpRunner, EveryOpOfTheShippedExampleScenariosIsSupported) {
  const std::filesystem::path root = source_root();
  const std::filesystem::path dir = root / "scenarios/examples";
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    const scenarios::Scenario sc = scenarios::load_scenario(entry.path());
    for (int step = 0; step < 2; ++step) {
      const scenarios::StepGraph graph = scenarios::expand(sc, step);
      for (const auto& cls : graph.classes) {
        for (const scenarios::Op& op : cls.ops) {
          if (op.kind == scenarios::OpKind::host || op.is_comm()) continue;
          if (op.kind == scenarios::OpKind::grouped_gemm && op.dtype == scenarios::DType::fp8) continue;  // documented gap
          try {
            static_cast<void>(OpRunner::need_of(op, OpRunnerConfig{}));
            ++checked;
          } catch (const InputError& e) {
            ADD_FAILURE() << entry.path().filename() << " step " << step << " " << graph.phase_name(op) << ": " << e.what();
            return;
          }
        }
      }
      if (!graph.varies_per_step) break;
    }
  }
  EXPECT_GT(checked, 100);
}

// The fp8 quantisation ops of every recipe map onto the cast, transpose and amax kernels: bf16 input
// and fp8 outputs (the columnwise one in training), or the fp8 weight's transpose.
TEST(OpRunner, Fp8QuantisationOpsOfEveryRecipeAreSupported) {
  int casts = 0;
  int transposes = 0;
  int amax = 0;
  for (const std::string recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}) {
    const std::string gpu = recipe == "mxfp8" ? "b200" : "h100";
    const std::string text =
        "schema_version = 1\n[model]\nnum_layers = 2\nhidden_size = 512\nnum_attention_heads = 4\n"
        "ffn_hidden_size = 1024\nvocab_size = 32000\n[train]\nprecision = \"fp8\"\nfp8_recipe = \"" +
        recipe + "\"\nfp8_format = \"e4m3\"\nfp8_param_gather = " + (recipe == "tensorwise" ? "true" : "false") +
        "\nmicro_batch_size = 1\nglobal_batch_size = 2\nseq_length = 256\n[cluster]\ngpu = \"" + gpu +
        "\"\ngpus_per_node = 1\nnodes = 1\n";
    const scenarios::StepGraph graph = scenarios::expand(scenarios::load_scenario_text(text, "fp8.toml").scenario);
    for (const scenarios::Op& op : graph.classes[0].ops) {
      if (op.kind != scenarios::OpKind::elementwise) continue;
      const auto kind = op.elementwise_kind();
      if (kind != scenarios::ElementwiseKind::quantize && kind != scenarios::ElementwiseKind::amax) continue;
      const OpRunner::Need n = OpRunner::need_of(op, OpRunnerConfig{});
      const auto elements = static_cast<std::size_t>(op.shape[0]);
      if (kind == scenarios::ElementwiseKind::amax) {
        EXPECT_EQ(n.bf16[0], 2 * elements) << graph.phase_name(op);
        ++amax;
      } else if (op.dtype == scenarios::DType::fp8) {
        EXPECT_EQ(n.bf16[0], 0U) << graph.phase_name(op);
        EXPECT_EQ(n.f8[0], elements) << graph.phase_name(op);
        EXPECT_EQ(n.f8[1], elements) << graph.phase_name(op);
        ++transposes;
      } else {
        EXPECT_EQ(n.bf16[0], 2 * elements) << graph.phase_name(op);
        EXPECT_EQ(n.f8[0], elements) << graph.phase_name(op);
        EXPECT_EQ(n.f8[1], elements) << graph.phase_name(op);  // training: the columnwise copy
        ++casts;
      }
    }
  }
  EXPECT_GT(casts, 0);
  EXPECT_GT(transposes, 0);
  EXPECT_GT(amax, 0);
}

}  // namespace
}  // namespace threewalls::backend
