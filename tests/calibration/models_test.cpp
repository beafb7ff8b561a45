// Each model family: the fit recovers known parameters from synthetic points with noise (seeded),
// and the equations behave as documented.
#include "threewalls/calibration/models.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <tuple>

#include "threewalls/calibration/fit.hpp"
#include "threewalls/core/attention_mask.hpp"
#include "threewalls/core/decode_attention_geometry.hpp"

using namespace threewalls::calibration;
using threewalls::causal_keys_seen;
using threewalls::causal_queries_seeing;
using threewalls::Collective;
using threewalls::DType;

namespace {

// Multiplicative noise of relative standard deviation `sigma`, fixed seed per test.
class Noise {
 public:
  Noise(std::uint64_t seed, double sigma) : rng_(seed), dist_(0.0, sigma) {}
  double operator()(double v) { return v * (1.0 + dist_(rng_)); }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> dist_;
};

const DeviceConstants kH200Bf16{132, 989e12};

GemmModel truth_gemm() {
  GemmModel m;
  m.tile_m = 128;
  m.tile_n = 128;
  m.efficiency_max = 0.82;
  m.k_half = 400.0;
  m.wave_tail = 0.15;
  m.overhead_s = 6e-6;
  m.memory_bandwidth_bytes_per_s = 4e12;
  m.device = kH200Bf16;
  m.elements = element_bytes(DType::bf16);
  return m;
}

}  // namespace

TEST(GemmModel, FitRecoversParametersFromNoisyPoints) {
  const GemmModel truth = truth_gemm();
  Noise noise(1, 0.02);
  std::vector<GemmModel::Sample> samples;
  for (std::int64_t m : {256, 1024, 2048, 4096, 16384}) {
    for (std::int64_t n : {1408, 4096, 8192}) {
      for (std::int64_t k : {512, 2048, 8192}) samples.push_back({m, n, k, 1, noise(truth.time_s(m, n, k))});
    }
  }
  const GemmModel fit = GemmModel::fit(samples, truth.device, truth.elements, truth.memory_bandwidth_bytes_per_s);
  EXPECT_EQ(fit.tile_m, 128);
  EXPECT_EQ(fit.tile_n, 128);
  EXPECT_NEAR(fit.efficiency_max, 0.82, 0.82 * 0.03);
  EXPECT_NEAR(fit.k_half, 400.0, 400.0 * 0.2);
  EXPECT_NEAR(fit.wave_tail, 0.15, 0.15 * 0.3);
  EXPECT_NEAR(fit.overhead_s, 6e-6, 6e-6 * 0.2);
  // Shapes that were never measured (the simulator's use) are predicted within a few percent.
  for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{3000, 5120, 1536},
                         {700, 2816, 7168},
                         {12000, 6000, 3000}}) {
    EXPECT_NEAR(fit.time_s(m, n, k) / truth.time_s(m, n, k), 1.0, 0.03) << m << "x" << n << "x" << k;
  }
}

TEST(GemmModel, FitNeedsFourPoints) {
  const GemmModel t = truth_gemm();
  std::vector<GemmModel::Sample> three = {
      {1024, 1024, 1024, 1, 1e-5}, {2048, 2048, 2048, 1, 5e-5}, {4096, 4096, 4096, 1, 2e-4}};
  EXPECT_THROW(GemmModel::fit(three, t.device, t.elements, 4e12), FitImpossible);
}

TEST(GemmModel, EveryGemmPaysTheKLoopOfTheWaveTail) {
  // 132 SMs, 128 x 128 tiles: one full wave of tiles costs (1 + tail) times its FLOP time; a GEMM of
  // one tile (1/132 of a wave) fills the GPU to w / (w + tail) = (1/132) / (1/132 + 0.15).
  GemmModel m = truth_gemm();
  m.overhead_s = 0;
  m.memory_bandwidth_bytes_per_s = 1e30;  // compute only
  const std::int64_t k = 8192;
  const double eff = m.efficiency_max * k / (k + m.k_half);
  const double one_wave_flops = 2.0 * 128 * 132 * 128 * k;
  EXPECT_NEAR(m.time_s(128 * 132, 128, k) / (one_wave_flops / (989e12 * eff)), 1.15, 1e-9);
  const double w = 1.0 / 132.0;
  EXPECT_NEAR(m.time_s(128, 128, k) / (one_wave_flops / 132.0 / (989e12 * eff)), (w + 0.15) / w, 1e-9);
  // Ten waves: the tail is a 1.5% surcharge.
  EXPECT_NEAR(m.time_s(128 * 1320, 128, k) / (10 * one_wave_flops / (989e12 * eff)), 1.015, 1e-9);
}

TEST(GemmModel, SmallMatricesAreMemoryBound) {
  // m = 16 (decode): the weight read dominates; time ~ bytes / BW + t0.
  const GemmModel m = truth_gemm();
  const double bytes = (16.0 * 8192 + 8192.0 * 8192 + 16.0 * 8192) * 2;
  EXPECT_NEAR(m.time_s(16, 8192, 8192), bytes / 4e12 + 6e-6, 1e-12);
}

TEST(GroupedGemmModel, FitRecoversEfficiencyAndOverheadFromNoisyPoints) {
  const GemmModel dense = truth_gemm();
  GroupedGemmModel truth;
  truth.tile_m = dense.tile_m;
  truth.tile_n = dense.tile_n;
  truth.k_half = dense.k_half;
  truth.efficiency_max = 0.7;
  truth.overhead_s = 9e-6;
  truth.memory_bandwidth_bytes_per_s = dense.memory_bandwidth_bytes_per_s;
  truth.device = dense.device;
  truth.elements = dense.elements;
  Noise noise(2, 0.02);
  std::vector<GroupedGemmModel::Sample> samples;
  for (std::int64_t g : {8, 32, 64}) {
    for (std::int64_t rows : {256, 768, 2048}) {
      samples.push_back({g, g * rows, rows, 1408, 2048, noise(truth.time_s(g, g * rows, rows, 1408, 2048))});
      samples.push_back({g, g * rows, 3 * rows, 1408, 2048, noise(truth.time_s(g, g * rows, 3 * rows, 1408, 2048))});
    }
  }
  const auto fit = GroupedGemmModel::fit(samples, dense);
  EXPECT_EQ(fit.tile_m, dense.tile_m);
  EXPECT_EQ(fit.k_half, dense.k_half);
  EXPECT_NEAR(fit.efficiency_max, 0.7, 0.7 * 0.03);
  EXPECT_NEAR(fit.overhead_s, 9e-6, 9e-6 * 0.3);
}

TEST(GroupedGemmModel, ExpertRowRunsFollowTheBackendSplit) {
  using Runs = std::vector<std::pair<std::int64_t, std::int64_t>>;
  EXPECT_EQ(expert_rows_runs(512, 8, 64), (Runs{{64, 8}}));                       // balanced: one call
  EXPECT_EQ(expert_rows_runs(10, 4, 1), (Runs{{3, 2}, {2, 2}}));                  // remainder first
  EXPECT_EQ(expert_rows_runs(512, 8, 128), (Runs{{128, 1}, {55, 6}, {54, 1}}));  // hot expert: 3 calls
  EXPECT_EQ(expert_rows_runs(100, 4, 100), (Runs{{100, 1}}));                     // the rest is empty
}

TEST(GroupedGemmModel, BatchedCallsFormRecoversT0AndCostsEachRunWithTheDenseModel) {
  const GemmModel dense = truth_gemm();
  GroupedGemmModel truth;
  truth.k_half = dense.k_half;
  truth.efficiency_max = dense.efficiency_max;
  truth.wave_tail = dense.wave_tail;
  truth.call_overhead_s = dense.overhead_s;
  truth.batched_calls = true;
  truth.overhead_s = 9e-6;
  truth.memory_bandwidth_bytes_per_s = dense.memory_bandwidth_bytes_per_s;
  truth.device = dense.device;
  truth.elements = dense.elements;
  // By hand: a hot expert makes 3 batched calls, each costed by the dense model without its t0.
  const double by_hand = 9e-6 + (dense.time_s(128, 1408, 2048, 1) - 6e-6) + (dense.time_s(55, 1408, 2048, 6) - 6e-6) +
                         (dense.time_s(54, 1408, 2048, 1) - 6e-6) + 2 * 6e-6;
  EXPECT_NEAR(truth.time_s(8, 512, 128, 1408, 2048), by_hand, by_hand * 1e-12);
  Noise noise(3, 0.01);
  std::vector<GroupedGemmModel::Sample> samples;
  for (std::int64_t g : {8, 32, 64}) {
    for (std::int64_t rows : {64, 256, 2048}) {
      samples.push_back({g, g * rows, rows, 1408, 2048, noise(truth.time_s(g, g * rows, rows, 1408, 2048))});
      samples.push_back({g, g * rows, 3 * rows, 1408, 2048, noise(truth.time_s(g, g * rows, 3 * rows, 1408, 2048))});
    }
  }
  const auto fit = GroupedGemmModel::fit(samples, dense, true);
  EXPECT_TRUE(fit.batched_calls);
  EXPECT_EQ(fit.wave_tail, dense.wave_tail);
  EXPECT_EQ(fit.call_overhead_s, dense.overhead_s);
  EXPECT_NEAR(fit.overhead_s, 9e-6, 9e-6 * 0.3);
  for (const auto& s : samples) {
    EXPECT_NEAR(fit.time_s(s.groups, s.total_rows, s.max_rows, s.n, s.k) / truth.time_s(s.groups, s.total_rows, s.max_rows, s.n, s.k),
                1.0, 0.02);
  }
  // Fewer than 3 points: the wave form (e_max only), as the synthetic default profiles have.
  EXPECT_FALSE(GroupedGemmModel::fit({samples[0], samples[1]}, dense, true).batched_calls);
}

TEST(GroupedGemmModel, SmallGroupsPayForWholeTiles) {
  GroupedGemmModel m;
  m.efficiency_max = 0.8;
  m.memory_bandwidth_bytes_per_s = 1e30;  // compute only
  m.device = kH200Bf16;
  // 64 groups of 10 rows cost as many tiles as 64 groups of 128 rows.
  EXPECT_DOUBLE_EQ(m.time_s(64, 640, 10, 4096, 4096), m.time_s(64, 64 * 128, 128, 4096, 4096));
  // Imbalance: the critical group's rows add tiles.
  EXPECT_GT(m.time_s(64, 64 * 128, 64 * 64, 4096, 4096), m.time_s(64, 64 * 128, 128, 4096, 4096));
}

TEST(Attention, CausalPairsMatchBruteForceCount) {
  for (auto [sq, skv] :
       {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 7}, {1, 4096}, {5, 12}, {12, 5}, {128, 300}}) {
    double brute = 0;
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t j = 0; j < skv; ++j) brute += (j <= i + (skv - sq)) ? 1 : 0;
    }
    EXPECT_EQ(attention_pairs(sq, skv, true), brute) << sq << "x" << skv;
  }
  EXPECT_EQ(attention_pairs(4, 6, false), 24.0);
}

// A sliding window of w keys: query i sees keys j with i + d - w < j <= i + d (d = s_kv - s_q); the
// closed-form pair count and the per-row and per-key counts (core/attention_mask.hpp) agree with a
// brute-force count, and a window at least as long as the keys masks nothing beyond causality.
TEST(Attention, WindowedCausalPairsMatchBruteForceCount) {
  for (auto [sq, skv] :
       {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 7}, {1, 4096}, {5, 12}, {300, 300}, {128, 300}}) {
    for (const std::int64_t w : {1, 3, 64, 128, 5000}) {
      double brute = 0;
      std::vector<std::int64_t> per_key(static_cast<std::size_t>(skv), 0);
      for (std::int64_t i = 0; i < sq; ++i) {
        std::int64_t row = 0;
        for (std::int64_t j = 0; j < skv; ++j) {
          const bool seen = j <= i + (skv - sq) && j > i + (skv - sq) - w;
          row += seen ? 1 : 0;
          per_key[static_cast<std::size_t>(j)] += seen ? 1 : 0;
        }
        brute += static_cast<double>(row);
        EXPECT_EQ(causal_keys_seen(i, sq, skv, w), row) << sq << "x" << skv << " w" << w << " row " << i;
      }
      for (std::int64_t j = 0; j < skv; ++j) {
        EXPECT_EQ(causal_queries_seeing(j, sq, skv, w), per_key[static_cast<std::size_t>(j)]) << j;
      }
      EXPECT_EQ(attention_pairs(sq, skv, true, w), brute) << sq << "x" << skv << " w" << w;
    }
    EXPECT_EQ(attention_pairs(sq, skv, true, skv), attention_pairs(sq, skv, true));
  }
  // Blocked (unfused) form: 512-row blocks from their first row's window start to their last row's diagonal.
  EXPECT_DOUBLE_EQ(attention_computed_pairs(1024, 1024, true, 128), 512.0 * 512.0 + 512.0 * (1024.0 - 385.0));
  EXPECT_DOUBLE_EQ(attention_computed_pairs(1024, 1024, true, 4096), attention_computed_pairs(1024, 1024, true));
}

TEST(Attention, BackwardCountsFiveMatmulsAgainstTwo) {
  AttentionShape s;
  s.batch = 2;
  s.seq_q = s.seq_kv = 1024;
  s.heads = s.kv_heads = 8;
  s.head_dim_qk = s.head_dim_v = 128;
  EXPECT_DOUBLE_EQ(attention_flops(s, true) / attention_flops(s, false), 2.5);
}

// Noisy samples of `truth` over square self-attention shapes: every sequence length and head dim, causal
// or not, 16 heads and `tokens` / seq sequences; `small` adds a 1-sequence, 2-head twin of each (where
// the fixed time t0 shows).
std::vector<AttentionModel::Sample> attention_samples(const AttentionModel& truth, Noise& noise,
                                                      std::initializer_list<std::int64_t> seqs,
                                                      std::initializer_list<std::int64_t> dims, std::int64_t tokens,
                                                      bool small) {
  std::vector<AttentionModel::Sample> samples;
  for (std::int64_t seq : seqs) {
    for (std::int64_t d : dims) {
      for (bool causal : {false, true}) {
        AttentionShape s;
        s.batch = std::max<std::int64_t>(1, tokens / seq);
        s.seq_q = s.seq_kv = seq;
        s.heads = s.kv_heads = 16;
        s.head_dim_qk = s.head_dim_v = d;
        s.causal = causal;
        samples.push_back({s, noise(truth.time_s(s))});
        if (!small) continue;
        s.batch = 1;
        s.heads = s.kv_heads = 2;
        samples.push_back({s, noise(truth.time_s(s))});
      }
    }
  }
  return samples;
}

// The attention truth of the fit tests: e_max 0.7, s_half 300 keys, d_half 20, t0 5 us, 4 TB/s, H200.
AttentionModel attention_truth() {
  AttentionModel m;
  m.efficiency_max = 0.7;
  m.s_half = 300.0;
  m.d_half = 20.0;
  m.overhead_s = 5e-6;
  m.memory_bandwidth_bytes_per_s = 4e12;
  m.device = kH200Bf16;
  return m;
}

void expect_attention_truth(const AttentionModel& fit) {
  EXPECT_NEAR(fit.efficiency_max, 0.7, 0.7 * 0.05);
  EXPECT_NEAR(fit.s_half, 300.0, 300.0 * 0.25);
  EXPECT_NEAR(fit.d_half, 20.0, 20.0 * 0.3);
  EXPECT_NEAR(fit.overhead_s, 5e-6, 5e-6 * 0.4);
}

TEST(AttentionModel, FitRecoversParametersFromNoisyPoints) {
  const AttentionModel truth = attention_truth();
  Noise noise(3, 0.015);
  const auto samples = attention_samples(truth, noise, {256, 512, 1024, 2048, 4096, 8192, 16384}, {64, 128, 256}, 8192, false);
  expect_attention_truth(AttentionModel::fit(samples, false, truth.device, truth.memory_bandwidth_bytes_per_s));
}

// The scheduled form (attention_tiles_v1): with equal tiles (no mask, whole 128-row tiles) it is the
// wave form; under a causal mask it follows the heads one by one where whole waves step; its fit
// recovers the parameters.
TEST(AttentionModel, ScheduledFormIsTheWaveFormForEqualTilesAndLinearInHeadsUnderAMask) {
  AttentionModel wave = attention_truth();
  AttentionModel tiles = wave;
  tiles.scheduled = true;
  for (const bool backward : {false, true}) {
    wave.backward = tiles.backward = backward;
    for (const std::int64_t h : {1, 7, 14, 16, 40}) {
      const AttentionShape s{2, 2048, 2048, h, h, 128, 128, false};
      EXPECT_NEAR(tiles.time_s(s), wave.time_s(s), wave.time_s(s) * 1e-9) << h << " " << backward;
    }
    // One sequence of 4,096 tokens, causal: 14 and 16 heads are both four waves of query tiles (448
    // and 512 tiles on 132 SMs), the same time in whole waves; placed tile by tile the time grows
    // with the heads, by most of the heads' ratio (16/14 = 1.143; the last tiles' tail is shared).
    const AttentionShape h14{1, 4096, 4096, 14, 14, 128, 128, true};
    const AttentionShape h16{1, 4096, 4096, 16, 16, 128, 128, true};
    EXPECT_NEAR(wave.time_s(h16) / wave.time_s(h14), 1.0, 0.02) << backward;
    const double ratio = (tiles.time_s(h16) - tiles.overhead_s) / (tiles.time_s(h14) - tiles.overhead_s);
    EXPECT_GT(ratio, 1.09) << backward;
    EXPECT_LT(ratio, 16.0 / 14.0 + 1e-9) << backward;
  }
  tiles.backward = false;
  Noise noise(5, 0.015);
  const auto samples =
      attention_samples(tiles, noise, {256, 512, 1024, 2048, 4096, 8192, 16384}, {64, 128, 256}, 8192, true);
  const auto fit = AttentionModel::fit(samples, false, tiles.device, tiles.memory_bandwidth_bytes_per_s, false, true);
  EXPECT_TRUE(fit.scheduled);
  expect_attention_truth(fit);
}

// Priced by its tiles, a sliding-window layer costs about its share of the pairs (plus the tiles'
// fixed work): far less than full causal attention at a long sequence, more as the window grows, the
// same when the window covers the sequence.
TEST(AttentionModel, AWindowedScheduledAttentionCostsItsBandOfTiles) {
  AttentionModel m = attention_truth();
  m.scheduled = true;
  for (const bool backward : {false, true}) {
    m.backward = backward;
    AttentionShape full{1, 8192, 8192, 64, 8, 64, 64, true};
    AttentionShape w128 = full, w1024 = full, w8192 = full;
    w128.window = 128;
    w1024.window = 1024;
    w8192.window = 8192;
    EXPECT_LT(m.time_s(w128), 0.2 * m.time_s(full)) << backward;
    EXPECT_LT(m.time_s(w128), m.time_s(w1024)) << backward;
    EXPECT_LT(m.time_s(w1024), m.time_s(full)) << backward;
    EXPECT_DOUBLE_EQ(m.time_s(w8192), m.time_s(full)) << backward;
    EXPECT_GT(attention_flops(full, backward) / attention_flops(w1024, backward), 4.0);
  }
}

// A tile's work: under a causal mask the mean of its first and last rows' keys (the diagonal block's
// masked half is in the fitted per-tile cost); a sliding window adds the block at the band's far edge
// that the kernel visits whole: 128 keys' window and 128-row tiles walk two blocks (the window's and
// the diagonal's), 192.5 keys where the mean seen is 128. Backward (key tiles, the queries seeing them)
// mirrors it.
TEST(AttentionModel, TileWorkCountsTheBandsEdgeBlocks) {
  AttentionShape s{1, 1024, 1024, 1, 1, 64, 64, true};
  const auto causal = attention_tile_work(s, false, 128);
  ASSERT_EQ(causal.size(), 8U);
  EXPECT_DOUBLE_EQ(causal[0], 64.5);
  EXPECT_DOUBLE_EQ(causal[3], 3 * 128 + 64.5);
  s.window = 128;
  const auto fwd = attention_tile_work(s, false, 128);
  const auto bwd = attention_tile_work(s, true, 128);
  EXPECT_DOUBLE_EQ(fwd[0], 64.5);  // the first tile's window starts at key 0
  EXPECT_DOUBLE_EQ(bwd.back(), 64.5);
  for (std::size_t i = 1; i < 8; ++i) {
    EXPECT_DOUBLE_EQ(fwd[i], 192.5) << i;
    EXPECT_DOUBLE_EQ(bwd[i - 1], 192.5) << i;
  }
  s.window = 1024;  // the whole sequence: the causal tiles
  EXPECT_EQ(attention_tile_work(s, false, 128), causal);
}

// The per-head-dimension form (attention_tiles_v2): the efficiency is linear in d_qk between the
// measured head dimensions and the nearest one's outside; its fit recovers one efficiency per head
// dimension where they do not follow a saturating curve (d_qk = 192 below d_qk = 128, as flash
// kernels built per head dimension run), and prices a shape at a head dimension between them by
// interpolation.
TEST(AttentionModel, PerHeadDimFormInterpolatesAndItsFitRecoversEachHeadDimsEfficiency) {
  AttentionModel truth = attention_truth();
  truth.scheduled = true;
  truth.head_dims = {64, 128, 192};
  truth.head_dim_efficiency = {0.45, 0.68, 0.55};
  truth.head_dim_efficiency_unmasked = {0.45, 0.68, 0.35};  // the unmasked d_qk = 192 kernel slower
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(32, true), 0.45);
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(96, true), (0.45 + 0.68) / 2);
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(160, true), (0.68 + 0.55) / 2);
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(256, true), 0.55);
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(256, false), 0.35);
  EXPECT_DOUBLE_EQ(truth.head_dim_factor(160, false), (0.68 + 0.35) / 2);
  // Without a table: the v1 curve, whatever the mask.
  const AttentionModel v1 = attention_truth();
  EXPECT_DOUBLE_EQ(v1.head_dim_factor(128, true), 0.7 * 128 / (128 + 20.0));
  EXPECT_DOUBLE_EQ(v1.head_dim_factor(128, false), 0.7 * 128 / (128 + 20.0));
  for (const bool backward : {false, true}) {
    truth.backward = backward;
    Noise noise(11, 0.015);
    const auto samples = attention_samples(truth, noise, {256, 1024, 4096, 16384}, {64, 128, 192}, 8192, true);
    const auto fit =
        AttentionModel::fit_per_head_dim(samples, backward, truth.device, truth.memory_bandwidth_bytes_per_s);
    EXPECT_TRUE(fit.scheduled);
    ASSERT_EQ(fit.head_dims, (std::vector<double>{64, 128, 192}));
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(fit.head_dim_efficiency[i], truth.head_dim_efficiency[i], truth.head_dim_efficiency[i] * 0.05)
          << backward << " " << fit.head_dims[i];
      EXPECT_NEAR(fit.head_dim_efficiency_unmasked[i], truth.head_dim_efficiency_unmasked[i],
                  truth.head_dim_efficiency_unmasked[i] * 0.05)
          << backward << " " << fit.head_dims[i];
    }
    EXPECT_NEAR(fit.s_half, truth.s_half, truth.s_half * 0.25) << backward;
    // A head dimension between the measured ones, at a length between the points.
    const AttentionShape mid{1, 3000, 3000, 24, 24, 160, 128, true};
    EXPECT_NEAR(fit.time_s(mid) / truth.time_s(mid), 1.0, 0.05) << backward;
    // A head dimension measured under one mask only takes that efficiency for the other.
    std::vector<AttentionModel::Sample> causal_only;
    for (const auto& smp : samples) {
      if (smp.shape.causal || smp.shape.head_dim_qk != 64) causal_only.push_back(smp);
    }
    const auto part =
        AttentionModel::fit_per_head_dim(causal_only, backward, truth.device, truth.memory_bandwidth_bytes_per_s);
    EXPECT_DOUBLE_EQ(part.head_dim_efficiency_unmasked[0], part.head_dim_efficiency[0]);
    // The v1 form fitted to the same points cannot follow the dip at 192.
    const auto one_curve =
        AttentionModel::fit(samples, backward, truth.device, truth.memory_bandwidth_bytes_per_s, false, true);
    const AttentionShape mla{1, 4096, 4096, 64, 64, 192, 128, true};
    EXPECT_LT(std::abs(fit.time_s(mla) / truth.time_s(mla) - 1.0),
              std::abs(one_curve.time_s(mla) / truth.time_s(mla) - 1.0))
        << backward;
  }
  Noise quiet(1, 1e-9);
  const auto four = attention_samples(truth, quiet, {1024}, {64}, 8192, true);  // 4 points, 4 parameters
  EXPECT_THROW((void)AttentionModel::fit_per_head_dim(four, false, truth.device, truth.memory_bandwidth_bytes_per_s),
               FitImpossible);
}

// Decode attention: t = t0 + B per_byte + F per_flop over caches, batches and GQA group sizes.
TEST(DecodeAttentionModel, FitRecoversTheBandwidthAndTheFlopTermAndScalesToLongerCaches) {
  DecodeAttentionModel truth;
  truth.overhead_s = 6e-6;
  truth.per_byte_s = 1.0 / 2.8e12;
  truth.per_flop_s = 1.0 / 40e12;
  Noise noise(7, 0.01);
  std::vector<DecodeAttentionModel::Sample> samples;
  for (std::int64_t skv : {512, 2048, 8192, 32768}) {
    for (std::int64_t b : {1, 16, 64}) {
      for (auto [h, kv] : {std::pair<std::int64_t, std::int64_t>{32, 32}, {32, 8}, {64, 4}}) {
        AttentionShape s;
        s.batch = b;
        s.seq_q = 1;
        s.seq_kv = skv;
        s.heads = h;
        s.kv_heads = kv;
        s.head_dim_qk = s.head_dim_v = 128;
        s.causal = true;
        samples.push_back({s, noise(truth.time_s(s))});
      }
    }
  }
  const auto fit = DecodeAttentionModel::fit(samples);
  EXPECT_NEAR(fit.per_byte_s, truth.per_byte_s, truth.per_byte_s * 0.05);
  EXPECT_NEAR(fit.per_flop_s, truth.per_flop_s, truth.per_flop_s * 0.3);
  EXPECT_NEAR(fit.overhead_s, truth.overhead_s, truth.overhead_s * 0.2);
  // A cache 32 times the longest measured: priced at the fitted rates (within the fit's noise).
  AttentionShape big = samples.back().shape;
  big.seq_kv = 1 << 20;
  big.heads = big.kv_heads = 32;
  EXPECT_NEAR(fit.time_s(big) / truth.time_s(big), 1.0, 0.05);
  // Bytes follow the KV heads, FLOPs the query heads.
  AttentionShape gqa = big;
  gqa.kv_heads = gqa.heads / 8;
  EXPECT_DOUBLE_EQ(decode_attention_kv_bytes(gqa) * 8, decode_attention_kv_bytes(big));
  EXPECT_DOUBLE_EQ(decode_attention_flops(gqa), decode_attention_flops(big));
}

TEST(DecodeAttentionModel, NeedsThreePointsAndTimesThatGrowWithTheCache) {
  std::vector<DecodeAttentionModel::Sample> samples;
  AttentionShape s;
  s.seq_q = 1;
  s.heads = s.kv_heads = 8;
  s.head_dim_qk = s.head_dim_v = 128;
  // Longer caches measured faster: no positive time per byte.
  for (const auto& [skv, t] : {std::pair<std::int64_t, double>{1024, 3e-5}, {4096, 2e-5}, {16384, 1e-5}}) {
    s.seq_kv = skv;
    samples.push_back({s, t});
  }
  EXPECT_THROW((void)DecodeAttentionModel::fit(samples), FitImpossible);
  samples.resize(2);
  EXPECT_THROW((void)DecodeAttentionModel::fit(samples), FitImpossible);
}

// The split-KV kernel's launch geometry: four blocks per SM, at least 256 keys per split, rounds of
// 128 keys per block.
TEST(DecodeAttentionGeometry, FollowsTheKernelsSplitRule) {
  // b 4, 4 KV heads on 132 SMs: 33 splits wanted, 32 allowed by 8193 keys; 257 keys a split: three rounds.
  auto g = threewalls::decode_attention_geometry(4, 4, 8193, 132);
  EXPECT_EQ(g.splits, 32);
  EXPECT_EQ(g.blocks, 512);
  EXPECT_EQ(g.keys_per_split, 257);
  EXPECT_EQ(g.rounds, 3);
  EXPECT_EQ(g.blocks_per_sm, 4);
  // One key fewer: 256 keys a split, two rounds.
  EXPECT_EQ(threewalls::decode_attention_geometry(4, 4, 8192, 132).rounds, 2);
  // Many sequences: one split, the whole cache per block.
  g = threewalls::decode_attention_geometry(64, 32, 1100, 132);
  EXPECT_EQ(g.splits, 1);
  EXPECT_EQ(g.rounds, 9);
  EXPECT_EQ(g.blocks_per_sm, 16);
  // A short cache is never split below 256 keys.
  EXPECT_EQ(threewalls::decode_attention_geometry(1, 1, 300, 132).splits, 1);
}

// Decode attention by waves (attention_decode_v2): points generated from known parameters over the
// calibration grid's kind of shapes (batches 1-64, caches 512-32768, 1-16 query heads per KV head,
// split-bound and bandwidth-bound) give them back.
TEST(DecodeAttentionModel, WavesFitRecoversItsParametersFromNoisyPoints) {
  DecodeAttentionModel truth;
  truth.waves = true;
  truth.sm_count = 132;
  truth.overhead_s = 1.1e-5;
  truth.per_split_s = 1.6e-7;
  truth.per_round_dim_s = 3.2e-9;
  truth.per_round_head_dim_s = 2.2e-9;
  truth.bandwidth_bytes_per_s = 3.0e12;
  Noise noise(11, 0.01);
  std::vector<DecodeAttentionModel::Sample> samples;
  struct Heads {
    std::int64_t h, kv, dqk, dv;
  };
  const std::vector<Heads> layouts{{32, 32, 128, 128}, {32, 8, 128, 128}, {32, 4, 128, 128},
                                   {64, 4, 128, 128},  {16, 2, 192, 128}, {16, 16, 192, 128}};
  std::size_t i = 0;
  int bandwidth_bound = 0;
  for (std::int64_t skv : {512, 1100, 3000, 8192, 12000, 32768}) {
    for (std::int64_t b : {1, 3, 5, 8, 16, 64}) {
      const Heads l = layouts[i++ % layouts.size()];
      AttentionShape s;
      s.batch = b;
      s.seq_q = 1;
      s.seq_kv = skv;
      s.heads = l.h;
      s.kv_heads = l.kv;
      s.head_dim_qk = l.dqk;
      s.head_dim_v = l.dv;
      s.causal = true;
      if (decode_attention_kv_bytes(s) > 2e9) continue;
      DecodeAttentionModel no_floor = truth;
      no_floor.bandwidth_bytes_per_s = 1e30;
      if (no_floor.time_s(s) < truth.time_s(s)) ++bandwidth_bound;
      samples.push_back({s, noise(truth.time_s(s))});
    }
  }
  ASSERT_GE(bandwidth_bound, 3);  // the grid sees the floor
  const auto fit = DecodeAttentionModel::fit_waves(samples, 132);
  EXPECT_TRUE(fit.waves);
  EXPECT_EQ(fit.sm_count, 132);
  EXPECT_NEAR(fit.overhead_s, truth.overhead_s, truth.overhead_s * 0.1);
  EXPECT_NEAR(fit.per_split_s, truth.per_split_s, truth.per_split_s * 0.2);
  EXPECT_NEAR(fit.per_round_dim_s, truth.per_round_dim_s, truth.per_round_dim_s * 0.1);
  EXPECT_NEAR(fit.per_round_head_dim_s, truth.per_round_head_dim_s, truth.per_round_head_dim_s * 0.05);
  EXPECT_NEAR(fit.bandwidth_bytes_per_s, truth.bandwidth_bytes_per_s, truth.bandwidth_bytes_per_s * 0.05);
  // The form follows the rounds: a split of 257 keys costs a third round, one of 256 does not.
  AttentionShape a = samples.front().shape;
  a.batch = 4;
  a.heads = 32;
  a.kv_heads = 4;
  a.head_dim_qk = a.head_dim_v = 128;
  a.seq_kv = 8192;
  AttentionShape b = a;
  b.seq_kv = 8193;
  EXPECT_GT(truth.time_s(b) / truth.time_s(a), 1.3);
  // Fewer than six points, or no SM count: no fit.
  EXPECT_THROW((void)DecodeAttentionModel::fit_waves({samples.begin(), samples.begin() + 5}, 132), FitImpossible);
  EXPECT_THROW((void)DecodeAttentionModel::fit_waves(samples, 0), FitImpossible);
}

TEST(AttentionModel, ComputedPairsAreWholeCausalBlocks) {
  // Non-causal: every pair. Causal: 512-row blocks up to their last row (s_q = 512: all of them).
  EXPECT_DOUBLE_EQ(attention_computed_pairs(1000, 700, false), 700000.0);
  EXPECT_DOUBLE_EQ(attention_computed_pairs(512, 512, true), 512.0 * 512.0);
  EXPECT_DOUBLE_EQ(attention_computed_pairs(1024, 1024, true), 512.0 * 512.0 + 512.0 * 1024.0);
  EXPECT_DOUBLE_EQ(attention_computed_pairs(1, 4096, true), 4096.0);  // decode: one row, all keys
  EXPECT_GT(attention_computed_pairs(8192, 8192, true), attention_pairs(8192, 8192, true));
  EXPECT_LT(attention_computed_pairs(8192, 8192, true), 1.07 * attention_pairs(8192, 8192, true));
}

TEST(AttentionModel, BlockedFormRecoversParametersFromNoisyPoints) {
  AttentionModel truth;
  truth.blocked = true;
  truth.efficiency_max = 0.6;
  truth.s_half = 500.0;
  truth.d_half = 60.0;
  truth.overhead_s = 2e-5;
  truth.pair_s = 4e-12;
  truth.memory_bandwidth_bytes_per_s = 3e12;
  truth.device = kH200Bf16;
  Noise noise(5, 0.015);
  const auto samples = attention_samples(truth, noise, {512, 1024, 2048, 4096, 8192}, {64, 128, 192}, 16384, true);
  const auto fit = AttentionModel::fit(samples, false, truth.device, truth.memory_bandwidth_bytes_per_s, true);
  EXPECT_TRUE(fit.blocked);
  EXPECT_NEAR(fit.pair_s, 4e-12, 4e-12 * 0.3);
  EXPECT_NEAR(fit.overhead_s, 2e-5, 2e-5 * 0.3);
  // The compute term as a whole (e_max, s_half and d_half trade against each other).
  AttentionShape big;
  big.batch = 4;
  big.seq_q = big.seq_kv = 4096;
  big.heads = big.kv_heads = 32;
  big.head_dim_qk = big.head_dim_v = 128;
  big.causal = true;
  EXPECT_NEAR(fit.time_s(big), truth.time_s(big), truth.time_s(big) * 0.03);
  // The fused form, fitted to the same points, cannot follow them as well.
  const auto fused = AttentionModel::fit(samples, false, truth.device, truth.memory_bandwidth_bytes_per_s, false);
  double err_blocked = 0, err_fused = 0;
  for (const auto& x : samples) {
    err_blocked += std::abs(fit.time_s(x.shape) / x.seconds - 1.0);
    err_fused += std::abs(fused.time_s(x.shape) / x.seconds - 1.0);
  }
  EXPECT_LT(err_blocked, err_fused);
}

TEST(LinearModel, FitRecoversLatencyAndBandwidthFromNoisyPoints) {
  Noise noise(4, 0.02);
  std::vector<LinearModel::Sample> samples;
  for (double s = 4096; s <= 1 << 30; s *= 2) samples.push_back({s, noise(8e-6 + s / 55e9)});
  const auto fit = LinearModel::fit(samples);
  EXPECT_TRUE(fit.knots_bytes.empty());
  EXPECT_NEAR(fit.alpha_s, 8e-6, 8e-7);
  EXPECT_NEAR(fit.asymptotic_bandwidth_bytes_per_s(), 55e9, 55e9 * 0.02);
}

TEST(LinearModel, TwoSegmentsWhenTheDataHasAKnee) {
  // Pageable copies: fast below 1 MiB (staging buffer), slower above.
  Noise noise(5, 0.01);
  const double knee = 1 << 20;
  std::vector<LinearModel::Sample> samples;
  for (double s = 4096; s <= 1 << 30; s *= 2) {
    const double t = 5e-6 + std::min(s, knee) / 40e9 + std::max(s - knee, 0.0) / 12e9;
    samples.push_back({s, noise(t)});
  }
  const auto fit = LinearModel::fit(samples);
  ASSERT_EQ(fit.knots_bytes.size(), 1U);
  EXPECT_NEAR(fit.bandwidths_bytes_per_s[1], 12e9, 12e9 * 0.03);
  EXPECT_NEAR(fit.time_s(3e8) / (5e-6 + knee / 40e9 + (3e8 - knee) / 12e9), 1.0, 0.03);
}

TEST(LinearModel, FitRefusesASingleSizeAndFlatData) {
  EXPECT_THROW(LinearModel::fit({{4096, 1e-5}, {4096, 1.1e-5}}), FitImpossible);
  EXPECT_THROW(LinearModel::fit({{4096, 2e-5}, {8192, 1e-5}, {16384, 0.5e-5}}), FitImpossible);
}

TEST(CollectiveModel, FitRecoversRampParametersFromNoisyPoints) {
  CollectiveGroupParams p;
  p.group_size = 8;
  p.alpha_s = 12e-6;
  p.beta_max_bytes_per_s = 400e9;
  p.s_half_bytes = 4 << 20;
  p.gamma = 0.6;
  CollectiveModel truth{Collective::all_reduce, {p}, {}};
  Noise noise(6, 0.01);
  std::vector<CollectiveModel::Sample> samples;
  for (double s = 1024; s <= 4.0 * (1 << 30); s *= 2) samples.push_back({8, s, noise(truth.time_s(s, 8))});
  const auto fit = CollectiveModel::fit(Collective::all_reduce, samples);
  ASSERT_EQ(fit.groups.size(), 1U);
  const auto& g = fit.groups[0];
  EXPECT_NEAR(g.alpha_s, 12e-6, 12e-6 * 0.1);
  EXPECT_NEAR(g.beta_max_bytes_per_s, 400e9, 400e9 * 0.05);
  EXPECT_NEAR(g.gamma, 0.6, 0.08);
  EXPECT_NEAR(std::log2(g.s_half_bytes), std::log2(4.0 * (1 << 20)), 0.7);
  for (double s : {3e3, 5e5, 7e7, 2e9}) EXPECT_NEAR(fit.time_s(s, 8) / truth.time_s(s, 8), 1.0, 0.03) << s;
}

TEST(CollectiveModel, FewSizesFitLatencyAndBandwidthOnly) {
  std::vector<CollectiveModel::Sample> samples = {{2, 1 << 20, 10e-6 + (1 << 20) / 300e9},
                                                  {2, 1 << 28, 10e-6 + (1 << 28) / 300e9},
                                                  {2, 1 << 30, 10e-6 + double(1 << 30) / 300e9}};
  const auto fit = CollectiveModel::fit(Collective::send_recv, samples);
  EXPECT_EQ(fit.groups[0].s_half_bytes, 0.0);
  EXPECT_EQ(fit.groups[0].gamma, 1.0);
  EXPECT_NEAR(fit.groups[0].beta_max_bytes_per_s, 300e9, 1e6);
  EXPECT_NEAR(fit.groups[0].alpha_s, 10e-6, 1e-10);
}

TEST(CollectiveModel, FitRefusesGroupOfOneAndSingleSize) {
  EXPECT_THROW(CollectiveModel::fit(Collective::all_reduce, {{1, 1024, 1e-5}, {1, 4096, 2e-5}}), FitImpossible);
  EXPECT_THROW(CollectiveModel::fit(Collective::all_reduce, {{2, 1024, 1e-5}, {2, 1024, 2e-5}}), FitImpossible);
}

TEST(CollectiveModel, UnmeasuredGroupSizesFollowTheDocumentedRules) {
  CollectiveModel m;
  m.kind = Collective::all_reduce;
  m.groups = {{2, 8e-6, 300e9, 8e6, 0.5}, {8, 14e-6, 400e9, 2e6, 0.7}};
  // Between: alpha and gamma linear in log2 n, beta_max and S_half geometric.
  const auto p4 = m.params_for(4);
  EXPECT_NEAR(p4.alpha_s, 11e-6, 1e-15);
  EXPECT_NEAR(p4.gamma, 0.6, 1e-12);
  EXPECT_NEAR(p4.beta_max_bytes_per_s, std::sqrt(300e9 * 400e9), 1.0);
  EXPECT_NEAR(p4.s_half_bytes, std::sqrt(8e6 * 2e6), 1e-6);
  // Above: bandwidth held, alpha extended with the slope of the last two sizes (3 us per doubling).
  const auto p32 = m.params_for(32);
  EXPECT_EQ(p32.beta_max_bytes_per_s, 400e9);
  EXPECT_NEAR(p32.alpha_s, 14e-6 + 2 * 3e-6, 1e-15);
  // Below (and n = 1): the smallest measured size.
  EXPECT_EQ(m.params_for(1).alpha_s, 8e-6);
  EXPECT_EQ(m.time_s(1 << 20, 1), 8e-6);  // f(1) = 0 for all_reduce: only the latency
  // Zero bytes: the latency.
  EXPECT_EQ(m.time_s(0, 4), p4.alpha_s);
}

TEST(ConstantModel, MedianIgnoresAnOutlierRun) {
  EXPECT_EQ(ConstantModel::fit({3.7e-6, 3.8e-6, 3.6e-6, 50e-6, 3.7e-6}).value_s, 3.7e-6);
  EXPECT_THROW(ConstantModel::fit({}), FitImpossible);
}

// host.gemm_call: the split-K boundary, the one-kernel time and the extra kernel's time
// come back from noisy synthetic calls whose kernel count follows a known rule.
TEST(GemmCallModel, FitRecoversTheSplitBoundaryAndBothCosts) {
  Noise noise(21, 0.03);
  const double t_one = 7.4e-6, t_extra = 5.6e-6, truth_ratio = 150.0;
  struct S {
    std::int64_t m, n, k;
  };
  std::vector<GemmCallModel::Sample> samples;
  for (const S s : {S{64, 2560, 640}, S{192, 1536, 1024}, S{128, 1024, 7168}, S{3968, 4096, 2048}, S{32, 640, 2560},
                    S{48, 1280, 1792}, S{16, 2304, 1280}, S{96, 896, 3584}, S{32, 1152, 5120}, S{64, 384, 6144},
                    S{256, 1664, 2304}, S{16, 5120, 896}}) {
    const bool split = static_cast<double>(s.k) / GemmCallModel::tiles(s.m, s.n) >= truth_ratio;
    samples.push_back({s.m, s.n, s.k, split ? 2 : 1, noise(t_one + (split ? t_extra : 0.0))});
  }
  samples.push_back({512, 512, 512, 0, 99e-6});  // unknown kernel count: not fitted
  const auto fit = GemmCallModel::fit(samples);
  EXPECT_NEAR(fit.t_one_s, t_one, 0.05 * t_one);
  EXPECT_NEAR(fit.t_extra_s, t_extra, 0.15 * t_extra);
  // Every point is classified as it was measured (the boundary lies between the two classes).
  for (const auto& s : samples) {
    if (s.nodes > 0) {
      EXPECT_EQ(fit.splits(s.m, s.n, s.k), s.nodes > 1) << s.m << " " << s.n << " " << s.k;
    }
  }
  // A shape never measured: 16 x 768 output (6 tiles), k 3072 (512 per tile) splits; 16 x 3072, k 768 does not.
  EXPECT_TRUE(fit.splits(16, 768, 3072));
  EXPECT_FALSE(fit.splits(16, 3072, 768));
  EXPECT_NEAR(fit.time_s(16, 768, 3072), fit.t_one_s + fit.t_extra_s, 1e-15);
  // Batches multiply the tiles.
  EXPECT_FALSE(fit.splits(16, 768, 3072, 64));
}

TEST(GemmCallModel, WithoutASplitCallItNeverPredictsOneAndWithoutAOneKernelCallItCannotFit) {
  const auto fit = GemmCallModel::fit({{64, 2560, 640, 1, 7e-6}, {128, 1024, 7168, 1, 8e-6}});
  EXPECT_EQ(fit.split_ratio, 0.0);
  EXPECT_EQ(fit.t_extra_s, 0.0);
  EXPECT_FALSE(fit.splits(1, 128, 1 << 20));
  EXPECT_THROW(GemmCallModel::fit({{128, 1024, 7168, 2, 13e-6}}), FitImpossible);
  EXPECT_THROW(GemmCallModel::fit({{128, 1024, 7168, 0, 13e-6}}), FitImpossible);
}

// host.stream_cycle: the median extra per stream count, log2 interpolation from extra(1) = 0 through
// the measured counts, held beyond the largest.
TEST(StreamCycleModel, FitTakesMediansAndInterpolatesTheExtraInLog2FromZeroAtOneStream) {
  const auto fit = StreamCycleModel::fit({{4, 0.4e-6}, {4, 0.5e-6}, {4, 9.0e-6}, {16, 1.3e-6}, {64, 2.9e-6}});
  ASSERT_EQ(fit.streams, (std::vector<int>{4, 16, 64}));
  EXPECT_NEAR(fit.extra_s[0], 0.5e-6, 1e-15);  // median: the 9 us outlier does not move it
  EXPECT_EQ(fit.extra(1), 0.0);
  EXPECT_NEAR(fit.extra(2), 0.25e-6, 1e-12);                 // halfway from (1, 0) to (4, 0.5) in log2
  EXPECT_NEAR(fit.extra(16), 1.3e-6, 1e-12);
  EXPECT_NEAR(fit.extra(32), 1.3e-6 + 0.5 * 1.6e-6, 1e-12);  // halfway from 16 to 64
  EXPECT_NEAR(fit.extra(65), 2.9e-6, 1e-12);                 // held beyond the largest
  EXPECT_THROW(StreamCycleModel::fit({{1, 5e-6}}), FitImpossible);
  EXPECT_THROW(StreamCycleModel::fit({}), FitImpossible);
}

// host.grouped_gemm_call: one matmul per run of equal rows (expert_rows_runs).
TEST(GroupedCallModel, FitRecoversTheCostPerRun) {
  // 64 x 96 balanced: 1 run; 64 experts with a hot one of 288 rows: 3 runs; 6143 rows over 64: 2 runs.
  ASSERT_EQ(expert_rows_runs(6144, 64, 96).size(), 1U);
  ASSERT_EQ(expert_rows_runs(6144, 64, 288).size(), 3U);
  ASSERT_EQ(expert_rows_runs(6143, 64, 96).size(), 2U);
  const auto fit = GroupedCallModel::fit({{64, 6144, 96, 9.0e-6}, {16, 10240, 640, 9.4e-6}, {64, 6144, 288, 24.6e-6},
                                          {64, 6143, 96, 16.9e-6}});
  EXPECT_NEAR(fit.t_one_s, 9.2e-6, 1e-12);
  EXPECT_NEAR(fit.t_run_s, 7.7e-6, 1e-12);  // median of 7.7 and 7.7
  EXPECT_NEAR(fit.time_s(64, 6144, 288), 9.2e-6 + 2 * 7.7e-6, 1e-12);
  EXPECT_THROW(GroupedCallModel::fit({{64, 6144, 288, 24e-6}}), FitImpossible);
}

TEST(ConcurrencyModel, FitRecoversEfficiencyPerStreamCountAndInterpolates) {
  Noise noise(8, 0.01);
  std::vector<ConcurrencyModel::Sample> samples;
  const std::pair<int, double> truth[] = {{2, 0.9}, {4, 0.7}, {8, 0.5}};
  for (const auto& [n, e] : truth) {
    for (double f : {0.05, 0.1, 0.2, 0.3}) {
      const double serial = n * 10e-6;
      samples.push_back({n, f, serial, noise(serial / std::pow(std::min<double>(n, 1 / f), e))});
    }
  }
  const auto fit = ConcurrencyModel::fit(samples);
  ASSERT_EQ(fit.streams, (std::vector<int>{2, 4, 8}));
  EXPECT_NEAR(fit.efficiency[0], 0.9, 0.03);
  EXPECT_NEAR(fit.efficiency[1], 0.7, 0.03);
  EXPECT_NEAR(fit.efficiency[2], 0.5, 0.03);
  EXPECT_EQ(fit.speedup(1, 0.1), 1.0);
  EXPECT_EQ(fit.speedup(4, 1.0), 1.0);  // a kernel that fills the GPU leaves no room
  const double e6 = fit.efficiency[1] + 0.5 * (fit.efficiency[2] - fit.efficiency[1]);
  EXPECT_NEAR(fit.speedup(6, 0.1), std::pow(6.0, e6), 1e-12);
  EXPECT_NEAR(fit.speedup(16, 0.25), std::pow(4.0, fit.efficiency[2]), 1e-12);
}

// ---- per-size correction of the collective model (knots at the measured sizes) ----

namespace {
// A smooth curve times a protocol dip: the time is a quarter longer at 128 MiB than the curve says
// and back on it at 64 and 256 MiB (NCCL's all-reduce on 2 H200: 272 GB/s at 64 MiB, 215 at 128 MiB,
// 257 at 256 MiB).
double stepped_all_reduce_s(double bytes) {
  CollectiveGroupParams p{2, 9e-6, 320e9, 4 << 20, 0.6};
  CollectiveModel smooth{Collective::all_reduce, {p}, {}};
  const double x = std::log2(bytes);
  const double dip = std::max(0.0, 1.0 - std::fabs(x - 27.0));  // 64 MiB .. 128 MiB (deepest) .. 256 MiB
  return smooth.time_s(bytes, 2) * (1.0 + 0.25 * dip);
}
}  // namespace

TEST(CollectiveModel, PerSizeCorrectionFollowsAProtocolStepBetweenMeasuredSizes) {
  Noise noise(11, 0.003);
  std::vector<CollectiveModel::Sample> samples;
  for (double s = 1024; s <= 1 << 30; s *= 2) samples.push_back({2, s + 256, noise(stepped_all_reduce_s(s + 256))});
  const auto smooth = CollectiveModel::fit(Collective::all_reduce, samples, false);
  const auto fit = CollectiveModel::fit(Collective::all_reduce, samples);
  EXPECT_TRUE(smooth.knots.empty());
  ASSERT_EQ(fit.knots.size(), samples.size());  // one knot per measured size
  // Held-out sizes half an octave between the measured ones: the knots follow the step (within the
  // noise plus the interpolation between octaves), the smooth curve alone does not.
  std::vector<double> err_fit;
  std::vector<double> err_smooth;
  for (double s = 1536; s <= 768.0 * (1 << 20); s *= 2) {
    const double truth = stepped_all_reduce_s(s);
    err_fit.push_back(std::fabs(fit.time_s(s, 2) / truth - 1.0));
    err_smooth.push_back(std::fabs(smooth.time_s(s, 2) / truth - 1.0));
  }
  EXPECT_LT(threewalls::calibration::fit::median(err_fit), 0.01);
  EXPECT_LT(*std::max_element(err_fit.begin(), err_fit.end()), 0.03);
  EXPECT_GT(*std::max_element(err_smooth.begin(), err_smooth.end()), 0.10);
  // At a measured size the corrected model reproduces the point (up to its noise: one point per size).
  EXPECT_NEAR(fit.time_s(samples[17].bytes, 2) / samples[17].seconds, 1.0, 1e-9);
}

TEST(CollectiveModel, NoCorrectionWhereTheSmoothCurveFits) {
  CollectiveGroupParams p{4, 12e-6, 350e9, 2 << 20, 0.5};
  const CollectiveModel truth{Collective::all_gather, {p}, {}};
  std::vector<CollectiveModel::Sample> samples;
  for (double s = 4096; s <= 1 << 30; s *= 4) samples.push_back({4, s, truth.time_s(s, 4)});
  const auto fit = CollectiveModel::fit(Collective::all_gather, samples);
  EXPECT_TRUE(fit.knots.empty());
  EXPECT_EQ(fit.correction(1e6, 4), 1.0);
}

TEST(CollectiveModel, CorrectionInterpolatesInLog2SizeHoldsOutsideAndBlendsGroupSizes) {
  CollectiveModel m;
  m.kind = Collective::all_reduce;
  m.groups = {{2, 8e-6, 300e9, 8e6, 0.5}, {8, 14e-6, 400e9, 2e6, 0.7}};
  m.knots = {{2, 1024, 0.1}, {2, 4096, -0.1}, {8, 1024, 0.3}};
  EXPECT_NEAR(std::log(m.correction(2048, 2)), 0.0, 1e-12);  // halfway in log2 S
  EXPECT_NEAR(std::log(m.correction(100, 2)), 0.1, 1e-12);   // held below the smallest knot
  EXPECT_NEAR(std::log(m.correction(1e9, 2)), -0.1, 1e-12);  // and above the largest
  EXPECT_NEAR(std::log(m.correction(1e9, 8)), 0.3, 1e-12);
  EXPECT_NEAR(std::log(m.correction(1e9, 4)), 0.5 * (-0.1 + 0.3), 1e-12);  // log2 4 halfway from 2 to 8
  EXPECT_NEAR(std::log(m.correction(1e9, 1)), -0.1, 1e-12);                // below: the smallest measured n
  EXPECT_NEAR(std::log(m.correction(1e9, 64)), 0.3, 1e-12);                // above: the largest
  // A measured group size without knots counts as no correction in the blend.
  m.knots = {{2, 1024, 0.2}};
  EXPECT_NEAR(std::log(m.correction(1e9, 4)), 0.1, 1e-12);
  EXPECT_EQ(m.correction(1e9, 8), 1.0);
}

TEST(CollectiveModel, CorrectedTimeIsLatencyPlusBytesOverBandwidth) {
  CollectiveModel m;
  m.kind = Collective::reduce_scatter;
  m.groups = {{4, 10e-6, 300e9, 4e6, 0.6}};
  m.knots = {{4, 1e6, 0.2}, {4, 1e8, -0.15}};
  for (double s : {0.0, 1e3, 3e6, 5e9}) {
    const double lat = m.latency_s(s, 4);
    const double c = m.correction(s, 4);
    EXPECT_NEAR(lat, c * 10e-6, 1e-18);
    EXPECT_NEAR(m.bus_bandwidth_bytes_per_s(s, 4), m.params_for(4).bus_bandwidth_bytes_per_s(s) / c, 1e-3);
    const double expected = s > 0 ? lat + s * 0.75 / m.bus_bandwidth_bytes_per_s(s, 4) : lat;
    EXPECT_EQ(m.time_s(s, 4), expected);
  }
}

// ---- residual correction in log-shape space (ShapeCorrection) ------------------------

namespace {

// A smooth structure of the kind the GEMM fits miss: ln c = 0.15 sin(0.7 x0) cos(0.5 x1) + 0.05 (x2 - 12) + 0.1.
double structured_log_factor(const std::array<double, 3>& x) {
  return 0.15 * std::sin(0.7 * x[0]) * std::cos(0.5 * x[1]) + 0.05 * (x[2] - 12.0) + 0.1;
}

struct CorrectionData {
  std::vector<double> features;
  std::vector<double> residuals;
};

// A grid of (log2 m, log2 n, log2 k) like the calibration's, residuals from `r` plus noise.
template <typename F>
CorrectionData correction_grid(F r, double sigma, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, sigma);
  CorrectionData d;
  for (double m = 6; m <= 15; m += 1) {
    for (double n = 9; n <= 14; n += 1) {
      for (double k = 10; k <= 14; k += 2) {
        const std::array<double, 3> x{m, n, k};
        d.features.insert(d.features.end(), x.begin(), x.end());
        d.residuals.push_back(r(x) + (sigma > 0 ? noise(rng) : 0.0));
      }
    }
  }
  return d;
}

}  // namespace

TEST(ShapeCorrection, RecoversASmoothResidualStructureBetweenTheGridPoints) {
  const auto d = correction_grid(structured_log_factor, 0.01, 3);
  const auto c = ShapeCorrection::fit(3, d.features, d.residuals);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.dims, 3u);
  // Shapes between the grid points (never centres), inside the grid: the correction follows the
  // structure to within a fraction of its size, where "no correction" would miss by the whole of it.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double err = 0.0;
  double size = 0.0;
  for (int i = 0; i < 200; ++i) {
    const std::array<double, 3> x{6.5 + 8 * u(rng), 9.5 + 4 * u(rng), 10.5 + 3 * u(rng)};
    err += std::fabs(c.log_factor_at(x.data()) - structured_log_factor(x));
    size += std::fabs(structured_log_factor(x));
  }
  EXPECT_GT(size / 200, 0.1);
  EXPECT_LT(err, 0.25 * size);
}

TEST(ShapeCorrection, IsAbsentOrNegligibleWithoutStructure) {
  // Residuals of pure noise (2%) and exact zeros: no correction, or one far below the noise.
  const auto noise = correction_grid([](const std::array<double, 3>&) { return 0.0; }, 0.02, 5);
  const auto c = ShapeCorrection::fit(3, noise.features, noise.residuals);
  for (const std::array<double, 3> x : {std::array<double, 3>{7.5, 10.3, 11.1}, {11.7, 9.4, 13.3}, {13.4, 11.5, 10.6}}) {
    EXPECT_LT(std::fabs(c.log_factor_at(x.data())), 0.01);
  }
  const auto zero = correction_grid([](const std::array<double, 3>&) { return 0.0; }, 0.0, 5);
  EXPECT_TRUE(ShapeCorrection::fit(3, zero.features, zero.residuals).empty());
  // Too few points: none.
  std::vector<double> few_f(3 * (kShapeCorrectionMinPoints - 1), 1.0);
  std::vector<double> few_r(kShapeCorrectionMinPoints - 1, 0.3);
  EXPECT_TRUE(ShapeCorrection::fit(3, few_f, few_r).empty());
}

TEST(ShapeCorrection, MultipliesTheRooflineAndGroupedTimes) {
  GemmModel g = truth_gemm();
  const double roofline = g.time_s(3000, 5120, 1536);
  const auto d = correction_grid(structured_log_factor, 0.0, 1);
  g.correction = ShapeCorrection::fit(3, d.features, d.residuals);
  ASSERT_FALSE(g.correction.empty());
  const auto x = gemm_correction_features(3000, 5120, 1536);
  EXPECT_DOUBLE_EQ(g.roofline_time_s(3000, 5120, 1536), roofline);
  EXPECT_NEAR(g.time_s(3000, 5120, 1536) / (roofline * std::exp(g.correction.log_factor_at(x.data()))), 1.0, 1e-12);
  EXPECT_NE(g.time_s(3000, 5120, 1536), roofline);

  GroupedGemmModel gg;
  gg.tile_m = gg.tile_n = 128;
  gg.efficiency_max = 0.7;
  gg.k_half = 400;
  gg.overhead_s = 5e-6;
  gg.memory_bandwidth_bytes_per_s = 4e12;
  gg.device = kH200Bf16;
  const double plain = gg.time_s(32, 8192, 512, 2048, 1024);
  gg.correction.dims = 5;
  gg.correction.features = {std::log2(256.0), 5.0, 11.0, 10.0, 1.0};
  gg.correction.log_factor = {0.1};
  gg.correction.bandwidth = 1.0;
  gg.correction.prior_weight = 0.0;  // one centre, no prior: c = e^0.1 everywhere
  EXPECT_NEAR(gg.time_s(32, 8192, 512, 2048, 1024) / plain, std::exp(0.1), 1e-12);
  EXPECT_DOUBLE_EQ(gg.parametric_time_s(32, 8192, 512, 2048, 1024), plain);
}

TEST(ExpertDispatchModel, FitsTheMedianRatePerGroupSizeAndInterpolatesInLog2) {
  std::vector<ExpertDispatchModel::Sample> s;
  for (const auto& [n, d, c] : {std::tuple{16, 40e9, 44e9}, {64, 50e9, 60e9}}) {
    s.push_back({n, 0, 1e8, 1e8 / d});
    s.push_back({n, 0, 2e8, 2e8 / (d * 1.1)});  // a second, faster dispatch point: the median of two
    s.push_back({n, 0, 1e8, 1e8 / (d * 0.9)});
    s.push_back({n, 1, 1e8, 1e8 / c});
  }
  const auto m = ExpertDispatchModel::fit(s);
  ASSERT_EQ(m.group_size, (std::vector<int>{16, 64}));
  EXPECT_NEAR(m.bandwidth(16, 0), 40e9, 1e-3);
  EXPECT_NEAR(m.bandwidth(64, 1), 60e9, 1e-3);
  EXPECT_NEAR(m.bandwidth(32, 0), 45e9, 1e-3);   // halfway in log2 between 16 and 64
  EXPECT_NEAR(m.bandwidth(8, 1), 44e9, 1e-3);    // held below the first group size
  EXPECT_NEAR(m.bandwidth(256, 0), 50e9, 1e-3);  // and above the last
  EXPECT_THROW((void)ExpertDispatchModel::fit({}), FitImpossible);
  EXPECT_THROW((void)ExpertDispatchModel::fit({{16, 2, 1e8, 1e-3}}), FitImpossible);
  EXPECT_THROW((void)ExpertDispatchModel::fit({{16, 0, 1e8, 1e-3}}), FitImpossible);  // no combine at 16
  EXPECT_THROW((void)ExpertDispatchModel::fit({{16, 0, 1e8, 0.0}, {16, 1, 1e8, 1e-3}}), FitImpossible);
}
