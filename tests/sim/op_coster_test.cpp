// CostModelCoster's kernel_terms path (sim/op_coster.hpp): softmax_topk, permute, unpermute,
// embedding, cross_entropy and optimizer ops are costed by their own shape fit when the profile has
// it, with OpRunner's shape mapping, and by the pooled elementwise(bytes) fit otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/op_coster.hpp"

using namespace threewalls;
using namespace threewalls::sim;
using scenarios::Op;
using scenarios::OpKind;

namespace {

calibration::Profile shipped_default() {
  return calibration::Profile::load(std::filesystem::path(THREEWALLS_SOURCE_DIR) / "calibration" / "profiles" /
                                    "default_h200.toml");
}

// Router forward: t = 5 us + 2 ns per token + 0.1 ns per (token, choice) + 0.01 ns per score.
double router_truth(double t, double e, double k) { return 5e-6 + 2e-9 * t + 1e-10 * t * k + 1e-11 * t * e; }
// Permute forward: t = 3 us + 1 ns per row + 1 ps per element.
double permute_truth(double t, double k, double h) { return 3e-6 + 1e-9 * t * k + 1e-12 * t * k * h; }

// The shipped default profile plus exact kernel_terms points of two families.
calibration::Profile default_with_kernel_families() {
  const calibration::Profile base = shipped_default();
  calibration::ProfileBuilder b(base.info(), base.hardware());
  for (double t : {200.0, 1000.0, 9000.0, 27000.0}) {
    for (double e : {8.0, 64.0, 256.0}) {
      for (double k : {1.0, 8.0}) {
        b.add_point(calibration::kSoftmaxTopkFwdFamily, {t, e, k},
                    calibration::Measurement::single(router_truth(t, e, k)));
      }
    }
  }
  for (double t : {300.0, 2000.0, 12000.0, 50000.0}) {
    for (double h : {1000.0, 7000.0}) {
      for (double k : {1.0, 4.0}) {
        b.add_point(calibration::kPermuteFwdFamily, {t, k, h}, calibration::Measurement::single(permute_truth(t, k, h)));
      }
    }
  }
  std::vector<calibration::Family> families = base.families();
  const calibration::Profile fitted = b.build();  // named: a range-for over a temporary's member dangles
  for (const auto& f : fitted.families()) families.push_back(f);
  return calibration::Profile(base.info(), base.hardware(), std::move(families));
}

Op memory_op(OpKind kind, std::vector<std::int64_t> shape, double bytes, bool backward = false) {
  Op op;
  op.kind = kind;
  op.wall = scenarios::Wall::memory;
  op.bytes = bytes;
  for (std::size_t i = 0; i < shape.size(); ++i) op.shape[i] = shape[i];
  if (backward) op.flags |= scenarios::kBackward;
  return op;
}

// A causal attention op of `shape` (batch, seq_q, seq_kv, heads, head_dim_qk, head_dim_v) run by
// `impl`, forward or backward.
Op attention_op(scenarios::OpShape shape, scenarios::AttentionImpl impl, bool backward) {
  Op op;
  op.kind = OpKind::attention;
  op.shape = shape;
  op.sub = static_cast<std::uint8_t>(impl);
  op.flags = static_cast<std::uint8_t>(scenarios::kCausal | (backward ? scenarios::kBackward : 0));
  return op;
}

}  // namespace

TEST(OpCosterFittedKernel, UsesTheKernelFamilyWhenTheProfileHasIt) {
  const calibration::CostModel model(default_with_kernel_families());
  const CostModelCoster coster(model);
  const Op topk = memory_op(OpKind::softmax_topk, {4096, 64, 6}, 4096.0 * 64 * 6);
  EXPECT_NEAR(coster.kernel_time(topk).value, router_truth(4096, 64, 6), 1e-3 * router_truth(4096, 64, 6));
  EXPECT_GT(std::fabs(coster.kernel_time(topk).value - model.elementwise(Bytes(topk.bytes)).value), 1e-7);
  // The StepGraph's permute sets tokens = rows: OpRunner runs topk 1 over all rows.
  Op perm = memory_op(OpKind::permute, {32768, 2048}, 2.0 * 32768 * 2048 * 2);
  perm.tokens = 32768;
  EXPECT_NEAR(coster.kernel_time(perm).value, permute_truth(32768, 1, 2048), 1e-3 * permute_truth(32768, 1, 2048));
  // tokens dividing the rows: topk = rows / tokens.
  perm.tokens = 8192;
  EXPECT_NEAR(coster.kernel_time(perm).value, permute_truth(8192, 4, 2048), 1e-3 * permute_truth(8192, 4, 2048));
}

TEST(OpCosterFittedKernel, FallsBackToThePooledElementwiseFitWithoutTheFamily) {
  const calibration::CostModel model(default_with_kernel_families());
  const CostModelCoster coster(model);
  // Families the profile lacks: the backward router, unpermute, embedding, loss, optimizer.
  for (const Op& op : {memory_op(OpKind::softmax_topk, {4096, 64, 6}, 3e6, true),
                       memory_op(OpKind::unpermute, {8192, 2048}, 1e8), memory_op(OpKind::embedding, {4096, 2048}, 3e7),
                       memory_op(OpKind::cross_entropy, {4096, 50304}, 1e9, true),
                       memory_op(OpKind::optimizer, {100000000}, 3e9)}) {
    EXPECT_DOUBLE_EQ(coster.kernel_time(op).value, model.elementwise(Bytes(op.bytes)).value) << to_string(op.kind);
  }
  // An older profile (the shipped default has none of the families): everything falls back.
  const calibration::CostModel plain(shipped_default());
  const CostModelCoster old(plain);
  const Op topk = memory_op(OpKind::softmax_topk, {4096, 64, 6}, 4096.0 * 64 * 6);
  EXPECT_DOUBLE_EQ(old.kernel_time(topk).value, plain.elementwise(Bytes(topk.bytes)).value);
}

TEST(OpCosterFittedKernel, MapsEachKindAndDirectionToOpRunnersLaunchSequence) {
  using namespace threewalls::calibration;
  auto fk = fitted_kernel_of(memory_op(OpKind::softmax_topk, {512, 128, 8}, 1.0, true));
  EXPECT_EQ(fk.family, kSoftmaxTopkBwdFamily);
  EXPECT_EQ(fk.inputs, (std::vector<double>{512, 128, 8}));
  Op unperm = memory_op(OpKind::unpermute, {6000, 1024}, 1.0, true);
  unperm.tokens = 1000;  // 6 rows per token
  fk = fitted_kernel_of(unperm);
  EXPECT_EQ(fk.family, kUnpermuteBwdFamily);
  EXPECT_EQ(fk.inputs, (std::vector<double>{1000, 6, 1024}));
  unperm.tokens = 0;  // unknown: topk 1
  EXPECT_EQ(fitted_kernel_of(unperm).inputs, (std::vector<double>{6000, 1, 1024}));
  unperm.tokens = 7;  // does not divide: topk 1
  EXPECT_EQ(fitted_kernel_of(unperm).inputs, (std::vector<double>{6000, 1, 1024}));
  unperm.tokens = 100;  // 60 per token: above OpRunner's 32, topk 1
  EXPECT_EQ(fitted_kernel_of(unperm).inputs, (std::vector<double>{6000, 1, 1024}));
  EXPECT_EQ(fitted_kernel_of(memory_op(OpKind::permute, {10, 8}, 1.0, true)).family, kPermuteBwdFamily);
  EXPECT_EQ(fitted_kernel_of(memory_op(OpKind::embedding, {10, 8}, 1.0, true)).family, kEmbeddingBwdFamily);
  EXPECT_EQ(fitted_kernel_of(memory_op(OpKind::cross_entropy, {10, 8}, 1.0)).family, kCrossEntropyFwdFamily);
  fk = fitted_kernel_of(memory_op(OpKind::optimizer, {123456}, 1.0));
  EXPECT_EQ(fk.family, kAdamStepFamily);
  EXPECT_EQ(fk.inputs, (std::vector<double>{123456}));
  EXPECT_THROW((void)fitted_kernel_of(memory_op(OpKind::gemm, {1, 1, 1}, 1.0)), std::logic_error);
}

// Norm ops: threewalls run runs the scenario's RMSNorm or LayerNorm kernel; each is costed by the
// per-kernel fit of its own calibration benchmark, and by the pooled norm fit when the profile lacks
// it (profiles calibrated before the LayerNorm benchmarks existed).
TEST(OpCosterNorm, EachNormKindAndDirectionUsesItsOwnKernelFitOrThePooledNormFit) {
  const calibration::Profile base = shipped_default();
  calibration::ProfileBuilder b(base.info(), base.hardware());
  auto layernorm_fwd = [](double bytes) { return 7e-6 + bytes / 0.7e12; };
  for (double bytes : {7e4, 3e5, 1.2e6, 4.7e6, 1.9e7, 7.5e7, 3e8}) {
    b.add_point("norm_layernorm_fwd", {bytes}, calibration::Measurement::single(layernorm_fwd(bytes)));
  }
  // A profile without LayerNorm fits, plus LayerNorm forward's.
  std::vector<calibration::Family> families;
  for (const auto& f : base.families()) {
    if (f.name.rfind("norm_layernorm", 0) != 0) families.push_back(f);
  }
  const calibration::Profile fitted = b.build();
  for (const auto& f : fitted.families()) families.push_back(f);
  const calibration::CostModel model(calibration::Profile(base.info(), base.hardware(), families));
  const CostModelCoster coster(model);
  auto norm_op = [](scenarios::NormKind kind, bool backward) {
    Op op = memory_op(OpKind::norm, {16384, 768}, 4.0 * 16384 * 768, backward);
    op.sub = static_cast<std::uint8_t>(kind);
    return op;
  };
  const Op ln_fwd = norm_op(scenarios::NormKind::layernorm, false);
  EXPECT_NEAR(coster.kernel_time(ln_fwd).value, layernorm_fwd(ln_fwd.bytes), 1e-3 * layernorm_fwd(ln_fwd.bytes));
  EXPECT_EQ(fitted_kernel_of(ln_fwd).family, calibration::kLayernormFwdFamily);
  EXPECT_EQ(fitted_kernel_of(ln_fwd).inputs, (std::vector<double>{16384, 768}));
  EXPECT_EQ(fitted_kernel_of(norm_op(scenarios::NormKind::rmsnorm, true)).family, calibration::kRmsnormBwdFamily);
  // No LayerNorm backward points: the pooled norm fit.
  const Op ln_bwd = norm_op(scenarios::NormKind::layernorm, true);
  EXPECT_DOUBLE_EQ(coster.kernel_time(ln_bwd).value, model.norm(Bytes(ln_bwd.bytes)).value);
  // RMSNorm: the default profile's per-kernel fits, which differ from the pooled one and from LayerNorm's.
  const Op rms_fwd = norm_op(scenarios::NormKind::rmsnorm, false);
  EXPECT_DOUBLE_EQ(coster.kernel_time(rms_fwd).value, model.memory_kernel("norm_rmsnorm_fwd", Bytes(rms_fwd.bytes)).value);
  EXPECT_NE(coster.kernel_time(rms_fwd).value, model.norm(Bytes(rms_fwd.bytes)).value);
  EXPECT_NE(coster.kernel_time(rms_fwd).value, coster.kernel_time(ln_fwd).value);

  // With a rows x hidden fit of LayerNorm forward, that one wins over the bytes fit.
  calibration::ProfileBuilder kb(base.info(), base.hardware());
  auto rows_hidden = [](double r, double h) { return 3e-6 + 4e-9 * r + 2.5e-12 * r * h + 1.5e-9 * h; };
  for (double r : {8.0, 300.0, 4000.0, 60000.0}) {
    for (double h : {712.0, 2824.0, 5640.0}) {
      kb.add_point(calibration::kLayernormFwdFamily, {r, h}, calibration::Measurement::single(rows_hidden(r, h)));
    }
  }
  std::vector<calibration::Family> with_terms = families;
  const calibration::Profile terms = kb.build();
  for (const auto& f : terms.families()) with_terms.push_back(f);
  const calibration::CostModel model2(calibration::Profile(base.info(), base.hardware(), std::move(with_terms)));
  const CostModelCoster coster2(model2);
  EXPECT_NEAR(coster2.kernel_time(ln_fwd).value, rows_hidden(16384, 768), 1e-3 * rows_hidden(16384, 768));
  EXPECT_DOUBLE_EQ(coster2.kernel_time(ln_bwd).value, model2.norm(Bytes(ln_bwd.bytes)).value);
}

// threewalls sim --host-scale: every host-side cost is multiplied, the device time of graph
// nodes and timing markers is not, and a scale that is not a positive number is refused.
TEST(OpCosterHostScale, ScalesHostCostsAndLibraryCallsButNotDeviceTime) {
  const calibration::Profile p = calibration::Profile::load(std::filesystem::path(THREEWALLS_SOURCE_DIR) /
                                                            "calibration" / "profiles" / "h100.toml");
  const calibration::CostModel model(p);
  const CostModelCoster base(model);
  const CostModelCoster slow(model, 1.5);
  const HostCosts a = base.host_costs();
  const HostCosts b = slow.host_costs();
  for (const auto& [x, y] : {std::pair{a.kernel_launch, b.kernel_launch}, {a.collective_launch, b.collective_launch},
                             {a.graph_launch, b.graph_launch}, {a.stream_sync, b.stream_sync}, {a.gpu_read, b.gpu_read},
                             {a.event_record, b.event_record}, {a.op_dispatch, b.op_dispatch}}) {
    EXPECT_DOUBLE_EQ(y.value, 1.5 * x.value);
  }
  ASSERT_TRUE(a.record_op && b.record_op);
  EXPECT_DOUBLE_EQ(b.record_op->value, 1.5 * a.record_op->value);
  EXPECT_DOUBLE_EQ(b.graph_node.value, a.graph_node.value);
  EXPECT_DOUBLE_EQ(b.timing_marker.value, a.timing_marker.value);
  Op g;
  g.kind = OpKind::gemm;
  g.shape = {64, 2560, 640, 1, 0, 0};
  ASSERT_TRUE(base.library_launch(g) && slow.library_launch(g));
  EXPECT_DOUBLE_EQ(slow.library_launch(g)->value, 1.5 * base.library_launch(g)->value);
  EXPECT_DOUBLE_EQ(slow.kernel_time(g).value, base.kernel_time(g).value);  // device time unchanged
  EXPECT_DOUBLE_EQ(slow.stream_cycle_extra(64).value, 1.5 * base.stream_cycle_extra(64).value);
  for (const double bad : {0.0, -1.0, std::nan("")}) EXPECT_THROW(CostModelCoster(model, bad), InputError) << bad;
}

// threewalls sim --disk-scale: disk reads and nothing else take the factor; a factor that
// is not a positive number is refused.
TEST(OpCosterDiskScale, ScalesDiskReadsOnly) {
  const calibration::Profile p = calibration::Profile::load(std::filesystem::path(THREEWALLS_SOURCE_DIR) /
                                                            "calibration" / "profiles" / "h100.toml");
  const calibration::CostModel model(p);
  const CostModelCoster base(model);
  const CostModelCoster slow_disk(model, 1.0, 1.25);
  const Bytes expert(17.3e6);
  EXPECT_DOUBLE_EQ(slow_disk.copy_time(scenarios::CopyKind::disk_read, expert).value,
                   1.25 * base.copy_time(scenarios::CopyKind::disk_read, expert).value);
  for (const auto k : {scenarios::CopyKind::h2d_pinned, scenarios::CopyKind::d2h_pinned, scenarios::CopyKind::d2d}) {
    EXPECT_DOUBLE_EQ(slow_disk.copy_time(k, expert).value, base.copy_time(k, expert).value);
  }
  EXPECT_DOUBLE_EQ(slow_disk.host_costs().kernel_launch.value, base.host_costs().kernel_launch.value);
  for (const double bad : {0.0, -2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(CostModelCoster(model, 1.0, bad), InputError) << bad;
  }
}

// Attention runs on the kernel scenarios::attention_kernel names (the op's sub = model.attention_impl).
// The default profiles have no fused or decode attention family: every kernel is costed from the
// unfused attention fits, and the coster says so for the fused ones (the simulator prints it as a
// warning).
TEST(OpCosterAttention, FusedAndDecodeAreCostedFromTheUnfusedFitsAndSaySo) {
  const calibration::CostModel model(shipped_default());
  const CostModelCoster coster(model);
  using scenarios::AttentionImpl;
  using scenarios::AttentionKernel;
  for (const bool bwd : {false, true}) {
    const Op fused = attention_op({2, 4096, 4096, 16, 128, 128}, AttentionImpl::fused, bwd);
    const Op unfused = attention_op({2, 4096, 4096, 16, 128, 128}, AttentionImpl::unfused, bwd);
    EXPECT_EQ(scenarios::attention_kernel(fused), AttentionKernel::fused);
    EXPECT_EQ(scenarios::attention_kernel(unfused), AttentionKernel::unfused);
    EXPECT_DOUBLE_EQ(coster.kernel_time(fused).value, coster.kernel_time(unfused).value);
    EXPECT_FALSE(coster.substitution(unfused).has_value());
    ASSERT_TRUE(coster.substitution(fused).has_value());
    EXPECT_NE(coster.substitution(fused)->find("fused attention"), std::string::npos) << *coster.substitution(fused);
  }
  const Op decode = attention_op({8, 1, 4096, 32, 128, 128}, AttentionImpl::fused, false);
  EXPECT_EQ(scenarios::attention_kernel(decode), AttentionKernel::decode);
  ASSERT_TRUE(coster.substitution(decode).has_value());
  EXPECT_NE(coster.substitution(decode)->find("decode attention"), std::string::npos);
  // One query per sequence, backward: the fused kernel, not the decode one.
  EXPECT_EQ(scenarios::attention_kernel(attention_op({8, 1, 4096, 32, 128, 128}, AttentionImpl::fused, true)),
            AttentionKernel::fused);
  EXPECT_EQ(scenarios::attention_kernel(attention_op({8, 1, 4096, 32, 128, 128}, AttentionImpl::unfused, false)),
            AttentionKernel::unfused);
}

namespace {

// The default profile with fused and decode attention families merged in, from exact points of
// closed forms (fused: 60% of the peak with a sequence ramp; decode: 6 us + KV bytes at 2.5 TB/s).
calibration::Profile default_with_attention_families() {
  const calibration::Profile base = shipped_default();
  calibration::ProfileBuilder b(base.info(), base.hardware());
  calibration::AttentionModel fused;
  fused.efficiency_max = 0.6;
  fused.s_half = 200.0;
  fused.d_half = 16.0;
  fused.overhead_s = 5e-6;
  fused.memory_bandwidth_bytes_per_s = 6e12;
  fused.device = {base.hardware().sm_count, base.hardware().peak_bf16_flop_per_s};
  for (const bool bwd : {false, true}) {
    fused.backward = bwd;
    for (const std::int64_t seq : {256, 1024, 4096, 16384}) {
      for (const bool causal : {false, true}) {
        calibration::AttentionShape a;
        a.batch = std::max<std::int64_t>(1, 16384 / seq);
        a.seq_q = a.seq_kv = seq;
        a.heads = 16;
        a.kv_heads = causal ? 4 : 16;
        a.head_dim_qk = a.head_dim_v = seq == 1024 ? 64 : 128;
        a.causal = causal;
        b.add_point(calibration::attention_fused_family(bwd),
                    {double(a.batch), double(a.seq_q), double(a.seq_kv), double(a.heads), double(a.kv_heads),
                     double(a.head_dim_qk), double(a.head_dim_v), causal ? 1.0 : 0.0},
                    calibration::Measurement::single(fused.time_s(a)));
      }
    }
  }
  for (const double skv : {1024.0, 8192.0, 32768.0}) {
    for (const double kv : {8.0, 32.0}) {
      const double bytes = 2.0 * 4 * kv * skv * 256;
      b.add_point(calibration::kAttentionDecodeFamily, {4, 32, kv, skv, 128, 128},
                  calibration::Measurement::single(6e-6 + bytes / 2.5e12));
    }
  }
  return calibration::merge_families(base, b.build(),
                                     {"attention_fused.fwd", "attention_fused.bwd", "attention_decode"});
}

}  // namespace

// With the families in the profile, fused and decode attention are costed by them, without a
// warning; unfused attention keeps the attention fits.
TEST(OpCosterAttention, FusedAndDecodeUseTheirOwnFamiliesWhenTheProfileHasThem) {
  const calibration::Profile base = shipped_default();
  const calibration::CostModel before(base);
  const calibration::CostModel model(default_with_attention_families());
  const CostModelCoster coster(model);
  const CostModelCoster old_coster(before);
  using scenarios::AttentionImpl;
  for (const bool bwd : {false, true}) {
    const Op fused = attention_op({2, 4096, 4096, 16, 128, 128}, AttentionImpl::fused, bwd);
    const Op unfused = attention_op({2, 4096, 4096, 16, 128, 128}, AttentionImpl::unfused, bwd);
    calibration::AttentionShape a;
    a.batch = 2;
    a.seq_q = a.seq_kv = 4096;
    a.heads = a.kv_heads = 16;
    a.head_dim_qk = a.head_dim_v = 128;
    a.causal = true;
    ASSERT_TRUE(model.fused_attention(a, bwd).has_value());
    EXPECT_DOUBLE_EQ(coster.kernel_time(fused).value, model.fused_attention(a, bwd)->value);
    EXPECT_FALSE(coster.substitution(fused).has_value()) << *coster.substitution(fused);
    EXPECT_DOUBLE_EQ(coster.kernel_time(unfused).value, old_coster.kernel_time(unfused).value);
    EXPECT_FALSE(before.fused_attention(a, bwd).has_value());
  }
  const Op decode = attention_op({8, 1, 4096, 32, 128, 128}, AttentionImpl::fused, false);
  EXPECT_FALSE(coster.substitution(decode).has_value());
  // 8 sequences x 32 KV heads x 4096 keys x 256 x 2 bytes at 2.5 TB/s + 6 us (the decode points' law).
  EXPECT_NEAR(coster.kernel_time(decode).value, 6e-6 + 2.0 * 8 * 32 * 4096 * 256 / 2.5e12, 1e-8);
  EXPECT_TRUE(old_coster.substitution(decode).has_value());
  // GQA (shape[6]: 4 key/value heads for 32 query heads): an eighth of the K/V bytes.
  const Op gqa = attention_op({8, 1, 4096, 32, 128, 128, 4}, AttentionImpl::fused, false);
  EXPECT_NEAR(coster.kernel_time(gqa).value, 6e-6 + 2.0 * 8 * 4 * 4096 * 256 / 2.5e12, 1e-8);
  calibration::AttentionShape g;
  g.batch = 2;
  g.seq_q = g.seq_kv = 4096;
  g.heads = 16;
  g.kv_heads = 2;
  g.head_dim_qk = g.head_dim_v = 128;
  g.causal = true;
  const Op fused_gqa = attention_op({2, 4096, 4096, 16, 128, 128, 2}, AttentionImpl::fused, false);
  EXPECT_DOUBLE_EQ(coster.kernel_time(fused_gqa).value, model.fused_attention(g, false)->value);
}

// The fp8 cast and amax pass are streaming passes over their bytes: priced on the measured copy
// kernel's bandwidth (elementwise_copy), whatever the recipe.
TEST(OpCosterFp8, CastAndAmaxPassAreCostedOnTheCopyKernelByTheirBytes) {
  const calibration::Profile h100 = calibration::Profile::load(std::filesystem::path(THREEWALLS_SOURCE_DIR) /
                                                               "calibration" / "profiles" / "h100.toml");
  const calibration::CostModel model(h100);
  const CostModelCoster coster(model);
  for (const auto kind : {scenarios::ElementwiseKind::quantize, scenarios::ElementwiseKind::amax}) {
    Op op;
    op.kind = OpKind::elementwise;
    op.sub = static_cast<std::uint8_t>(kind);
    op.wall = Wall::memory;
    op.shape = {32768LL * 2048, 32768, 2048, 1, 0, 0, 0};
    op.bytes = 4.0 * 32768 * 2048;
    const double t = coster.kernel_time(op).value;
    EXPECT_DOUBLE_EQ(t, model.memory_kernel("elementwise_copy", Bytes(op.bytes)).value);
    // 268 MB at the H100's ~2.9 TB/s copy bandwidth: about 92 us.
    EXPECT_GT(t, 85e-6);
    EXPECT_LT(t, 100e-6);
  }
}

// run.framework = "pytorch_eager": the memory-bound ops are priced by PyTorch's own kernels (the
// pytorch.* twins and families) where the profile has them, by the backend's otherwise, and the
// coster says which.
namespace {
// PyTorch's unpermute forward: t = 20 us + 0.5 ns per row + 10 ps per row element + 1 ps per token element.
double py_unpermute_truth(double t, double k, double h) {
  return 20e-6 + 5e-10 * t * k + 1e-11 * t * k * h + 1e-12 * t * h;
}

calibration::Profile default_with_pytorch_unpermute() {
  const calibration::Profile base = default_with_kernel_families();
  calibration::ProfileBuilder b(base.info(), base.hardware());
  for (double t : {300.0, 2000.0, 6000.0, 12000.0}) {
    for (double k : {2.0, 8.0}) {
      for (double h : {1000.0, 4104.0}) {
        b.add_point(calibration::pytorch_twin(calibration::kUnpermuteFwdFamily), {t, k, h},
                    calibration::Measurement::single(py_unpermute_truth(t, k, h)));
      }
    }
  }
  std::vector<calibration::Family> families = base.families();
  const calibration::Profile fitted = b.build();
  for (const auto& f : fitted.families()) families.push_back(f);
  return calibration::Profile(base.info(), base.hardware(), std::move(families));
}
}  // namespace

TEST(OpCosterPytorch, MapsOpsToPyTorchsFamiliesWithTheTokensTheRowsComeFrom) {
  using namespace threewalls::calibration;
  // 4096 tokens routed to 8 experts each: 32768 rows summed back into 4096 tokens (shape[2]).
  auto fk = pytorch_kernel_of(memory_op(OpKind::unpermute, {32768, 2048, 4096}, 1.0));
  ASSERT_TRUE(fk.has_value());
  EXPECT_EQ(fk->family, "pytorch.unpermute_fwd");
  EXPECT_EQ(fk->inputs, (std::vector<double>{4096, 8, 2048}));
  // No token side (a pure reordering, the sort of received rows by local expert and its inverse):
  // one index_select forward, F.embedding's kernel over a table of the rows, whichever direction;
  // backward, index_select's backward, the permute backward with one row per token.
  fk = pytorch_kernel_of(memory_op(OpKind::permute, {6000, 1024, 0}, 1.0, true));
  EXPECT_EQ(fk->family, "pytorch.permute_bwd");
  EXPECT_EQ(fk->inputs, (std::vector<double>{6000, 1, 1024}));
  fk = pytorch_kernel_of(memory_op(OpKind::unpermute, {6000, 1024, 0}, 1.0, true));
  EXPECT_EQ(fk->family, "pytorch.permute_bwd");
  EXPECT_EQ(fk->inputs, (std::vector<double>{6000, 1, 1024}));
  for (const OpKind kind : {OpKind::permute, OpKind::unpermute}) {
    fk = pytorch_kernel_of(memory_op(kind, {6000, 1024, 0}, 1.0));
    EXPECT_EQ(fk->family, "pytorch.embedding_fwd");
    EXPECT_EQ(fk->inputs, (std::vector<double>{6000, 1024, 6000}));
  }
  // An eager loop's gather of one expert's 300 rows out of 4096 tokens: one index kernel (F.embedding's
  // index_select over a table of the tokens), not the dispatcher's permute of every token; its
  // backward (a zeroed table of the tokens with the rows added in) stays the permute backward's.
  Op gather = memory_op(OpKind::permute, {300, 2048, 4096}, 1.0);
  gather.expert = 3;
  fk = pytorch_kernel_of(gather);
  EXPECT_EQ(fk->family, "pytorch.embedding_fwd");
  EXPECT_EQ(fk->inputs, (std::vector<double>{300, 2048, 4096}));
  gather.flags |= scenarios::kBackward;
  EXPECT_EQ(pytorch_kernel_of(gather)->family, "pytorch.permute_bwd");
  gather.expert = -1;
  gather.flags = static_cast<std::uint8_t>(gather.flags & ~scenarios::kBackward);
  EXPECT_EQ(pytorch_kernel_of(gather)->family, "pytorch.permute_fwd");
  fk = pytorch_kernel_of(memory_op(OpKind::embedding, {4096, 2048, 50304}, 1.0, true));
  EXPECT_EQ(fk->family, "pytorch.embedding_bwd");
  EXPECT_EQ(fk->inputs, (std::vector<double>{4096, 2048, 50304}));
  EXPECT_EQ(pytorch_kernel_of(memory_op(OpKind::optimizer, {1000}, 1.0))->family, "pytorch.adam_step");
  Op act = memory_op(OpKind::elementwise, {4096 * 1024}, 1.0, true);
  act.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::swiglu_bwd);
  EXPECT_EQ(pytorch_kernel_of(act)->family, kPytorchSwigluBwdFamily);
  Op add = memory_op(OpKind::elementwise, {4096 * 2048}, 1.0);
  add.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::add);
  EXPECT_FALSE(pytorch_kernel_of(add).has_value());  // a forward add: the same kernel either way
  add.flags |= scenarios::kBackward;
  EXPECT_EQ(pytorch_kernel_of(add)->family, kPytorchAddBwdFamily);
  Op norm = memory_op(OpKind::elementwise, {1000000}, 4e6);
  norm.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::reduce);
  EXPECT_EQ(pytorch_kernel_of(norm)->family, kPytorchGradNormFamily);
  EXPECT_FALSE(pytorch_kernel_of(memory_op(OpKind::gemm, {1, 1, 1}, 1.0)).has_value());
  // Every family the mapping names is in the kernel_terms table with as many inputs.
  for (const auto& f : kernel_terms_families()) {
    if (f.points_of != "python") continue;
    EXPECT_TRUE(f.name.rfind(std::string(kPytorchFamilyPrefix), 0) == 0 ||
                f.name.rfind(std::string(kPytorchHostFamilyPrefix), 0) == 0)
        << f.name;
  }
}

TEST(OpCosterPytorch, EveryPerLayerBodyHasAHostFamilyAndOpsFindTheirs) {
  using namespace threewalls::calibration;
  // The table: a host twin for every pytorch.* family but the optimizer's (a host loop per tensor).
  for (const auto& f : kernel_terms_families()) {
    if (f.name.rfind(std::string(kPytorchFamilyPrefix), 0) != 0) continue;
    const KernelTermsFamily* h = find_kernel_terms_family(pytorch_host_twin(f.name));
    if (f.inputs.front().key == "parameters") {
      EXPECT_EQ(h, nullptr) << f.name;
      continue;
    }
    ASSERT_NE(h, nullptr) << f.name;
    EXPECT_EQ(h->points_of, "python");
    ASSERT_EQ(h->inputs.size(), 1U);
    EXPECT_EQ(h->inputs[0].key, "autograd");
    // A forward body pays for recording autograd nodes; a backward one is a node's share of a run.
    EXPECT_EQ(h->terms.size(), f.name.find("_bwd") == std::string::npos ? 1U : 0U) << h->name;
  }
  auto body = [](const Op& op, bool autograd) {
    const auto b = pytorch_host_body_of(op, autograd);
    EXPECT_TRUE(!b || find_kernel_terms_family(b->family) != nullptr) << b->family;
    return b;
  };
  // The grouped path's unpermute: PyTorch's unpermute body; inference records no autograd node.
  auto b = body(memory_op(OpKind::unpermute, {32768, 2048, 4096}, 1.0), false);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->family, "pytorch_host.unpermute_fwd");
  EXPECT_EQ(b->autograd, 0.0);
  // An eager loop's per-expert gather and combine: bodies of their own; a backward is always 1. A
  // backward op keeps its forward op's kind and pays that op's backward body.
  Op gather = memory_op(OpKind::permute, {300, 2048, 4096}, 1.0);
  gather.expert = 3;
  EXPECT_EQ(body(gather, true)->family, kPytorchHostExpertGatherFwdFamily);
  EXPECT_EQ(body(gather, true)->autograd, 1.0);
  Op gather_bwd = memory_op(OpKind::permute, {300, 2048, 4096}, 1.0, true);
  gather_bwd.expert = 3;
  EXPECT_EQ(body(gather_bwd, false)->family, kPytorchHostExpertGatherBwdFamily);
  Op combine = memory_op(OpKind::unpermute, {300, 2048, 4096}, 1.0);
  combine.expert = 3;
  EXPECT_EQ(body(combine, true)->family, kPytorchHostExpertScatterFwdFamily);
  EXPECT_TRUE(body(combine, true)->fallback.empty());
  Op combine_bwd = memory_op(OpKind::unpermute, {300, 2048, 4096}, 1.0, true);
  combine_bwd.expert = 3;
  EXPECT_EQ(body(combine_bwd, false)->family, kPytorchHostExpertScatterBwdFamily);
  EXPECT_EQ(body(combine_bwd, false)->autograd, 1.0);
  // Without router weights (ep > 1: moe_unpermute applies them): the unweighted bodies, the weighted
  // ones their fallback.
  for (Op* op : {&combine, &combine_bwd}) op->sub = static_cast<std::uint8_t>(scenarios::RowWeights::unweighted);
  EXPECT_EQ(body(combine, true)->family, kPytorchHostExpertScatterUnweightedFwdFamily);
  EXPECT_EQ(body(combine, true)->fallback, kPytorchHostExpertScatterFwdFamily);
  EXPECT_EQ(body(combine_bwd, false)->family, kPytorchHostExpertScatterUnweightedBwdFamily);
  EXPECT_EQ(body(combine_bwd, false)->fallback, kPytorchHostExpertScatterBwdFamily);
  // A linear layer: the forward's body; each of the backward's two products half of its node.
  EXPECT_EQ(body(memory_op(OpKind::gemm, {4096, 2048, 2048}, 1.0), true)->family, kPytorchHostLinearFwdFamily);
  b = body(memory_op(OpKind::gemm, {4096, 2048, 2048}, 1.0, true), true);
  EXPECT_EQ(b->family, kPytorchHostLinearBwdFamily);
  EXPECT_EQ(b->share, 0.5);
  // Attention: the training core's body, or a decode step's (the twin of pytorch.attention_decode).
  Op attn = attention_op({2, 4096, 4096, 16, 128, 128}, scenarios::AttentionImpl::fused, false);
  EXPECT_EQ(body(attn, true)->family, kPytorchHostAttentionFwdFamily);
  Op decode = attention_op({32, 1, 1040, 32, 128, 128}, scenarios::AttentionImpl::fused, false);
  decode.shape[6] = 4;
  ASSERT_EQ(scenarios::attention_kernel(decode), scenarios::AttentionKernel::decode);
  EXPECT_EQ(body(decode, false)->family, pytorch_host_twin(kPytorchAttentionDecodeFamily));
  const auto dk = pytorch_kernel_of(decode);
  ASSERT_TRUE(dk.has_value());
  EXPECT_EQ(dk->family, kPytorchAttentionDecodeFamily);
  EXPECT_EQ(dk->inputs, (std::vector<double>{32, 1040, 32, 4, 256}));
  // None: the optimizer (a loop per tensor), the gradient norm, a forward add, grouped GEMMs.
  EXPECT_FALSE(body(memory_op(OpKind::optimizer, {1000}, 1.0), true).has_value());
  Op norm = memory_op(OpKind::elementwise, {1000000}, 4e6);
  norm.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::reduce);
  EXPECT_FALSE(body(norm, true).has_value());
  Op add = memory_op(OpKind::elementwise, {4096 * 2048}, 1.0);
  add.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::add);
  EXPECT_FALSE(body(add, true).has_value());
  EXPECT_FALSE(body(memory_op(OpKind::grouped_gemm, {4096, 768, 2048, 8, 512, 0}, 1.0), true).has_value());
}

TEST(OpCosterPytorch, ChargesAMeasuredBodysHostTimeOnlyForAPytorchEagerScenario) {
  using namespace threewalls::calibration;
  // F.linear's host time: 20 us without autograd, 26 us recording it.
  const Profile base = default_with_kernel_families();
  ProfileBuilder pb(base.info(), base.hardware());
  for (int rep = 0; rep < 3; ++rep) {
    pb.add_point(std::string(kPytorchHostLinearFwdFamily), {0.0}, Measurement::single(20e-6));
    pb.add_point(std::string(kPytorchHostLinearFwdFamily), {1.0}, Measurement::single(26e-6));
  }
  std::vector<Family> families = base.families();
  const Profile fitted = pb.build();
  for (const auto& f : fitted.families()) families.push_back(f);
  const CostModel model(Profile(base.info(), base.hardware(), std::move(families)));
  const Op fwd = memory_op(OpKind::gemm, {4096, 2048, 2048}, 1.0);
  const CostModelCoster eager(model, 1.0, 1.0, scenarios::Framework::pytorch_eager);
  ASSERT_TRUE(eager.framework_body_host(fwd, false).has_value());
  EXPECT_NEAR(eager.framework_body_host(fwd, false)->value, 20e-6, 1e-9);
  EXPECT_NEAR(eager.framework_body_host(fwd, true)->value, 26e-6, 1e-9);
  // --host-scale scales it as every host cost; the C++ executor's scenario never has it.
  const CostModelCoster slower(model, 1.5, 1.0, scenarios::Framework::pytorch_eager);
  EXPECT_NEAR(slower.framework_body_host(fwd, true)->value, 39e-6, 1e-9);
  EXPECT_FALSE(CostModelCoster(model).framework_body_host(fwd, true).has_value());
  // A body the profile has no family for: the per-launch costs.
  EXPECT_FALSE(eager.framework_body_host(memory_op(OpKind::gemm, {4096, 2048, 2048}, 1.0, true), true).has_value());
}

TEST(OpCosterPytorch, PricesWithPyTorchsFamilyOnlyForAPytorchEagerScenario) {
  const calibration::CostModel model(default_with_pytorch_unpermute());
  const CostModelCoster cpp(model);
  const CostModelCoster eager(model, 1.0, 1.0, scenarios::Framework::pytorch_eager);
  const Op op = memory_op(OpKind::unpermute, {32768, 2048, 4096}, 3.0 * 32768 * 2048 * 2);
  EXPECT_NEAR(eager.kernel_time(op).value, py_unpermute_truth(4096, 8, 2048), 1e-3 * py_unpermute_truth(4096, 8, 2048));
  EXPECT_EQ(eager.substitution(op), std::nullopt);
  // The C++ executor's scenario: the backend's family (absent here: the pooled element-wise fit).
  EXPECT_DOUBLE_EQ(cpp.kernel_time(op).value, model.elementwise(Bytes(op.bytes)).value);
  EXPECT_EQ(cpp.substitution(op), std::nullopt);
  // A family the profile lacks: the backend's kernel, and the coster names the missing family.
  const Op topk = memory_op(OpKind::softmax_topk, {4096, 64, 6}, 4096.0 * 64 * 6);
  EXPECT_DOUBLE_EQ(eager.kernel_time(topk).value, cpp.kernel_time(topk).value);
  const auto why = eager.substitution(topk);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("pytorch.softmax_topk_fwd"), std::string::npos) << *why;
  // A profile without any pytorch.* family: one sentence for all of them.
  const calibration::CostModel plain(shipped_default());
  const CostModelCoster old(plain, 1.0, 1.0, scenarios::Framework::pytorch_eager);
  const auto all = old.substitution(topk);
  ASSERT_TRUE(all.has_value());
  EXPECT_NE(all->find("no pytorch.* kernel families"), std::string::npos) << *all;
  EXPECT_EQ(old.substitution(topk), old.substitution(op));
}

TEST(OpCosterPytorch, AnEagerLoopsScatterWithoutRouterWeightsPaysTheUnweightedBodyElseTheWeightedOneAndSaysSo) {
  using namespace threewalls::calibration;
  // The eager loop at ep 2 scatter-adds each expert's output without router weights (moe_unpermute
  // applies them after the combine); on one EP rank it weights them itself. Host bodies, us: weighted
  // 60 / 70 forward (without / recording autograd), 250 backward; unweighted 20 / 24 and 40.
  const Profile base = default_with_kernel_families();
  ProfileBuilder weighted(base.info(), base.hardware());
  ProfileBuilder unweighted(base.info(), base.hardware());
  for (int rep = 0; rep < 3; ++rep) {
    weighted.add_point(std::string(kPytorchHostExpertScatterFwdFamily), {0.0}, Measurement::single(60e-6));
    weighted.add_point(std::string(kPytorchHostExpertScatterFwdFamily), {1.0}, Measurement::single(70e-6));
    weighted.add_point(std::string(kPytorchHostExpertScatterBwdFamily), {1.0}, Measurement::single(250e-6));
    unweighted.add_point(std::string(kPytorchHostExpertScatterUnweightedFwdFamily), {0.0}, Measurement::single(20e-6));
    unweighted.add_point(std::string(kPytorchHostExpertScatterUnweightedFwdFamily), {1.0}, Measurement::single(24e-6));
    unweighted.add_point(std::string(kPytorchHostExpertScatterUnweightedBwdFamily), {1.0}, Measurement::single(40e-6));
  }
  auto profile = [&](bool with_unweighted) {
    std::vector<Family> families = base.families();
    const Profile w = weighted.build();
    for (const auto& f : w.families()) families.push_back(f);
    if (with_unweighted) {
      const Profile u = unweighted.build();
      for (const auto& f : u.families()) families.push_back(f);
    }
    return Profile(base.info(), base.hardware(), std::move(families));
  };
  const CostModel old_model(profile(false));
  const CostModel new_model(profile(true));
  const CostModelCoster old_profile(old_model, 1.0, 1.0, scenarios::Framework::pytorch_eager);
  const CostModelCoster new_profile(new_model, 1.0, 1.0, scenarios::Framework::pytorch_eager);
  // Whether the coster's warning of `op` is about router weights (this profile has no pytorch.*
  // device families: the other warnings name those).
  auto weights_warning = [](const CostModelCoster& coster, const Op& op) {
    const auto why = coster.substitution(op);
    return why && why->find("router weights") != std::string::npos;
  };
  const std::filesystem::path src(THREEWALLS_SOURCE_DIR);
  struct Case {
    std::string file;
    bool ep2;
    double fwd_us, bwd_us;  // with the new profile
    std::size_t local_experts;
  };
  for (const Case& c : {Case{"python/scenarios/ep2/qwen3_moe_4l_eager_ep2.toml", true, 24.0, 40.0, 64},
                        Case{"python/scenarios/heldout/qwen3_moe_4l_eager.toml", false, 70.0, 250.0, 128}}) {
    const scenarios::Scenario s = scenarios::load_scenario(src / c.file);
    ASSERT_EQ(s.run.framework, scenarios::Framework::pytorch_eager) << c.file;
    ASSERT_EQ(s.parallel.ep, c.ep2 ? 2 : 1) << c.file;
    const bool ep2 = c.ep2;
    const scenarios::StepGraph g = scenarios::expand(s, 0);
    std::size_t fwd = 0;
    std::size_t bwd = 0;
    for (const Op& op : g.classes[0].ops) {
      const std::string& phase = g.phase_name(op);
      if (phase == "expert_gather_fwd" || phase == "expert_gather_bwd") {
        const auto b = pytorch_host_body_of(op, true);
        ASSERT_TRUE(b.has_value()) << phase;
        EXPECT_EQ(b->family,
                  phase == "expert_gather_fwd" ? kPytorchHostExpertGatherFwdFamily : kPytorchHostExpertGatherBwdFamily);
        EXPECT_FALSE(weights_warning(old_profile, op)) << phase;
        continue;
      }
      if (phase != "expert_scatter_fwd" && phase != "expert_scatter_bwd") continue;
      const bool backward = phase == "expert_scatter_bwd";
      (backward ? bwd : fwd) += 1;
      EXPECT_EQ(op.row_weights(), ep2 ? scenarios::RowWeights::unweighted : scenarios::RowWeights::weighted) << phase;
      const auto now = new_profile.framework_body_host(op, true);
      ASSERT_TRUE(now.has_value()) << phase;
      EXPECT_NEAR(now->value * 1e6, backward ? c.bwd_us : c.fwd_us, 1e-3) << c.file << " " << phase;
      EXPECT_FALSE(weights_warning(new_profile, op)) << phase;
      // A profile measured before the unweighted families: the weighted body, and a warning naming
      // the family it lacks (none on one EP rank, where the weighted body is the loop's own).
      EXPECT_NEAR(old_profile.framework_body_host(op, true)->value * 1e6, backward ? 250.0 : 70.0, 1e-3) << phase;
      const auto why = old_profile.substitution(op);
      if (!ep2) {
        EXPECT_FALSE(weights_warning(old_profile, op)) << phase;
        continue;
      }
      ASSERT_TRUE(weights_warning(old_profile, op)) << phase;
      EXPECT_NE(why->find(std::string(backward ? kPytorchHostExpertScatterUnweightedBwdFamily
                                               : kPytorchHostExpertScatterUnweightedFwdFamily)),
                std::string::npos)
          << *why;
    }
    EXPECT_EQ(fwd, c.local_experts * 4U * 2U) << c.file;  // local experts x layers x micro-batches
    EXPECT_EQ(bwd, fwd) << c.file;
  }
}
