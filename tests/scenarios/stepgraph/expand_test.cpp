#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "test_util.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls;
using namespace threewalls::scenarios;

namespace {

int count_phase(const StepGraph& g, const RankClass& rc, const std::string& phase) {
  int n = 0;
  for (const auto& op : rc.ops) n += g.phase_name(op) == phase ? 1 : 0;
  return n;
}

const Op* find_op(const StepGraph& g, const RankClass& rc, const std::string& phase, int layer = -2, int mb = -2) {
  for (const auto& op : rc.ops) {
    if (g.phase_name(op) == phase && (layer == -2 || op.layer == layer) && (mb == -2 || op.microbatch == mb)) return &op;
  }
  return nullptr;
}

// Invariants every expanded step must satisfy, whatever the scenario.
void check_invariants(const Scenario& s, const StepGraph& g) {
  ASSERT_FALSE(g.classes.empty());
  ASSERT_EQ(g.class_of_rank.size(), static_cast<std::size_t>(s.world_size()));
  std::size_t members = 0;
  for (const auto& rc : g.classes) {
    members += rc.ranks.size();
    ASSERT_FALSE(rc.ops.empty()) << rc.label;
    std::set<std::tuple<std::uint16_t, int, int, int>> keys;
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const Op& op = rc.ops[i];
      ASSERT_LT(op.stream, g.streams.size());
      ASSERT_LT(op.phase, g.phases.size());
      ASSERT_LE(op.deps_begin, op.deps_end);
      ASSERT_LE(op.deps_end, rc.deps.size());
      for (auto d = op.deps_begin; d < op.deps_end; ++d) {
        ASSERT_LT(rc.deps[d], i) << "dependency on a later op: " << g.phase_name(op);
        ASSERT_NE(rc.ops[rc.deps[d]].stream, op.stream) << "same-stream deps are implied, not listed";
      }
      // The record key (phase, layer, microbatch, expert) is unique within a step and rank.
      ASSERT_TRUE(keys.insert({op.phase, op.layer, op.microbatch, op.expert}).second)
          << "duplicate key " << g.phase_name(op) << " layer " << op.layer << " mb " << op.microbatch << " expert "
          << op.expert << " in " << rc.label;
      if (op.kind == OpKind::collective) {
        ASSERT_GT(op.group_size, 1) << g.phase_name(op) << ": a collective over one rank should not exist";
        ASSERT_EQ(op.group_size, g.layout.group_size(op.group));
      }
      ASSERT_GE(op.flops, 0.0);
      ASSERT_GE(op.bytes, 0.0);
    }
    for (const auto& run : rc.graph_runs) {
      for (auto i = run.first_op; i < run.end_op; ++i) {
        ASSERT_NE(rc.ops[i].kind, OpKind::host) << "host op inside a CUDA graph";
        ASSERT_EQ(rc.ops[i].graph, run.graph);
      }
    }
  }
  ASSERT_EQ(members, static_cast<std::size_t>(s.world_size()));
  // Every send has a matching recv of the opposite direction on the peer stage, and vice versa.
  if (s.train && s.parallel.pp > 1) {
    const int pp = s.parallel.pp;
    std::map<std::tuple<int, int, std::string>, int> sends;  // (dst stage, tag, stream) -> count
    std::map<std::tuple<int, int, std::string>, int> recvs;  // (own stage, tag, stream) -> count
    for (const auto& rc : g.classes) {
      if (rc.ranks.front() != g.classes[static_cast<std::size_t>(g.class_of_rank[static_cast<std::size_t>(rc.ranks.front())])].ranks.front()) continue;
      // The channel: "pp_fwd_send" pairs with "pp_fwd_recv" on the peer.
      auto channel = [&](const Op& op) {
        std::string n = g.stream_name(op);
        return n.substr(0, n.rfind('_'));
      };
      for (const auto& op : rc.ops) {
        if (op.kind == OpKind::send) {
          EXPECT_EQ(g.stream_name(op), channel(op) + "_send");
          sends[{(rc.pp_stage + op.peer + pp) % pp, op.tag, channel(op)}]++;
        }
        if (op.kind == OpKind::recv) {
          EXPECT_EQ(g.stream_name(op), channel(op) + "_recv");
          recvs[{rc.pp_stage, op.tag, channel(op)}]++;
        }
      }
    }
    // With several classes per stage (imbalance) counts scale equally; compare the key sets.
    std::set<std::tuple<int, int, std::string>> sk;
    std::set<std::tuple<int, int, std::string>> rk;
    for (const auto& [k, v] : sends) sk.insert(k);
    for (const auto& [k, v] : recvs) rk.insert(k);
    ASSERT_EQ(sk, rk) << "pipeline sends and receives do not pair up";
  }
}

}  // namespace

TEST(StepGraph, EveryExampleExpandsWithInvariants) {
  for (const auto& path : test::example_scenarios()) {
    SCOPED_TRACE(path.string());
    Scenario s = load_scenario(path);
    StepGraph g = expand(s, 0);
    check_invariants(s, g);
    if (s.infer) {
      StepGraph d = expand(s, 1);
      check_invariants(s, d);
      EXPECT_EQ(g.step_kind, "prefill");
      EXPECT_EQ(d.step_kind, "decode");
    }
  }
}

TEST(StepGraph, EveryValidationScenarioExpandsWithInvariants) {
  const auto files = test::validation_scenarios();
  ASSERT_GE(files.size(), 12U);
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    Scenario s = load_scenario(path);
    check_invariants(s, expand(s, 0));
    if (s.infer) check_invariants(s, expand(s, 1));
  }
}

TEST(StepGraph, OneF1BScheduleIssuesForwardBeforeItsBackwardWithPipelineTraffic) {
  Scenario s = test::scenario_from(test::small_moe("pp = 4", "", 4));
  StepGraph g = expand(s);
  ASSERT_EQ(g.classes.size(), 4U);
  const int M = s.train->num_microbatches;
  ASSERT_EQ(M, 8);
  for (const auto& rc : g.classes) {
    // Each micro-batch goes forward once and backward once per layer of the stage.
    EXPECT_EQ(count_phase(g, rc, "attn_qkv_fwd"), M * 1);
    EXPECT_EQ(count_phase(g, rc, "attn_qkv_dgrad"), M * 1);
    const int stage = rc.pp_stage;
    EXPECT_EQ(count_phase(g, rc, "pp_recv_fwd"), stage == 0 ? 0 : M);
    EXPECT_EQ(count_phase(g, rc, "pp_send_fwd"), stage == 3 ? 0 : M);
    EXPECT_EQ(count_phase(g, rc, "pp_recv_bwd"), stage == 3 ? 0 : M);
    EXPECT_EQ(count_phase(g, rc, "embedding_fwd"), stage == 0 ? M : 0);
    EXPECT_EQ(count_phase(g, rc, "loss_fwd"), stage == 3 ? M : 0);
    // Warm-up: stage s runs pp - s - 1 forwards before its first backward.
    int forwards_before_first_backward = 0;
    for (const auto& op : rc.ops) {
      if (g.phase_name(op) == "attn_qkv_dgrad") break;
      forwards_before_first_backward += g.phase_name(op) == "attn_qkv_fwd" ? 1 : 0;
    }
    EXPECT_EQ(forwards_before_first_backward, 4 - stage);  // warm-up + the first steady forward
  }
}

TEST(StepGraph, InterleavedScheduleRunsEveryChunkOfEveryMicrobatch) {
  Scenario s = test::scenario_from(test::small_moe("pp = 2\nvpp = 2", "", 2));
  StepGraph g = expand(s);
  const int M = s.train->num_microbatches;
  for (const auto& rc : g.classes) {
    EXPECT_EQ(count_phase(g, rc, "attn_core_fwd"), M * 2);  // 2 chunks of 1 layer each
    EXPECT_EQ(count_phase(g, rc, "attn_core_bwd"), M * 2);
  }
  // Stage 1 sends its chunk 0 output to stage 0's chunk 1 (wrap-around).
  const auto& last = g.classes[1];
  EXPECT_EQ(count_phase(g, last, "pp_send_fwd"), M);
  const auto& first = g.classes[0];
  EXPECT_EQ(count_phase(g, first, "pp_recv_fwd"), M);
}

// Index of the first op of `phase` (layer, micro-batch) in issue order; -1 when absent.
long op_index(const StepGraph& g, const RankClass& rc, const std::string& phase, int layer, int mb) {
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const Op& op = rc.ops[i];
    if (g.phase_name(op) == phase && op.layer == layer && op.microbatch == mb) return static_cast<long>(i);
  }
  return -1;
}

TEST(StepGraph, ExpertParallelOverlapRunsAForwardBesideAnotherMicrobatchsBackward) {
  // pp = 1, two micro-batches: forward 0 alone, then forward 1 beside backward 0, then backward 1.
  const std::string overlap = "overlap_moe_expert_parallel_comm = true";
  const Scenario base = test::scenario_from(test::small_moe("ep = 4", "", 4));
  const Scenario s = test::scenario_from(test::small_moe("ep = 4", overlap, 4));
  ASSERT_EQ(s.train->num_microbatches, 2);
  const StepGraph gb = expand(base);
  const StepGraph g = expand(s);
  check_invariants(s, g);
  ASSERT_EQ(g.classes.size(), 1U);
  const RankClass& rc = g.classes[0];
  // The same ops, issued in another order and on other streams.
  EXPECT_EQ(rc.ops.size(), gb.classes[0].ops.size());
  for (const auto& ph : {"attn_qkv_fwd", "moe_dispatch_fwd", "moe_combine_bwd", "expert_fc1_wgrad", "optimizer_step"}) {
    EXPECT_EQ(count_phase(g, rc, ph), count_phase(gb, gb.classes[0], ph)) << ph;
  }
  // The paired items' dispatch and combine run on the expert-parallel communication stream; the
  // unpaired first forward keeps its collectives on the compute stream.
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_dispatch_fwd", 0, 1)), "ep_comm");
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_combine_fwd", 3, 1)), "ep_comm");
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_combine_bwd", 3, 0)), "ep_comm");
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_dispatch_fwd", 0, 0)), "compute");
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "expert_fc1_fwd", 0, 1)), "compute");
  // Layer pairs: forward layer i with backward layer 3 - i, in Megatron's node order
  // B.combine | F.attention | F.dispatch | B.experts | B.dispatch | F.experts | F.combine | B.attention.
  const long b_combine = op_index(g, rc, "moe_combine_bwd", 3, 0);
  const long f_attn = op_index(g, rc, "attn_qkv_fwd", 0, 1);
  const long f_dispatch = op_index(g, rc, "moe_dispatch_fwd", 0, 1);
  const long b_experts = op_index(g, rc, "expert_fc2_dgrad", 3, 0);
  const long b_dispatch = op_index(g, rc, "moe_dispatch_bwd", 3, 0);
  const long f_experts = op_index(g, rc, "expert_fc1_fwd", 0, 1);
  const long f_combine = op_index(g, rc, "moe_combine_fwd", 0, 1);
  const long b_attn = op_index(g, rc, "attn_qkv_dgrad", 3, 0);
  const long next_pair = op_index(g, rc, "moe_combine_bwd", 2, 0);
  EXPECT_TRUE(b_combine >= 0 && b_combine < f_attn && f_attn < f_dispatch && f_dispatch < b_experts &&
              b_experts < b_dispatch && b_dispatch < f_experts && f_experts < f_combine && f_combine < b_attn &&
              b_attn < next_pair)
      << b_combine << " " << f_attn << " " << f_dispatch << " " << b_experts << " " << b_dispatch << " " << f_experts
      << " " << f_combine << " " << b_attn << " " << next_pair;
  // Without the overlap, forward 1 is issued after the whole of backward 0.
  EXPECT_LT(op_index(gb, gb.classes[0], "attn_qkv_dgrad", 0, 0), op_index(gb, gb.classes[0], "attn_qkv_fwd", 0, 1));
}

TEST(StepGraph, DelayedWeightGradientsFollowTheDispatchBackward) {
  const std::string overlap = "overlap_moe_expert_parallel_comm = true";
  const Scenario s = test::scenario_from(test::small_moe("ep = 4", overlap, 4));
  const Scenario d = test::scenario_from(test::small_moe("ep = 4", overlap + "\ndelay_wgrad_compute = true", 4));
  const StepGraph gs = expand(s);
  const StepGraph gd = expand(d);
  const RankClass& rs = gs.classes[0];
  const RankClass& rd = gd.classes[0];
  // Backward 0 runs beside forward 1: its expert weight gradients come before its dispatch backward,
  // or after it when delayed.
  EXPECT_LT(op_index(gs, rs, "expert_fc1_wgrad", 3, 0), op_index(gs, rs, "moe_dispatch_bwd", 3, 0));
  EXPECT_GT(op_index(gd, rd, "expert_fc1_wgrad", 3, 0), op_index(gd, rd, "moe_dispatch_bwd", 3, 0));
  EXPECT_GT(op_index(gd, rd, "expert_fc2_wgrad", 3, 0), op_index(gd, rd, "moe_dispatch_bwd", 3, 0));
  // The unpaired backward 1 is not reordered.
  EXPECT_LT(op_index(gd, rd, "expert_fc1_wgrad", 3, 1), op_index(gd, rd, "moe_dispatch_bwd", 3, 1));
  EXPECT_EQ(rs.ops.size(), rd.ops.size());
}

// With the overlap, a multi-token-prediction depth's final norm, output head and loss form Megatron's
// post-process node on the computation stream: after the depth's combine forward, and its backward
// before the combine backward; the combine itself stays on the communication stream.
TEST(StepGraph, ExpertParallelOverlapRunsTheMtpHeadOnTheComputeStream) {
  const Scenario s = test::scenario_from(
      test::small_moe("ep = 4", "overlap_moe_expert_parallel_comm = true", 4, "mtp_num_layers = 1"));
  const StepGraph g = expand(s);
  check_invariants(s, g);
  ASSERT_EQ(g.classes.size(), 1U);
  const RankClass& rc = g.classes[0];
  const int depth = 4;  // the depth runs as layer num_layers
  ASSERT_GE(s.train->num_microbatches, 2);
  // Micro-batch 1's forward is paired with micro-batch 0's backward.
  for (const char* phase : {"mtp_final_norm_fwd", "mtp_lm_head_fwd", "mtp_loss_fwd"}) {
    const Op* op = find_op(g, rc, phase, depth, 1);
    ASSERT_NE(op, nullptr) << phase;
    EXPECT_EQ(g.stream_name(*op), "compute") << phase;
  }
  for (const char* phase : {"mtp_lm_head_dgrad", "mtp_lm_head_wgrad", "mtp_loss_bwd"}) {
    const Op* op = find_op(g, rc, phase, depth, 0);
    ASSERT_NE(op, nullptr) << phase;
    EXPECT_EQ(g.stream_name(*op), "compute") << phase;
  }
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_combine_fwd", depth, 1)), "ep_comm");
  EXPECT_EQ(g.stream_name(*find_op(g, rc, "moe_combine_bwd", depth, 0)), "ep_comm");
  EXPECT_LT(op_index(g, rc, "moe_combine_fwd", depth, 1), op_index(g, rc, "mtp_lm_head_fwd", depth, 1));
  EXPECT_LT(op_index(g, rc, "mtp_loss_bwd", depth, 0), op_index(g, rc, "moe_combine_bwd", depth, 0));
}

TEST(StepGraph, ExpertParallelOverlapAddsAWarmupForwardToTheInterleavedSchedule) {
  const std::string overlap = "overlap_moe_expert_parallel_comm = true";
  const Scenario base = test::scenario_from(test::small_moe("pp = 2\nvpp = 2\nep = 2", "", 4));
  const Scenario s = test::scenario_from(test::small_moe("pp = 2\nvpp = 2\nep = 2", overlap, 4));
  const StepGraph gb = expand(base);
  const StepGraph g = expand(s);
  check_invariants(s, g);
  for (std::size_t k = 0; k < g.classes.size(); ++k) {
    auto forwards_before_first_backward = [](const StepGraph& gg, const RankClass& rc) {
      int n = 0;
      for (const auto& op : rc.ops) {
        if (gg.phase_name(op) == "attn_qkv_dgrad") break;
        n += gg.phase_name(op) == "attn_qkv_fwd" && op.layer >= 0 ? 1 : 0;
      }
      return n;
    };
    // Megatron's warm-up + 1, and then the first steady forward runs beside the first backward.
    EXPECT_EQ(forwards_before_first_backward(g, g.classes[k]), forwards_before_first_backward(gb, gb.classes[k]) + 1)
        << "stage " << g.classes[k].pp_stage;
    EXPECT_EQ(g.classes[k].ops.size(), gb.classes[k].ops.size());
  }
}

// The distributed optimizer's overlapped parameter all-gather, as Megatron-Core's DDP dispatches it:
// a bucket's gather is issued in the forward pre-hook of the previous bucket's first layer (after
// that layer's wait), one bucket ahead of its use, and gates its own first layer's forward; the
// chunk's first bucket is issued at its own first use. With one bucket per layer (grad_bucket_size 1):
// the expert gather of layer k + 1 between the first forward ops of layers k - 1 and k.
TEST(StepGraph, OverlappedParameterGathersAreIssuedOneBucketAhead) {
  const Scenario s = test::scenario_from(test::small_moe(
      "ep = 2", "use_distributed_optimizer = true\noverlap_param_gather = true\ngrad_bucket_size = 1", 4));
  const StepGraph g = expand(s);
  check_invariants(s, g);
  const RankClass& rc = g.classes[0];
  auto gather = [&](int layer) { return op_index(g, rc, "edp_param_allgather", layer, -1); };
  auto first_fwd = [&](int layer) { return op_index(g, rc, "attn_norm_fwd", layer, 0); };
  ASSERT_GE(gather(0), 0);
  ASSERT_GE(first_fwd(0), 0);
  EXPECT_LT(gather(0), first_fwd(0));
  EXPECT_LT(gather(1), first_fwd(0));  // dispatched by layer 0's pre-hook
  for (int k = 1; k < 3; ++k) {
    EXPECT_GT(gather(k + 1), first_fwd(k - 1)) << k;  // not before the previous layer's pre-hook
    EXPECT_LT(gather(k + 1), first_fwd(k)) << k;
  }
  // Each layer's first forward op waits for a gather holding its parameters (the later of its dense
  // and expert buckets', both on dp_comm).
  for (int k = 0; k < 4; ++k) {
    const Op& op = rc.ops[static_cast<std::size_t>(first_fwd(k))];
    const std::vector<std::uint32_t> d(rc.deps_of(op), rc.deps_of(op) + rc.num_deps(op));
    const long want = gather(k);
    EXPECT_TRUE(std::any_of(d.begin(), d.end(), [&](std::uint32_t x) {
      return g.phase_name(rc.ops[x]).find("param_allgather") != std::string::npos && static_cast<long>(x) >= want;
    })) << k;
  }
}

// An interleaved pipeline (Megatron's align_param_gather): every gather of model chunks 0 and 1 is
// issued before the first forward.
TEST(StepGraph, InterleavedPipelinesIssueTheFirstTwoChunksGathersAtTheStart) {
  const Scenario s = test::scenario_from(
      test::small_moe("pp = 2\nvpp = 2\nep = 2",
                      "use_distributed_optimizer = true\noverlap_param_gather = true\ngrad_bucket_size = 1", 8));
  const StepGraph g = expand(s);
  check_invariants(s, g);
  for (const RankClass& rc : g.classes) {
    long first_forward = -1, last_gather = -1, gathers = 0;
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const std::string& ph = g.phase_name(rc.ops[i]);
      if (ph == "attn_norm_fwd" && first_forward < 0) first_forward = static_cast<long>(i);
      if (ph.find("param_allgather") != std::string::npos) {
        last_gather = static_cast<long>(i);
        ++gathers;
      }
    }
    EXPECT_GE(gathers, 2) << rc.label;
    EXPECT_LT(last_gather, first_forward) << rc.label;
  }
}

// Megatron-FSDP, optim_grads_params: every forward and backward pass of a unit (layer, embedding,
// head) gathers its parameters (dense over dp x cp, experts over edp, bf16) and every backward
// reduce-scatters its gradients (fp32); no bucketed reduction, no step-end parameter gather.
TEST(StepGraph, FsdpGathersEveryLayerBeforeEachPassAndReduceScattersAfterEachBackward) {
  const Scenario s =
      test::scenario_from(test::small_moe("ep = 2", "data_parallel_sharding_strategy = \"optim_grads_params\"", 4));
  ASSERT_EQ(s.train->num_microbatches, 2);
  const StepGraph g = expand(s);
  check_invariants(s, g);
  const RankClass& rc = g.classes[0];
  const int M = 2;
  const int units = 4 + 2;  // layers, embedding, head (untied)
  EXPECT_EQ(count_phase(g, rc, "dp_fsdp_param_allgather_fwd"), units * M);
  EXPECT_EQ(count_phase(g, rc, "dp_fsdp_param_allgather_bwd"), units * M);
  EXPECT_EQ(count_phase(g, rc, "dp_fsdp_grad_reduce_scatter"), units * M);
  EXPECT_EQ(count_phase(g, rc, "edp_fsdp_param_allgather_fwd"), 4 * M);  // expert parameters: MoE layers only
  EXPECT_EQ(count_phase(g, rc, "edp_fsdp_grad_reduce_scatter"), 4 * M);
  EXPECT_EQ(count_phase(g, rc, "dp_grad_reduce_scatter"), 0);
  EXPECT_EQ(count_phase(g, rc, "edp_grad_reduce_scatter"), 0);
  EXPECT_EQ(count_phase(g, rc, "dp_param_allgather"), 0);
  // Bytes per layer: the layer's parameters on this rank, bf16 gathered and fp32 reduced, each over
  // its group.
  const scenarios::ParameterCount lp = scenarios::layer_parameters(s, 1);
  const Op* ag = find_op(g, rc, "dp_fsdp_param_allgather_fwd", 1, 0);
  const Op* eag = find_op(g, rc, "edp_fsdp_param_allgather_bwd", 1, 1);
  const Op* rs = find_op(g, rc, "edp_fsdp_grad_reduce_scatter", 1, 1);
  ASSERT_TRUE(ag != nullptr && eag != nullptr && rs != nullptr);
  EXPECT_DOUBLE_EQ(ag->bytes, 2.0 * lp.dense);
  EXPECT_EQ(ag->group, Group::dp_cp);
  EXPECT_EQ(ag->group_size, 4);
  EXPECT_EQ(g.stream_name(*ag), "fsdp_param_gather");
  EXPECT_DOUBLE_EQ(eag->bytes, 2.0 * lp.expert);
  EXPECT_EQ(eag->group, Group::edp);
  EXPECT_EQ(eag->group_size, 2);
  EXPECT_DOUBLE_EQ(rs->bytes, 4.0 * lp.expert);
  EXPECT_EQ(rs->collective(), Collective::reduce_scatter);
  EXPECT_EQ(g.stream_name(*rs), "dp_comm");
  // Order: a layer's gather before its forward, its reduce-scatter after its backward.
  EXPECT_LT(op_index(g, rc, "dp_fsdp_param_allgather_fwd", 2, 0), op_index(g, rc, "attn_qkv_fwd", 2, 0));
  EXPECT_LT(op_index(g, rc, "dp_fsdp_param_allgather_bwd", 2, 0), op_index(g, rc, "attn_qkv_dgrad", 2, 0));
  EXPECT_GT(op_index(g, rc, "dp_fsdp_grad_reduce_scatter", 2, 0), op_index(g, rc, "attn_qkv_wgrad", 2, 0));
  // The first compute op of layer 2's forward waits for its gather; layer 3's gather (the prefetch)
  // waits for the end of layer 1's forward, not for layer 2's.
  const auto idx = [&](const char* ph, int l, int mb) {
    return static_cast<std::uint32_t>(op_index(g, rc, ph, l, mb));
  };
  const Op& qkv2 = rc.ops[idx("attn_norm_fwd", 2, 0)];
  const auto deps = [&](const Op& op) {
    return std::vector<std::uint32_t>(rc.deps_of(op), rc.deps_of(op) + rc.num_deps(op));
  };
  const auto d2 = deps(qkv2);
  EXPECT_NE(std::find(d2.begin(), d2.end(), idx("dp_fsdp_param_allgather_fwd", 2, 0)), d2.end());
  const auto d3 = deps(rc.ops[idx("dp_fsdp_param_allgather_fwd", 3, 0)]);
  ASSERT_EQ(d3.size(), 1U);
  EXPECT_LT(d3[0], idx("attn_norm_fwd", 2, 0));
  EXPECT_GT(d3[0], idx("attn_norm_fwd", 1, 0));
  // The optimizer steps the shard.
  const Op* adam = find_op(g, rc, "optimizer_step");
  ASSERT_NE(adam, nullptr);
  EXPECT_DOUBLE_EQ(adam->bytes, 30.0 * (rc.dense_params / 4 + rc.expert_params / 2));
}

TEST(StepGraph, FsdpShardingStrategiesShardWhatTheyName) {
  auto graph = [](const char* strategy) {
    return expand(test::scenario_from(test::small_moe(
        "ep = 2", std::string("overlap_grad_reduce = true\ndata_parallel_sharding_strategy = \"") + strategy + "\"",
        4)));
  };
  // no_shard: gradients all-reduced once, optimizer replicated; optim: the distributed optimizer's
  // reduce-scatter and step-end gather; optim_grads: reduce-scatter after every backward of a layer,
  // parameters gathered at the step's end.
  const StepGraph none = graph("no_shard");
  EXPECT_GT(count_phase(none, none.classes[0], "dp_grad_allreduce"), 0);
  EXPECT_EQ(count_phase(none, none.classes[0], "dp_param_allgather"), 0);
  const StepGraph optim = graph("optim");
  EXPECT_GT(count_phase(optim, optim.classes[0], "dp_grad_reduce_scatter"), 0);
  EXPECT_GT(count_phase(optim, optim.classes[0], "dp_param_allgather"), 0);
  EXPECT_EQ(count_phase(optim, optim.classes[0], "dp_fsdp_grad_reduce_scatter"), 0);
  const StepGraph grads = graph("optim_grads");
  EXPECT_EQ(count_phase(grads, grads.classes[0], "dp_fsdp_grad_reduce_scatter"), 6 * 2);
  EXPECT_EQ(count_phase(grads, grads.classes[0], "dp_grad_reduce_scatter"), 0);
  EXPECT_EQ(count_phase(grads, grads.classes[0], "dp_fsdp_param_allgather_fwd"), 0);
  EXPECT_GT(count_phase(grads, grads.classes[0], "dp_param_allgather"), 0);
}

TEST(StepGraph, FsdpWithRecomputeAndExpertOverlapGathersEveryPass) {
  const std::string fsdp = "data_parallel_sharding_strategy = \"optim_grads_params\"\n";
  for (const std::string& extra : {fsdp + "recompute_granularity = \"full\"\nrecompute_num_layers = 2",
                                   fsdp + "recompute_granularity = \"selective\"\nrecompute_modules = [\"moe\"]",
                                   fsdp + "overlap_moe_expert_parallel_comm = true\ndelay_wgrad_compute = true"}) {
    const Scenario s = test::scenario_from(test::small_moe("ep = 2", extra, 4));
    const StepGraph g = expand(s);
    check_invariants(s, g);
    const RankClass& rc = g.classes[0];
    EXPECT_EQ(count_phase(g, rc, "edp_fsdp_param_allgather_fwd"), 4 * 2) << extra;
    // Each layer once per backward (a checkpoint group's layers together, before its recompute).
    EXPECT_EQ(count_phase(g, rc, "edp_fsdp_param_allgather_bwd"), 4 * 2) << extra;
    EXPECT_EQ(count_phase(g, rc, "edp_fsdp_grad_reduce_scatter"), 4 * 2) << extra;
  }
}

TEST(StepGraph, DistributedOptimizerReducesGradientsAndGathersParameters) {
  Scenario s = test::scenario_from(test::small_moe("ep = 2", "overlap_grad_reduce = true", 4));
  StepGraph g = expand(s);
  const auto& rc = g.classes[0];
  EXPECT_GT(count_phase(g, rc, "dp_grad_reduce_scatter"), 0);   // dense params over dp_cp = 4
  EXPECT_GT(count_phase(g, rc, "edp_grad_reduce_scatter"), 0);  // expert params over edp = 2
  EXPECT_GT(count_phase(g, rc, "dp_param_allgather"), 0);
  const Op* rs = find_op(g, rc, "dp_grad_reduce_scatter");
  ASSERT_NE(rs, nullptr);
  EXPECT_EQ(rs->group, Group::dp_cp);
  EXPECT_EQ(rs->group_size, 4);
  EXPECT_EQ(g.stream_name(*rs), "dp_comm");
  // Overlapped: the first reduce-scatter is issued before the optimizer step, between backward ops.
  std::size_t rs_index = 0;
  std::size_t last_bwd = 0;
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    if (g.phase_name(rc.ops[i]) == "dp_grad_reduce_scatter" && rs_index == 0) rs_index = i;
    if (rc.ops[i].flags & kBackward) last_bwd = i;
  }
  EXPECT_LT(rs_index, last_bwd);
  // Without the distributed optimizer: all-reduce, no parameter all-gather.
  Scenario s2 = test::scenario_from(test::small_moe("ep = 2", "use_distributed_optimizer = false", 4));
  StepGraph g2 = expand(s2);
  EXPECT_GT(count_phase(g2, g2.classes[0], "dp_grad_allreduce"), 0);
  EXPECT_EQ(count_phase(g2, g2.classes[0], "dp_param_allgather"), 0);
}

TEST(StepGraph, FullRecomputeAddsAForwardPassOfFlops) {
  Scenario base = test::scenario_from(test::small_moe("", "", 1));
  Scenario full = test::scenario_from(test::small_moe("", "recompute_granularity = \"full\"", 1));
  auto total = [](const StepGraph& g, bool recompute_only) {
    double f = 0;
    for (const auto& op : g.classes[0].ops) {
      if (!recompute_only || (op.flags & kRecompute)) f += op.flops;
    }
    return f;
  };
  StepGraph gb = expand(base);
  StepGraph gf = expand(full);
  // Every layer's forward runs again (not the embedding or the output head): recompute FLOPs equal
  // the forward FLOPs of the layers, and nothing else changes.
  double layer_forward = 0;
  for (const auto& op : gb.classes[0].ops) {
    if (op.layer >= 0 && !(op.flags & kBackward)) layer_forward += op.flops;
  }
  EXPECT_DOUBLE_EQ(total(gf, true), layer_forward);
  EXPECT_DOUBLE_EQ(total(gf, false) - total(gf, true), total(gb, false));
}

TEST(StepGraph, SelectiveRecomputeOfCoreAttentionRecomputesOnlyIt) {
  Scenario s = test::scenario_from(
      test::small_moe("", "recompute_granularity = \"selective\"\nrecompute_modules = [\"core_attn\"]", 1));
  StepGraph g = expand(s);
  std::set<std::string> recomputed;
  for (const auto& op : g.classes[0].ops) {
    if (op.flags & kRecompute) recomputed.insert(g.phase_name(op));
  }
  EXPECT_EQ(recomputed, std::set<std::string>{"attn_core_recompute"});
}

TEST(StepGraph, RoutingImbalanceSplitsHotAndColdClasses) {
  Scenario s = test::scenario_from(test::small_moe("ep = 4", "routing_imbalance = 2.0", 4));
  StepGraph g = expand(s);
  ASSERT_EQ(g.classes.size(), 2U);
  const RankClass* hot = nullptr;
  const RankClass* cold = nullptr;
  for (const auto& rc : g.classes) (rc.expert_load > 1.0 ? hot : cold) = &rc;
  ASSERT_TRUE(hot && cold);
  EXPECT_DOUBLE_EQ(hot->expert_load, 2.0);
  EXPECT_NEAR(cold->expert_load, 2.0 / 3.0, 1e-12);
  EXPECT_EQ(hot->ranks, std::vector<int>{0});
  const Op* hot_fc1 = find_op(g, *hot, "expert_fc1_fwd");
  const Op* cold_fc1 = find_op(g, *cold, "expert_fc1_fwd");
  ASSERT_TRUE(hot_fc1 && cold_fc1);
  EXPECT_NEAR(hot_fc1->flops / cold_fc1->flops, 3.0, 0.01);
  // The dispatch sends the same, the combine returns what each rank processed.
  EXPECT_DOUBLE_EQ(find_op(g, *hot, "moe_dispatch_fwd")->bytes, find_op(g, *cold, "moe_dispatch_fwd")->bytes);
  EXPECT_NEAR(find_op(g, *hot, "moe_combine_fwd")->bytes / find_op(g, *cold, "moe_combine_fwd")->bytes, 3.0, 0.01);
}

TEST(StepGraph, SlowRankGetsItsOwnClass) {
  std::string text = test::small_moe("ep = 2", "", 4) + "\n[[cluster.slowdown]]\nrank = 3\nfactor = 1.5\n";
  Scenario s = test::scenario_from(text);
  StepGraph g = expand(s);
  // ep2 edp2 on 4 ranks: rank 2 shares rank 3's EP group, rank 1 its expert-data-parallel group, rank 0
  // neither; each waits for the slow rank in different collectives, so each is a class of its own.
  ASSERT_EQ(g.classes.size(), 4U);
  EXPECT_EQ(g.class_of(3).ranks, std::vector<int>{3});
  EXPECT_NE(g.class_of(3).label.find("slow rank 3"), std::string::npos);
  EXPECT_EQ(g.class_of(0).label, "stage 0");
  EXPECT_NE(g.class_of(2).label.find("beside a slow rank"), std::string::npos);
}

// Op indices are 32-bit: layers, micro-batches and group sizes past 32,767 keep their values (they
// once wrapped negative in 16-bit fields).
TEST(StepGraph, LayerIndicesPast32767AreKept) {
  const Scenario s = test::scenario_from(
      "schema_version = 1\n[model]\nnum_layers = 32770\nhidden_size = 256\nnum_attention_heads = 4\n"
      "ffn_hidden_size = 512\nvocab_size = 1024\n[parallel]\npp = 2\n[train]\nmicro_batch_size = 1\n"
      "global_batch_size = 1\nseq_length = 128\n[cluster]\ngpu = \"h100\"\ngpus_per_node = 2\nnodes = 1\n");
  const StepGraph g = expand(s);
  int top = -1;
  for (const auto& rc : g.classes) {
    for (const Op& op : rc.ops) {
      ASSERT_GE(op.layer, -1);
      top = std::max(top, op.layer);
    }
  }
  EXPECT_EQ(top, 32769);
}

TEST(StepGraph, GroupsOf32768RanksKeepTheirSize) {
  const Scenario s = test::scenario_from(
      "schema_version = 1\n[model]\nnum_layers = 2\nhidden_size = 256\nnum_attention_heads = 4\n"
      "ffn_hidden_size = 512\nvocab_size = 1024\n[train]\nmicro_batch_size = 1\n"
      "global_batch_size = 32768\nseq_length = 128\n[cluster]\ngpu = \"h100\"\ngpus_per_node = 8\nnodes = 4096\n");
  const StepGraph g = expand(s);
  ASSERT_EQ(g.classes.size(), 1U);
  std::set<Group> seen;
  for (const Op& op : g.classes.at(0).ops) {
    if (op.kind != OpKind::collective) continue;
    EXPECT_EQ(op.group_size, 32768) << g.phase_name(op);
    seen.insert(op.group);
  }
  EXPECT_TRUE(seen.count(Group::dp_cp) == 1 && seen.count(Group::world) == 1);
}

TEST(StepGraph, FlexDispatchPermutesTheReceivedRowsIntoExpertOrderAndBack) {
  // ep = 4, 8 experts: 2 per rank. 4 layers x 2 micro-batches per rank (GBS 8 over dp 4).
  const Scenario s = test::scenario_from(test::small_moe("ep = 4", "token_dispatcher = \"flex\"", 4));
  const StepGraph g = expand(s);
  const RankClass& rc = g.classes.at(0);
  EXPECT_EQ(count_phase(g, rc, "moe_permute_fwd"), 4 * 2);
  EXPECT_EQ(count_phase(g, rc, "moe_unpermute_fwd"), 4 * 2);
  EXPECT_EQ(count_phase(g, rc, "moe_sort_fwd"), 0);  // the alltoall dispatcher's sort is not run
  // The permute follows the dispatch and feeds the experts; the unpermute precedes the combine.
  std::vector<std::string> order;
  for (const Op& op : rc.ops) {
    const std::string n = g.phase_name(op);
    if (op.layer == 0 && op.microbatch == 0 &&
        (n == "moe_dispatch_fwd" || n == "moe_permute_fwd" || n == "expert_fc1_fwd" || n == "expert_fc2_fwd" ||
         n == "moe_unpermute_fwd" || n == "moe_combine_fwd")) {
      order.push_back(n);
    }
  }
  const std::vector<std::string> expected = {"moe_dispatch_fwd", "moe_permute_fwd",   "expert_fc1_fwd",
                                             "expert_fc2_fwd",   "moe_unpermute_fwd", "moe_combine_fwd"};
  EXPECT_EQ(order, expected);
  // Every row the experts process is permuted: 1024 tokens x top-2, balanced over the EP group.
  for (const Op& op : rc.ops) {
    if (g.phase_name(op) == "moe_permute_fwd") {
      EXPECT_EQ(op.shape[0], 1024 * 2);
    }
  }
}

TEST(StepGraph, ExpertExecutionStrategies) {
  // grouped: one grouped GEMM per projection.
  Scenario grouped = test::scenario_from(test::small_moe("", "expert_execution = \"grouped\"", 1));
  StepGraph gg = expand(grouped);
  EXPECT_EQ(count_phase(gg, gg.classes[0], "expert_fc1_fwd"), 4 * 8);  // layers x micro-batches
  // sequential: gather, gate, up, act, down, scatter per expert, all on the compute stream.
  Scenario seq = test::scenario_from(test::small_moe("", "expert_execution = \"sequential\"", 1));
  StepGraph gs = expand(seq);
  const auto& rc = gs.classes[0];
  EXPECT_EQ(count_phase(gs, rc, "expert_gate_fwd"), 8 * 4 * 8);  // experts x layers x micro-batches
  EXPECT_EQ(count_phase(gs, rc, "moe_permute_fwd"), 0);          // a framework loop indexes tokens per expert
  for (const auto& op : rc.ops) {
    if (gs.phase_name(op) == "expert_gate_fwd") {
      EXPECT_EQ(gs.stream_name(op), "compute");
    }
  }
  // streams:4: experts round-robin over compute, expert_1, expert_2, expert_3; the output waits for all.
  Scenario st = test::scenario_from(test::small_moe("", "expert_execution = \"streams:4\"", 1));
  StepGraph gt = expand(st);
  std::set<std::string> streams;
  for (const auto& op : gt.classes[0].ops) {
    if (gt.phase_name(op) == "expert_gate_fwd") streams.insert(gt.stream_name(op));
  }
  EXPECT_EQ(streams, (std::set<std::string>{"compute", "expert_1", "expert_2", "expert_3"}));
  const Op* bda = find_op(gt, gt.classes[0], "mlp_bda_fwd", 0, 0);
  ASSERT_NE(bda, nullptr);
  EXPECT_EQ(gt.classes[0].num_deps(*bda), 6U);  // experts 1,2,3,5,6,7 run on other streams
}

TEST(StepGraph, APermutesAndAnUnpermutesBackwardKeepTheirKindAndAreTheirOwnGradients) {
  // The backward of a permute (rows gathered into expert order) is the scatter-sum of the rows back
  // to the tokens, backend::permute_bwd and PyTorch's index_select backward; that of an unpermute
  // (the weighted scatter-add) is the row gather with the weights' gradient, unpermute_bwd. The
  // backward op keeps the forward op's kind with kBackward, which is what the backend runs and the
  // coster prices (kernel.permute_bwd / kernel.unpermute_bwd and their PyTorch twins).
  for (const char* exec : {"grouped", "sequential"}) {
    const Scenario s = test::scenario_from(std::string(R"(
schema_version = 1
name = "perm_kinds"
[model]
num_layers = 2
hidden_size = 256
ffn_hidden_size = 512
num_attention_heads = 4
vocab_size = 1024
num_experts = 8
moe_ffn_hidden_size = 256
moe_router_topk = 2
[parallel]
ep = 2
[train]
micro_batch_size = 1
global_batch_size = 2
seq_length = 128
expert_execution = ")") + exec + R"("
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 1
)");
    const StepGraph g = expand(s, 0);
    std::map<std::string, int> seen;
    for (const Op& op : g.classes.at(0).ops) {
      const std::string& n = g.phase_name(op);
      for (const char* base :
           {"moe_permute", "moe_unpermute", "moe_sort", "moe_unsort", "expert_gather", "expert_scatter"}) {
        for (const char* suffix : {"_fwd", "_bwd"}) {
          if (n != std::string(base) + suffix) continue;
          const bool gather_like = std::string(base) == "moe_permute" || std::string(base) == "moe_sort" ||
                                   std::string(base) == "expert_gather";
          EXPECT_EQ(op.kind, gather_like ? OpKind::permute : OpKind::unpermute) << exec << " " << n;
          EXPECT_EQ((op.flags & kBackward) != 0, std::string(suffix) == "_bwd") << exec << " " << n;
          ++seen[n];
        }
      }
    }
    EXPECT_GT(seen["moe_permute_bwd"] + seen["moe_sort_bwd"], 0) << exec;
    EXPECT_GT(seen["moe_unpermute_bwd"] + seen["moe_unsort_bwd"], 0) << exec;
    if (std::string(exec) == "sequential") {
      EXPECT_GT(seen["expert_gather_bwd"] * seen["expert_scatter_bwd"], 0);
    }
  }
}

TEST(StepGraph, AnExpertLoopsScatterCarriesTheRouterWeightsOnlyWhereNoUnpermuteFollows) {
  // Hugging Face's loop scatter-adds each expert's output into the block's output. On one EP rank it
  // weights the rows itself (no moe_unpermute); over the rows an EP rank received (ep > 1), and with
  // the allgather dispatcher, a moe_unpermute after the experts applies the weights and the loop adds
  // them as they are. A scatter's backward (an unpermute too) carries the same RowWeights.
  auto check = [](const std::string& text, int step, RowWeights want) {
    const Scenario s = test::scenario_from(text);
    const StepGraph g = expand(s, step);
    const RankClass& rc = g.classes.at(0);
    int scatters = 0;
    for (const Op& op : rc.ops) {
      const std::string& n = g.phase_name(op);
      if (n == "expert_scatter_fwd" || n == "expert_scatter_bwd") {
        ++scatters;
        EXPECT_EQ(op.kind, OpKind::unpermute);
        EXPECT_EQ(op.row_weights(), want) << n;
      } else if (op.kind == OpKind::permute || op.kind == OpKind::unpermute) {
        EXPECT_EQ(op.row_weights(), RowWeights::weighted) << n;  // sub 0: the rest apply them
      }
    }
    EXPECT_GT(scatters, 0);
    EXPECT_EQ(count_phase(g, rc, "moe_unpermute_fwd") > 0, want == RowWeights::unweighted);
  };
  const std::string seq = "expert_execution = \"sequential\"";
  check(test::small_moe("", seq, 1), 0, RowWeights::weighted);
  check(test::small_moe("ep = 2", seq, 2), 0, RowWeights::unweighted);
  check(test::small_moe("ep = 2", "expert_execution = \"streams:4\"", 2), 0, RowWeights::unweighted);
  check(test::small_moe("", seq + "\ntoken_dispatcher = \"allgather\"", 1), 0, RowWeights::unweighted);
  // Inference (step 1: a decode step): the same rule.
  auto infer = [](int ep) {
    return "schema_version = 1\n[model]\nnum_layers = 2\nhidden_size = 512\nnum_attention_heads = 8\n"
           "vocab_size = 1000\nnum_experts = 8\nmoe_ffn_hidden_size = 256\nmoe_router_topk = 2\n[parallel]\nep = " +
           std::to_string(ep) +
           "\n[infer]\nbatch_size = 4\nprompt_length = 16\ngenerate_tokens = 4\nexpert_execution = \"sequential\"\n"
           "[cluster]\ngpu = \"h100\"\ngpus_per_node = " +
           std::to_string(ep) + "\nnodes = 1\n";
  };
  check(infer(1), 1, RowWeights::weighted);
  check(infer(2), 1, RowWeights::unweighted);
}

TEST(StepGraph, CudaGraphScopesFormRunsWithoutHostOps) {
  Scenario s = test::scenario_from(test::small_moe("", "cuda_graph_scope = [\"attn\", \"moe_router\"]", 1));
  StepGraph g = expand(s);
  EXPECT_EQ(g.graphs, (std::vector<std::string>{"attn", "moe_router"}));
  const auto& rc = g.classes[0];
  ASSERT_FALSE(rc.graph_runs.empty());
  // One forward and one backward attention run per layer and micro-batch, same for the router.
  EXPECT_EQ(rc.graph_runs.size(), 4U * 8U * 2U * 2U);
  Scenario none = test::scenario_from(test::small_moe("", "", 1));
  EXPECT_TRUE(expand(none).classes[0].graph_runs.empty());
}

TEST(StepGraph, SyncKnobsAddHostOps) {
  Scenario s = test::scenario_from(test::small_moe("", "sync_routing_stats = true\nsync_after_copy = true", 1));
  StepGraph g = expand(s);
  const auto& rc = g.classes[0];
  EXPECT_EQ(count_phase(g, rc, "moe_routing_stats_read_fwd"), 4 * 8);
  EXPECT_EQ(count_phase(g, rc, "host_to_device_sync"), 8);
  const Op* read = find_op(g, rc, "moe_routing_stats_read_fwd");
  EXPECT_EQ(read->kind, OpKind::host);
  EXPECT_EQ(read->host_kind(), HostKind::gpu_read);
  EXPECT_EQ(rc.num_deps(*read), 1U);
}

TEST(StepGraph, TensorAndSequenceParallelCollectives) {
  Scenario s = test::scenario_from(test::small_moe("tp = 2\nsequence_parallel = true", "", 2));
  StepGraph g = expand(s);
  const auto& rc = g.classes[0];
  const Op* ag = find_op(g, rc, "attn_sp_allgather_fwd", 0, 0);
  const Op* rs = find_op(g, rc, "attn_sp_reducescatter_fwd", 0, 0);
  ASSERT_TRUE(ag && rs);
  EXPECT_EQ(ag->collective(), Collective::all_gather);
  EXPECT_EQ(rs->collective(), Collective::reduce_scatter);
  EXPECT_DOUBLE_EQ(ag->bytes, 1024.0 * 1024 * 2);  // gathered [seq x hidden] bf16
  EXPECT_EQ(find_op(g, rc, "attn_sp_allgather_bwd", 0, 0)->collective(), Collective::reduce_scatter);
  const Op* qkv = find_op(g, rc, "attn_qkv_fwd", 0, 0);
  EXPECT_EQ(qkv->shape[0], 1024);              // all tokens after the gather
  EXPECT_EQ(qkv->shape[1], 3 * 1024 / 2);      // heads split over tp
  Scenario noseq = test::scenario_from(test::small_moe("tp = 2", "", 2));
  StepGraph g2 = expand(noseq);
  EXPECT_EQ(find_op(g2, g2.classes[0], "attn_tp_allreduce_fwd", 0, 0)->collective(), Collective::all_reduce);
}

TEST(StepGraph, AttentionOpsCarryTheirKeyValueHeads) {
  // GQA: 8 query heads over 2 key/value groups, split over tp = 2 -> 4 and 1 per rank.
  Scenario gqa = test::scenario_from(test::small_moe("tp = 2", "", 2, "attention = \"gqa\"\nnum_query_groups = 2\n"));
  StepGraph g = expand(gqa);
  const Op* a = find_op(g, g.classes[0], "attn_core_fwd", 0, 0);
  const Op* b = find_op(g, g.classes[0], "attn_core_bwd", 0, 0);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->shape[3], 4);
  EXPECT_EQ(scenarios::attention_kv_heads(*a), 1);
  EXPECT_EQ(scenarios::attention_kv_heads(*b), 1);
  // MHA: as many key/value heads as query heads.
  Scenario mha = test::scenario_from(test::small_moe("", "", 1));
  StepGraph g1 = expand(mha);
  const Op* m = find_op(g1, g1.classes[0], "attn_core_fwd", 0, 0);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(scenarios::attention_kv_heads(*m), m->shape[3]);
}

TEST(StepGraph, ContextParallelSplitsAttentionIntoLocalAndRing) {
  Scenario s = test::scenario_from(test::small_moe("cp = 2", "", 2));
  StepGraph g = expand(s);
  const auto& rc = g.classes[0];
  const Op* local = find_op(g, rc, "attn_core_fwd", 0, 0);
  const Op* ring = find_op(g, rc, "attn_core_ring_fwd", 0, 0);
  const Op* xchg = find_op(g, rc, "cp_kv_exchange_fwd", 0, 0);
  ASSERT_TRUE(local && ring && xchg);
  // Work per rank is half of the whole causal attention.
  Scenario one = test::scenario_from(test::small_moe("", "", 1));
  StepGraph g1 = expand(one);
  const Op* whole = find_op(g1, g1.classes[0], "attn_core_fwd", 0, 0);
  EXPECT_NEAR((local->flops + ring->flops) / whole->flops, 0.5, 1e-9);
  EXPECT_EQ(g.stream_name(*xchg), "cp_comm");
  EXPECT_EQ(rc.num_deps(*ring), 1U);  // waits for the exchange
}

TEST(StepGraph, InferenceDecodeReadsTheKvCacheAndFetchesMissingExperts) {
  Scenario s = load_scenario(test::source_dir() / "scenarios" / "examples" / "deepseek_v2_lite_offload.toml");
  StepGraph prefill = expand(s, 0);
  StepGraph decode = expand(s, 5);
  EXPECT_EQ(decode.step_kind, "decode");
  const auto& rc = decode.classes[0];
  const Op* attn = find_op(decode, rc, "attn_core_fwd", 0);
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->shape[1], 1);  // one query per sequence
  EXPECT_EQ(attn->shape[2], s.infer->prompt_length + 5);
  // 16 of 64 experts cached, 8 sequences x top-6: some layers must miss.
  EXPECT_GT(count_phase(decode, rc, "expert_fetch_h2d"), 0);
  EXPECT_GT(count_phase(decode, rc, "expert_wait"), 0);
  const Op* wait = find_op(decode, rc, "expert_wait");
  EXPECT_EQ(wait->host_kind(), HostKind::barrier);
  EXPECT_GE(rc.num_deps(*wait), 1U);
  EXPECT_EQ(count_phase(decode, rc, "sampled_token_read"), 1);
  // Deterministic: the same step expands to the same ops.
  StepGraph again = expand(s, 5);
  ASSERT_EQ(again.classes[0].ops.size(), rc.ops.size());
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    EXPECT_EQ(again.classes[0].ops[i].shape, rc.ops[i].shape);
    EXPECT_EQ(again.classes[0].ops[i].expert, rc.ops[i].expert);
  }
  EXPECT_GT(prefill.classes[0].ops.size(), 0U);
}

TEST(StepGraph, InferenceWithAllExpertsInHbmFetchesNothing) {
  std::string text = R"(schema_version = 1
[model]
num_layers = 2
hidden_size = 512
num_attention_heads = 8
vocab_size = 1000
num_experts = 8
moe_ffn_hidden_size = 256
moe_router_topk = 2
[infer]
batch_size = 4
prompt_length = 16
generate_tokens = 4
[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
)";
  Scenario s = test::scenario_from(text);
  StepGraph g = expand(s, 2);
  EXPECT_EQ(count_phase(g, g.classes[0], "expert_fetch_h2d"), 0);
  EXPECT_EQ(count_phase(g, g.classes[0], "expert_wait"), 0);
}

// LayerNorm has a weight and a bias (2h per norm), as the memory model counts it: the dense
// parameters that size the gradient buckets and the optimizer step count both.
TEST(StepGraph, LayerNormParametersCountWeightAndBias) {
  const Scenario s = test::scenario_from(R"(schema_version = 1
[model]
num_layers = 4
hidden_size = 1024
num_attention_heads = 16
ffn_hidden_size = 4096
vocab_size = 32000
swiglu = false
normalization = "layernorm"
untie_embeddings_and_output_weights = false
[train]
micro_batch_size = 1
global_batch_size = 8
seq_length = 1024
[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
)");
  const double h = 1024;
  const double layer = 4 * h * h + 2 * h * 4 * h + 2 * (2 * h);  // Q, K, V, O; fc1, fc2; two norms
  const double emb = 32000 * h;                                  // 32000 is a multiple of 128: not padded
  const StepGraph g = expand(s, 0);
  ASSERT_EQ(g.classes.size(), 1U);
  EXPECT_EQ(g.classes[0].dense_params, 4 * layer + emb + 2 * h);  // tied output layer, final norm
  EXPECT_EQ(g.classes[0].expert_params, 0.0);
}

TEST(StepGraph, AttentionOpsCarryTheScenariosAttentionImpl) {
  Scenario s = test::scenario_from(test::small_moe("", "", 1));
  for (const AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::unfused}) {
    s.model.attention_impl = impl;
    const StepGraph g = expand(s);
    int attention = 0;
    for (const auto& op : g.classes.front().ops) {
      if (op.kind != OpKind::attention) continue;
      ++attention;
      EXPECT_EQ(op.attention_impl(), impl);  // forward and backward alike
    }
    EXPECT_GT(attention, 0);
  }
}

namespace {

// A GQA model (16 query heads of 64, 4 key/value groups) with QK norms and RoPE, or MLA with RoPE.
std::string rope_model(bool mla) {
  const std::string attention = mla ? R"(attention = "mla"
kv_lora_rank = 512
qk_head_dim = 128
qk_pos_emb_head_dim = 64
v_head_dim = 128
)"
                                    : R"(attention = "gqa"
num_query_groups = 4
kv_channels = 64
qk_layernorm = true
)";
  return R"(schema_version = 1
[model]
num_layers = 2
hidden_size = 1024
num_attention_heads = 16
)" + attention +
         R"(ffn_hidden_size = 4096
vocab_size = 32000
position_embedding_type = "rope"
[train]
micro_batch_size = 1
global_batch_size = 2
seq_length = 1024
[cluster]
gpu = "h100"
gpus_per_node = 1
nodes = 1
)";
}

}  // namespace

// model.qk_layernorm: one norm over every query and key head (rows = tokens x (heads + groups), width
// the head dim) after the QKV projection, forward and backward, its weights per head counted;
// position_embedding_type = "rope": one streaming op over the rotated queries and keys (MLA: the
// rotary dims of each query head and the shared rotary key) that the attention core waits for.
TEST(StepGraph, QkNormAndRopeAddTheirOpsBeforeTheAttentionCore) {
  const Scenario s = test::scenario_from(rope_model(false));
  const StepGraph g = expand(s, 0);
  const auto& rc = g.classes[0];
  const Op* norm = find_op(g, rc, "attn_qk_norm_fwd", 0, 0);
  const Op* rope = find_op(g, rc, "attn_rope_fwd", 0, 0);
  const Op* core = find_op(g, rc, "attn_core_fwd", 0, 0);
  ASSERT_TRUE(norm && rope && core);
  EXPECT_EQ(norm->kind, OpKind::norm);
  EXPECT_EQ(norm->shape[0], 1024 * (16 + 4));
  EXPECT_EQ(norm->shape[1], 64);
  EXPECT_DOUBLE_EQ(rope->bytes, 2.0 * 1024 * (16 + 4) * 64 * 2);  // read and write, bf16
  EXPECT_EQ(count_phase(g, rc, "attn_qk_norm_bwd"), 4);           // 2 layers x 2 micro-batches
  EXPECT_EQ(count_phase(g, rc, "attn_rope_bwd"), 4);
  EXPECT_LT(norm, rope);  // issued in this order on the compute stream
  EXPECT_LT(rope, core);
  Scenario plain = s;
  plain.model.qk_layernorm = false;
  plain.model.position_embedding_type = PositionEmbedding::none;
  const StepGraph pg = expand(plain, 0);
  EXPECT_EQ(count_phase(pg, pg.classes[0], "attn_qk_norm_fwd") + count_phase(pg, pg.classes[0], "attn_rope_fwd"), 0);
  EXPECT_DOUBLE_EQ(g.classes[0].dense_params - pg.classes[0].dense_params, 2 * 2 * 64.0);  // 2 layers, q and k

  const Scenario m = test::scenario_from(rope_model(true));
  const StepGraph mg = expand(m, 0);
  const Op* mrope = find_op(mg, mg.classes[0], "attn_rope_fwd", 0, 0);
  ASSERT_NE(mrope, nullptr);
  EXPECT_DOUBLE_EQ(mrope->bytes, 2.0 * 1024 * (16 + 1) * 64 * 2);
}

TEST(StepGraph, QkNormWithMlaIsAnErrorNamingTheKey) {
  std::string text = rope_model(true);
  text.replace(text.find("position_embedding_type"), 0, "qk_layernorm = true\n");
  try {
    (void)test::scenario_from(text);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("qk_layernorm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attention-kind"), std::string::npos) << e.what();
  }
}

// Multi-token prediction: the depth runs on the last pipeline stage as layer num_layers, after the
// last layer's forward and before the head's, and its backward between the head's and the last
// layer's; the last stage holds a copy of the word embedding whose gradient it all-reduces with the
// first stage's; inference steps do not run it.
TEST(StepGraph, MultiTokenPredictionDepthRunsOnTheLastStage) {
  const Scenario s = test::scenario_from(
      test::small_moe("tp = 2\npp = 2\nep = 2\nsequence_parallel = true", "", 8, "mtp_num_layers = 1"));
  const StepGraph g = expand(s);
  check_invariants(s, g);
  const RankClass* first = nullptr;
  const RankClass* last = nullptr;
  for (const auto& rc : g.classes) (rc.pp_stage == 0 ? first : last) = &rc;
  ASSERT_NE(first, nullptr);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(count_phase(g, *first, "mtp_eh_proj_fwd"), 0);
  const int m = s.train->num_microbatches;
  for (const char* phase : {"mtp_embedding_fwd", "mtp_enorm_fwd", "mtp_hnorm_fwd", "mtp_eh_proj_fwd",
                            "mtp_eh_proj_dgrad", "mtp_eh_proj_wgrad", "mtp_eh_proj_tp_allgather_fwd", "mtp_lm_head_fwd",
                            "mtp_loss_fwd", "mtp_loss_bwd", "lm_head_fwd"}) {
    EXPECT_EQ(count_phase(g, *last, phase), m) << phase;
  }
  const Op* eh = find_op(g, *last, "mtp_eh_proj_fwd", 4, 0);
  ASSERT_NE(eh, nullptr);                                           // layer num_layers
  EXPECT_EQ(eh->shape[0], 1024);                                    // T rows
  EXPECT_EQ(eh->shape[1], 1024 / 2);                                // h / tp
  EXPECT_EQ(eh->shape[2], 2 * 1024);                                // the concatenation
  EXPECT_NE(find_op(g, *last, "moe_dispatch_fwd", 4, 0), nullptr);  // the depth's layer is the last layer's kind
  // Order within micro-batch 0 on the last stage.
  auto index = [&](const char* phase, int layer) {
    for (std::size_t i = 0; i < last->ops.size(); ++i) {
      const Op& op = last->ops[i];
      if (g.phase_name(op) == phase && op.layer == layer && op.microbatch == 0) return static_cast<long>(i);
    }
    return -1L;
  };
  EXPECT_LT(index("mlp_bda_fwd", 3), index("mtp_embedding_fwd", 4));
  EXPECT_LT(index("mtp_loss_fwd", 4), index("lm_head_fwd", -1));
  EXPECT_LT(index("lm_head_dgrad", -1), index("mtp_loss_bwd", 4));
  EXPECT_LT(index("mtp_hnorm_bwd", 4), index("mlp_bda_bwd", 3));
  // The word embedding's copy on the last stage: its gradient all-reduced with the first stage's.
  EXPECT_EQ(count_phase(g, *first, "embedding_grad_allreduce"), 1);
  EXPECT_EQ(count_phase(g, *last, "embedding_grad_allreduce"), 1);
  const ParameterCount with = rank_parameters(s, last->layers, false, true);
  Scenario plain = s;
  plain.model.mtp_num_layers = 0;
  const ParameterCount without = rank_parameters(plain, expand(plain).classes.back().layers, false, true);
  const ModelDims d = model_dims(s.model);
  EXPECT_DOUBLE_EQ(with.dense - without.dense,
                   layer_parameters(plain, 3).dense + 2.0 * d.h * d.h / 2 + 3.0 * d.norm + embedding_parameters(s));
  EXPECT_DOUBLE_EQ(with.expert - without.expert, layer_parameters(plain, 3).expert);
  // An inference step of the same model runs the main layers only.
  std::string text = test::small_moe("", "", 1, "mtp_num_layers = 1");
  text.replace(text.find("[train]"), text.find("[cluster]") - text.find("[train]"),
               "[infer]\nbatch_size = 2\nprompt_length = 64\ngenerate_tokens = 4\n");
  const Scenario inf = test::scenario_from(text);
  const StepGraph gi = expand(inf);
  for (const auto& rc : gi.classes) {
    for (const auto& op : rc.ops) EXPECT_LT(op.layer, 4) << gi.phase_name(op);
  }
}
