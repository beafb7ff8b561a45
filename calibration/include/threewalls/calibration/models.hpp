#pragma once
// The fitted cost models of a calibration profile: one struct per model family, each with the
// equation it evaluates (`time_s`) and the fit that produces it from raw points (`fit`). Pure
// functions of their parameters: no I/O, no Profile, no Eigen in this header. The equations are
// restated, with their justification, in docs/calibration.md.
//
// Units: every `_s` is seconds, `_bytes` bytes, `_bytes_per_s` bytes per second, `_flop_per_s`
// FLOP per second; shapes are element counts. Parameters are SI doubles because they are read from
// and written to the profile file; the CostModel wraps results in the unit types of core/units.hpp.
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "threewalls/calibration/cost_model.hpp"

namespace threewalls::calibration {

// A model cannot be fitted from the points given (too few, degenerate, nonsensical). The builder
// turns it into an InputError naming the family; leave-one-out treats it as "no prediction".
class FitImpossible : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the compute models need to know about the GPU (from the profile's [hardware] table).
struct DeviceConstants {
  int sm_count = 0;
  double peak_flop_per_s = 0.0;  // datasheet dense peak of the dtype in question
};

// Bytes per element of A/B (inputs) and C (output) for a dtype: fp8 GEMMs write bf16.
struct ElementBytes {
  int input = 2;
  int output = 2;
};
ElementBytes element_bytes(DType dt);

// ---------------------------------------------------------------------------------------------
// Residual correction in log-shape space (optional part of gemm.fp8 and grouped_gemm.*).
//
// After the parametric fit, each fit point j has a log residual r_j = ln(t_measured / t_model) and a
// feature vector x_j of log2 shape coordinates (dense: m, n, k; grouped: rows per expert, groups, n,
// k, skew = max_rows groups / total_rows). A shape x is corrected by a Gaussian kernel average of the
// residuals, shrunk towards 0 by a prior weight w0 (a pseudo-point with r = 0):
//   ln c(x) = sum_j w_j r_j / (w0 + sum_j w_j),   w_j = exp(-|x - x_j|^2 / (2 h^2))
//   t(x)    = c(x) t_model(x)
// The bandwidth h (log2 units, isotropic) and w0 are chosen on the fit points only, by leave-one-out
// of the correction itself (each r_j predicted from the others; least sum of squared log errors)
// over kShapeCorrectionBandwidths x kShapeCorrectionPriorWeights; "no correction" (c = 1) competes and
// wins when no pair predicts the residuals better than 0. Far from every fit point c -> 1 (w0 > 0)
// or the nearest points' mean (w0 = 0). A model of shape, like the collectives' per-size knots: a
// new shape is never one of the measured ones.
inline constexpr std::size_t kShapeCorrectionMinPoints = 16;
inline constexpr std::array<double, 8> kShapeCorrectionBandwidths = {0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0};
inline constexpr std::array<double, 4> kShapeCorrectionPriorWeights = {0.0, 0.25, 1.0, 4.0};

struct ShapeCorrection {
  std::size_t dims = 0;               // features per point (0: no correction)
  std::vector<double> features;       // centres, row-major: point j's features at [j dims, (j+1) dims)
  std::vector<double> log_factor;     // r_j per centre
  double bandwidth = 0.0;             // h, log2 units
  double prior_weight = 0.0;          // w0

  [[nodiscard]] bool empty() const { return log_factor.empty(); }
  // ln c(x); 0 without a correction. `x` has `dims` entries.
  [[nodiscard]] double log_factor_at(const double* x) const;

  // Chooses h and w0 by leave-one-out over the points (features row-major, `dims` per point); an empty
  // correction when "no correction" predicts the residuals at least as well, or with fewer than
  // kShapeCorrectionMinPoints points.
  static ShapeCorrection fit(std::size_t dims, const std::vector<double>& features,
                             const std::vector<double>& log_residuals);
};

// log2 features of the corrections (the formulas above).
std::array<double, 3> gemm_correction_features(std::int64_t m, std::int64_t n, std::int64_t k);
std::array<double, 5> grouped_correction_features(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                                  std::int64_t n, std::int64_t k);

// ---------------------------------------------------------------------------------------------
// Dense GEMM ("gemm_roofline_v2")
//
//   F     = 2 m n k b                                 (b = batch of independent products)
//   B     = b (m k + k n) e_in + b m n e_out          (bytes read and written once)
//   eff   = e_max * k / (k + k_half)                  (K-loop prologue/epilogue amortisation)
//   t     = max( (F + tail * 2 k T_m T_n SMs) / (P eff),  B / BW ) + t0
//
// Besides its FLOPs a GEMM pays the K loop of `tail` waves of T_m x T_n output tiles (wave_tail):
// the ramp and the partly idle last wave, which cuBLAS's split-K / stream-K kernels on Hopper spread
// smoothly over shapes instead of the hard ceil(tiles / SMs) steps of a single fixed tile. Written
// as an efficiency it is a fill curve, eff * w / (w + tail) with w = b m n / (T_m T_n SMs) full waves
// of tiles: small GEMMs fill the GPU poorly, large ones do not notice. Small-m GEMMs (decode) are
// bound by reading the weights (B / BW); t0 is the fixed device-side cost of a GEMM call.
// Fitted on relative residuals by multi-start Levenberg-Marquardt: e_max in (0, 1) (logistic),
// k_half, tail and t0 (log-parameters). T_m = T_n = 128 is the unit of the tail (and the tile the
// grouped GEMM model takes over). BW is the measured HBM copy bandwidth (read + write) from
// copy.d2d, P the datasheet peak. Replaces gemm_wave_v1 (t = max(F / (P eff q), B / BW) + t0 with a
// hard wave quantisation q), which missed cuBLAS's measured H100 times by 16% in the median
// (docs/validation/calibration_h100_2026-11-22.md).
struct GemmModel {
  int tile_m = 128;
  int tile_n = 128;
  double efficiency_max = 0.0;
  double k_half = 0.0;
  double wave_tail = 0.0;  // waves of tiles whose K loop every GEMM pays on top of its FLOPs
  double overhead_s = 0.0;
  double memory_bandwidth_bytes_per_s = 0.0;
  DeviceConstants device;
  ElementBytes elements;
  // Optional residual correction (ShapeCorrection above; empty: the roofline alone).
  ShapeCorrection correction;

  // The roofline times c(m, n, k) (batch is not a feature: each product has the shape m x n x k).
  [[nodiscard]] double time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1) const;
  // The roofline alone (what the parametric fit fits).
  [[nodiscard]] double roofline_time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1) const;

  struct Sample {
    std::int64_t m, n, k, batch;
    double seconds;
  };
  struct Tile {
    int m, n;
  };
  // Tile units the fit tries (the one with the least RMS relative error is kept): 128 x 128.
  static const std::vector<Tile>& default_tiles();
  // Throws FitImpossible with fewer than 4 samples.
  static GemmModel fit(const std::vector<Sample>& samples, const DeviceConstants& device, ElementBytes elements,
                       double memory_bandwidth_bytes_per_s, const std::vector<Tile>& tiles = default_tiles());
};

// ---------------------------------------------------------------------------------------------
// Grouped GEMM ("grouped_gemm_wave_v1"): one kernel over `groups` GEMMs of r_g x n x k.
//
// Only the total rows R and the largest group r_max are known. The critical (largest) group is
// tiled with its own rows; the others with their mean r_o = (R - r_max) / (groups - 1):
//   tiles = ceil(n / T_n) (ceil(r_max / T_m) + (groups - 1) ceil(r_o / T_m))
//   waves = ceil(tiles / SMs)
//   t     = max( waves * 2 T_m T_n (k + k_half) / (P_sm e_max),  B / BW ) + t0
// with P_sm = P / SMs and B = (R k + groups k n) e_in + R n e_out. Unlike the dense model, every
// tile costs a full tile: a grouped kernel runs one tile shape for all groups, so a group of 10
// rows pays for T_m rows. T_m, T_n and k_half are taken from the dense GEMM fit of the same dtype;
// fitted: e_max in (0, 1) and t0 (with fewer than 3 points only e_max, t0 taken from the dense fit).
//
// Batched-calls form (bf16 only, used when the family has the optional `wave_tail` and
// `call_overhead_s`, fitted from 3 or more points): the backend's grouped GEMM (OpRunner's default,
// GroupedImpl::lt_batched) launches one strided-batched cuBLASLt matmul per run of consecutive
// experts with equal rows. The rows follow backend::expert_rows(R, groups, r_max): balanced, R / groups
// each with the remainder on the first experts (1 or 2 runs); with a hot expert, r_max on expert 0
// and the rest shared evenly by the others (up to 3 runs). Each run c of b_c experts of m_c rows is
// costed by the dense GEMM model of the same dtype (gemm_roofline_v2, its e_max, k_half, wave_tail):
//   t = sum_c (t_dense(m_c, n, k, b_c) - t0_dense) + t0 + (runs - 1) t_call
// with t_call = the dense t0 (one more kernel), and t0 fitted (the only parameter fitted on the
// grouped points). `expert_rows_runs` gives the runs.
std::vector<std::pair<std::int64_t, std::int64_t>> expert_rows_runs(std::int64_t total_rows, std::int64_t groups,
                                                                    std::int64_t max_rows);  // (m_c, b_c)

struct GroupedGemmModel {
  int tile_m = 128;
  int tile_n = 128;
  double efficiency_max = 0.0;
  double k_half = 0.0;
  double overhead_s = 0.0;
  double memory_bandwidth_bytes_per_s = 0.0;
  DeviceConstants device;
  ElementBytes elements;
  // Batched-calls form when true (wave_tail and call_overhead_s from the dense fit); wave form else.
  bool batched_calls = false;
  double wave_tail = 0.0;
  double call_overhead_s = 0.0;
  // Optional residual correction (ShapeCorrection above; empty: the parametric form alone).
  ShapeCorrection correction;

  [[nodiscard]] double time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows, std::int64_t n,
                              std::int64_t k) const;
  // The parametric form alone (what the parametric fit fits).
  [[nodiscard]] double parametric_time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                         std::int64_t n, std::int64_t k) const;

  struct Sample {
    std::int64_t groups, total_rows, max_rows, n, k;
    double seconds;
  };
  // `batched_calls_form`: fit the batched-calls form when there are 3 or more points (bf16: what the
  // backend runs); else, and for fp8 / fp32 (no backend grouped kernel to model), the wave form.
  static GroupedGemmModel fit(const std::vector<Sample>& samples, const GemmModel& dense,
                              bool batched_calls_form = false);
};

// ---------------------------------------------------------------------------------------------
// Attention ("attention_wave_v1": the unfused families; its scheduled form "attention_tiles_v1": the
// fused families), one model for forward and one for backward.
//
//   pairs = s_q s_kv, or for causal (bottom-right aligned mask) sum_i clamp(i + s_kv - s_q + 1, 0, s_kv)
//   F_fwd = 2 b h pairs (d_qk + d_v)               F_bwd = 2 b h pairs (3 d_qk + 2 d_v)
//   L     = pairs / s_q                            (mean keys per query row: causal halves it)
//   tiles = b h ceil(s_q / T_q),  waves = ceil(tiles / SMs),  q = tiles / (waves SMs)
//   eff   = e_max * L / (L + s_half) * d_qk / (d_qk + d_half)
//   t     = max( F / (P eff q),  B / BW ) + t0
// B counts Q, K, V, O once (backward also dQ, dK, dV, dO); K and V have kv_heads heads.
// T_q = 128 query rows per CTA (FlashAttention-2/3 on Hopper). Fitted: e_max in (0, 1), s_half,
// d_half, t0 (Levenberg-Marquardt, relative residuals). Attention has no dtype argument: bf16 peak.
//
// Blocked form (optional `pair_s` present; what calibrate fits): the backend's
// unfused attention (cuBLASLt GEMMs for S = Q K^T and O = P V with a softmax kernel between, over
// blocks of kAttentionCausalBlock query rows under a causal mask) computes every pair of a block
// up to the block's last row, and passes the score matrix through memory between its kernels:
//   pairs_c = sum over blocks of rows x keys visible to the block's last row (non-causal: s_q s_kv)
//   F, L, eff as above with pairs_c;   t = max( F / (P eff q) + b h pairs_c pair_s,  B / BW ) + t0
// (s_q = 512 causal: pairs_c = s_q^2, twice the mask's pairs; the old form priced the mask's pairs
// and was 16-19% fast on the Switch-like layers of docs/validation/host_overhead.md.)
//
// Scheduled form ("attention_tiles_v1", the fused families): the same parameters, but the tiles are
// placed on the SMs one by one instead of counted in whole waves. A forward tile is 128 query rows of
// one (batch, head), a backward tile 128 key rows (the FlashAttention backward loops over the queries
// that see its keys); its work is the mean number of keys (forward) or queries (backward) its first
// and last row pair with, k_i. With every tile's time
//   d_i = (k_i + s_half) · 2 T (d_qk + d_v) · SMs / (P e_max d_qk / (d_qk + d_half))   (backward: 3 d_qk + 2 d_v)
// the tiles go, batch and head outermost and blocks in ascending order, each to the SM that frees
// first (list scheduling; the order is the one that predicted the calibration's held-out points best,
// docs/calibration.md), and
//   t = max( makespan,  B / BW ) + t0.
// Under a causal mask tiles differ in work, so a few tiles per SM leave SMs idle at the end that the
// wave count does not see, and whole-wave counting charges a step where the measured time has none.
//
// Per-kernel form ("attention_tiles_v2", the fused families): the scheduled form with the
// head-dimension factor e_max d_qk / (d_qk + d_half) replaced by one efficiency per measured head
// dimension and mask, e(d_qk, causal), linear in d_qk between the measured head dimensions and the
// nearest one's outside. Flash-attention kernels are built per head dimension and mask (tile sizes,
// pipelining and register use differ), so their efficiencies do not follow one saturating curve: on
// both calibrated GPUs the d_qk = 192 (MLA) kernels run below the d_qk = 128 curve's extrapolation,
// and the unmasked d_qk = 192 backward 35-40% below the masked one per unit of work.
// Fitted: s_half, t0 and e in (0, 1) for each (head dimension, mask) with points; a head dimension
// measured under one mask only takes that efficiency for the other.
// (AttentionShape is declared in cost_model.hpp.)
inline constexpr std::int64_t kAttentionCausalBlock = 512;  // backend/src/attention.cpp kCausalBlock
// Number of (query, key) pairs the mask lets through; `window` > 0 (causal only): a sliding window of
// that many keys per query (core/attention_mask.hpp).
double attention_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, std::int64_t window = 0);
// Pairs the blocked (unfused) implementation computes: whole blocks of kAttentionCausalBlock rows, each
// against the keys from its first row's window start (0 without a window) to its last row's diagonal.
double attention_computed_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, std::int64_t window = 0);
double attention_flops(const AttentionShape& s, bool backward);
// The work of each `tile`-row tile of one (batch, head) in the fused forms' list schedule, in keys
// (forward: query tiles) or queries (backward: key tiles) per row, launch order (models.cpp).
std::vector<double> attention_tile_work(const AttentionShape& s, bool backward, int tile);

struct AttentionModel {
  int tile_q = 128;
  double efficiency_max = 0.0;
  double s_half = 0.0;
  double d_half = 0.0;
  double overhead_s = 0.0;
  double memory_bandwidth_bytes_per_s = 0.0;
  bool backward = false;
  bool blocked = false;  // the blocked form (pair_s)
  bool scheduled = false;  // the scheduled form (attention_tiles_v1)
  double pair_s = 0.0;   // seconds per computed (query, key) pair and head: the score matrix's memory passes
  // Per-kernel form: head_dims increasing (d_qk), head_dim_efficiency[i] the fraction of the peak at
  // head_dims[i] under a causal mask, head_dim_efficiency_unmasked[i] without one (same size; empty:
  // the causal values); empty head_dims: e_max d_qk / (d_qk + d_half) for both.
  std::vector<double> head_dims;
  std::vector<double> head_dim_efficiency;
  std::vector<double> head_dim_efficiency_unmasked;
  DeviceConstants device;  // bf16 peak

  [[nodiscard]] double time_s(const AttentionShape& s) const;
  // The head-dimension part of the efficiency at d_qk, under a causal mask or none (the form's).
  [[nodiscard]] double head_dim_factor(double dqk, bool causal) const;

  struct Sample {
    AttentionShape shape;
    double seconds;
  };
  // Throws FitImpossible with fewer than 4 samples (5 for the blocked form).
  static AttentionModel fit(const std::vector<Sample>& samples, bool backward, const DeviceConstants& device,
                            double memory_bandwidth_bytes_per_s, bool blocked = false, bool scheduled = false);
  // The per-kernel form (scheduled): one efficiency per (distinct d_qk, mask) of the samples. Throws
  // FitImpossible with fewer samples than parameters + 1.
  static AttentionModel fit_per_head_dim(const std::vector<Sample>& samples, bool backward,
                                         const DeviceConstants& device, double memory_bandwidth_bytes_per_s);
};

// ---------------------------------------------------------------------------------------------
// Decode attention: one new query per sequence against a KV cache of seq_kv rows (the backend's
// split-KV kernel, DecodeAttention; every cached key visible).
//
//   B = 2 b kv_heads seq_kv (d_qk + d_v)       bytes of K and V read (bf16), once per KV head
//   F = 2 b heads seq_kv (d_qk + d_v)          FLOPs (scores and the weighted sum)
//
// "attention_decode_v1" (bytes and FLOPs): t = t0 + B per_byte + F per_flop. Linear in (1, B, F):
// non-negative weighted least squares with weights 1/t^2 (relative error). Needs >= 3 points and a
// positive per_byte. It ignores how the kernel fills the GPU: a few sequences of a long cache, or
// splits just over a round of keys, are off by 15-30%.
//
// "attention_decode_v2" (waves of the split-KV kernel): the launch geometry of
// threewalls/core/decode_attention_geometry.hpp on the profile's SMs gives the splits S of each
// (sequence, kv head), the blocks (b kv_heads S), the busiest SM's blocks L = ceil(blocks / SMs) and
// the rounds R a block walks (its split's keys in rounds of 4 warps x 32 keys, rounded up). A round
// costs the block (d_qk + d_v) (per_round_dim + g per_round_head_dim), g = heads / kv_heads query
// heads scoring each key; the busiest SM runs its L blocks one after another; K and V cannot stream
// faster than `bandwidth`; the combine kernel walks the S partial results of each query head:
//   t = t0 + S per_split + max(L R (d_qk + d_v) (per_round_dim + g per_round_head_dim), B / bandwidth)
// Fitted by Levenberg-Marquardt on log-parameters (relative error, several starts). Needs >= 6 points
// and the SM count of the profile's hardware.
double decode_attention_kv_bytes(const AttentionShape& s);
double decode_attention_flops(const AttentionShape& s);

struct DecodeAttentionModel {
  bool waves = false;       // the v2 form
  double overhead_s = 0.0;  // t0
  // v1
  double per_byte_s = 0.0;  // seconds per byte of K and V read (1 / bandwidth)
  double per_flop_s = 0.0;  // seconds per FLOP beyond the read
  // v2
  double per_split_s = 0.0;            // the combine kernel, per split of the cache
  double per_round_dim_s = 0.0;        // a block's round of keys, per head dimension (d_qk + d_v)
  double per_round_head_dim_s = 0.0;   // and per query head and head dimension
  double bandwidth_bytes_per_s = 0.0;  // the K/V stream's limit
  int sm_count = 0;                    // the profile's SMs (the kernel's split rule and waves)

  [[nodiscard]] double time_s(const AttentionShape& s) const;

  struct Sample {
    AttentionShape shape;
    double seconds;
  };
  static DecodeAttentionModel fit(const std::vector<Sample>& samples);
  // The v2 form; throws FitImpossible with fewer than 6 samples or no SM count.
  static DecodeAttentionModel fit_waves(const std::vector<Sample>& samples, int sm_count);
};

// ---------------------------------------------------------------------------------------------
// Latency + bandwidth, piecewise by size ("linear_v1"): element-wise, norm and copy kernels.
//
//   t(S) = alpha + sum_j |[x_{j-1}, x_j) ∩ [0, S)| / beta_j        x_0 = 0, x_J = inf
// i.e. continuous and piecewise linear in S with knots x_j. One segment (t = alpha + S / beta) unless
// the data needs two: with at least 6 distinct sizes, a knot is tried at every interior size (3
// sizes on each side at least) and kept when it cuts the weighted squared error by 4x and the
// one-segment fit misses some point by more than 5%. Fit: non-negative weighted least squares
// with weights 1/t^2 (relative error).
struct LinearModel {
  double alpha_s = 0.0;
  std::vector<double> knots_bytes;             // size J-1, increasing
  std::vector<double> bandwidths_bytes_per_s;  // size J >= 1

  [[nodiscard]] double time_s(double bytes) const;
  // Bandwidth of the last (largest-size) segment.
  [[nodiscard]] double asymptotic_bandwidth_bytes_per_s() const { return bandwidths_bytes_per_s.back(); }

  struct Sample {
    double bytes;
    double seconds;
  };
  static LinearModel fit(const std::vector<Sample>& samples);
};

// ---------------------------------------------------------------------------------------------
// Collectives ("collective_hill_v1"), one model per kind and scope, parameters per group size n.
//
//   t(S, n)     = alpha_n + S f(n) / beta_eff(S, n)
//   beta_eff    = beta_max,n S^g / (S^g + S_half,n^g)      (g = gamma_n in (0, 1])
// equivalently t = alpha + f S / beta_max + c S^(1-g) with c = f S_half^g / beta_max: latency, a
// bandwidth term and a sub-linear ramp (NCCL's protocol and chunk pipelining at medium sizes).
// For fixed g the model is linear in (alpha, 1/beta_max, c): non-negative weighted least squares
// (weights 1/t^2) on a grid of g, refined. With fewer than 5 distinct sizes for a group size the
// ramp is dropped (c = 0, S_half = 0, g = 1: t = alpha + f S / beta_max).
//
// Group sizes not measured (documented in docs/calibration.md):
//   n between two measured sizes: alpha, gamma linear in log2 n; beta_max, S_half geometric.
//   n above the largest measured: beta_max, S_half, gamma of the largest (nccl-tests bus bandwidth is
//     built to be independent of n); alpha extrapolated linearly in log2 n with the slope of the two
//     largest measured sizes (never decreasing), held if only one size was measured.
//   n below the smallest measured (including 1): the smallest measured size's parameters.
struct CollectiveGroupParams {
  int group_size = 0;
  double alpha_s = 0.0;
  double beta_max_bytes_per_s = 0.0;
  double s_half_bytes = 0.0;
  double gamma = 1.0;

  // beta_eff(S); for S = 0, beta_eff at 1 byte (the time is alpha either way).
  [[nodiscard]] double bus_bandwidth_bytes_per_s(double bytes) const;
};

// Per-size correction (optional; profiles without it use the smooth curve alone, as before):
//   t(S, n) = c(S, n) (alpha_n + S f(n) / beta_eff(S, n))
//   ln c(S, n) = r_n(log2 S), piecewise linear in log2 S through knots (log2 S_j, r_j) at the
//                measured sizes S_j of group size n, held constant outside them;
//   r_j = mean over the fit points at S_j of ln(t / smooth curve).
// NCCL switches protocol and algorithm with size (bus bandwidth not monotonic: all-reduce on 2 H200
// 272 GB/s at 64 MiB, 215 at 128 MiB, 257 at 256 MiB); the smooth curve cannot follow those steps,
// the knots do. A group size whose curve misses no measured size by more than
// kCollectiveCorrectionMin gets no knots. Group sizes not measured: r of the nearest measured
// size below / above, blended linearly in log2 n between two measured sizes.
// For a flow simulator: latency = c alpha and bus bandwidth = beta_eff / c, so that
// latency + S f / bandwidth is the same t.
inline constexpr double kCollectiveCorrectionMin = 0.005;

struct CollectiveCorrectionKnot {
  int group_size = 0;
  double bytes = 0.0;
  double log_factor = 0.0;  // r_j = ln c at this size
};

struct CollectiveModel {
  Collective kind = Collective::all_reduce;
  std::vector<CollectiveGroupParams> groups;  // sorted by group_size, at least one
  // Sorted by (group_size, bytes); empty: no correction (collective_hill_v1 without knots).
  std::vector<CollectiveCorrectionKnot> knots;

  // Parameters for any n >= 1 by the interpolation rules above.
  [[nodiscard]] CollectiveGroupParams params_for(int group_size) const;
  // c(S, n) of the per-size correction (1 without knots).
  [[nodiscard]] double correction(double bytes, int group_size) const;
  // latency = c alpha and bus bandwidth = beta_eff / c: what CostModel::collective_params returns.
  [[nodiscard]] double latency_s(double bytes, int group_size) const;
  [[nodiscard]] double bus_bandwidth_bytes_per_s(double bytes, int group_size) const;
  // t = latency + (S f(n)) / bus bandwidth: exactly the expression a flow simulator evaluates.
  [[nodiscard]] double time_s(double bytes, int group_size) const;

  struct Sample {
    int group_size;
    double bytes;
    double seconds;
  };
  // Throws FitImpossible when a group size has fewer than 2 distinct sizes, a group size < 2 is
  // given, or the times do not grow with size. `with_correction = false`: the smooth curve alone.
  static CollectiveModel fit(Collective kind, const std::vector<Sample>& samples, bool with_correction = true);
};

// ---------------------------------------------------------------------------------------------
// Host costs ("median_v1"): t = median of the points' medians (robust to an outlier run).
struct ConstantModel {
  double value_s = 0.0;
  [[nodiscard]] double time_s() const { return value_s; }
  static ConstantModel fit(const std::vector<double>& seconds);
};

// ---------------------------------------------------------------------------------------------
// Host time of one cuBLASLt GEMM call as OpRunner makes it ("gemm_call_v1"). A call
// launches one kernel, or more when cuBLASLt's heuristic splits K (a reduction kernel, or a memset
// of the output before atomic accumulation); each further launch costs the host about as much again. Split-K pays off
// when the output has few tiles for a long reduction, so the call is predicted to split when
//   k / tiles >= split_ratio,   tiles = ceil(m / 128) ceil(n / 128) batch
// and costs
//   t = t_one + split * t_extra   (t_extra per further node; the fit assumes one).
// Fit: t_one = median of the points whose call launched one node (counted by graph capture),
// t_extra = median over the others of (t - t_one) / (nodes - 1), split_ratio = the boundary in
// k / tiles that misclassifies the fewest points (the widest gap in log k / tiles among ties);
// split_ratio = 0: no point split (never predicted). Points with an unknown count (0) are not fitted.
struct GemmCallModel {
  double t_one_s = 0.0;
  double t_extra_s = 0.0;
  double split_ratio = 0.0;

  [[nodiscard]] static double tiles(std::int64_t m, std::int64_t n, std::int64_t batch = 1);
  [[nodiscard]] bool splits(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1) const;
  [[nodiscard]] double time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1) const;

  struct Sample {
    std::int64_t m, n, k;
    int nodes;  // graph nodes one call launched, kernels and memsets (0: unknown)
    double seconds;
  };
  // Throws FitImpossible without a one-node point.
  static GemmCallModel fit(const std::vector<Sample>& samples);
};

// Host time of one grouped-GEMM call of OpRunner's lt_batched implementation ("grouped_call_v1"):
// one strided-batched cuBLASLt matmul per run of experts with equal rows (expert_rows_runs: 1 or 2
// runs when balanced, up to 3 with a hot expert), so
//   t = t_one + (runs - 1) t_run.
// Fit: t_one = median of the one-run points, t_run = median over the others of (t - t_one) / (runs - 1)
// (0 without such points).
struct GroupedCallModel {
  double t_one_s = 0.0;
  double t_run_s = 0.0;

  [[nodiscard]] double time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows) const;

  struct Sample {
    std::int64_t groups, total_rows, max_rows;
    double seconds;
  };
  // Throws FitImpossible without a one-run point.
  static GroupedCallModel fit(const std::vector<Sample>& samples);
};

// Extra host time per launch when the launches rotate over N streams, each with its own cuBLASLt
// handle, as threewalls run's OpRunners do ("stream_cycle_v1": spreading a MoE layer's
// experts over 64 streams made every launch of the layer slower on the host, not only the stream
// waits). A point issues visits of five launches (kernel, GEMM call, kernel, GEMM call, kernel) on
// one stream, then moves to the next stream, and the same visits all on one stream, back to back
// (one, N, one again, so that a drift of the host's speed cancels); a sample is the difference in
// host seconds per launch. Per measured N the median (>= 0); other N interpolate linearly in log2 N
// from extra(1) = 0 through the measured N, holding the largest measured value beyond it.
struct StreamCycleModel {
  std::vector<int> streams;     // measured stream counts, increasing, >= 2
  std::vector<double> extra_s;  // extra host seconds per launch, per entry of `streams`

  [[nodiscard]] double extra(int n) const;

  struct Sample {
    int streams;
    double seconds;  // extra host seconds per launch over one stream
  };
  // Throws FitImpossible without points or with a stream count below 2.
  static StreamCycleModel fit(const std::vector<Sample>& samples);
};

// ---------------------------------------------------------------------------------------------
// Multi-stream concurrency ("concurrency_v1").
//
// A point runs `n` identical kernels, each using a fraction f of the SMs, on n streams at once
// (measured time t) and back to back on one stream (serial time, an input). Speed-up s = serial / t.
// The ideal speed-up is I = min(n, 1 / f) (no more kernels than streams, no more than fit on the GPU):
//   s(n, f) = I^e(n)
// e(n) = 1: ideal overlap; 0: none; < 0: concurrency hurts. Per measured stream count, e is the median
// of ln s / ln I over its points with I > 1; other stream counts interpolate e linearly in n and
// hold the nearest measured value outside; n = 1 gives s = 1.
struct ConcurrencyModel {
  std::vector<int> streams;        // increasing, each >= 2
  std::vector<double> efficiency;  // e(n) per entry of `streams`

  [[nodiscard]] double speedup(int streams_count, double sm_fraction) const;

  struct Sample {
    int streams;
    double sm_fraction;
    double serial_s;
    double seconds;
  };
  static ConcurrencyModel fit(const std::vector<Sample>& samples);
};

// ---------------------------------------------------------------------------------------------
// Compute kernels beside a resident NCCL kernel ("nccl_resident_v2", family nccl.interference).
//
// An NCCL kernel holds SMs (one CTA per channel) from the moment its stream reaches it until it
// completes, including the time it spins waiting for its peer. Compute kernels launched on other
// streams meanwhile get the remaining SMs. Two cases are measured (calibrate, group "interference"):
//   case 0 "pending":  a receive whose peer posts the send only after the compute finished (spinning);
//   case 1 "transfer": a large all-reduce actually moving data (also competes for HBM and L2).
// Per case c, with alone_s the kernel's time without NCCL:
//   GEMM with T 128 x 128 output tiles: t = alone_s * G_c(T), where G_c is the measured slowdown
//     at the calibration's GEMMs (gemm_tiles, ascending; the median where a tile count repeats),
//     piecewise linear in ln T between them and constant beyond the first and the last; a GEMM of
//     unknown tiles (T <= 0) takes the median of G_c's knots;
//   grouped expert GEMM with T output tiles (every group's): t = alone_s * H_c(T), the same kind of
//     curve over the calibration's grouped GEMMs (grouped_tiles); without grouped points, G_c;
//   attention: t = alone_s * a_c;   memory-bound kernel: t = alone_s * b_c.
// The slowdown of a GEMM depends on its size in a way no single factor or wave count describes
// (measured on H200: 1.7-1.8x for GEMMs of one wave or less, 1.4x at 8 waves, 1.2x at 16), so the
// GEMM side is the measured curve itself. a_c and b_c are the median slowdowns of their points.
// A case that was not measured has no entry (the simulator then uses no slowdown for it).
enum class NcclResidentCase : std::uint8_t { pending = 0, transfer = 1 };
enum class ComputeClass : std::uint8_t { gemm = 0, attention = 1, memory = 2, grouped_gemm = 3 };

struct NcclInterferenceModel {
  std::vector<int> cases;               // measured cases (NcclResidentCase values), increasing
  std::vector<double> gemm_tiles;       // knots of G_c: tiles of the measured GEMMs, ascending, > 0
  std::vector<double> gemm_factor;      // G_c at the knots, case-major (cases.size() x gemm_tiles.size())
  std::vector<double> attention_factor; // a_c
  std::vector<double> memory_factor;    // b_c
  std::vector<double> grouped_tiles;    // knots of H_c, ascending, > 0; empty: grouped GEMMs take G_c
  std::vector<double> grouped_factor;   // H_c at the knots, case-major

  [[nodiscard]] bool has(NcclResidentCase c) const;
  // t_with / t_alone for a kernel of `kind` with `tiles` 128 x 128 output tiles (GEMM only); 1 for a
  // case that was not measured.
  [[nodiscard]] double factor(NcclResidentCase c, ComputeClass kind, double tiles) const;

  struct Sample {
    int kase;  // NcclResidentCase
    int kind;  // ComputeClass
    double tiles;
    double alone_s;
    double seconds;  // with the NCCL kernel resident
  };
  // Throws FitImpossible when a measured case lacks GEMM, attention or memory points, when the cases
  // measured GEMMs (or grouped GEMMs) of different tile counts, when some cases have grouped points and
  // others not, for a GEMM point without tiles, or for a non-positive time.
  static NcclInterferenceModel fit(const std::vector<Sample>& samples);
};

// One point of a staged memory measurement (nccl.memory, device.memory): the device bytes that stage
// `stage` of one repeat took.
struct StageSample {
  int stage;
  double bytes;
};

// ---------------------------------------------------------------------------------------------
// NCCL device memory ("nccl_memory_v1", family nccl.memory): bytes NCCL allocates on a rank's GPU,
// measured with cudaMemGetInfo around each stage on a fresh pair of communicators (calibrate,
// group "interference"):
//   stage 0: communicator init (ncclCommInitRank), per communicator of more than one rank;
//   stage 1: the first collectives (all-reduce of 1 MiB, then 1 GiB: NCCL connects its ring/tree
//            buffers lazily, at the first collective that uses them), per communicator that runs
//            collectives;
//   stage 2: the first send/recv with a peer, both directions (p2p connection buffers, lazy), per peer.
// A rank's NCCL memory = sum over its communicators of (communicator + collective if it runs
// collectives) + p2p_peer x (distinct p2p peers). Each parameter is the median of its stage's points.
// The points' measured quantity is bytes (their times are the stages' host seconds, kept only for
// reference), so the fit errors of this family are over bytes.
struct NcclMemoryModel {
  double communicator_bytes = 0.0;
  double collective_bytes = 0.0;
  double p2p_peer_bytes = 0.0;

  [[nodiscard]] double stage_bytes(int stage) const;
  using Sample = StageSample;
  // Throws FitImpossible when a stage has no point or a stage number is unknown.
  static NcclMemoryModel fit(const std::vector<Sample>& samples);
};

// ---------------------------------------------------------------------------------------------
// Network bandwidth of expert-parallel dispatch and combine kernels that forward over NVLink and
// send one copy per destination node over RDMA ("expert_dispatch_v1", family dispatch.flex.network;
// DeepEP's normal kernels, Megatron's flex dispatcher):
//   t = bytes / bandwidth(direction, n)
// where bytes are the RDMA bytes one GPU sends (de-duplicated per destination node) and n the
// expert-parallel group size. bandwidth is piecewise linear in log2 n between the group sizes that
// have points and held outside them. Its latency is not part of the model (the simulator takes the
// network all-to-all family's). Fit: per group size and direction, the median of bytes / time.
struct ExpertDispatchModel {
  std::vector<int> group_size;       // increasing
  std::vector<double> dispatch_bps;  // bytes/s per group size
  std::vector<double> combine_bps;

  // direction 0: dispatch, 1: combine.
  [[nodiscard]] double bandwidth(int n, int direction) const;
  struct Sample {
    int group_size = 0;
    int direction = 0;
    double bytes = 0.0;
    double time_s = 0.0;
  };
  // Throws FitImpossible for no samples, a direction other than 0 or 1, a non-positive time or
  // bytes, or a group size without both directions.
  static ExpertDispatchModel fit(const std::vector<Sample>& samples);
};

// ---------------------------------------------------------------------------------------------
// Per-process device memory ("device_memory_v1", family device.memory): what a process running
// threewalls run holds on its GPU besides its tensors, measured with cudaMemGetInfo around each
// stage in a fresh CUDA context on one GPU (calibrate, group "device"):
//   stage 0: the CUDA context (cuCtxCreate), once per process;
//   stage 1: the first launches of the backend's kernels (module loading, lazy by default), once;
//   stage 2: the first CublasLt (cuBLASLt and cuBLAS handles, the backend's workspace) and its first
//            GEMMs (their kernels' modules), once: the first OpRunner's;
//   stage 3: a second CublasLt with the same GEMMs, per further OpRunner (one per device stream
//            with ops);
//   stage 4: one cuDNN handle and the fused-attention graphs of a typical shape, forward and
//            backward, with the workspace they ask for, per OpRunner that runs fused attention;
//   stage 5: the device bytes that cudaMemGetInfo shows a 1-byte cudaMalloc taking: the bytes newly
//            mapped, not the driver's rounding (0 on H100 and H200, whose driver serves it from memory
//            mapped before). Recorded with the profile; the memory model does not use it.
// Each parameter is the median of its stage's points (one per repeat). The points' measured
// quantity is bytes, as nccl.memory's.
struct DeviceMemoryModel {
  static constexpr int kStages = 6;
  static constexpr int kRepeats = 3;  // the calibration's repeats, each in a fresh CUDA context
  double context_bytes = 0.0;
  double modules_bytes = 0.0;
  double blas_bytes = 0.0;
  double blas_further_bytes = 0.0;
  double cudnn_bytes = 0.0;
  double granularity_bytes = 0.0;

  [[nodiscard]] double stage_bytes(int stage) const;
  using Sample = StageSample;
  // Throws FitImpossible when a stage has no point or a stage number is unknown.
  static DeviceMemoryModel fit(const std::vector<Sample>& samples);
};

}  // namespace threewalls::calibration
