// The CostModel over the shipped default profiles and over small built ones.
#include "threewalls/calibration/cost_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::calibration;
using namespace threewalls::calibration::testing;

namespace {
const Collective kKinds[] = {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                             Collective::all_to_all, Collective::broadcast,  Collective::send_recv};
}  // namespace

TEST(CostModel, LoneCollectiveTakesAlphaPlusSizeTimesFactorOverEffectiveBandwidth) {
  const CostModel cm(default_profile("h200"));
  for (Collective kind : kKinds) {
    for (LinkScope scope : {LinkScope::nvlink, LinkScope::network}) {
      for (int n : {2, 3, 4, 8, 64}) {  // measured, interpolated and extrapolated group sizes
        for (double s : {1.0, 4096.0, 1.5e6, 3e8, 4.0 * (1 << 30)}) {
          const auto p = cm.collective_params(kind, Bytes(s), n, scope);
          const double f = bus_bandwidth_factor(kind, n);
          // Exactly the expression a flow-level simulator evaluates.
          EXPECT_EQ(cm.collective(kind, Bytes(s), n, scope).value, p.latency.value + (s * f) / p.bus_bandwidth.value)
              << to_string(kind) << " " << to_string(scope) << " n=" << n << " S=" << s;
          EXPECT_GT(p.bus_bandwidth.value, 0.0);
        }
        EXPECT_EQ(cm.collective(kind, Bytes(0), n, scope).value,
                  cm.collective_params(kind, Bytes(0), n, scope).latency.value);
      }
    }
  }
}

TEST(CostModel, CollectiveParamsFollowTheHillCurveOfTheProfile) {
  const Profile& p = default_profile("h200");
  const CostModel cm(p);
  const Family& f = p.family(collective_family(Collective::all_reduce, LinkScope::nvlink));
  const double alpha = f.param_array("alpha_s")[0];
  const double beta = f.param_array("beta_max_bytes_per_s")[0];
  const double s_half = f.param_array("s_half_bytes")[0];
  const double g = f.param_array("gamma")[0];
  ASSERT_EQ(f.param_array("group_size")[0], 2.0);
  for (double s : {1e3, 1e6, 1e9}) {
    const auto cp = cm.collective_params(Collective::all_reduce, Bytes(s), 2, LinkScope::nvlink);
    EXPECT_EQ(cp.latency.value, alpha);
    EXPECT_NEAR(cp.bus_bandwidth.value / (beta * std::pow(s, g) / (std::pow(s, g) + std::pow(s_half, g))), 1.0, 1e-12);
  }
}

TEST(CostModel, DefaultH200ReproducesTheFactsItWasBuiltFrom) {
  const CostModel cm(default_profile("h200"));
  auto tflops = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    return 2.0 * m * n * k / cm.gemm(m, n, k, DType::bf16).value / 1e12;
  };
  EXPECT_NEAR(tflops(1024, 1408, 2048), 208, 208 * 0.05);
  EXPECT_NEAR(tflops(16384, 1408, 2048), 667, 667 * 0.05);
  EXPECT_GE(tflops(8192, 8192, 8192), 770 * 0.95);
  EXPECT_LE(tflops(8192, 8192, 8192), 890 * 1.05);
  // Grouped GEMM 64 experts x 768 tokens: 0.49 ms; the loop of 64 GEMMs: 1.85 ms.
  EXPECT_NEAR(cm.grouped_gemm(64, 64 * 768, 768, 1408, 2048, DType::bf16).value, 0.49e-3, 0.49e-3 * 0.01);
  EXPECT_NEAR(64 * cm.gemm(768, 1408, 2048, DType::bf16).value, 1.85e-3, 1.85e-3 * 0.1);
  // Bus bandwidth at 1 GiB: all-reduce 321 / 355, all-to-all 320 / 336 GB/s for 2 / 4 GPUs.
  const Bytes gib = gibibytes(1);
  auto busbw = [&](Collective k, int n) {
    return gib.value * bus_bandwidth_factor(k, n) / cm.collective(k, gib, n, LinkScope::nvlink).value / 1e9;
  };
  EXPECT_NEAR(busbw(Collective::all_reduce, 2), 321, 321 * 0.01);
  EXPECT_NEAR(busbw(Collective::all_reduce, 4), 355, 355 * 0.01);
  EXPECT_NEAR(busbw(Collective::all_to_all, 2), 320, 320 * 0.01);
  EXPECT_NEAR(busbw(Collective::all_to_all, 4), 336, 336 * 0.01);
  // Copies and host costs.
  EXPECT_NEAR(cm.hbm_bandwidth().value, 4.0e12, 1e6);
  EXPECT_NEAR(mebibytes(64).value / cm.copy(CopyKind::h2d_pinned, mebibytes(64)).value, 55e9, 55e9 * 0.01);
  EXPECT_NEAR(to_us(cm.kernel_launch()), 3.7, 1e-9);
  EXPECT_NEAR(to_us(cm.stream_sync()), 8.5, 1e-9);
  EXPECT_NEAR(to_us(cm.graph_node()), 1.0, 1e-9);
  EXPECT_NEAR(to_us(cm.kernel_launch() + cm.framework_op()), 15.5, 1e-9);
  EXPECT_EQ(cm.sm_count(), 132);
  EXPECT_EQ(cm.peak_flops(DType::bf16).value, 989e12);
}

TEST(CostModel, DefaultH100ReproducesItsFacts) {
  const CostModel cm(default_profile("h100"));
  const double t = cm.gemm(8192, 8192, 8192, DType::bf16).value;
  EXPECT_NEAR(2.0 * 8192 * 8192 * 8192 / t / 1e12, 740, 740 * 0.05);
  EXPECT_NEAR(cm.hbm_bandwidth().value, 3.0e12, 1e6);
  EXPECT_NEAR(to_us(cm.kernel_launch()), 3.7, 1e-9);
}

TEST(CostModel, CostsGrowWithWorkOnEveryDefaultProfile) {
  for (const char* kind : {"h100", "h200"}) {
    const CostModel cm(default_profile(kind));
    for (DType dt : {DType::bf16, DType::fp8}) {
      double prev = 0;
      for (std::int64_t m = 1; m <= 65536; m *= 2) {
        const double t = cm.gemm(m, 4096, 4096, dt).value;
        EXPECT_GE(t, prev) << kind << " m=" << m;
        prev = t;
      }
      EXPECT_LT(cm.gemm(8192, 8192, 8192, dt).value,
                cm.gemm(8192, 8192, 8192, DType::bf16).value * (dt == DType::fp8 ? 0.8 : 1.01));
    }
    for (Collective k : kKinds) {
      for (LinkScope sc : {LinkScope::nvlink, LinkScope::network}) {
        double prev = 0;
        for (double s = 1; s <= 8.0 * (1 << 30); s *= 4) {
          const double t = cm.collective(k, Bytes(s), 8, sc).value;
          EXPECT_GT(t, prev);
          prev = t;
        }
      }
    }
    // NVLink beats the network at every size.
    EXPECT_LT(cm.collective(Collective::all_reduce, mebibytes(64), 8, LinkScope::nvlink).value,
              cm.collective(Collective::all_reduce, mebibytes(64), 8, LinkScope::network).value);
    // Causal attention costs about half of full attention at long sequence lengths; backward more than forward.
    const double full = cm.attention(1, 8192, 8192, 32, 128, 128, false, false).value;
    const double causal = cm.attention(1, 8192, 8192, 32, 128, 128, true, false).value;
    EXPECT_NEAR(causal / full, 0.5, 0.08);
    EXPECT_GT(cm.attention(1, 8192, 8192, 32, 128, 128, true, true).value, causal * 2);
    EXPECT_GT(cm.stream_concurrency(4, 0.1), 1.0);
    EXPECT_LT(cm.stream_concurrency(4, 0.1), 4.0);
  }
}

TEST(CostModel, AttentionWithKvHeadsEqualToHeadsMatchesTheShortForm) {
  const CostModel cm(default_profile("h200"));
  AttentionShape s;
  s.batch = 2;
  s.seq_q = s.seq_kv = 4096;
  s.heads = s.kv_heads = 16;
  s.head_dim_qk = 192;
  s.head_dim_v = 128;
  s.causal = true;
  EXPECT_EQ(cm.attention(s, false).value, cm.attention(2, 4096, 4096, 16, 192, 128, true, false).value);
  // Decode against a long cache is memory-bound: fewer KV heads read less.
  AttentionShape d = s;
  d.seq_q = 1;
  d.batch = 64;
  d.head_dim_qk = 128;
  AttentionShape gqa = d;
  gqa.kv_heads = 2;
  EXPECT_LT(cm.attention(gqa, false).value, cm.attention(d, false).value);
}

TEST(CostModel, MissingFamilyIsAnInputErrorNamingTheProfile) {
  const Profile p = small_profile();
  const CostModel cm(p);
  try {
    (void)cm.attention(1, 1024, 1024, 8, 128, 128, true, false);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("calibration profile small@"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has no model 'attention.fwd'"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)cm.gemm(16, 16, 16, DType::fp32), InputError);
  EXPECT_THROW((void)cm.collective(Collective::all_reduce, mebibytes(1), 8, LinkScope::network), InputError);
  EXPECT_THROW((void)cm.stream_sync(), InputError);
  EXPECT_EQ(cm.profile_id(), p.id());
}

TEST(CostModel, MemoryKernelsUseTheirOwnFitAndFallBackToThePooledFamily) {
  // Pooled elementwise at 3 TB/s, an add kernel at 4 TB/s and an RMSNorm backward at 0.5 TB/s.
  ProfileBuilder b({"kernels", "synthetic: unit test", "tests/calibration"}, test_hardware());
  for (double s = 65536; s <= 1 << 30; s *= 4) {
    b.add_elementwise(Bytes(s), Measurement::single(2e-6 + s / 3e12));
    b.add_point("elementwise_add", {s}, Measurement::single(2e-6 + s / 4e12));
    b.add_norm(Bytes(s), Measurement::single(5e-6 + s / 1e12));
    b.add_point("norm_rmsnorm_bwd", {s}, Measurement::single(5e-6 + s / 0.5e12));
  }
  const CostModel cm(b.build());
  const Bytes s(1 << 28);
  EXPECT_NEAR(cm.memory_kernel("elementwise_add", s).value, 2e-6 + s.value / 4e12, 1e-9);
  EXPECT_NEAR(cm.memory_kernel("norm_rmsnorm_bwd", s).value, 5e-6 + s.value / 0.5e12, 1e-9);
  // Kernels the profile has no fit of: the pooled family (older profiles behave as before).
  EXPECT_EQ(cm.memory_kernel("elementwise_swiglu", s).value, cm.elementwise(s).value);
  EXPECT_EQ(cm.memory_kernel("norm_rmsnorm_fwd", s).value, cm.norm(s).value);
  // No timing-marker entry: markers cost no device time.
  EXPECT_EQ(cm.timing_marker().value, 0.0);
}

// The host time of a GEMM, grouped-GEMM or attention call has its own optional family;
// a profile without one charges kernel_launch.
TEST(CostModel, LibraryCallLaunchCostsUseTheirFamiliesAndFallBackToKernelLaunch) {
  const CostModel old_profile(default_profile("h100"));
  EXPECT_FALSE(old_profile.has_library_launch_costs());
  EXPECT_EQ(old_profile.gemm_launch().value, old_profile.kernel_launch().value);
  EXPECT_EQ(old_profile.grouped_gemm_launch().value, old_profile.kernel_launch().value);
  EXPECT_EQ(old_profile.attention_launch().value, old_profile.kernel_launch().value);
  EXPECT_EQ(old_profile.attention_bwd_launch().value, old_profile.kernel_launch().value);

  ProfileBuilder b({"launch", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  for (const double t : {14e-6, 15e-6, 19e-6}) b.add_host("gemm_launch", Measurement::single(t));
  b.add_host("attention_launch", Measurement::single(9e-6));
  b.add_host("attention_bwd_launch", Measurement::single(25e-6));
  // Through the TOML writer and reader: the families load (a profile that has them).
  const Profile p = Profile::parse(b.build().to_toml(), "launch.toml");
  const CostModel cm(p);
  EXPECT_TRUE(cm.has_library_launch_costs());
  EXPECT_NEAR(cm.gemm_launch().value, 15e-6, 1e-12);  // the median of the points
  EXPECT_NEAR(cm.attention_launch().value, 9e-6, 1e-12);
  EXPECT_NEAR(cm.attention_bwd_launch().value, 25e-6, 1e-12);
  EXPECT_NEAR(cm.grouped_gemm_launch().value, 4.5e-6, 1e-12);  // absent: kernel_launch
  EXPECT_NEAR(cm.kernel_launch().value, 4.5e-6, 1e-12);
  // Without the shape-aware families, the by-shape calls are the medians.
  EXPECT_NEAR(cm.gemm_launch(16, 768, 3072).value, 15e-6, 1e-12);
  EXPECT_NEAR(cm.grouped_gemm_launch(64, 6144, 288).value, 4.5e-6, 1e-12);
}

// host.gemm_call and host.grouped_gemm_call through the writer and reader: the by-shape host costs
// of a GEMM (split-K predicted) and a grouped GEMM (runs of equal rows).
TEST(CostModel, ShapeAwareLibraryCallCostsRoundTripAndPredictSplitKAndRuns) {
  ProfileBuilder b({"calls", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  b.add_point(kGemmCallFamily, {64, 2560, 640, 1}, Measurement::single(7.4e-6));
  b.add_point(kGemmCallFamily, {192, 1536, 1024, 1}, Measurement::single(7.5e-6));
  b.add_point(kGemmCallFamily, {128, 1024, 7168, 2}, Measurement::single(13.1e-6));
  b.add_point(kGemmCallFamily, {32, 640, 2560, 2}, Measurement::single(12.9e-6));
  b.add_point(kGroupedCallFamily, {64, 6144, 96, 2560, 640}, Measurement::single(9.5e-6));
  b.add_point(kGroupedCallFamily, {64, 6144, 288, 2560, 640}, Measurement::single(24.9e-6));
  const Profile p = Profile::parse(b.build().to_toml(), "calls.toml");
  const Family& f = p.family(std::string(kGemmCallFamily));
  EXPECT_EQ(f.quality.loo_points, 4);  // each point predicted from the other three
  EXPECT_LT(f.quality.rel_err_max, 0.02);
  const CostModel cm(p);
  EXPECT_TRUE(cm.has_library_launch_costs());
  EXPECT_NEAR(cm.gemm_launch(64, 2560, 640).value, 7.45e-6, 1e-12);              // one kernel
  EXPECT_NEAR(cm.gemm_launch(16, 768, 3072).value, 7.45e-6 + 5.55e-6, 1e-12);    // split-K: 512 k per tile
  EXPECT_NEAR(cm.gemm_launch(16, 3072, 768).value, 7.45e-6, 1e-12);              // 32 k per tile
  EXPECT_NEAR(cm.grouped_gemm_launch(64, 1024, 16).value, 9.5e-6, 1e-12);        // balanced: one run
  EXPECT_NEAR(cm.grouped_gemm_launch(64, 1024, 64).value, 24.9e-6, 1e-12);  // hot expert: 3 runs
  EXPECT_EQ(cm.stream_cycle_extra(64).value, 0.0);  // no host.stream_cycle: no extra
}

// An eager framework's backward node and device read: absent from the shipped and default
// profiles (the simulator charges framework_op and gpu_read instead), their medians when a profile
// has them (the Python benchmark's families, merged), and they survive the TOML round trip.
TEST(CostModel, FrameworkBackwardAndSyncFamiliesAreOptional) {
  for (const char* kind : {"h100", "h200"}) {
    const CostModel d(default_profile(kind));
    EXPECT_FALSE(d.framework_backward_op().has_value()) << kind;
    EXPECT_FALSE(d.framework_sync().has_value()) << kind;
  }
  ProfileBuilder b({"path", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  b.add_host("framework_backward_op", Measurement::single(7.25e-6));
  for (const double t : {30e-6, 31e-6, 45e-6}) b.add_host("framework_sync", Measurement::single(t));
  const std::string text = b.build().to_toml();
  EXPECT_NE(text.find("[host.framework_backward_op]"), std::string::npos);
  const CostModel cm(Profile::parse(text, "path.toml"));
  ASSERT_TRUE(cm.framework_backward_op().has_value());
  EXPECT_NEAR(cm.framework_backward_op()->value, 7.25e-6, 1e-15);
  ASSERT_TRUE(cm.framework_sync().has_value());
  EXPECT_NEAR(cm.framework_sync()->value, 31e-6, 1e-15);
}

// The executor's per-op path: absent (older profiles), nothing extra and no record_op (the simulator
// keeps its two event records); present, the medians.
TEST(CostModel, ExecutorPathFamiliesAreOptional) {
  const CostModel old_profile(default_profile("h100"));
  EXPECT_EQ(old_profile.op_dispatch().value, 0.0);
  EXPECT_FALSE(old_profile.record_op().has_value());
  ProfileBuilder b({"path", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  for (const double t : {0.4e-6, 0.5e-6, 0.9e-6}) b.add_host("op_dispatch", Measurement::single(t));
  b.add_host("record_op", Measurement::single(3.1e-6));
  const CostModel cm(Profile::parse(b.build().to_toml(), "path.toml"));
  EXPECT_NEAR(cm.op_dispatch().value, 0.5e-6, 1e-15);
  ASSERT_TRUE(cm.record_op().has_value());
  EXPECT_NEAR(cm.record_op()->value, 3.1e-6, 1e-15);
  // host.stream_wait: an event record without it, its median with it.
  EXPECT_EQ(old_profile.stream_wait().value, old_profile.event_record().value);
  b.add_host("stream_wait", Measurement::single(2.7e-6));
  const CostModel with_wait(Profile::parse(b.build().to_toml(), "path.toml"));
  EXPECT_NEAR(with_wait.stream_wait().value, 2.7e-6, 1e-15);
}

TEST(CostModel, StreamCycleExtraRoundTripsAndIsZeroOnOneStream) {
  ProfileBuilder b({"cycle", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  b.add_point(kStreamCycleFamily, {64}, Measurement::single(3.0e-6));
  const CostModel cm(Profile::parse(b.build().to_toml(), "cycle.toml"));
  EXPECT_EQ(cm.stream_cycle_extra(1).value, 0.0);
  EXPECT_NEAR(cm.stream_cycle_extra(8).value, 1.5e-6, 1e-12);  // log2 8 / log2 64 = 1/2
  EXPECT_NEAR(cm.stream_cycle_extra(64).value, 3.0e-6, 1e-12);
}

// host.framework_stream_op is its own family: it neither feeds nor reads host.stream_cycle.
TEST(CostModel, FrameworkStreamExtraIsItsOwnFamily) {
  ProfileBuilder b({"fwstream", "synthetic: unit test", "tests/calibration"}, test_hardware());
  b.add_host("kernel_launch", Measurement::single(4.5e-6));
  const CostModel without(Profile::parse(b.build().to_toml(), "fwstream.toml"));
  EXPECT_FALSE(without.framework_stream_extra(4).has_value());
  b.add_point(kFrameworkStreamFamily, {2}, Measurement::single(6.0e-6));
  b.add_point(kFrameworkStreamFamily, {8}, Measurement::single(9.0e-6));
  const CostModel cm(Profile::parse(b.build().to_toml(), "fwstream.toml"));
  ASSERT_TRUE(cm.framework_stream_extra(4).has_value());
  EXPECT_NEAR(cm.framework_stream_extra(2)->value, 6.0e-6, 1e-12);
  EXPECT_NEAR(cm.framework_stream_extra(4)->value, 7.5e-6, 1e-12);  // log2-interpolated between 2 and 8
  EXPECT_EQ(cm.framework_stream_extra(1)->value, 0.0);
  EXPECT_EQ(cm.stream_cycle_extra(4).value, 0.0);
}

TEST(CostModel, BadArgumentsAreInputErrors) {
  const CostModel cm(default_profile("h200"));
  EXPECT_THROW((void)cm.gemm(-1, 16, 16, DType::bf16), InputError);
  EXPECT_THROW((void)cm.copy(CopyKind::d2d, Bytes(-1)), InputError);
  EXPECT_THROW((void)cm.collective(Collective::all_reduce, Bytes(1), 0, LinkScope::nvlink), InputError);
  EXPECT_THROW((void)cm.grouped_gemm(4, 100, 10, 128, 128, DType::bf16), InputError);   // max_rows < total/groups
  EXPECT_THROW((void)cm.grouped_gemm(4, 100, 101, 128, 128, DType::bf16), InputError);  // max_rows > total
  EXPECT_THROW((void)cm.stream_concurrency(0, 0.5), InputError);
  EXPECT_THROW((void)cm.stream_concurrency(2, 0.0), InputError);
  EXPECT_THROW((void)cm.stream_concurrency(2, 1.5), InputError);
  // Zero work: the fixed cost of issuing it, not a crash.
  EXPECT_EQ(cm.gemm(0, 4096, 4096, DType::bf16).value, default_profile("h200").family("gemm.bf16").param("overhead_s"));
}

TEST(CostModel, MovesWithoutLosingTheProfile) {
  CostModel a(default_profile("h200"));
  const double t = a.gemm(4096, 4096, 4096, DType::bf16).value;
  CostModel b(std::move(a));
  EXPECT_EQ(b.gemm(4096, 4096, 4096, DType::bf16).value, t);
}

TEST(CostModel, PredictPointIsTheSimulatorsCallForTheFamily) {
  const CostModel cm(default_profile("h200"));
  EXPECT_EQ(cm.predict_point("gemm.fp8", {1000, 2048, 7168, 1})->value, cm.gemm(1000, 2048, 7168, DType::fp8).value);
  EXPECT_EQ(cm.predict_point("grouped_gemm.bf16", {16, 4096, 512, 1408, 2048})->value,
            cm.grouped_gemm(16, 4096, 512, 1408, 2048, DType::bf16).value);
  AttentionShape s{2, 4096, 4096, 32, 8, 128, 128, true};
  EXPECT_EQ(cm.predict_point("attention.bwd", {2, 4096, 4096, 32, 8, 128, 128, 1})->value, cm.attention(s, true).value);
  EXPECT_EQ(cm.predict_point("collective.all_gather.network", {16, 3e7})->value,
            cm.collective(Collective::all_gather, Bytes(3e7), 16, LinkScope::network).value);
  EXPECT_EQ(cm.predict_point("norm", {5e6})->value, cm.norm(Bytes(5e6)).value);
  EXPECT_EQ(cm.predict_point("elementwise_swiglu", {5e6})->value,
            cm.memory_kernel("elementwise_swiglu", Bytes(5e6)).value);
  // Families the simulator costs otherwise have no point prediction.
  EXPECT_FALSE(cm.predict_point("host.kernel_launch", {}).has_value());
  EXPECT_FALSE(cm.predict_point("copy.d2d", {1e6}).has_value());
  EXPECT_THROW((void)cm.predict_point("gemm.bf17", {1, 2, 3, 1}), InputError);
  EXPECT_THROW((void)cm.predict_point("gemm.bf16", {1, 2, 3}), InputError);
}
