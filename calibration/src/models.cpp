// Model equations and fits. Each equation is stated once in models.hpp next to its struct and again,
// with its justification, in docs/calibration.md; this file implements exactly those statements.
#include "threewalls/calibration/models.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <utility>

#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/core/attention_mask.hpp"
#include "threewalls/core/decode_attention_geometry.hpp"

namespace threewalls::calibration {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Wave quantisation efficiency q = tiles / (waves * SMs).
double wave_efficiency(double tiles, int sm_count) {
  const double sms = static_cast<double>(sm_count);
  const double waves = std::ceil(tiles / sms);
  return tiles / (waves * sms);
}

// Efficiencies are fractions of the datasheet peak: fitted as logistic(theta) in (0, 1).
double logistic(double theta) { return 1.0 / (1.0 + std::exp(-theta)); }
double logit(double p) { return std::log(p / (1.0 - p)); }

std::vector<double> exp_all(const std::vector<double>& theta) {
  std::vector<double> out(theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) out[i] = std::exp(theta[i]);
  return out;
}

void require_positive_time(double seconds, const char* what) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw FitImpossible(std::string(what) + ": every measured time must be a positive finite number of seconds");
  }
}

void require_device(const DeviceConstants& d, double bw, const char* what) {
  if (d.sm_count <= 0 || !(d.peak_flop_per_s > 0) || !(bw > 0)) {
    throw FitImpossible(std::string(what) + ": needs the SM count, the dtype's peak FLOP/s and the HBM bandwidth");
  }
}

}  // namespace

ElementBytes element_bytes(DType dt) {
  switch (dt) {
    case DType::bf16: return {2, 2};
    case DType::fp8: return {1, 2};
    case DType::fp32: return {4, 4};
  }
  return {2, 2};
}

double bus_bandwidth_factor(Collective kind, int group_size) {
  const double n = static_cast<double>(group_size);
  switch (kind) {
    case Collective::all_reduce: return 2.0 * (n - 1.0) / n;
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all: return (n - 1.0) / n;
    case Collective::broadcast:
    case Collective::send_recv: return 1.0;
  }
  return 1.0;
}

// ------------------------------------------------------------------------- residual correction

double ShapeCorrection::log_factor_at(const double* x) const {
  if (log_factor.empty() || dims == 0) return 0.0;
  // ln c(x) = sum_j w_j r_j / (w0 + sum_j w_j),  w_j = exp(-|x - x_j|^2 / (2 h^2))
  const double scale = -0.5 / (bandwidth * bandwidth);
  double num = 0.0;
  double den = prior_weight;
  for (std::size_t j = 0; j < log_factor.size(); ++j) {
    const double* c = features.data() + j * dims;
    double d2 = 0.0;
    for (std::size_t d = 0; d < dims; ++d) d2 += (x[d] - c[d]) * (x[d] - c[d]);
    const double w = std::exp(scale * d2);
    num += w * log_factor[j];
    den += w;
  }
  return den > 0.0 ? num / den : 0.0;
}

ShapeCorrection ShapeCorrection::fit(std::size_t dims, const std::vector<double>& features,
                                     const std::vector<double>& log_residuals) {
  const std::size_t n = log_residuals.size();
  if (dims == 0 || features.size() != n * dims) throw std::invalid_argument("ShapeCorrection::fit: features and residuals disagree");
  ShapeCorrection none;
  if (n < kShapeCorrectionMinPoints) return none;
  for (const double r : log_residuals) {
    if (!std::isfinite(r)) return none;
  }
  // Squared distances between the points, once.
  std::vector<double> d2(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (std::size_t d = 0; d < dims; ++d) {
        const double diff = features[i * dims + d] - features[j * dims + d];
        s += diff * diff;
      }
      d2[i * n + j] = s;
    }
  }
  // Leave-one-out score of "no correction": every residual predicted by 0.
  double best = 0.0;
  for (const double r : log_residuals) best += r * r;
  double best_h = 0.0;
  double best_w0 = 0.0;
  std::vector<double> num(n), den(n);
  for (const double h : kShapeCorrectionBandwidths) {
    const double scale = -0.5 / (h * h);
    for (std::size_t i = 0; i < n; ++i) {
      num[i] = 0.0;
      den[i] = 0.0;
      for (std::size_t j = 0; j < n; ++j) {
        if (j == i) continue;
        const double w = std::exp(scale * d2[i * n + j]);
        num[i] += w * log_residuals[j];
        den[i] += w;
      }
    }
    for (const double w0 : kShapeCorrectionPriorWeights) {
      double score = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const double c = (w0 + den[i]) > 0.0 ? num[i] / (w0 + den[i]) : 0.0;
        score += (log_residuals[i] - c) * (log_residuals[i] - c);
      }
      if (score < best) {  // strictly better: ties keep the simpler choice found first
        best = score;
        best_h = h;
        best_w0 = w0;
      }
    }
  }
  if (best_h == 0.0) return none;
  ShapeCorrection c;
  c.dims = dims;
  c.features = features;
  c.log_factor = log_residuals;
  c.bandwidth = best_h;
  c.prior_weight = best_w0;
  return c;
}

std::array<double, 3> gemm_correction_features(std::int64_t m, std::int64_t n, std::int64_t k) {
  auto l2 = [](std::int64_t v) { return std::log2(static_cast<double>(std::max<std::int64_t>(v, 1))); };
  return {l2(m), l2(n), l2(k)};
}

std::array<double, 5> grouped_correction_features(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                                  std::int64_t n, std::int64_t k) {
  const double g = static_cast<double>(std::max<std::int64_t>(groups, 1));
  const double r = static_cast<double>(std::max<std::int64_t>(total_rows, 1));
  const double mx = static_cast<double>(std::max<std::int64_t>(max_rows, 1));
  return {std::log2(r / g), std::log2(g), std::log2(static_cast<double>(std::max<std::int64_t>(n, 1))),
          std::log2(static_cast<double>(std::max<std::int64_t>(k, 1))), std::log2(mx * g / r)};
}

// ------------------------------------------------------------------------------------------ GEMM

double GemmModel::time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) const {
  const double t = roofline_time_s(m, n, k, batch);
  if (correction.empty() || m <= 0 || n <= 0 || k <= 0 || batch <= 0) return t;
  const auto x = gemm_correction_features(m, n, k);
  return t * std::exp(correction.log_factor_at(x.data()));
}

double GemmModel::roofline_time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return overhead_s;
  const double md = static_cast<double>(m);
  const double nd = static_cast<double>(n);
  const double kd = static_cast<double>(k);
  const double bd = static_cast<double>(batch);
  const double flops = 2.0 * md * nd * kd * bd;
  const double bytes = bd * ((md * kd + kd * nd) * elements.input + md * nd * elements.output);
  // t = max((F + tail 2 k T_m T_n SMs) / (P e_max k / (k + k_half)), B / BW) + t0   ("gemm_roofline_v2")
  const double tail_flops = wave_tail * 2.0 * kd * tile_m * tile_n * device.sm_count;
  const double eff = efficiency_max * kd / (kd + k_half);
  const double t_compute = (flops + tail_flops) / (device.peak_flop_per_s * eff);
  const double t_memory = bytes / memory_bandwidth_bytes_per_s;
  return std::max(t_compute, t_memory) + overhead_s;
}

const std::vector<GemmModel::Tile>& GemmModel::default_tiles() {
  static const std::vector<Tile> tiles = {{128, 128}};
  return tiles;
}

GemmModel GemmModel::fit(const std::vector<Sample>& samples, const DeviceConstants& device, ElementBytes elements,
                         double memory_bandwidth_bytes_per_s, const std::vector<Tile>& tiles) {
  require_device(device, memory_bandwidth_bytes_per_s, "gemm");
  if (samples.size() < 4) {
    throw FitImpossible("gemm: needs at least 4 points (e_max, k_half, wave_tail and t0 are fitted), has " +
                        std::to_string(samples.size()));
  }
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "gemm");
    if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0)
      throw FitImpossible("gemm: m, n, k and batch must be positive");
  }
  const std::vector<std::vector<double>> starts = [] {
    std::vector<std::vector<double>> s;
    for (double e : {0.5, 0.85}) {
      for (double kh : {32.0, 512.0, 4096.0}) {
        for (double tail : {0.05, 0.5}) {
          for (double t0 : {1e-6, 1e-5}) s.push_back({logit(e), std::log(kh), std::log(tail), std::log(t0)});
        }
      }
    }
    return s;
  }();
  if (tiles.empty()) throw FitImpossible("gemm: no tile shape to choose from");
  struct Candidate {
    GemmModel model;
    double rms = kInf;  // root-mean-square relative error over the points
  };
  std::vector<Candidate> candidates;
  for (const auto& tile : tiles) {
    GemmModel m;
    m.tile_m = tile.m;
    m.tile_n = tile.n;
    m.memory_bandwidth_bytes_per_s = memory_bandwidth_bytes_per_s;
    m.device = device;
    m.elements = elements;
    auto make = [&m](const std::vector<double>& theta) {
      GemmModel c = m;
      c.efficiency_max = logistic(theta[0]);
      c.k_half = std::exp(theta[1]);
      c.wave_tail = std::exp(theta[2]);
      c.overhead_s = std::exp(theta[3]);
      return c;
    };
    auto residuals = [&](const std::vector<double>& theta) {
      const GemmModel c = make(theta);
      std::vector<double> r(samples.size());
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const auto& s = samples[i];
        r[i] = (c.roofline_time_s(s.m, s.n, s.k, s.batch) - s.seconds) / s.seconds;
      }
      return r;
    };
    const auto res = fit::levenberg_marquardt_multistart(residuals, starts);
    if (std::isfinite(res.cost)) {
      candidates.push_back({make(res.theta), std::sqrt(2.0 * res.cost / static_cast<double>(samples.size()))});
    }
  }
  if (candidates.empty()) throw FitImpossible("gemm: no parameters reproduce the points (non-finite error)");
  // The tile unit with the least RMS relative error (the first on a tie).
  const Candidate* chosen = &candidates.front();
  for (const auto& c : candidates) {
    if (c.rms < chosen->rms) chosen = &c;
  }
  return chosen->model;
}

std::vector<std::pair<std::int64_t, std::int64_t>> expert_rows_runs(std::int64_t total_rows, std::int64_t groups,
                                                                    std::int64_t max_rows) {
  // The same split as backend::expert_rows (backend/src/grouped_gemm.cpp), as runs of equal rows:
  // `n` experts sharing `rows` evenly take rows / n each, the first rows % n of them one more; a hot
  // expert (max_rows above the even share) takes max_rows first and the others share the rest.
  // Computed per run, not per expert: the simulator asks it for every grouped GEMM it launches.
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  if (groups <= 0 || total_rows <= 0) return runs;
  auto add = [&runs](std::int64_t rows, std::int64_t count) {
    if (count <= 0) return;
    if (!runs.empty() && runs.back().first == rows) {
      runs.back().second += count;
    } else {
      runs.emplace_back(rows, count);
    }
  };
  auto even = [&add](std::int64_t rows, std::int64_t n) {
    add(rows / n + 1, rows % n);
    add(rows / n, n - rows % n);
  };
  const std::int64_t balanced = (total_rows + groups - 1) / groups;
  if (max_rows <= balanced || groups == 1) {
    even(total_rows, groups);
  } else {
    const std::int64_t hot = std::min(max_rows, total_rows);
    add(hot, 1);
    even(total_rows - hot, groups - 1);
  }
  std::erase_if(runs, [](const auto& run) { return run.first <= 0; });
  return runs;
}

namespace {
GemmModel dense_of(const GroupedGemmModel& g) {
  GemmModel d;
  d.tile_m = g.tile_m;
  d.tile_n = g.tile_n;
  d.efficiency_max = g.efficiency_max;
  d.k_half = g.k_half;
  d.wave_tail = g.wave_tail;
  d.overhead_s = 0.0;
  d.memory_bandwidth_bytes_per_s = g.memory_bandwidth_bytes_per_s;
  d.device = g.device;
  d.elements = g.elements;
  return d;
}
}  // namespace

double GroupedGemmModel::time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows, std::int64_t n,
                                std::int64_t k) const {
  const double t = parametric_time_s(groups, total_rows, max_rows, n, k);
  if (correction.empty() || groups <= 0 || total_rows <= 0 || max_rows <= 0 || n <= 0 || k <= 0) return t;
  const auto x = grouped_correction_features(groups, total_rows, max_rows, n, k);
  return t * std::exp(correction.log_factor_at(x.data()));
}

double GroupedGemmModel::parametric_time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                           std::int64_t n, std::int64_t k) const {
  if (groups <= 0 || total_rows <= 0 || max_rows <= 0 || n <= 0 || k <= 0) return overhead_s;
  if (batched_calls) {
    // t = sum_c (t_dense(m_c, n, k, b_c) - t0_dense) + t0 + (runs - 1) t_call
    const GemmModel dense = dense_of(*this);
    const auto runs = expert_rows_runs(total_rows, groups, max_rows);
    double t = overhead_s;
    for (const auto& [m, b] : runs) t += dense.time_s(m, n, k, b);
    if (runs.size() > 1) t += static_cast<double>(runs.size() - 1) * call_overhead_s;
    return t;
  }
  const double g = static_cast<double>(groups);
  const double rt = static_cast<double>(total_rows);
  const double rmax = std::min(static_cast<double>(max_rows), rt);
  const double nd = static_cast<double>(n);
  const double kd = static_cast<double>(k);
  const double r_other = g > 1 ? (rt - rmax) / (g - 1) : 0.0;
  const double row_tiles = ceil_div(rmax, tile_m) + (g - 1) * ceil_div(r_other, tile_m);
  const double tiles = ceil_div(nd, tile_n) * row_tiles;
  const double waves = std::ceil(tiles / device.sm_count);
  const double per_sm_peak = device.peak_flop_per_s / device.sm_count;
  const double t_compute = waves * 2.0 * tile_m * tile_n * (kd + k_half) / (per_sm_peak * efficiency_max);
  const double bytes = (rt * kd + g * kd * nd) * elements.input + rt * nd * elements.output;
  const double t_memory = bytes / memory_bandwidth_bytes_per_s;
  return std::max(t_compute, t_memory) + overhead_s;
}

namespace {

// (model time - measured time) / measured time at each point: the residuals both grouped-GEMM
// forms are fitted by.
std::vector<double> relative_residuals(const GroupedGemmModel& m,
                                       const std::vector<GroupedGemmModel::Sample>& samples) {
  std::vector<double> r(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    r[i] = (m.parametric_time_s(s.groups, s.total_rows, s.max_rows, s.n, s.k) - s.seconds) / s.seconds;
  }
  return r;
}

}  // namespace

GroupedGemmModel GroupedGemmModel::fit(const std::vector<Sample>& samples, const GemmModel& dense,
                                       bool batched_calls_form) {
  if (samples.empty()) throw FitImpossible("grouped_gemm: needs at least 1 point");
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "grouped_gemm");
    if (s.groups <= 0 || s.total_rows <= 0 || s.max_rows <= 0 || s.n <= 0 || s.k <= 0) {
      throw FitImpossible("grouped_gemm: groups, total_rows, max_rows, n and k must be positive");
    }
    if (s.max_rows > s.total_rows || s.max_rows * s.groups < s.total_rows) {
      throw FitImpossible("grouped_gemm: max_rows must be between total_rows / groups and total_rows");
    }
  }
  GroupedGemmModel base;
  base.tile_m = dense.tile_m;
  base.tile_n = dense.tile_n;
  base.k_half = dense.k_half;
  base.overhead_s = dense.overhead_s;
  base.memory_bandwidth_bytes_per_s = dense.memory_bandwidth_bytes_per_s;
  base.device = dense.device;
  base.elements = dense.elements;
  const bool fit_overhead = samples.size() >= 3;
  if (fit_overhead && batched_calls_form) {
    // Batched-calls form: the dense model per run of equal-row experts; only t0 is fitted.
    base.batched_calls = true;
    base.efficiency_max = dense.efficiency_max;
    base.wave_tail = dense.wave_tail;
    base.call_overhead_s = dense.overhead_s;
    auto make_calls = [&](const std::vector<double>& theta) {
      GroupedGemmModel c = base;
      c.overhead_s = std::exp(theta[0]);
      return c;
    };
    auto residuals = [&](const std::vector<double>& theta) { return relative_residuals(make_calls(theta), samples); };
    std::vector<std::vector<double>> starts;
    for (double t0 : {1e-6, std::max(dense.overhead_s, 1e-7), 2e-5}) starts.push_back({std::log(t0)});
    const auto res = fit::levenberg_marquardt_multistart(residuals, starts);
    if (!std::isfinite(res.cost)) throw FitImpossible("grouped_gemm: no parameters reproduce the points");
    return make_calls(res.theta);
  }
  auto make = [&](const std::vector<double>& theta) {
    GroupedGemmModel c = base;
    c.efficiency_max = logistic(theta[0]);
    if (fit_overhead) c.overhead_s = std::exp(theta[1]);
    return c;
  };
  auto residuals = [&](const std::vector<double>& theta) { return relative_residuals(make(theta), samples); };
  std::vector<std::vector<double>> starts;
  for (double e : {0.3, 0.7, 0.95}) {
    if (fit_overhead) {
      for (double t0 : {1e-6, std::max(dense.overhead_s, 1e-7)}) starts.push_back({logit(e), std::log(t0)});
    } else {
      starts.push_back({logit(e)});
    }
  }
  const auto res = fit::levenberg_marquardt_multistart(residuals, starts);
  if (!std::isfinite(res.cost)) throw FitImpossible("grouped_gemm: no parameters reproduce the points");
  return make(res.theta);
}

// ------------------------------------------------------------------------------------- attention

double attention_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, std::int64_t window) {
  if (seq_q <= 0 || seq_kv <= 0) return 0.0;
  if (!causal) return static_cast<double>(seq_q) * static_cast<double>(seq_kv);
  return causal_pairs(seq_q, seq_kv, window);
}

double attention_computed_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, std::int64_t window) {
  if (seq_q <= 0 || seq_kv <= 0) return 0.0;
  if (!causal) return static_cast<double>(seq_q) * static_cast<double>(seq_kv);
  double pairs = 0.0;
  for (std::int64_t q0 = 0; q0 < seq_q; q0 += kAttentionCausalBlock) {
    const std::int64_t rows = std::min(kAttentionCausalBlock, seq_q - q0);
    const std::int64_t last = q0 + rows - 1 + seq_kv - seq_q;  // the block's last row's diagonal key
    const std::int64_t hi = std::clamp<std::int64_t>(last + 1, 0, seq_kv);
    const std::int64_t lo = window > 0 ? std::clamp<std::int64_t>(q0 + seq_kv - seq_q + 1 - window, 0, seq_kv) : 0;
    pairs += static_cast<double>(rows) * static_cast<double>(std::max<std::int64_t>(hi - lo, 0));
  }
  return pairs;
}

namespace {
// FLOPs of attention over `pairs` (query, key) pairs per head.
double attention_flops_of_pairs(const AttentionShape& s, double pairs, bool backward) {
  const double bh = static_cast<double>(s.batch) * static_cast<double>(s.heads);
  const double dqk = static_cast<double>(s.head_dim_qk);
  const double dv = static_cast<double>(s.head_dim_v);
  // Forward: S = Q K^T (d_qk) and O = P V (d_v). Backward (FlashAttention recomputes S): S, dV = P^T dO,
  // dP = dO V^T, dQ = dS K, dK = dS^T Q.
  return backward ? 2.0 * bh * pairs * (3.0 * dqk + 2.0 * dv) : 2.0 * bh * pairs * (dqk + dv);
}
}  // namespace

double attention_flops(const AttentionShape& s, bool backward) {
  return attention_flops_of_pairs(s, attention_pairs(s.seq_q, s.seq_kv, s.causal, s.window), backward);
}

namespace {

// The scheduled form's makespan (AttentionModel, "attention_tiles_v1"): tiles of `reps` identical
// (batch, head) runs of `work` (each tile's keys or queries, ascending block order), placed in that
// order on the SM that frees first; `per_unit` seconds per unit of work plus `s_half` units per tile.
// Past kMaxScheduledTiles the placement is taken as balanced (total / SMs + the longest tile).
constexpr double kMaxScheduledTiles = 200000;
double list_schedule_makespan(const std::vector<double>& work, double reps, double s_half, double per_unit,
                              int sm_count) {
  const auto sms = static_cast<std::size_t>(std::max(sm_count, 1));
  const double n = reps * static_cast<double>(work.size());
  if (n > kMaxScheduledTiles) {
    double total = 0.0, longest = 0.0;
    for (const double w : work) {
      total += w + s_half;
      longest = std::max(longest, w + s_half);
    }
    return (reps * total / static_cast<double>(sms) + longest) * per_unit;
  }
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (std::size_t i = 0; i < sms; ++i) free_at.push(0.0);
  double end = 0.0;
  const auto runs = static_cast<std::int64_t>(reps);
  for (std::int64_t r = 0; r < runs; ++r) {
    for (const double w : work) {
      const double t = free_at.top() + (w + s_half) * per_unit;
      free_at.pop();
      free_at.push(t);
      end = std::max(end, t);
    }
  }
  return end;
}

}  // namespace

// Work of each 128-row tile of one (batch, head): forward, the mean keys the tile's first and last
// query rows see under the causal mask; backward, the mean queries that see the tile's first and last
// key rows. The causal diagonal's partly masked block is in every tile alike (its cost is in the fitted
// per-tile s_half). A sliding window adds, at the band's other edge, the blocks of `tile` keys
// (queries) the kernel visits whole although the window starts inside them: the forward tile walks
// from the block holding its first row's first key, the backward tile up to the end of the block
// holding its last key's last query (core/attention_mask.hpp gives the band).
std::vector<double> attention_tile_work(const AttentionShape& s, bool backward, int tile) {
  const std::int64_t sq = s.seq_q, skv = s.seq_kv, off = skv - sq;  // bottom-right aligned mask
  const std::int64_t window = s.causal ? s.window : 0;
  std::vector<double> w;
  const std::int64_t rows = backward ? skv : sq;
  for (std::int64_t r0 = 0; r0 < rows; r0 += tile) {
    const std::int64_t r1 = std::min(rows, r0 + tile) - 1;
    if (!s.causal) {
      w.push_back(static_cast<double>(backward ? sq : skv));
      continue;
    }
    // Without the window's edge: keys up to each row's diagonal (forward), queries from each key's
    // diagonal on (backward).
    auto unwindowed = [&](std::int64_t r) -> double {
      return static_cast<double>(backward ? causal_queries_seeing(r, sq, skv, 0) : causal_keys_seen(r, sq, skv, 0));
    };
    double work = (unwindowed(r0) + unwindowed(r1)) / 2.0;
    if (window > 0) {
      if (!backward) {
        const std::int64_t first = causal_key_range(r0, sq, skv, window).lo;  // the first row's first key
        work -= static_cast<double>(first / tile * tile);
      } else {
        const std::int64_t end = std::clamp<std::int64_t>(r1 - off + window, 0, sq);  // last key's last query + 1
        work -= static_cast<double>(sq - std::min(sq, (end + tile - 1) / tile * tile));
      }
    }
    w.push_back(std::max(work, 1.0));
  }
  return w;
}

double AttentionModel::head_dim_factor(double dqk, bool causal) const {
  if (head_dims.empty()) return efficiency_max * dqk / (dqk + d_half);
  const auto& e = causal || head_dim_efficiency_unmasked.empty() ? head_dim_efficiency : head_dim_efficiency_unmasked;
  if (dqk <= head_dims.front()) return e.front();
  if (dqk >= head_dims.back()) return e.back();
  const auto hi =
      static_cast<std::size_t>(std::upper_bound(head_dims.begin(), head_dims.end(), dqk) - head_dims.begin());
  const std::size_t lo = hi - 1;
  const double w = (dqk - head_dims[lo]) / (head_dims[hi] - head_dims[lo]);
  return e[lo] + w * (e[hi] - e[lo]);
}

namespace {

void check_attention_samples(const std::vector<AttentionModel::Sample>& samples, const char* what) {
  for (const auto& s : samples) {
    require_positive_time(s.seconds, what);
    if (attention_pairs(s.shape.seq_q, s.shape.seq_kv, s.shape.causal) <= 0 || s.shape.batch <= 0 ||
        s.shape.heads <= 0 || s.shape.kv_heads <= 0 || s.shape.head_dim_qk <= 0 || s.shape.head_dim_v <= 0) {
      throw FitImpossible(std::string(what) + ": every dimension of a point must be positive");
    }
  }
}

// A model of the direction, device and memory bandwidth; a fit sets the rest.
AttentionModel attention_base(bool backward, const DeviceConstants& device, double memory_bandwidth_bytes_per_s) {
  AttentionModel m;
  m.backward = backward;
  m.device = device;
  m.memory_bandwidth_bytes_per_s = memory_bandwidth_bytes_per_s;
  return m;
}

// The model make(theta) with the least relative errors over the samples (each a shape and its
// measured seconds; multi-start Levenberg-Marquardt from `starts`); FitImpossible naming `what` when no
// start converges.
template <class Sample, class Make>
auto fit_to_relative_error(const std::vector<Sample>& samples, const Make& make,
                           const std::vector<std::vector<double>>& starts, const char* what) {
  auto residuals = [&](const std::vector<double>& theta) {
    const auto c = make(theta);
    std::vector<double> r(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i)
      r[i] = (c.time_s(samples[i].shape) - samples[i].seconds) / samples[i].seconds;
    return r;
  };
  const auto res = fit::levenberg_marquardt_multistart(residuals, starts);
  if (!std::isfinite(res.cost)) throw FitImpossible(std::string(what) + ": no parameters reproduce the points");
  return make(res.theta);
}

}  // namespace

double AttentionModel::time_s(const AttentionShape& s) const {
  const double pairs = blocked ? attention_computed_pairs(s.seq_q, s.seq_kv, s.causal, s.window)
                               : attention_pairs(s.seq_q, s.seq_kv, s.causal, s.window);
  if (pairs <= 0 || s.batch <= 0 || s.heads <= 0 || s.head_dim_qk <= 0 || s.head_dim_v <= 0) return overhead_s;
  const double flops = attention_flops_of_pairs(s, pairs, backward);
  const double sq = static_cast<double>(s.seq_q);
  const double skv = static_cast<double>(s.seq_kv);
  const double b = static_cast<double>(s.batch);
  const double h = static_cast<double>(s.heads);
  const double hkv = static_cast<double>(s.kv_heads > 0 ? s.kv_heads : s.heads);
  const double dqk = static_cast<double>(s.head_dim_qk);
  const double dv = static_cast<double>(s.head_dim_v);
  const double bytes = 2.0 * b * (h * sq * (dqk + dv) + hkv * skv * (dqk + dv)) * (backward ? 2.0 : 1.0);
  const double t_memory = bytes / memory_bandwidth_bytes_per_s;
  if (scheduled) {
    // The one-curve form keeps its own evaluation order (its profiles' times do not move by a rounding).
    const double rate = head_dims.empty() ? device.peak_flop_per_s * efficiency_max * dqk / (dqk + d_half)
                                          : device.peak_flop_per_s * head_dim_factor(dqk, s.causal);
    const double per_unit = 2.0 * tile_q * (backward ? 3.0 * dqk + 2.0 * dv : dqk + dv) * device.sm_count / rate;
    const double makespan =
        list_schedule_makespan(attention_tile_work(s, backward, tile_q), b * h, s_half, per_unit, device.sm_count);
    return std::max(makespan, t_memory) + overhead_s;
  }
  const double keys_per_row = pairs / sq;
  const double tiles = b * h * ceil_div(sq, tile_q);
  const double q = wave_efficiency(tiles, device.sm_count);
  const double eff = head_dims.empty() ? efficiency_max * keys_per_row / (keys_per_row + s_half) * dqk / (dqk + d_half)
                                       : head_dim_factor(dqk, s.causal) * keys_per_row / (keys_per_row + s_half);
  const double t_compute = flops / (device.peak_flop_per_s * eff * q) + (blocked ? b * h * pairs * pair_s : 0.0);
  return std::max(t_compute, t_memory) + overhead_s;
}

AttentionModel AttentionModel::fit(const std::vector<Sample>& samples, bool backward, const DeviceConstants& device,
                                   double memory_bandwidth_bytes_per_s, bool blocked, bool scheduled) {
  const char* what = backward ? "attention.bwd" : "attention.fwd";
  require_device(device, memory_bandwidth_bytes_per_s, what);
  const std::size_t need = blocked ? 5 : 4;
  if (samples.size() < need) {
    throw FitImpossible(std::string(what) + ": needs at least " + std::to_string(need) + " points (e_max, s_half, d_half, t0" +
                        (blocked ? ", pair_s" : "") + " are fitted), has " + std::to_string(samples.size()));
  }
  check_attention_samples(samples, what);
  AttentionModel base = attention_base(backward, device, memory_bandwidth_bytes_per_s);
  base.blocked = blocked;
  base.scheduled = scheduled;
  auto make = [&](const std::vector<double>& theta) {
    const auto p = exp_all(theta);
    AttentionModel c = base;
    c.efficiency_max = logistic(theta[0]);
    c.s_half = p[1];
    c.d_half = p[2];
    c.overhead_s = p[3];
    if (blocked) c.pair_s = p[4];
    return c;
  };
  std::vector<std::vector<double>> starts;
  for (double e : {0.5, 0.8}) {
    for (double sh : {64.0, 1024.0}) {
      for (double dh : {8.0, 64.0}) {
        if (!blocked) {
          starts.push_back({logit(e), std::log(sh), std::log(dh), std::log(3e-6)});
          continue;
        }
        for (double ps : {1e-13, 3e-12}) starts.push_back({logit(e), std::log(sh), std::log(dh), std::log(3e-6), std::log(ps)});
      }
    }
  }
  return fit_to_relative_error(samples, make, starts, what);
}

AttentionModel AttentionModel::fit_per_head_dim(const std::vector<Sample>& samples, bool backward,
                                                const DeviceConstants& device, double memory_bandwidth_bytes_per_s) {
  const char* what = backward ? "attention.bwd" : "attention.fwd";
  require_device(device, memory_bandwidth_bytes_per_s, what);
  check_attention_samples(samples, what);
  std::vector<double> dims;
  for (const auto& s : samples) dims.push_back(static_cast<double>(s.shape.head_dim_qk));
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  // Parameter index of each (head dimension, mask) with points; -1: none (the other mask's).
  std::vector<std::array<int, 2>> slot(dims.size(), {-1, -1});  // [unmasked, causal]
  int params = 2;
  for (const auto& s : samples) {
    const auto d =
        static_cast<std::size_t>(std::lower_bound(dims.begin(), dims.end(), s.shape.head_dim_qk) - dims.begin());
    int& k = slot[d][s.shape.causal ? 1 : 0];
    if (k < 0) k = params++;
  }
  if (samples.size() < static_cast<std::size_t>(params) + 1) {
    throw FitImpossible(std::string(what) + ": needs at least " + std::to_string(params + 1) +
                        " points (s_half, t0 and " + std::to_string(params - 2) +
                        " efficiencies of head dimension and mask are fitted), has " + std::to_string(samples.size()));
  }
  AttentionModel base = attention_base(backward, device, memory_bandwidth_bytes_per_s);
  base.scheduled = true;
  base.head_dims = dims;
  auto make = [&](const std::vector<double>& theta) {
    AttentionModel c = base;
    c.s_half = std::exp(theta[0]);
    c.overhead_s = std::exp(theta[1]);
    c.head_dim_efficiency.clear();
    c.head_dim_efficiency_unmasked.clear();
    for (const auto& [unmasked, causal] : slot) {
      c.head_dim_efficiency.push_back(logistic(theta[static_cast<std::size_t>(causal >= 0 ? causal : unmasked)]));
      c.head_dim_efficiency_unmasked.push_back(
          logistic(theta[static_cast<std::size_t>(unmasked >= 0 ? unmasked : causal)]));
    }
    return c;
  };
  std::vector<std::vector<double>> starts;
  for (double e : {0.5, 0.8}) {
    for (double sh : {64.0, 1024.0}) {
      std::vector<double> theta{std::log(sh), std::log(3e-6)};
      theta.resize(static_cast<std::size_t>(params), logit(e));
      starts.push_back(theta);
    }
  }
  return fit_to_relative_error(samples, make, starts, what);
}

// ------------------------------------------------------------------------------ decode attention

double decode_attention_kv_bytes(const AttentionShape& s) {
  const double kv = static_cast<double>(s.kv_heads > 0 ? s.kv_heads : s.heads);
  return 2.0 * static_cast<double>(s.batch) * kv * static_cast<double>(s.seq_kv) *
         static_cast<double>(s.head_dim_qk + s.head_dim_v);
}

double decode_attention_flops(const AttentionShape& s) {
  return 2.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) * static_cast<double>(s.seq_kv) *
         static_cast<double>(s.head_dim_qk + s.head_dim_v);
}

double DecodeAttentionModel::time_s(const AttentionShape& s) const {
  if (s.batch <= 0 || s.heads <= 0 || s.seq_kv <= 0) return overhead_s;
  if (!waves) return overhead_s + decode_attention_kv_bytes(s) * per_byte_s + decode_attention_flops(s) * per_flop_s;
  const std::int64_t kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const auto g = decode_attention_geometry(s.batch, kv, s.seq_kv, sm_count);
  const double dims = static_cast<double>(s.head_dim_qk + s.head_dim_v);
  const double group = static_cast<double>(s.heads) / static_cast<double>(kv);
  const double sm_s = static_cast<double>(g.blocks_per_sm) * static_cast<double>(g.rounds) * dims *
                      (per_round_dim_s + group * per_round_head_dim_s);
  return overhead_s + static_cast<double>(g.splits) * per_split_s +
         std::max(sm_s, decode_attention_kv_bytes(s) / bandwidth_bytes_per_s);
}

namespace {

void check_decode_samples(const std::vector<DecodeAttentionModel::Sample>& samples, const char* what) {
  for (const auto& s : samples) {
    require_positive_time(s.seconds, what);
    if (s.shape.batch <= 0 || s.shape.heads <= 0 || s.shape.kv_heads <= 0 || s.shape.seq_kv <= 0 ||
        s.shape.head_dim_qk <= 0 || s.shape.head_dim_v <= 0) {
      throw FitImpossible(std::string(what) + ": every dimension of a point must be positive");
    }
  }
}

}  // namespace

DecodeAttentionModel DecodeAttentionModel::fit(const std::vector<Sample>& samples) {
  const char* what = "attention_decode";
  check_decode_samples(samples, what);
  // The terms' solver (kernel_terms.hpp): t = t0 + c_1 x_1 + c_2 x_2 with x = (B, F).
  std::vector<KernelTermsModel::Sample> rows;
  for (const auto& s : samples) {
    rows.push_back({{decode_attention_kv_bytes(s.shape), decode_attention_flops(s.shape)}, s.seconds});
  }
  KernelTermsModel k;
  try {
    k = KernelTermsModel::fit({{0}, {1}}, rows);
  } catch (const FitImpossible& e) {
    throw FitImpossible(std::string(what) + ": " + e.what());
  }
  if (!(k.coefficients_s[0] > 0)) {
    throw FitImpossible(std::string(what) +
                        ": the points do not determine the time per byte of K and V (fitted 0): "
                        "measure caches of several lengths");
  }
  DecodeAttentionModel m;
  m.overhead_s = k.overhead_s;
  m.per_byte_s = k.coefficients_s[0];
  m.per_flop_s = k.coefficients_s[1];
  return m;
}

DecodeAttentionModel DecodeAttentionModel::fit_waves(const std::vector<Sample>& samples, int sm_count) {
  const char* what = "attention_decode";
  check_decode_samples(samples, what);
  if (sm_count <= 0) throw FitImpossible(std::string(what) + ": the profile's hardware has no SM count");
  constexpr std::size_t kParams = 5;
  if (samples.size() < kParams + 1) {
    throw FitImpossible(std::string(what) + ": needs at least " + std::to_string(kParams + 1) +
                        " points (t0, per_split, per_round_dim, per_round_head_dim, bandwidth are fitted), has " +
                        std::to_string(samples.size()));
  }
  auto make = [&](const std::vector<double>& theta) {
    const auto p = exp_all(theta);
    DecodeAttentionModel m;
    m.waves = true;
    m.sm_count = sm_count;
    m.overhead_s = p[0];
    m.per_split_s = p[1];
    m.per_round_dim_s = p[2];
    m.per_round_head_dim_s = p[3];
    m.bandwidth_bytes_per_s = p[4];
    return m;
  };
  // Starts around what a GPU of this class shows: microseconds of launch, a fraction of one per
  // split, nanoseconds per round and dimension, TB/s.
  std::vector<std::vector<double>> starts;
  for (double t0 : {3e-6, 1e-5}) {
    for (double round : {1e-10, 3e-9}) {
      for (double head : {1e-10, 3e-9}) {
        for (double bw : {1e12, 4e12}) {
          starts.push_back({std::log(t0), std::log(2e-7), std::log(round), std::log(head), std::log(bw)});
        }
      }
    }
  }
  return fit_to_relative_error(samples, make, starts, what);
}

// ---------------------------------------------------------------------------------------- linear

double LinearModel::time_s(double bytes) const {
  double t = alpha_s;
  double lo = 0.0;
  for (std::size_t j = 0; j < bandwidths_bytes_per_s.size(); ++j) {
    const double hi = j < knots_bytes.size() ? knots_bytes[j] : kInf;
    const double part = std::clamp(bytes - lo, 0.0, hi - lo);
    t += part / bandwidths_bytes_per_s[j];
    if (bytes <= hi) break;
    lo = hi;
  }
  return t;
}

namespace {

struct LinearCandidate {
  LinearModel model;
  double sse = kInf;
  double max_rel = kInf;
};

// Fits t = alpha + min(S, K)/b1 (+ max(S - K, 0)/b2 when a knot K is given); nullopt when a slope is 0.
std::optional<LinearCandidate> fit_linear_candidate(const std::vector<LinearModel::Sample>& samples,
                                                    std::optional<double> knot) {
  fit::Design a;
  std::vector<double> y;
  std::vector<double> w;
  for (const auto& s : samples) {
    if (knot)
      a.add_row({1.0, std::min(s.bytes, *knot), std::max(s.bytes - *knot, 0.0)});
    else
      a.add_row({1.0, s.bytes});
    y.push_back(s.seconds);
    w.push_back(1.0 / (s.seconds * s.seconds));
  }
  std::vector<double> x;
  try {
    x = fit::nonnegative_least_squares(a, y, w);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  for (std::size_t j = 1; j < x.size(); ++j) {
    if (!(x[j] > 0)) return std::nullopt;
  }
  LinearCandidate c;
  c.model.alpha_s = x[0];
  if (knot) c.model.knots_bytes = {*knot};
  for (std::size_t j = 1; j < x.size(); ++j) c.model.bandwidths_bytes_per_s.push_back(1.0 / x[j]);
  c.sse = 0;
  c.max_rel = 0;
  for (const auto& s : samples) {
    const double r = (c.model.time_s(s.bytes) - s.seconds) / s.seconds;
    c.sse += r * r;
    c.max_rel = std::max(c.max_rel, std::fabs(r));
  }
  return c;
}

}  // namespace

LinearModel LinearModel::fit(const std::vector<Sample>& samples) {
  std::set<double> sizes;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "linear");
    if (!(s.bytes >= 0) || !std::isfinite(s.bytes)) throw FitImpossible("bytes must be a non-negative number");
    sizes.insert(s.bytes);
  }
  if (sizes.size() < 2) {
    throw FitImpossible("needs points at 2 or more distinct sizes (latency and bandwidth are fitted), has " +
                        std::to_string(sizes.size()));
  }
  auto one = fit_linear_candidate(samples, std::nullopt);
  if (!one) throw FitImpossible("the measured time does not grow with size: measure larger sizes");
  if (sizes.size() >= 6 && one->max_rel > 0.05) {
    const std::vector<double> sorted(sizes.begin(), sizes.end());
    std::optional<LinearCandidate> best;
    for (std::size_t j = 2; j + 3 <= sorted.size(); ++j) {
      auto c = fit_linear_candidate(samples, sorted[j]);
      if (c && (!best || c->sse < best->sse)) best = std::move(c);
    }
    if (best && best->sse < one->sse / 4) return best->model;
  }
  return one->model;
}

// ----------------------------------------------------------------------------------- collectives

double CollectiveGroupParams::bus_bandwidth_bytes_per_s(double bytes) const {
  const double s = std::max(bytes, 1.0);
  if (!(s_half_bytes > 0)) return beta_max_bytes_per_s;
  return beta_max_bytes_per_s / (1.0 + std::pow(s_half_bytes / s, gamma));
}

CollectiveGroupParams CollectiveModel::params_for(int group_size) const {
  const auto& first = groups.front();
  const auto& last = groups.back();
  if (group_size <= first.group_size) {
    auto p = first;
    p.group_size = group_size;
    return p;
  }
  const double x = std::log2(static_cast<double>(group_size));
  if (group_size >= last.group_size) {
    auto p = last;
    p.group_size = group_size;
    if (groups.size() >= 2) {
      const auto& prev = groups[groups.size() - 2];
      const double dx =
          std::log2(static_cast<double>(last.group_size)) - std::log2(static_cast<double>(prev.group_size));
      const double slope = std::max(0.0, (last.alpha_s - prev.alpha_s) / dx);
      p.alpha_s = last.alpha_s + slope * (x - std::log2(static_cast<double>(last.group_size)));
    }
    return p;
  }
  std::size_t j = 0;
  while (groups[j + 1].group_size < group_size) ++j;
  const auto& lo = groups[j];
  const auto& hi = groups[j + 1];
  const double x0 = std::log2(static_cast<double>(lo.group_size));
  const double x1 = std::log2(static_cast<double>(hi.group_size));
  const double u = (x - x0) / (x1 - x0);
  auto lerp = [u](double a, double b) { return a + u * (b - a); };
  auto geo = [u, &lerp](double a, double b) {
    return (a > 0 && b > 0) ? std::exp(lerp(std::log(a), std::log(b))) : lerp(a, b);
  };
  CollectiveGroupParams p;
  p.group_size = group_size;
  p.alpha_s = lerp(lo.alpha_s, hi.alpha_s);
  p.beta_max_bytes_per_s = geo(lo.beta_max_bytes_per_s, hi.beta_max_bytes_per_s);
  p.s_half_bytes = geo(lo.s_half_bytes, hi.s_half_bytes);
  p.gamma = lerp(lo.gamma, hi.gamma);
  return p;
}

namespace {
// r_n(log2 S) of one measured group size: knots[first, last) (sorted by bytes), held outside.
double correction_of_group(const std::vector<CollectiveCorrectionKnot>& k, std::size_t first, std::size_t last,
                           double bytes) {
  const double x = std::log2(std::max(bytes, 1.0));
  if (x <= std::log2(k[first].bytes)) return k[first].log_factor;
  if (x >= std::log2(k[last - 1].bytes)) return k[last - 1].log_factor;
  std::size_t j = first;
  while (std::log2(k[j + 1].bytes) < x) ++j;
  const double x0 = std::log2(k[j].bytes);
  const double x1 = std::log2(k[j + 1].bytes);
  const double u = (x - x0) / (x1 - x0);
  return k[j].log_factor + u * (k[j + 1].log_factor - k[j].log_factor);
}
}  // namespace

double CollectiveModel::correction(double bytes, int group_size) const {
  if (knots.empty()) return 1.0;
  // Measured group sizes with knots, and the range of each in `knots`.
  struct Range {
    int n;
    std::size_t first, last;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < knots.size(); ++i) {
    if (ranges.empty() || ranges.back().n != knots[i].group_size) ranges.push_back({knots[i].group_size, i, i});
    ranges.back().last = i + 1;
  }
  auto r_of = [&](const Range& g) { return correction_of_group(knots, g.first, g.last, bytes); };
  // Group sizes measured without knots (the smooth curve was within kCollectiveCorrectionMin) count
  // as r = 0: the blend below runs over every measured group size.
  std::vector<std::pair<int, double>> rs;
  for (const auto& g : groups) {
    double r = 0.0;
    for (const auto& rg : ranges) {
      if (rg.n == g.group_size) r = r_of(rg);
    }
    rs.emplace_back(g.group_size, r);
  }
  if (group_size <= rs.front().first) return std::exp(rs.front().second);
  if (group_size >= rs.back().first) return std::exp(rs.back().second);
  std::size_t j = 0;
  while (rs[j + 1].first < group_size) ++j;
  const double x = std::log2(static_cast<double>(group_size));
  const double x0 = std::log2(static_cast<double>(rs[j].first));
  const double x1 = std::log2(static_cast<double>(rs[j + 1].first));
  const double u = (x - x0) / (x1 - x0);
  return std::exp(rs[j].second + u * (rs[j + 1].second - rs[j].second));
}

double CollectiveModel::latency_s(double bytes, int group_size) const {
  return correction(bytes, group_size) * params_for(group_size).alpha_s;
}

double CollectiveModel::bus_bandwidth_bytes_per_s(double bytes, int group_size) const {
  return params_for(group_size).bus_bandwidth_bytes_per_s(bytes) / correction(bytes, group_size);
}

double CollectiveModel::time_s(double bytes, int group_size) const {
  const double latency = latency_s(bytes, group_size);
  if (!(bytes > 0)) return latency;
  const double f = bus_bandwidth_factor(kind, group_size);
  return latency + (bytes * f) / bus_bandwidth_bytes_per_s(bytes, group_size);
}

namespace {

struct CollectiveCandidate {
  double alpha = 0;
  double inv_beta = 0;
  double c = 0;
  double p = 0;
  double sse = kInf;
};

// Fits t = alpha + f S / beta_max + c S^p for one p (c fixed to 0 when p is nullopt).
std::optional<CollectiveCandidate> fit_collective_candidate(const std::vector<CollectiveModel::Sample>& s, double f,
                                                            std::optional<double> p) {
  fit::Design a;
  std::vector<double> y;
  std::vector<double> w;
  for (const auto& x : s) {
    if (p)
      a.add_row({1.0, f * x.bytes, std::pow(x.bytes, *p)});
    else
      a.add_row({1.0, f * x.bytes});
    y.push_back(x.seconds);
    w.push_back(1.0 / (x.seconds * x.seconds));
  }
  std::vector<double> sol;
  try {
    sol = fit::nonnegative_least_squares(a, y, w);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (!(sol[1] > 0)) return std::nullopt;
  CollectiveCandidate c;
  c.alpha = sol[0];
  c.inv_beta = sol[1];
  c.c = p ? sol[2] : 0.0;
  c.p = p.value_or(0.0);
  c.sse = 0;
  for (const auto& x : s) {
    const double t = c.alpha + f * x.bytes * c.inv_beta + (c.c > 0 ? c.c * std::pow(x.bytes, c.p) : 0.0);
    const double r = (t - x.seconds) / x.seconds;
    c.sse += r * r;
  }
  return c;
}

}  // namespace

CollectiveModel CollectiveModel::fit(Collective kind, const std::vector<Sample>& samples, bool with_correction) {
  std::map<int, std::vector<Sample>> by_n;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "collective");
    if (s.group_size < 2)
      throw FitImpossible("collective: group_size must be at least 2, got " + std::to_string(s.group_size));
    if (!(s.bytes >= 0) || !std::isfinite(s.bytes))
      throw FitImpossible("collective: bytes must be a non-negative number");
    by_n[s.group_size].push_back(s);
  }
  if (by_n.empty()) throw FitImpossible("collective: needs at least 2 points");
  CollectiveModel model;
  model.kind = kind;
  for (const auto& [n, pts] : by_n) {
    std::set<double> sizes;
    for (const auto& s : pts) sizes.insert(s.bytes);
    if (sizes.size() < 2) {
      throw FitImpossible("collective: group size " + std::to_string(n) +
                          " needs points at 2 or more distinct sizes, has " + std::to_string(sizes.size()));
    }
    const double f = bus_bandwidth_factor(kind, n);
    auto best = fit_collective_candidate(pts, f, std::nullopt);
    if (sizes.size() >= 5) {
      // Coarse grid over the ramp exponent p = 1 - gamma, then a fine grid around the best.
      auto try_p = [&](double p) {
        auto c = fit_collective_candidate(pts, f, p);
        if (c && (!best || c->sse < best->sse)) best = c;
      };
      for (int i = 1; i <= 19; ++i) try_p(0.05 * i);
      if (best && best->c > 0) {
        const double centre = best->p;
        for (int i = -10; i <= 10; ++i) {
          const double p = centre + 0.005 * i;
          if (p >= 0.05 - 1e-12 && p <= 0.95 + 1e-12) try_p(p);
        }
      }
    }
    if (!best) {
      throw FitImpossible("collective: group size " + std::to_string(n) +
                          ": the measured time does not grow with size (measure sizes up to hundreds of MiB)");
    }
    CollectiveGroupParams g;
    g.group_size = n;
    g.alpha_s = best->alpha;
    g.beta_max_bytes_per_s = 1.0 / best->inv_beta;
    if (best->c > 0) {
      // c = f S_half^g / beta_max, g = 1 - p  =>  S_half = (c beta_max / f)^(1/g)
      g.gamma = 1.0 - best->p;
      g.s_half_bytes = std::pow(best->c * g.beta_max_bytes_per_s / f, 1.0 / g.gamma);
    } else {
      g.gamma = 1.0;
      g.s_half_bytes = 0.0;
    }
    model.groups.push_back(g);
  }
  if (!with_correction) return model;
  // Per-size correction: r_j = mean ln(t / smooth curve) of the points at each measured size.
  CollectiveModel smooth = model;
  for (const auto& [n, pts] : by_n) {
    std::map<double, std::pair<double, int>> by_size;  // bytes -> (sum of ln ratios, count)
    bool needed = false;
    for (const auto& s : pts) {
      const double ratio = s.seconds / smooth.time_s(s.bytes, n);
      if (std::fabs(ratio - 1.0) > kCollectiveCorrectionMin) needed = true;
      auto& acc = by_size[std::max(s.bytes, 1.0)];
      acc.first += std::log(ratio);
      acc.second += 1;
    }
    if (!needed) continue;
    for (const auto& [bytes, acc] : by_size) model.knots.push_back({n, bytes, acc.first / acc.second});
  }
  return model;
}

// -------------------------------------------------------------------------------------- constant

ConstantModel ConstantModel::fit(const std::vector<double>& seconds) {
  if (seconds.empty()) throw FitImpossible("needs at least 1 point");
  for (double s : seconds) require_positive_time(s, "host");
  return ConstantModel{fit::median(seconds)};
}

// ----------------------------------------------------------------------------------- library calls

double GemmCallModel::tiles(std::int64_t m, std::int64_t n, std::int64_t batch) {
  const auto up = [](std::int64_t v) { return static_cast<double>((std::max<std::int64_t>(v, 1) + 127) / 128); };
  return up(m) * up(n) * static_cast<double>(std::max<std::int64_t>(batch, 1));
}

bool GemmCallModel::splits(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) const {
  return split_ratio > 0.0 && static_cast<double>(std::max<std::int64_t>(k, 1)) / tiles(m, n, batch) >= split_ratio;
}

double GemmCallModel::time_s(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) const {
  return t_one_s + (splits(m, n, k, batch) ? t_extra_s : 0.0);
}

GemmCallModel GemmCallModel::fit(const std::vector<Sample>& samples) {
  std::vector<double> one;
  std::vector<std::pair<double, bool>> labelled;  // (k / tiles, split)
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "gemm call");
    if (s.nodes < 1) continue;
    if (s.nodes == 1) one.push_back(s.seconds);
    labelled.emplace_back(static_cast<double>(std::max<std::int64_t>(s.k, 1)) / tiles(s.m, s.n), s.nodes > 1);
  }
  if (one.empty()) throw FitImpossible("needs a point whose call launched one node");
  GemmCallModel m;
  m.t_one_s = fit::median(one);
  std::vector<double> extra;
  for (const auto& s : samples) {
    if (s.nodes > 1) extra.push_back(std::max(0.0, (s.seconds - m.t_one_s) / static_cast<double>(s.nodes - 1)));
  }
  if (extra.empty()) return m;  // no split seen: split_ratio 0, never predicted
  m.t_extra_s = fit::median(extra);
  // Boundaries: between consecutive distinct ratios (geometric mean), and above the largest (never).
  std::vector<double> r;
  for (const auto& l : labelled) r.push_back(l.first);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  struct Cut {
    double theta;  // 0: never split
    double gap;    // width in log ratio
  };
  std::vector<Cut> cuts;
  cuts.push_back({r.front() / 2.0, 0.0});
  for (std::size_t i = 0; i + 1 < r.size(); ++i) cuts.push_back({std::sqrt(r[i] * r[i + 1]), std::log(r[i + 1] / r[i])});
  cuts.push_back({0.0, 0.0});
  std::size_t best_errors = labelled.size() + 1;
  Cut best{0.0, 0.0};
  for (const Cut& c : cuts) {
    std::size_t errors = 0;
    for (const auto& [ratio, split] : labelled) errors += ((c.theta > 0.0 && ratio >= c.theta) != split) ? 1 : 0;
    if (errors < best_errors || (errors == best_errors && c.gap > best.gap)) best_errors = errors, best = c;
  }
  m.split_ratio = best.theta;
  return m;
}

double GroupedCallModel::time_s(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows) const {
  const std::size_t runs = std::max<std::size_t>(expert_rows_runs(total_rows, groups, max_rows).size(), 1);
  return t_one_s + static_cast<double>(runs - 1) * t_run_s;
}

GroupedCallModel GroupedCallModel::fit(const std::vector<Sample>& samples) {
  std::vector<double> one;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "grouped call");
    if (expert_rows_runs(s.total_rows, s.groups, s.max_rows).size() <= 1) one.push_back(s.seconds);
  }
  if (one.empty()) throw FitImpossible("needs a point whose experts form one run of equal rows");
  GroupedCallModel m;
  m.t_one_s = fit::median(one);
  std::vector<double> per_run;
  for (const auto& s : samples) {
    const std::size_t runs = expert_rows_runs(s.total_rows, s.groups, s.max_rows).size();
    if (runs > 1) per_run.push_back(std::max(0.0, (s.seconds - m.t_one_s) / static_cast<double>(runs - 1)));
  }
  if (!per_run.empty()) m.t_run_s = fit::median(per_run);
  return m;
}

// ----------------------------------------------------------------------------------- stream cycle

double StreamCycleModel::extra(int n) const {
  if (streams.empty() || n <= 1) return 0.0;
  if (n >= streams.back()) return extra_s.back();
  // Knots: (1, 0), then the measured stream counts.
  double x0 = 0.0, y0 = 0.0;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const double x1 = std::log2(static_cast<double>(streams[i]));
    if (n <= streams[i]) {
      const double w = (std::log2(static_cast<double>(n)) - x0) / (x1 - x0);
      return y0 + w * (extra_s[i] - y0);
    }
    x0 = x1, y0 = extra_s[i];
  }
  return extra_s.back();
}

StreamCycleModel StreamCycleModel::fit(const std::vector<Sample>& samples) {
  std::map<int, std::vector<double>> by_n;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "stream cycle");
    if (s.streams < 2) throw FitImpossible("stream cycle: streams must be at least 2 (one stream is the reference)");
    by_n[s.streams].push_back(s.seconds);
  }
  if (by_n.empty()) throw FitImpossible("stream cycle: needs at least one point");
  StreamCycleModel m;
  for (auto& [n, t] : by_n) {
    m.streams.push_back(n);
    m.extra_s.push_back(fit::median(t));
  }
  return m;
}

// ----------------------------------------------------------------------------------- concurrency

namespace {
double ideal_speedup(int streams, double sm_fraction) {
  return std::min(static_cast<double>(streams), 1.0 / sm_fraction);
}
}  // namespace

double ConcurrencyModel::speedup(int streams_count, double sm_fraction) const {
  if (streams_count <= 1) return 1.0;
  const double ideal = ideal_speedup(streams_count, sm_fraction);
  if (ideal <= 1.0) return 1.0;
  double e = efficiency.front();
  if (streams_count >= streams.back()) {
    e = efficiency.back();
  } else if (streams_count > streams.front()) {
    std::size_t j = 0;
    while (streams[j + 1] < streams_count) ++j;
    const double u = static_cast<double>(streams_count - streams[j]) / static_cast<double>(streams[j + 1] - streams[j]);
    e = efficiency[j] + u * (efficiency[j + 1] - efficiency[j]);
  }
  return std::pow(ideal, e);
}

ConcurrencyModel ConcurrencyModel::fit(const std::vector<Sample>& samples) {
  std::map<int, std::vector<double>> by_n;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "concurrency");
    require_positive_time(s.serial_s, "concurrency");
    if (s.streams < 1) throw FitImpossible("concurrency: streams must be at least 1");
    if (!(s.sm_fraction > 0 && s.sm_fraction <= 1)) throw FitImpossible("concurrency: sm_fraction must be in (0, 1]");
    const double ideal = ideal_speedup(s.streams, s.sm_fraction);
    if (s.streams < 2 || ideal <= 1.0 + 1e-9) continue;
    by_n[s.streams].push_back(std::log(s.serial_s / s.seconds) / std::log(ideal));
  }
  if (by_n.empty()) {
    throw FitImpossible(
        "concurrency: needs a point with 2 or more streams of kernels that leave room for another (sm_fraction < 1)");
  }
  ConcurrencyModel m;
  for (auto& [n, es] : by_n) {
    m.streams.push_back(n);
    m.efficiency.push_back(fit::median(es));
  }
  return m;
}

// ---- NCCL-resident slowdown ("nccl_resident_v2") ----
// GEMM t = alone * G_c(T) (measured curve, linear in ln T between knots), alone * a_c / alone * b_c
// otherwise (models.hpp).

bool NcclInterferenceModel::has(NcclResidentCase c) const {
  return std::find(cases.begin(), cases.end(), static_cast<int>(c)) != cases.end();
}

namespace {

// A measured slowdown curve of case row i: knots `tiles`, values case-major in `factor`; linear in
// ln T between knots, flat beyond them, the knots' median for T <= 0.
double curve_at(const std::vector<double>& tiles, const std::vector<double>& factor, std::size_t i, double t) {
  const std::size_t k = tiles.size();
  const auto g = factor.begin() + static_cast<std::ptrdiff_t>(i * k);
  if (!(t > 0)) return fit::median(std::vector<double>(g, g + static_cast<std::ptrdiff_t>(k)));
  if (t <= tiles.front()) return g[0];
  if (t >= tiles.back()) return g[static_cast<std::ptrdiff_t>(k - 1)];
  const auto hi = static_cast<std::size_t>(std::upper_bound(tiles.begin(), tiles.end(), t) - tiles.begin());
  const std::size_t lo = hi - 1;
  const double w = std::log(t / tiles[lo]) / std::log(tiles[hi] / tiles[lo]);
  return g[static_cast<std::ptrdiff_t>(lo)] * (1.0 - w) + g[static_cast<std::ptrdiff_t>(hi)] * w;
}

}  // namespace

double NcclInterferenceModel::factor(NcclResidentCase c, ComputeClass kind, double tiles) const {
  const auto it = std::find(cases.begin(), cases.end(), static_cast<int>(c));
  if (it == cases.end()) return 1.0;
  const auto i = static_cast<std::size_t>(it - cases.begin());
  switch (kind) {
    case ComputeClass::grouped_gemm:
      if (!grouped_tiles.empty()) return curve_at(grouped_tiles, grouped_factor, i, tiles);
      return curve_at(gemm_tiles, gemm_factor, i, tiles);
    case ComputeClass::gemm: return curve_at(gemm_tiles, gemm_factor, i, tiles);
    case ComputeClass::attention:
      return attention_factor[i];
    case ComputeClass::memory:
      return memory_factor[i];
  }
  return 1.0;
}

NcclInterferenceModel NcclInterferenceModel::fit(const std::vector<Sample>& samples) {
  std::map<int, std::array<std::vector<const Sample*>, 4>> by_case;
  for (const auto& s : samples) {
    require_positive_time(s.seconds, "nccl interference");
    require_positive_time(s.alone_s, "nccl interference (alone_s)");
    if (s.kase < 0 || s.kase > 1) throw FitImpossible("nccl interference: case must be 0 (pending) or 1 (transfer)");
    if (s.kind < 0 || s.kind > 3) {
      throw FitImpossible("nccl interference: kernel must be 0 (gemm), 1 (attention), 2 (memory) or 3 (grouped GEMM)");
    }
    if ((s.kind == 0 || s.kind == 3) && !(s.tiles > 0)) {
      throw FitImpossible("nccl interference: a GEMM or grouped GEMM point needs tiles > 0");
    }
    if (s.tiles < 0) throw FitImpossible("nccl interference: tiles must be >= 0");
    by_case[s.kase][static_cast<std::size_t>(s.kind)].push_back(&s);
  }
  if (by_case.empty()) throw FitImpossible("nccl interference: no points");
  NcclInterferenceModel m;
  const char* names[3] = {"GEMM", "attention", "memory-bound"};
  for (const auto& [c, kinds] : by_case) {
    for (std::size_t k = 0; k < 3; ++k) {
      if (kinds[k].empty()) {
        throw FitImpossible("nccl interference: case " + std::to_string(c) + " has no " + names[k] + " point");
      }
    }
    // The case's GEMM curve (and grouped GEMM curve): the median slowdown at each measured tile count.
    auto curve = [&](const std::vector<const Sample*>& pts, std::vector<double>& knots, std::vector<double>& values,
                     const char* what) {
      std::map<double, std::vector<double>> at;
      for (const Sample* s : pts) at[s->tiles].push_back(s->seconds / s->alone_s);
      std::vector<double> tiles;
      for (const auto& [t, r] : at) {
        tiles.push_back(t);
        values.push_back(fit::median(r));
      }
      if (m.cases.empty()) {
        knots = tiles;
      } else if (tiles != knots) {
        throw FitImpossible("nccl interference: case " + std::to_string(c) + " measured " + what +
                            " of other tile counts than case " + std::to_string(m.cases.front()) +
                            "; every case must measure the same " + what);
      }
    };
    curve(kinds[0], m.gemm_tiles, m.gemm_factor, "GEMMs");
    if (!m.cases.empty() && kinds[3].empty() != m.grouped_tiles.empty()) {
      throw FitImpossible("nccl interference: case " + std::to_string(c) + (kinds[3].empty() ? " has no" : " has") +
                          " grouped GEMM points and case " + std::to_string(m.cases.front()) +
                          (kinds[3].empty() ? " has" : " has none") + "; every case must measure the same kernels");
    }
    if (!kinds[3].empty()) curve(kinds[3], m.grouped_tiles, m.grouped_factor, "grouped GEMMs");
    auto ratio_median = [](const std::vector<const Sample*>& v) {
      std::vector<double> r;
      for (const Sample* s : v) r.push_back(s->seconds / s->alone_s);
      return fit::median(r);
    };
    m.cases.push_back(c);
    m.attention_factor.push_back(ratio_median(kinds[1]));
    m.memory_factor.push_back(ratio_median(kinds[2]));
  }
  return m;
}

// ---- NCCL device memory ("nccl_memory_v1") ----

double NcclMemoryModel::stage_bytes(int stage) const {
  switch (stage) {
    case 0:
      return communicator_bytes;
    case 1:
      return collective_bytes;
    case 2:
      return p2p_peer_bytes;
    default:
      throw std::invalid_argument("nccl memory: stage must be 0, 1 or 2");
  }
}

namespace {

// The median bytes of each stage of a staged memory measurement (nccl.memory, device.memory):
// FitImpossible naming `what` and the stage for an unknown stage, negative bytes or a stage without
// points.
template <std::size_t N>
std::array<double, N> stage_medians(const std::vector<StageSample>& samples, const char* what,
                                    const std::array<const char*, N>& names) {
  std::array<std::vector<double>, N> by_stage;
  for (const auto& [stage, bytes] : samples) {
    if (stage < 0 || stage >= static_cast<int>(N)) {
      std::string allowed;
      for (std::size_t i = 0; i < N; ++i) {
        allowed += (i ? ", " : "") + std::to_string(i) + " (" + names[i] + ")";
      }
      throw FitImpossible(std::string(what) + ": stage must be " + allowed);
    }
    if (!(bytes >= 0) || !std::isfinite(bytes)) throw FitImpossible(std::string(what) + ": bytes must be >= 0");
    by_stage[static_cast<std::size_t>(stage)].push_back(bytes);
  }
  std::array<double, N> m{};
  for (std::size_t i = 0; i < N; ++i) {
    if (by_stage[i].empty()) throw FitImpossible(std::string(what) + ": no point of stage " + names[i]);
    m[i] = fit::median(by_stage[i]);
  }
  return m;
}

}  // namespace

NcclMemoryModel NcclMemoryModel::fit(const std::vector<Sample>& samples) {
  const auto m = stage_medians<3>(samples, "nccl memory",
                                  {"communicator init", "first collectives", "first send/recv with a peer"});
  NcclMemoryModel out;
  out.communicator_bytes = m[0];
  out.collective_bytes = m[1];
  out.p2p_peer_bytes = m[2];
  return out;
}

// ---- expert-parallel dispatch over RDMA ("expert_dispatch_v1") ----

double ExpertDispatchModel::bandwidth(int n, int direction) const {
  const std::vector<double>& bw = direction == 0 ? dispatch_bps : combine_bps;
  if (group_size.empty() || bw.size() != group_size.size()) {
    throw std::logic_error("expert dispatch model without group sizes");
  }
  if (n <= group_size.front()) return bw.front();
  if (n >= group_size.back()) return bw.back();
  std::size_t i = 1;
  while (group_size[i] < n) ++i;
  const double x0 = std::log2(static_cast<double>(group_size[i - 1]));
  const double x1 = std::log2(static_cast<double>(group_size[i]));
  const double w = (std::log2(static_cast<double>(n)) - x0) / (x1 - x0);
  return bw[i - 1] + w * (bw[i] - bw[i - 1]);
}

ExpertDispatchModel ExpertDispatchModel::fit(const std::vector<Sample>& samples) {
  if (samples.empty()) throw FitImpossible("expert dispatch: no points");
  std::map<int, std::array<std::vector<double>, 2>> rates;
  for (const Sample& x : samples) {
    if (x.direction != 0 && x.direction != 1) {
      throw FitImpossible("expert dispatch: direction " + std::to_string(x.direction) + " (0: dispatch, 1: combine)");
    }
    if (!(x.bytes > 0.0) || !(x.time_s > 0.0)) throw FitImpossible("expert dispatch: a point with bytes or time <= 0");
    rates[x.group_size][static_cast<std::size_t>(x.direction)].push_back(x.bytes / x.time_s);
  }
  ExpertDispatchModel m;
  for (auto& [n, r] : rates) {
    if (r[0].empty() || r[1].empty()) {
      throw FitImpossible("expert dispatch: group size " + std::to_string(n) + " lacks the dispatch or the combine");
    }
    m.group_size.push_back(n);
    m.dispatch_bps.push_back(fit::median(r[0]));
    m.combine_bps.push_back(fit::median(r[1]));
  }
  return m;
}

// ---- per-process device memory ("device_memory_v1") ----

double DeviceMemoryModel::stage_bytes(int stage) const {
  switch (stage) {
    case 0: return context_bytes;
    case 1: return modules_bytes;
    case 2: return blas_bytes;
    case 3: return blas_further_bytes;
    case 4: return cudnn_bytes;
    case 5: return granularity_bytes;
    default: throw std::invalid_argument("device memory: stage must be 0 to 5");
  }
}

DeviceMemoryModel DeviceMemoryModel::fit(const std::vector<Sample>& samples) {
  const auto m =
      stage_medians<kStages>(samples, "device memory",
                             {"CUDA context", "first kernel launches", "first cuBLASLt handle and workspace",
                              "further cuBLASLt handle", "cuDNN handle and fused attention", "allocation granularity"});
  DeviceMemoryModel out;
  out.context_bytes = m[0];
  out.modules_bytes = m[1];
  out.blas_bytes = m[2];
  out.blas_further_bytes = m[3];
  out.cudnn_bytes = m[4];
  out.granularity_bytes = m[5];
  return out;
}

}  // namespace threewalls::calibration
