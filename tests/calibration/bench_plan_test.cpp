// The calibration's op table and grids (calibration/bench/plan.hpp): what is measured, with which
// definitions, and that the held-out validation scenarios' shapes are never among the points.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/decode_attention_geometry.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/op_coster.hpp"

using namespace threewalls;
using namespace threewalls::calibration::bench;

namespace {

std::vector<PointSpec> plan(Mode mode, int gpus, std::set<std::string> only = {}) {
  PlanOptions o;
  o.mode = mode;
  o.gpus = gpus;
  o.only = std::move(only);
  return make_plan(o);
}

std::vector<PointSpec> of_op(const std::vector<PointSpec>& points, const std::string& op) {
  std::vector<PointSpec> out;
  for (const auto& p : points) {
    if (p.op == op) out.push_back(p);
  }
  return out;
}

double min_param(const std::vector<PointSpec>& ps, const char* key) {
  double v = 1e300;
  for (const auto& p : ps) v = std::min(v, p.param(key));
  return v;
}
double max_param(const std::vector<PointSpec>& ps, const char* key) {
  double v = 0;
  for (const auto& p : ps) v = std::max(v, p.param(key));
  return v;
}

}  // namespace

TEST(CalibrationPlan, GemmGridCoversTheIssueRangesInBf16AndFp8) {
  const auto points = plan(Mode::full, 1);
  for (const char* op : {"gemm_bf16", "gemm_fp8"}) {
    const auto g = of_op(points, op);
    ASSERT_GE(g.size(), 30U) << op;
    // bf16 down to the 16 rows of one expert in a sequential MoE layer; fp8 from 64.
    EXPECT_EQ(min_param(g, "m"), std::string(op) == "gemm_bf16" ? 16 : 64) << op;
    EXPECT_EQ(max_param(g, "m"), 32768) << op;
    EXPECT_LE(std::min(min_param(g, "n"), min_param(g, "k")), 512) << op;
    EXPECT_EQ(std::max(max_param(g, "n"), max_param(g, "k")), 16384) << op;
  }
  // bf16 measures all three layouts of a linear layer; fp8 the forward ("TN") layout only.
  std::set<double> layouts;
  for (const auto& p : of_op(points, "gemm_bf16")) layouts.insert(p.param("layout"));
  EXPECT_EQ(layouts, (std::set<double>{kLayoutForward, kLayoutDgrad, kLayoutWgrad}));
  for (const auto& p : of_op(points, "gemm_fp8")) {
    EXPECT_EQ(p.param("layout"), kLayoutForward);
    EXPECT_EQ(p.iparam("m") % 16, 0) << p.label();  // Hopper fp8 needs multiples of 16
    EXPECT_EQ(p.iparam("n") % 16, 0) << p.label();
    EXPECT_EQ(p.iparam("k") % 16, 0) << p.label();
  }
}

// Every per-kernel memory family (profile.hpp) has a benchmark in the full plan, so that no kernel
// threewalls run launches for an op is costed by a pooled fit of other kernels; the quick plan
// measures both norms too.
TEST(CalibrationPlan, EveryMemoryKernelOfThreewallsRunIsMeasured) {
  const auto full = plan(Mode::full, 1);
  for (std::string_view k : calibration::kMemoryKernelFamilies) {
    EXPECT_GE(of_op(full, std::string(k)).size(), 5U) << k;
  }
  const auto quick = plan(Mode::quick, 1);
  for (const char* k : {"norm_rmsnorm_fwd", "norm_rmsnorm_bwd", "norm_layernorm_fwd", "norm_layernorm_bwd"}) {
    EXPECT_GE(of_op(quick, k).size(), 3U) << k;
  }
}

TEST(CalibrationPlan, EveryFamilyOfTheIssueIsMeasured) {
  const auto points = plan(Mode::full, 4);
  std::set<std::string> families;
  for (const auto& p : points) families.insert(p.family);
  for (const char* f : {"gemm.bf16",
                        "gemm.fp8",
                        "grouped_gemm.bf16",
                        "attention.fwd",
                        "attention.bwd",
                        "elementwise",
                        "norm",
                        "copy.h2d_pinned",
                        "copy.d2h_pinned",
                        "copy.h2d_pageable",
                        "copy.d2h_pageable",
                        "copy.d2d",
                        "copy.disk_read",
                        "collective.all_reduce.nvlink",
                        "collective.all_gather.nvlink",
                        "collective.reduce_scatter.nvlink",
                        "collective.all_to_all.nvlink",
                        "collective.broadcast.nvlink",
                        "collective.send_recv.nvlink",
                        "host.kernel_launch",
                        "host.event_record",
                        "host.stream_sync",
                        "host.gpu_read",
                        "host.graph_launch",
                        "host.graph_node",
                        "host.collective_launch",
                        "host.gemm_call",
                        "host.grouped_gemm_call",
                        "host.attention_launch",
                        "host.attention_bwd_launch",
                        "concurrency"}) {
    EXPECT_TRUE(families.count(f)) << f;
  }
}

TEST(CalibrationPlan, PointsMatchTheProfileRegistry) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    for (const auto& p : plan(mode, 3)) {
      const auto* spec = calibration::find_family_spec(p.family);
      ASSERT_NE(spec, nullptr) << p.label();
      EXPECT_EQ(p.inputs.size(), spec->inputs.size()) << p.label();
      const OpInfo* op = find_op(p.op);
      ASSERT_NE(op, nullptr) << p.label();
      if (op->group != "collective") {
        EXPECT_EQ(op->family, p.family) << p.label();
      }
    }
  }
}

TEST(CalibrationPlan, GroupedGemmIsMeasuredBalancedAndSkewed) {
  const auto g = of_op(plan(Mode::full, 1), "grouped_gemm_bf16");
  int balanced = 0, skewed = 0;
  for (const auto& p : g) {
    const double mean = p.param("total_rows") / p.param("groups");
    (p.param("max_rows") > mean ? skewed : balanced)++;
    EXPECT_LE(p.param("max_rows"), p.param("total_rows")) << p.label();
  }
  EXPECT_GE(balanced, 8);
  EXPECT_GE(skewed, 8);
}

TEST(CalibrationPlan, AttentionCoversSequenceHeadsHeadDimCausalAndDecode) {
  const auto points = plan(Mode::full, 1);
  const auto fwd = of_op(points, "attention_fwd");
  const auto bwd = of_op(points, "attention_bwd");
  EXPECT_GE(fwd.size(), 12U);
  EXPECT_GE(bwd.size(), 8U);
  std::set<double> heads, dims, causal;
  int decode = 0;
  for (const auto& p : fwd) {
    heads.insert(p.param("heads"));
    dims.insert(p.param("head_dim_qk"));
    causal.insert(p.param("causal"));
    if (p.param("seq_q") == 1) ++decode;
  }
  EXPECT_GE(heads.size(), 3U);
  EXPECT_GE(dims.size(), 3U);
  EXPECT_EQ(causal.size(), 2U);
  EXPECT_GE(decode, 4);
  EXPECT_GE(max_param(fwd, "seq_q"), 8192);
  for (const auto& p : bwd) EXPECT_GT(p.param("seq_q"), 1) << "no backward of decode: " << p.label();
}

// Fused attention over MHA, GQA and MLA-like head layouts, short to long sequences, causal and not;
// decode over cache lengths, batches and query heads per KV head; each with held-out shapes.
TEST(CalibrationPlan, FusedAndDecodeAttentionCoverHeadLayoutsSequencesAndCaches) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const auto points = plan(mode, 1);
    for (const char* op : {"attention_fused_fwd", "attention_fused_bwd"}) {
      const auto pts = of_op(points, op);
      std::set<double> ratios, dims, causal;
      int held_out = 0;
      for (const auto& p : pts) {
        ratios.insert(p.param("heads") / p.param("kv_heads"));
        dims.insert(p.param("head_dim_qk") * 1000 + p.param("head_dim_v"));
        causal.insert(p.param("causal"));
        held_out += p.held_out ? 1 : 0;
        EXPECT_EQ(p.param("seq_q"), p.param("seq_kv")) << p.label();
      }
      EXPECT_GE(ratios.size(), 3U) << op;
      EXPECT_GE(dims.size(), 3U) << op;
      EXPECT_EQ(causal.size(), 2U) << op;
      EXPECT_GE(held_out, 1) << op;
      EXPECT_LE(min_param(pts, "seq_q"), 128) << op;
      EXPECT_GE(max_param(pts, "seq_q"), 16384) << op;
    }
    const auto decode = of_op(points, "attention_decode");
    std::set<double> caches, ratios, batches;
    for (const auto& p : decode) {
      caches.insert(p.param("seq_kv"));
      ratios.insert(p.param("heads") / p.param("kv_heads"));
      batches.insert(p.param("batch"));
      EXPECT_LE(p.param("heads") / p.param("kv_heads"), p.param("head_dim_qk") > 128 ? 8 : 16) << p.label();
    }
    EXPECT_GE(caches.size(), 2U);
    EXPECT_GE(ratios.size(), 3U);
    EXPECT_GE(batches.size(), 3U);
    // A few sequences (the split count at its cap, blocks on a few SMs) and several blocks per SM.
    EXPECT_EQ(*batches.begin(), 1.0);
    EXPECT_GE(*batches.rbegin(), 32.0);
    if (mode == Mode::full) {
      EXPECT_TRUE(batches.count(3.0) && batches.count(5.0)) << "odd small batches";
      // Caches whose splits hold exactly two rounds of keys and some whose splits hold a few more.
      std::set<std::int64_t> rounds;
      for (const auto& p : decode) {
        rounds.insert(threewalls::decode_attention_geometry(static_cast<std::int64_t>(p.param("batch")),
                                                            static_cast<std::int64_t>(p.param("kv_heads")),
                                                            static_cast<std::int64_t>(p.param("seq_kv")), 132)
                          .rounds);
      }
      EXPECT_TRUE(rounds.count(2) && rounds.count(3)) << "rounds of keys per block";
    }
  }
}

TEST(CalibrationPlan, CollectivesCoverOneKiBToOneGiBForEveryGroupSize) {
  const auto points = plan(Mode::full, 4);
  for (const auto& op : collective_ops()) {
    const int max_n = op == "send_recv" ? 2 : 4;
    for (int n = 2; n <= 4; ++n) {
      double lo = 1e300, hi = 0;
      int count = 0;
      for (const auto& p : of_op(points, op)) {
        if (p.group_size != n || p.held_out) continue;
        lo = std::min(lo, p.bytes);
        hi = std::max(hi, p.bytes);
        ++count;
      }
      if (n > max_n) {
        EXPECT_EQ(count, 0) << op << " n=" << n;
        continue;
      }
      EXPECT_GE(count, 20) << op << " n=" << n;
      // 1 KiB to 1 GiB by factors of 2, each size 128 elements per member off the power of two (so no
      // validation scenario's exact size is measured), every member's chunk 16-byte aligned (at most
      // one 16-byte unit per member below).
      EXPECT_NEAR(lo, 1024 + 256 * n, 16 * n) << op << " n=" << n;
      EXPECT_NEAR(hi, 1024.0 * 1024 * 1024 + 256 * n, 16 * n) << op << " n=" << n;
    }
  }
  // One GPU: no collectives at all (and no error).
  EXPECT_TRUE(of_op(plan(Mode::full, 1), "all_reduce").empty());
}

TEST(CalibrationPlan, CollectiveSizesAreWholeElementsPerMember) {
  for (const auto& p : plan(Mode::full, 3, {"collective"})) {
    const bool split = p.op == "all_gather" || p.op == "reduce_scatter" || p.op == "all_to_all";
    const double unit = split ? 2.0 * p.group_size : 2.0;
    EXPECT_EQ(std::fmod(p.bytes, unit), 0.0) << p.label();
    EXPECT_EQ(p.inputs[0], p.group_size);
    EXPECT_EQ(p.inputs[1], p.bytes);
  }
}

// Each member's chunk of a split collective starts 16-byte aligned, as a step's messages do: NCCL
// took twice as long for misaligned chunks on 2 H200, and group size 3 ran its unaligned grid
// points slower than its aligned held-out points on 4 H200 (docs/calibration.md). Every group size.
TEST(CalibrationPlan, SplitCollectiveChunksAreSixteenByteAligned) {
  int groups_of_three = 0;
  for (const auto& p : plan(Mode::full, 8, {"collective"})) {
    const bool split = p.op == "all_gather" || p.op == "reduce_scatter" || p.op == "all_to_all";
    if (!split) continue;
    EXPECT_EQ(std::fmod(p.bytes / p.group_size, 16.0), 0.0) << p.label();
    groups_of_three += p.group_size == 3 ? 1 : 0;
  }
  EXPECT_GT(groups_of_three, 0);
}

TEST(CalibrationPlan, HostOverheadsAndConcurrencyOnTwoToSixtyFourStreams) {
  const auto points = plan(Mode::quick, 1);
  std::set<double> streams;
  for (const auto& p : of_op(points, "concurrency_section")) streams.insert(p.param("streams"));
  // The 1-stream time is each point's serial_s; 16-64 share CUDA's 8 hardware queues.
  EXPECT_EQ(streams, (std::set<double>{2, 4, 8, 16, 32, 64}));
  for (const char* h : {"host_kernel_launch", "host_event_record", "host_stream_sync", "host_gpu_read",
                        "host_graph_launch", "host_graph_node", "host_collective_launch", "host_op_dispatch",
                        "host_record_op", "host_stream_wait"}) {
    EXPECT_EQ(of_op(points, h).size(), 1U) << h;
  }
}

// The host time of a library call as OpRunner makes it, for GEMM, grouped GEMM and
// attention, in quick and full mode, each family with more than one point (its value is the median).
TEST(CalibrationPlan, LibraryCallHostCostsAreMeasuredForGemmGroupedGemmAndAttention) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const auto points = plan(mode, 1, {"host"});
    const auto gemm = of_op(points, "host_gemm_launch");
    const auto grouped = of_op(points, "host_grouped_gemm_launch");
    const auto attn = of_op(points, "host_attention_launch");
    const auto attn_bwd = of_op(points, "host_attention_bwd_launch");
    std::set<double> cycle;
    for (const auto& p : of_op(points, "host_stream_cycle")) {
      EXPECT_EQ(p.family, "host.stream_cycle");
      cycle.insert(p.param("streams"));
    }
    EXPECT_TRUE(cycle.count(64.0)) << "64 streams (one expert per stream of a 64-expert layer)";
    EXPECT_FALSE(cycle.count(1.0)) << "one stream is each sample's own reference";
    ASSERT_GE(gemm.size(), 3U);
    ASSERT_GE(grouped.size(), 2U);
    ASSERT_EQ(attn.size(), 1U);
    ASSERT_EQ(attn_bwd.size(), 1U);
    for (const auto& p : gemm) {
      EXPECT_EQ(p.family, "host.gemm_call");
      ASSERT_EQ(p.inputs.size(), 4U);  // m, n, k and the kernel count the runner fills in
      EXPECT_EQ(p.inputs[0], p.param("m"));
      EXPECT_EQ(p.inputs[3], 0.0);
    }
    for (const auto& p : grouped) {
      EXPECT_EQ(p.family, "host.grouped_gemm_call");
      ASSERT_EQ(p.inputs.size(), 5U);
    }
    EXPECT_EQ(attn[0].family, "host.attention_launch");
    EXPECT_EQ(attn_bwd[0].family, "host.attention_bwd_launch");
    // Small (launch-bound) and large GEMMs; a balanced and a skewed grouped GEMM; forward and backward.
    EXPECT_LE(min_param(gemm, "m"), 128);
    EXPECT_GE(max_param(gemm, "m"), 2048);
    std::set<double> skew;
    for (const auto& p : grouped) skew.insert(p.param("max_rows") * p.param("groups") / p.param("total_rows"));
    EXPECT_TRUE(skew.count(1.0));
    EXPECT_GT(*skew.rbegin(), 1.0);
    EXPECT_EQ(attn[0].param("backward"), 0.0);
    EXPECT_EQ(attn_bwd[0].param("backward"), 1.0);
    // host.gemm_call learns where cuBLASLt adds a split-K kernel from k per 128 x 128 output tile:
    // the points reach from a few to hundreds of k per tile.
    double lo = 1e18, hi = 0.0;
    for (const auto& p : gemm) {
      const double r = p.param("k") / calibration::GemmCallModel::tiles(p.iparam("m"), p.iparam("n"));
      lo = std::min(lo, r), hi = std::max(hi, r);
    }
    EXPECT_LE(lo, 4.0);
    EXPECT_GE(hi, 500.0);
  }
}

// The grouped-GEMM grid reaches expert dimensions of 512 (n and k), balanced and skewed, in
// quick and full mode (the d_model 768 expert GEMMs were far off a fit of n >= 1408 only).
TEST(CalibrationPlan, GroupedGemmCoversSmallExpertDimensionsBalancedAndSkewed) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const auto g = of_op(plan(mode, 1, {"grouped"}), "grouped_gemm_bf16");
    bool small_n_balanced = false, small_n_skewed = false, small_k_balanced = false, small_k_skewed = false;
    for (const auto& p : g) {
      if (p.held_out) continue;
      const bool balanced = p.param("max_rows") * p.param("groups") == p.param("total_rows");
      if (p.param("n") <= 512) (balanced ? small_n_balanced : small_n_skewed) = true;
      if (p.param("k") <= 512) (balanced ? small_k_balanced : small_k_skewed) = true;
    }
    EXPECT_TRUE(small_n_balanced && small_n_skewed && small_k_balanced && small_k_skewed);
    EXPECT_LE(min_param(g, "n"), 512);
    EXPECT_LE(min_param(g, "k"), 512);
    EXPECT_GE(max_param(g, "n"), 4096);
  }
}

TEST(CalibrationPlan, QuickIsSmallerThanFullAndBothAreDeterministic) {
  const auto quick = plan(Mode::quick, 4);
  const auto full = plan(Mode::full, 4);
  EXPECT_LT(2 * quick.size(), full.size());
  const auto again = plan(Mode::full, 4);
  ASSERT_EQ(full.size(), again.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].label(), again[i].label());
    EXPECT_EQ(full[i].inputs, again[i].inputs);
  }
}

TEST(CalibrationPlan, HeldOutShapesAreNotFitPoints) {
  const auto points = plan(Mode::full, 4);
  std::set<std::pair<std::string, std::vector<double>>> fit;
  std::map<std::string, int> held;
  for (const auto& p : points) {
    if (!p.held_out) fit.insert({p.family, p.inputs});
  }
  for (const auto& p : points) {
    if (!p.held_out) continue;
    ++held[p.family.substr(0, p.family.find('.'))];
    EXPECT_FALSE(fit.count({p.family, p.inputs})) << p.label();
  }
  EXPECT_GE(held["gemm"], 30);
  EXPECT_GE(held["grouped_gemm"], 6);
  EXPECT_GE(held["collective"], 5 * 5 * 3);  // every kind and group size
}

TEST(CalibrationPlan, UnknownGroupIsAnInputErrorNamingTheAllowedOnes) {
  try {
    plan(Mode::quick, 1, {"gemms"});
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown benchmark group 'gemms' (did you mean 'gemm'?)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("collective"), std::string::npos) << msg;
  }
  EXPECT_THROW(plan(Mode::quick, 0), InputError);
}

TEST(CalibrationPlan, OnlySelectsGroups) {
  for (const auto& p : plan(Mode::quick, 2, {"copy", "host"})) {
    const std::string g = find_op(p.op)->group;
    EXPECT_TRUE(g == "copy" || g == "host") << p.label();
  }
}

TEST(BusBandwidth, FollowsNcclTestsDefinitions) {
  // nccl-tests: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; send/recv 1.
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_gather", 8), 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("reduce_scatter", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("send_recv", 2), 1.0);
  // 1 GiB all-reduce on 4 GPUs in 5 ms: algbw 214.7 GB/s, busbw 322.1 GB/s.
  const double gib = 1024.0 * 1024 * 1024;
  EXPECT_NEAR(algorithm_bandwidth(gib, 5e-3) / 1e9, 214.748, 1e-3);
  EXPECT_NEAR(bus_bandwidth("all_reduce", 4, gib, 5e-3) / 1e9, 322.123, 1e-3);
  EXPECT_THROW(bus_bandwidth_factor("allreduce", 4), std::invalid_argument);
  // The same factors as the CostModel's (what the simulator divides by).
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 4), calibration::bus_bandwidth_factor(Collective::all_to_all, 4));
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 8), calibration::bus_bandwidth_factor(Collective::all_reduce, 8));
}

TEST(CalibrationPlan, OpTableDocumentsEveryOp) {
  std::set<std::string> names;
  for (const auto& o : op_table()) {
    EXPECT_TRUE(names.insert(o.name).second) << "duplicate " << o.name;
    EXPECT_FALSE(o.what.empty()) << o.name;
    EXPECT_FALSE(o.definition.empty()) << o.name;
    EXPECT_NE(std::find(op_groups().begin(), op_groups().end(), o.group), op_groups().end()) << o.name;
  }
  for (const auto& p : plan(Mode::full, 2)) EXPECT_TRUE(names.count(p.op)) << p.op;
  // Every calibrate group of the family table measures something, once listed.
  const std::set<std::string> groups(op_groups().begin(), op_groups().end());
  EXPECT_EQ(groups.size(), op_groups().size());
  for (const auto& g : op_groups()) {
    EXPECT_TRUE(std::any_of(op_table().begin(), op_table().end(), [&](const OpInfo& o) { return o.group == g; })) << g;
  }
}

// ---- the held-out validation scenarios are never measured ----

namespace {

using Key = std::tuple<std::string, std::vector<double>>;

// The calibration inputs each StepGraph op would be predicted from (family, inputs), over the suites
// compared with runs on our own GPUs. scenarios/validation/scale/ is left out: it is compared with
// published throughput of clusters we cannot run, not with measurements a calibration point could
// stand in for, and its generic shapes (a 4096^3 GEMM) are ordinary grid points.
std::set<Key> validation_shapes() {
  using namespace threewalls::scenarios;
  std::set<Key> out;
  // Decode attention shapes by all but their cache length: the lengths seen (filled in below).
  std::map<std::vector<double>, std::set<double>> decode_lengths;
  const auto dir = std::filesystem::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "validation";
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    if (e.path().parent_path().filename() == "scale") continue;
    const Scenario sc = load_scenario(e.path().string());
    // Training steps repeat. Inference steps differ: the prefill, then decode steps whose caches grow
    // by one key a step; the first and last decode steps bound every decode step's cache.
    std::vector<int> steps{0, 1};
    if (sc.infer && sc.infer->generate_tokens > 1) steps.push_back(sc.infer->generate_tokens);
    for (const int step : steps) {
      const StepGraph g = expand(sc, step);
      for (const auto& rc : g.classes) {
        for (const auto& op : rc.ops) {
          const auto& s = op.shape;
          const std::string dt = op.dtype == DType::fp8 ? "fp8" : op.dtype == DType::fp32 ? "fp32" : "bf16";
          auto d = [](std::int64_t v) { return static_cast<double>(v); };
          switch (op.kind) {
            case OpKind::gemm:
              out.insert({"gemm." + dt, {d(s[0]), d(s[1]), d(s[2]), d(std::max<std::int64_t>(1, s[3]))}});
              break;
            case OpKind::grouped_gemm:
              out.insert({"grouped_gemm." + dt, {d(s[3]), d(s[0]), d(s[4]), d(s[1]), d(s[2])}});
              break;
            case OpKind::attention: {
              // Whatever kernel the scenario picks: its shape as a point of every attention family.
              const bool bwd = (op.flags & kBackward) != 0;
              const std::vector<double> in{d(s[0]), d(s[1]), d(s[2]), d(s[3]),
                                           d(s[3]), d(s[4]), d(s[5]), (op.flags & kCausal) ? 1.0 : 0.0};
              out.insert({bwd ? "attention.bwd" : "attention.fwd", in});
              out.insert({bwd ? "attention_fused.bwd" : "attention_fused.fwd", in});
              if (s[1] == 1 && !bwd) {
                decode_lengths[{d(s[0]), d(s[3]), d(attention_kv_heads(op)), d(s[4]), d(s[5])}].insert(d(s[2]));
              }
              break;
            }
            case OpKind::collective: {
              const char* kind = to_string(op.collective());
              out.insert({std::string("collective.") + kind + ".nvlink", {d(op.group_size), op.bytes}});
              break;
            }
            case OpKind::send:
            case OpKind::recv:
              out.insert({"collective.send_recv.nvlink", {d(op.group_size), op.bytes}});
              break;
            case OpKind::norm:
              out.insert({"norm", {op.bytes}});
              break;
            case OpKind::copy:
              out.insert({std::string("copy.") + to_string(op.copy_kind()), {op.bytes}});
              break;
            case OpKind::softmax_topk:
            case OpKind::permute:
            case OpKind::unpermute:
            case OpKind::embedding:
            case OpKind::cross_entropy:
            case OpKind::optimizer: {
              // Their kernel_terms family and inputs (what sim/ costs them with), and the pooled fit
              // it falls back to.
              const auto fk = sim::fitted_kernel_of(op);
              out.insert({std::string(fk.family), fk.inputs});
              out.insert({"elementwise", {op.bytes}});
              break;
            }
            case OpKind::elementwise:
              out.insert({"elementwise", {op.bytes}});
              break;  // what sim/ costs them with
            default:
              break;
          }
        }
      }
    }
  }
  for (const auto& [dims, lengths] : decode_lengths) {
    for (double skv = *lengths.begin(); skv <= *lengths.rbegin(); skv += 1.0) {
      out.insert({"attention_decode", {dims[0], dims[1], dims[2], skv, dims[3], dims[4]}});
    }
  }
  return out;
}

}  // namespace

TEST(CalibrationPlan, NeverMeasuresAShapeOfTheValidationScenarios) {
  const auto shapes = validation_shapes();
  ASSERT_GT(shapes.size(), 50U);  // the scenarios were read
  // A decode step between the first and the last, with its KV heads (i03: 4 x 8192 prompts, 7 steps).
  EXPECT_TRUE(shapes.count({"attention_decode", {4, 32, 4, 8195, 128, 128}}));
  for (const Mode mode : {Mode::quick, Mode::full}) {
    for (int gpus = 1; gpus <= 8; ++gpus) {
      for (const auto& p : plan(mode, gpus)) {
        EXPECT_FALSE(shapes.count({p.family, p.inputs})) << p.label() << " is a shape of a validation scenario";
      }
    }
  }
}

// The interference group's kernels, as the compute families would see them, are no validation shape.
TEST(CalibrationPlan, InterferenceKernelsAreNoShapeOfTheValidationScenarios) {
  const auto shapes = validation_shapes();
  for (const Mode mode : {Mode::quick, Mode::full}) {
    for (const auto& p : plan(mode, 2, {"interference"})) {
      if (p.op != "nccl_interference") continue;
      Key k;
      if (p.iparam("kernel") == 0) {
        k = {"gemm.bf16", {p.param("m"), p.param("n"), p.param("k"), 1.0}};
      } else if (p.iparam("kernel") == 1) {
        k = {p.iparam("backward") ? "attention.bwd" : "attention.fwd",
             {p.param("batch"), p.param("seq"), p.param("seq"), p.param("heads"), p.param("heads"), p.param("head_dim"),
              p.param("head_dim"), p.param("causal")}};
      } else if (p.iparam("kernel") == 3) {
        k = {"grouped_gemm.bf16",
             {p.param("groups"), p.param("total_rows"), p.param("max_rows"), p.param("n"), p.param("k")}};
      } else {
        k = {"elementwise", {6.0 * p.param("elements")}};
      }
      EXPECT_FALSE(shapes.count(k)) << p.label() << " is a shape of a validation scenario";
    }
  }
}

// The library calls whose host time is measured, as the compute families would see them,
// are no validation shape either.
TEST(CalibrationPlan, LibraryCallHostPointsAreNoShapeOfTheValidationScenarios) {
  const auto shapes = validation_shapes();
  for (const Mode mode : {Mode::quick, Mode::full}) {
    int checked = 0;
    for (const auto& p : plan(mode, 1, {"host"})) {
      Key k;
      if (p.op == "host_gemm_launch") {
        k = {"gemm.bf16", {p.param("m"), p.param("n"), p.param("k"), 1.0}};
      } else if (p.op == "host_grouped_gemm_launch") {
        k = {"grouped_gemm.bf16",
             {p.param("groups"), p.param("total_rows"), p.param("max_rows"), p.param("n"), p.param("k")}};
      } else if (p.op == "host_attention_launch" || p.op == "host_attention_bwd_launch") {
        k = {p.iparam("backward") ? "attention.bwd" : "attention.fwd",
             {p.param("batch"), p.param("seq"), p.param("seq"), p.param("heads"), p.param("heads"), p.param("head_dim"),
              p.param("head_dim"), 1.0}};
      } else {
        continue;
      }
      ++checked;
      EXPECT_FALSE(shapes.count(k)) << p.label() << " is a shape of a validation scenario";
    }
    EXPECT_GE(checked, 7);
  }
}

TEST(CalibrationPlan, DeviceMemoryIsEveryStageOfEveryRepeatOnOneGpu) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const auto points = plan(mode, 1, {"device"});
    ASSERT_EQ(points.size(), static_cast<std::size_t>(calibration::DeviceMemoryModel::kStages *
                                                      calibration::DeviceMemoryModel::kRepeats));
    std::set<std::pair<int, int>> seen;
    for (const auto& p : points) {
      EXPECT_EQ(p.op, "device_memory");
      EXPECT_EQ(p.family, calibration::kDeviceMemoryFamily);
      EXPECT_EQ(p.inputs.size(), 3U);
      EXPECT_EQ(p.inputs[0], p.param("stage"));
      seen.insert({static_cast<int>(p.iparam("stage")), static_cast<int>(p.iparam("repeat"))});
    }
    EXPECT_EQ(seen.size(), points.size());
  }
}

TEST(CalibrationPlan, InterferenceNeedsTwoGpusAndCoversOneAndManyWaveGemms) {
  EXPECT_TRUE(plan(Mode::full, 1, {"interference"}).empty());  // the report says why (needs 2 GPUs)
  for (const Mode mode : {Mode::quick, Mode::full}) {
    const auto points = plan(mode, 4, {"interference"});
    std::set<double> stages;
    std::map<std::pair<int, int>, int> per_case_kernel;
    double min_tiles = 1e300, max_tiles = 0;
    for (const auto& p : points) {
      EXPECT_EQ(p.group_size, 2) << p.label();  // one pair: GPU 0 measured, GPU 1 the peer
      if (p.op == "nccl_memory") {
        stages.insert(p.param("stage"));
        continue;
      }
      ASSERT_EQ(p.op, "nccl_interference");
      ++per_case_kernel[{static_cast<int>(p.iparam("case")), static_cast<int>(p.iparam("kernel"))}];
      if (p.iparam("kernel") == 0) {
        const double tiles = std::ceil(p.param("m") / 128) * std::ceil(p.param("n") / 128);
        EXPECT_EQ(p.inputs[2], tiles) << p.label();
        min_tiles = std::min(min_tiles, tiles);
        max_tiles = std::max(max_tiles, tiles);
      }
    }
    EXPECT_EQ(stages, (std::set<double>{0, 1, 2})) << to_string(mode);
    for (int c = 0; c <= 1; ++c) {
      for (int k = 0; k <= 2; ++k) {
        const int n = per_case_kernel[std::make_pair(c, k)];
        EXPECT_GE(n, 1) << "case " << c << " kernel " << k;
      }
      const int gemms = per_case_kernel[std::make_pair(c, 0)];
      EXPECT_GE(gemms, 3) << "case " << c;
    }
    // A GEMM that fits one wave on 132 SMs but not on 132 - 24, and one of many waves.
    EXPECT_LE(min_tiles, 132) << to_string(mode);
    EXPECT_GE(max_tiles, 1000) << to_string(mode);
  }
}

TEST(CalibrationPlan, EveryModeHasEnoughFitPointsForEveryModel) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    std::map<std::string, int> fit;
    for (const auto& p : plan(mode, 2)) {
      if (!p.held_out) ++fit[p.family];
    }
    EXPECT_GE(fit["gemm.bf16"], 8) << to_string(mode);
    EXPECT_GE(fit["gemm.fp8"], 8) << to_string(mode);
    EXPECT_GE(fit["grouped_gemm.bf16"], 3) << to_string(mode);
    EXPECT_GE(fit["attention.fwd"], 5) << to_string(mode);  // 4 parameters, and leave-one-out
    EXPECT_GE(fit["attention.bwd"], 5) << to_string(mode);
    EXPECT_GE(fit["attention_fused.fwd"], 5) << to_string(mode);
    EXPECT_GE(fit["attention_fused.bwd"], 5) << to_string(mode);
    EXPECT_GE(fit["attention_decode"], 6) << to_string(mode);  // 5 parameters, and leave-one-out
    EXPECT_GE(fit["copy.d2d"], 5) << to_string(mode);
    EXPECT_GE(fit["collective.all_reduce.nvlink"], 5) << to_string(mode);  // the ramp needs 5 sizes
    EXPECT_GE(fit["concurrency"], 6) << to_string(mode);
  }
}

// The concurrency points run what a streams:N expert section runs (the step graph's expert
// ops), at the calibration's own shapes: no d_model or FFN of the host-overhead suite (768/1024,
// 3072/4096), whose runs the simulator is compared with. Their kernels fill from a few of the SMs
// to most (the model's speed-up depends on the mean fraction).
TEST(CalibrationPlan, ConcurrencySectionsAreTheStepGraphsExpertOpsAtTheCalibrationsOwnShapes) {
  double lo = 1.0, hi = 0.0;
  for (const auto& p : plan(Mode::full, 1, {"concurrency"})) {
    EXPECT_EQ(p.op, "concurrency_section") << p.label();
    for (const double h : {768.0, 1024.0}) EXPECT_NE(p.param("hidden"), h) << p.label();
    for (const double f : {3072.0, 4096.0}) EXPECT_NE(p.param("ffn"), f) << p.label();
    const auto ops = concurrency_section_ops(p.iparam("rows"), p.iparam("hidden"), p.iparam("ffn"));
    ASSERT_EQ(ops.size(), 5U * kConcurrencySectionExperts) << p.label();
    const std::vector<scenarios::OpKind> section{scenarios::OpKind::permute, scenarios::OpKind::gemm,
                                                 scenarios::OpKind::elementwise, scenarios::OpKind::gemm,
                                                 scenarios::OpKind::unpermute};
    std::int64_t routed = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(ops[i].kind, section[i % 5]) << p.label() << " op " << i;
      EXPECT_EQ(ops[i].expert, static_cast<int>(i / 5)) << p.label() << " op " << i;
      // The expert's rows (the activation's elements: rows x ffn).
      const std::int64_t rows = ops[i - i % 5].tokens;
      EXPECT_EQ(ops[i].shape[0], i % 5 == 2 ? rows * p.iparam("ffn") : rows) << p.label() << " op " << i;
      if (i % 5 == 0) routed += ops[i].tokens;
    }
    // The seeded routing spreads every token (top-1) over the experts, `rows` each on average.
    EXPECT_EQ(routed, p.iparam("rows") * kConcurrencySectionExperts) << p.label();
    EXPECT_EQ(ops[1].shape[1], p.iparam("ffn"));  // fc1: rows x ffn x hidden
    EXPECT_EQ(ops[1].shape[2], p.iparam("hidden"));
    const double f = mean_sm_fraction(ops, 132);
    lo = std::min(lo, f), hi = std::max(hi, f);
  }
  EXPECT_LT(lo, 0.1);
  EXPECT_GT(hi, 0.4);
  EXPECT_THROW((void)concurrency_section_ops(3, 512, 2048), InputError);  // 3 x 64 tokens: not whole sequences
  EXPECT_THROW((void)concurrency_section_ops(32, 100, 2048), InputError);
}

TEST(CalibrationPlan, KernelsGroupMeasuresEveryKernelTermsFamilyWithHeldOutPoints) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    std::map<std::string, int> fit, held;
    std::map<std::string, std::set<std::vector<double>>> shapes;
    for (const auto& p : plan(mode, 1, {"kernels"})) {
      EXPECT_EQ(find_op(p.op)->group, "kernels") << p.label();
      (p.held_out ? held : fit)[p.family] += 1;
      shapes[p.family].insert(p.inputs);
      EXPECT_GT(p.bytes, 0.0) << p.label();
    }
    for (const auto& k : calibration::kernel_terms_families()) {
      if (!k.points_of.empty()) continue;  // the norms' points are the norm family's (plan_norm)
      // Overhead + terms, and at least 2 more for leave-one-out.
      EXPECT_GE(fit[k.name], static_cast<int>(k.terms.size()) + 3) << k.name << " " << to_string(mode);
      EXPECT_GE(held[k.name], 1) << k.name << " " << to_string(mode);
      EXPECT_EQ(shapes[k.name].size(), static_cast<std::size_t>(fit[k.name] + held[k.name])) << k.name;
    }
  }
  // The routing kernels are measured over what the scenarios route: 8..256 experts, topk 1..8,
  // decode-sized to large-batch token counts; gathers at topk 1 (OpRunner's mapping) and above.
  const auto full = plan(Mode::full, 1, {"kernels"});
  const auto router = of_op(full, "softmax_topk_fwd");
  EXPECT_LE(min_param(router, "experts"), 8);
  EXPECT_GE(max_param(router, "experts"), 256);
  EXPECT_LE(min_param(router, "tokens"), 256);
  EXPECT_GE(max_param(router, "tokens"), 16384);
  const auto gathers = of_op(full, "unpermute_fwd");
  EXPECT_EQ(min_param(gathers, "topk"), 1);
  EXPECT_GE(max_param(gathers, "topk"), 8);
  EXPECT_GE(max_param(gathers, "tokens") * 1, 32768);
  EXPECT_GE(max_param(of_op(full, "adam_step"), "parameters"), 1e8);
}
