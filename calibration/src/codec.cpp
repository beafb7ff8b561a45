#include "codec.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "threewalls/calibration/fit.hpp"

namespace threewalls::calibration::detail {

namespace {

std::int64_t as_int(double v) { return static_cast<std::int64_t>(std::llround(v)); }

std::size_t index_of(const FamilySpec& spec, std::string_view key) {
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    if (spec.params[i].key == key) return i;
  }
  throw std::logic_error("family " + spec.name + " has no parameter " + std::string(key));
}

double scalar(const FamilySpec& spec, const Params& p, std::string_view key) { return p.at(index_of(spec, key)).at(0); }
const std::vector<double>& array(const FamilySpec& spec, const Params& p, std::string_view key) {
  return p.at(index_of(spec, key));
}

DeviceConstants device_of(const Hardware& hw, Dtype dt) { return {hw.sm_count, hw.peak_flop_per_s(dt)}; }

// The optional residual correction of a GEMM family: centres from the shape arrays `keys` (in the
// order of the features), log factors, bandwidth and prior weight; empty when absent.
template <std::size_t D, typename Features>
ShapeCorrection correction_of(const FamilySpec& s, const Params& p, const std::array<const char*, D>& keys,
                              Features features) {
  ShapeCorrection c;
  const auto& r = array(s, p, "correction_log_factor");
  if (r.empty()) return c;
  c.dims = D;
  c.log_factor = r;
  c.bandwidth = array(s, p, "correction_bandwidth").at(0);
  c.prior_weight = array(s, p, "correction_prior_weight").at(0);
  c.features.reserve(r.size() * D);
  for (std::size_t j = 0; j < r.size(); ++j) {
    std::array<std::int64_t, D> shape{};
    for (std::size_t d = 0; d < D; ++d) shape[d] = as_int(array(s, p, std::string("correction_") + keys[d]).at(j));
    const auto x = std::apply(features, shape);
    c.features.insert(c.features.end(), x.begin(), x.end());
  }
  return c;
}

constexpr std::array<const char*, 3> kGemmCorrectionShape = {"m", "n", "k"};
constexpr std::array<const char*, 5> kGroupedCorrectionShape = {"groups", "total_rows", "max_rows", "n", "k"};

GemmModel gemm_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  GemmModel m;
  m.tile_m = static_cast<int>(as_int(scalar(s, p, "tile_m")));
  m.tile_n = static_cast<int>(as_int(scalar(s, p, "tile_n")));
  m.efficiency_max = scalar(s, p, "efficiency_max");
  m.k_half = scalar(s, p, "k_half");
  m.wave_tail = scalar(s, p, "wave_tail");
  m.overhead_s = scalar(s, p, "overhead_s");
  m.memory_bandwidth_bytes_per_s = scalar(s, p, "memory_bandwidth_bytes_per_s");
  m.device = device_of(hw, s.dtype);
  m.elements = element_bytes(s.dtype);
  m.correction = correction_of(s, p, kGemmCorrectionShape, gemm_correction_features);
  return m;
}

GroupedGemmModel grouped_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  GroupedGemmModel m;
  m.tile_m = static_cast<int>(as_int(scalar(s, p, "tile_m")));
  m.tile_n = static_cast<int>(as_int(scalar(s, p, "tile_n")));
  m.efficiency_max = scalar(s, p, "efficiency_max");
  m.k_half = scalar(s, p, "k_half");
  m.overhead_s = scalar(s, p, "overhead_s");
  m.memory_bandwidth_bytes_per_s = scalar(s, p, "memory_bandwidth_bytes_per_s");
  m.device = device_of(hw, s.dtype);
  m.elements = element_bytes(s.dtype);
  // Optional: present = batched-calls form; absent = wave form.
  if (const auto& wt = array(s, p, "wave_tail"); !wt.empty()) {
    m.batched_calls = true;
    m.wave_tail = wt.at(0);
    m.call_overhead_s = array(s, p, "call_overhead_s").at(0);
  }
  m.correction = correction_of(s, p, kGroupedCorrectionShape, grouped_correction_features);
  return m;
}

AttentionModel attention_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  AttentionModel m;
  m.tile_q = static_cast<int>(as_int(scalar(s, p, "tile_q")));
  m.efficiency_max = scalar(s, p, "efficiency_max");
  m.s_half = scalar(s, p, "s_half");
  m.d_half = scalar(s, p, "d_half");
  m.overhead_s = scalar(s, p, "overhead_s");
  m.memory_bandwidth_bytes_per_s = scalar(s, p, "memory_bandwidth_bytes_per_s");
  m.backward = s.backward;
  m.device = device_of(hw, Dtype::bf16);
  // Optional: present = blocked form (the backend's unfused attention); absent (older profiles) = v1.
  if (const auto& ps = array(s, p, "pair_s"); !ps.empty()) {
    m.blocked = true;
    m.pair_s = ps.at(0);
  }
  return m;
}

LinearModel linear_of(const FamilySpec& s, const Params& p) {
  LinearModel m;
  m.alpha_s = scalar(s, p, "alpha_s");
  m.knots_bytes = array(s, p, "knots_bytes");
  m.bandwidths_bytes_per_s = array(s, p, "bandwidths_bytes_per_s");
  return m;
}

// kernel_terms_v1: the terms' factors from the family table; parameters overhead_s, then one
// coefficient per term (none when `p` is empty: the fit only needs the factors).
KernelTermsModel kernel_terms_of(const FamilySpec& s, const Params& p) {
  const KernelTermsFamily* k = find_kernel_terms_family(s.name);
  if (!k) throw std::logic_error("family " + s.name + " is not in the kernel_terms table");
  KernelTermsModel m;
  for (const auto& t : k->terms) m.factors.push_back(t.factors);
  if (p.empty()) return m;
  m.overhead_s = scalar(s, p, "overhead_s");
  for (const auto& t : k->terms) m.coefficients_s.push_back(scalar(s, p, t.param));
  return m;
}

CollectiveModel collective_of(const FamilySpec& s, const Params& p) {
  CollectiveModel m;
  m.kind = s.collective;
  const auto& n = array(s, p, "group_size");
  for (std::size_t i = 0; i < n.size(); ++i) {
    CollectiveGroupParams g;
    g.group_size = static_cast<int>(as_int(n[i]));
    g.alpha_s = array(s, p, "alpha_s")[i];
    g.beta_max_bytes_per_s = array(s, p, "beta_max_bytes_per_s")[i];
    g.s_half_bytes = array(s, p, "s_half_bytes")[i];
    g.gamma = array(s, p, "gamma")[i];
    m.groups.push_back(g);
  }
  const auto& kn = array(s, p, "correction_group_size");
  for (std::size_t i = 0; i < kn.size(); ++i) {
    m.knots.push_back({static_cast<int>(as_int(kn[i])), array(s, p, "correction_bytes")[i],
                       array(s, p, "correction_log_factor")[i]});
  }
  return m;
}

StreamCycleModel stream_cycle_of(const FamilySpec& s, const Params& p) {
  StreamCycleModel m;
  for (double v : array(s, p, "streams")) m.streams.push_back(static_cast<int>(as_int(v)));
  m.extra_s = array(s, p, "extra_s");
  return m;
}

GemmCallModel gemm_call_of(const FamilySpec& s, const Params& p) {
  return GemmCallModel{scalar(s, p, "t_one_s"), scalar(s, p, "t_extra_s"), scalar(s, p, "split_ratio")};
}

GroupedCallModel grouped_call_of(const FamilySpec& s, const Params& p) {
  return GroupedCallModel{scalar(s, p, "t_one_s"), scalar(s, p, "t_run_s")};
}

ConcurrencyModel concurrency_of(const FamilySpec& s, const Params& p) {
  ConcurrencyModel m;
  for (double v : array(s, p, "streams")) m.streams.push_back(static_cast<int>(as_int(v)));
  m.efficiency = array(s, p, "efficiency");
  return m;
}

NcclInterferenceModel nccl_interference_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  NcclInterferenceModel m;
  m.sm_count = hw.sm_count;
  for (double v : array(s, p, "cases")) m.cases.push_back(static_cast<int>(as_int(v)));
  m.held_sms = array(s, p, "held_sms");
  m.gemm_factor = array(s, p, "gemm_factor");
  m.attention_factor = array(s, p, "attention_factor");
  m.memory_factor = array(s, p, "memory_factor");
  return m;
}

NcclMemoryModel nccl_memory_of(const FamilySpec& s, const Params& p) {
  NcclMemoryModel m;
  m.communicator_bytes = scalar(s, p, "communicator_bytes");
  m.collective_bytes = scalar(s, p, "collective_bytes");
  m.p2p_peer_bytes = scalar(s, p, "p2p_peer_bytes");
  return m;
}

// Group sizes and stream counts become ints; anything this large is not a machine.
constexpr double kMaxRanks = 1 << 20;

int small_int(double v, const char* what) {
  if (!(v >= 0 && v <= kMaxRanks)) throw FitImpossible(std::string(what) + " must be between 0 and 1048576");
  return static_cast<int>(as_int(v));
}

double round_param(double v) { return fit::round_significant(v, kParamDigits); }

Params round_all(Params p) {
  for (auto& v : p) {
    for (double& x : v) x = round_param(x);
  }
  return p;
}

std::vector<double> measured_medians(const std::vector<Point>& pts) {
  std::vector<double> y;
  y.reserve(pts.size());
  for (const auto& p : pts) y.push_back(p.time.median_s);
  return y;
}

AttentionShape attention_shape(const Point& p) {
  AttentionShape s;
  s.batch = as_int(p.inputs[0]);
  s.seq_q = as_int(p.inputs[1]);
  s.seq_kv = as_int(p.inputs[2]);
  s.heads = as_int(p.inputs[3]);
  s.kv_heads = as_int(p.inputs[4]);
  s.head_dim_qk = as_int(p.inputs[5]);
  s.head_dim_v = as_int(p.inputs[6]);
  s.causal = as_int(p.inputs[7]) != 0;
  return s;
}

std::vector<double>& array_ref(const FamilySpec& spec, Params& p, std::string_view key) { return p.at(index_of(spec, key)); }

// The fitted correction's log factors (rounded like every parameter), bandwidth and prior weight.
void put_correction(const FamilySpec& spec, Params& out, const ShapeCorrection& c) {
  auto& r = array_ref(spec, out, "correction_log_factor");
  for (const double v : c.log_factor) r.push_back(round_param(v));
  array_ref(spec, out, "correction_bandwidth") = {c.bandwidth};
  array_ref(spec, out, "correction_prior_weight") = {c.prior_weight};
}

// Fits the residual correction over a family's fit points and stores it with the centres' shapes:
// `shape_of(x)` gives the values of `keys` for sample x, `features_of(x)` its log features and
// `model_s(x)` the stored (rounded) parametric time. Nothing is stored when "no correction" wins.
template <std::size_t D, class Sample, class ShapeOf, class FeaturesOf, class ModelS>
void fit_correction(const FamilySpec& spec, Params& out, const std::vector<Sample>& s,
                    const std::array<const char*, D>& keys, ShapeOf shape_of, FeaturesOf features_of,
                    ModelS model_s) {
  std::vector<double> features, residuals;
  for (const auto& x : s) {
    const auto f = features_of(x);
    features.insert(features.end(), f.begin(), f.end());
    residuals.push_back(std::log(x.seconds / model_s(x)));
  }
  const auto c = ShapeCorrection::fit(D, features, residuals);
  if (c.empty()) return;
  for (const auto& x : s) {
    const std::array<double, D> v = shape_of(x);
    for (std::size_t i = 0; i < D; ++i) array_ref(spec, out, std::string("correction_") + keys[i]).push_back(v[i]);
  }
  put_correction(spec, out, c);
}

}  // namespace

bool shape_correction_fitted(const FamilySpec& spec) {
  // Dense fp8 and grouped GEMMs (docs/calibration.md, "Residual correction": dense bf16 is left
  // without, its held-out errors grew with it on every data set).
  return (spec.kind == ModelKind::gemm && spec.dtype == Dtype::fp8) || spec.kind == ModelKind::grouped_gemm;
}

double memory_bandwidth(const FitContext& ctx) {
  if (ctx.find) {
    if (const Family* d2d = ctx.find(copy_family(CopyDirection::d2d)); d2d && !d2d->params.empty()) {
      return 2.0 * decode_linear(*d2d).asymptotic_bandwidth_bytes_per_s();
    }
  }
  return ctx.hardware->hbm_bandwidth_datasheet_bytes_per_s;
}

Params fit_params(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) {
  const Hardware& hw = *ctx.hardware;
  switch (spec.kind) {
    case ModelKind::gemm: {
      std::vector<GemmModel::Sample> s;
      for (const auto& p : points) {
        s.push_back(
            {as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]), p.time.median_s});
      }
      const auto m = GemmModel::fit(s, device_of(hw, spec.dtype), element_bytes(spec.dtype), memory_bandwidth(ctx));
      Params out = round_all({{static_cast<double>(m.tile_m)},
                              {static_cast<double>(m.tile_n)},
                              {m.efficiency_max},
                              {m.k_half},
                              {m.wave_tail},
                              {m.overhead_s},
                              {m.memory_bandwidth_bytes_per_s}});
      out.resize(spec.params.size());  // the optional correction arrays, empty unless fitted below
      if (shape_correction_fitted(spec)) {
        // Residuals of the stored (rounded) roofline; centres are the fit points' shapes.
        const GemmModel stored = gemm_of(spec, out, hw);
        fit_correction(
            spec, out, s, kGemmCorrectionShape,
            [](const auto& x) { return std::array<double, 3>{static_cast<double>(x.m), static_cast<double>(x.n), static_cast<double>(x.k)}; },
            [](const auto& x) { return gemm_correction_features(x.m, x.n, x.k); },
            [&](const auto& x) { return stored.roofline_time_s(x.m, x.n, x.k, x.batch); });
      }
      return out;
    }
    case ModelKind::grouped_gemm: {
      const std::string dense_name = gemm_family(spec.dtype);
      const Family* dense = ctx.find ? ctx.find(dense_name) : nullptr;
      if (!dense || dense->params.empty()) {
        throw FitImpossible("needs the family " + dense_name +
                            " in the same profile (the grouped model reuses its tile shape and k_half)");
      }
      std::vector<GroupedGemmModel::Sample> s;
      for (const auto& p : points) {
        s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]),
                     as_int(p.inputs[4]), p.time.median_s});
      }
      // Batched-calls form for bf16 (the backend's lt_batched grouped GEMM); wave form otherwise.
      const auto m = GroupedGemmModel::fit(s, decode_gemm(*dense, hw), spec.dtype == Dtype::bf16);
      Params out{{static_cast<double>(m.tile_m)},
                 {static_cast<double>(m.tile_n)},
                 {m.efficiency_max},
                 {m.k_half},
                 {m.overhead_s},
                 {m.memory_bandwidth_bytes_per_s},
                 {},
                 {}};
      if (m.batched_calls) {
        out[6] = {m.wave_tail};
        out[7] = {m.call_overhead_s};
      }
      out = round_all(out);
      out.resize(spec.params.size());  // the optional correction arrays, empty unless fitted below
      if (shape_correction_fitted(spec)) {
        const GroupedGemmModel stored = grouped_of(spec, out, hw);
        fit_correction(
            spec, out, s, kGroupedCorrectionShape,
            [](const auto& x) {
              return std::array<double, 5>{static_cast<double>(x.groups), static_cast<double>(x.total_rows), static_cast<double>(x.max_rows), static_cast<double>(x.n), static_cast<double>(x.k)};
            },
            [](const auto& x) { return grouped_correction_features(x.groups, x.total_rows, x.max_rows, x.n, x.k); },
            [&](const auto& x) { return stored.parametric_time_s(x.groups, x.total_rows, x.max_rows, x.n, x.k); });
      }
      return out;
    }
    case ModelKind::attention: {
      std::vector<AttentionModel::Sample> s;
      for (const auto& p : points) s.push_back({attention_shape(p), p.time.median_s});
      // Both forms; the blocked one (the backend's unfused attention, one more parameter) only where it
      // fits the points better: a measured calibration of threewalls' kernel, not the fused curve the
      // default profiles are generated from (docs/calibration.md, "Attention").
      const auto v1 = AttentionModel::fit(s, spec.backward, device_of(hw, Dtype::bf16), memory_bandwidth(ctx), false);
      const std::vector<double> measured = measured_medians(points);
      auto median_error = [&](const AttentionModel& m) {
        std::vector<double> predicted;
        for (const auto& x : s) predicted.push_back(m.time_s(x.shape));
        return fit::relative_error_stats(predicted, measured).median;
      };
      AttentionModel m = v1;
      if (s.size() >= 5) {
        const auto blocked = AttentionModel::fit(s, spec.backward, device_of(hw, Dtype::bf16), memory_bandwidth(ctx), true);
        if (median_error(blocked) < median_error(v1)) m = blocked;
      }
      Params out{{static_cast<double>(m.tile_q)},
                 {m.efficiency_max},
                 {m.s_half},
                 {m.d_half},
                 {m.overhead_s},
                 {m.memory_bandwidth_bytes_per_s},
                 {}};
      if (m.blocked) out[6] = {m.pair_s};
      return round_all(out);
    }
    case ModelKind::linear: {
      std::vector<LinearModel::Sample> s;
      for (const auto& p : points) s.push_back({p.inputs[0], p.time.median_s});
      const auto m = LinearModel::fit(s);
      return round_all({{m.alpha_s}, m.knots_bytes, m.bandwidths_bytes_per_s});
    }
    case ModelKind::kernel_terms: {
      std::vector<KernelTermsModel::Sample> s;
      for (const auto& p : points) s.push_back({p.inputs, p.time.median_s});
      const auto m = KernelTermsModel::fit(kernel_terms_of(spec, {}).factors, s);
      Params out{{m.overhead_s}};
      for (const double c : m.coefficients_s) out.push_back({c});
      return round_all(out);
    }
    case ModelKind::collective: {
      std::vector<CollectiveModel::Sample> s;
      for (const auto& p : points) s.push_back({small_int(p.inputs[0], "group_size"), p.inputs[1], p.time.median_s});
      const auto m = CollectiveModel::fit(spec.collective, s);
      Params out(8);
      for (const auto& g : m.groups) {
        out[0].push_back(g.group_size);
        out[1].push_back(g.alpha_s);
        out[2].push_back(g.beta_max_bytes_per_s);
        out[3].push_back(g.s_half_bytes);
        out[4].push_back(g.gamma);
      }
      for (const auto& k : m.knots) {
        out[5].push_back(k.group_size);
        out[6].push_back(k.bytes);
        out[7].push_back(k.log_factor);
      }
      return round_all(out);
    }
    case ModelKind::constant: {
      return round_all({{ConstantModel::fit(measured_medians(points)).value_s}});
    }
    case ModelKind::gemm_call: {
      std::vector<GemmCallModel::Sample> s;
      for (const auto& p : points) {
        s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]),
                     static_cast<int>(as_int(p.inputs[3])), p.time.median_s});
      }
      const auto m = GemmCallModel::fit(s);
      return round_all({{m.t_one_s}, {m.t_extra_s}, {m.split_ratio}});
    }
    case ModelKind::stream_cycle: {
      std::vector<StreamCycleModel::Sample> s;
      for (const auto& p : points) s.push_back({small_int(p.inputs[0], "streams"), p.time.median_s});
      const auto m = StreamCycleModel::fit(s);
      std::vector<double> streams(m.streams.begin(), m.streams.end());
      return round_all({streams, m.extra_s});
    }
    case ModelKind::grouped_call: {
      std::vector<GroupedCallModel::Sample> s;
      for (const auto& p : points) {
        s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), p.time.median_s});
      }
      const auto m = GroupedCallModel::fit(s);
      return round_all({{m.t_one_s}, {m.t_run_s}});
    }
    case ModelKind::concurrency: {
      std::vector<ConcurrencyModel::Sample> s;
      for (const auto& p : points) {
        s.push_back({small_int(p.inputs[0], "streams"), p.inputs[1], p.inputs[2], p.time.median_s});
      }
      const auto m = ConcurrencyModel::fit(s);
      std::vector<double> streams(m.streams.begin(), m.streams.end());
      return round_all({streams, m.efficiency});
    }
    case ModelKind::nccl_interference: {
      std::vector<NcclInterferenceModel::Sample> s;
      for (const auto& p : points) {
        s.push_back({small_int(p.inputs[0], "case"), small_int(p.inputs[1], "kernel"), p.inputs[2], p.inputs[3],
                     p.time.median_s});
      }
      const auto m = NcclInterferenceModel::fit(s, hw.sm_count);
      std::vector<double> cases(m.cases.begin(), m.cases.end());
      return round_all({cases, m.held_sms, m.gemm_factor, m.attention_factor, m.memory_factor});
    }
    case ModelKind::nccl_memory: {
      std::vector<NcclMemoryModel::Sample> s;
      for (const auto& p : points) s.push_back({small_int(p.inputs[0], "stage"), p.inputs[2]});
      const auto m = NcclMemoryModel::fit(s);
      return round_all({{m.communicator_bytes}, {m.collective_bytes}, {m.p2p_peer_bytes}});
    }
  }
  throw std::logic_error("unhandled model kind");
}

double predict(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  switch (spec.kind) {
    case ModelKind::gemm:
      return gemm_of(spec, params, hw)
          .time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]));
    case ModelKind::grouped_gemm:
      return grouped_of(spec, params, hw)
          .time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), as_int(p.inputs[3]),
                  as_int(p.inputs[4]));
    case ModelKind::attention:
      return attention_of(spec, params, hw).time_s(attention_shape(p));
    case ModelKind::linear:
      return linear_of(spec, params).time_s(p.inputs[0]);
    case ModelKind::kernel_terms:
      return kernel_terms_of(spec, params).time_s(p.inputs);
    case ModelKind::collective:
      return collective_of(spec, params).time_s(p.inputs[1], static_cast<int>(as_int(p.inputs[0])));
    case ModelKind::constant:
      return scalar(spec, params, "value_s");
    case ModelKind::gemm_call:
      return gemm_call_of(spec, params).time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]));
    case ModelKind::stream_cycle:
      return stream_cycle_of(spec, params).extra(static_cast<int>(as_int(p.inputs[0])));
    case ModelKind::grouped_call:
      return grouped_call_of(spec, params).time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]));
    case ModelKind::concurrency:
      return p.inputs[2] / concurrency_of(spec, params).speedup(static_cast<int>(as_int(p.inputs[0])), p.inputs[1]);
    case ModelKind::nccl_interference: {
      const auto c = static_cast<NcclResidentCase>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 1));
      const auto k = static_cast<ComputeClass>(std::clamp<std::int64_t>(as_int(p.inputs[1]), 0, 2));
      return p.inputs[3] * nccl_interference_of(spec, params, hw).factor(c, k, p.inputs[2]);
    }
    case ModelKind::nccl_memory:
      // The measured quantity of this family is bytes (measured_value): the fit errors are over bytes.
      return nccl_memory_of(spec, params).stage_bytes(static_cast<int>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 2)));
  }
  throw std::logic_error("unhandled model kind");
}

std::optional<std::string> check_params(const FamilySpec& spec, const Params& params) {
  if (params.size() != spec.params.size()) return "expected " + std::to_string(spec.params.size()) + " parameters";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& ps = spec.params[i];
    if (!ps.array && params[i].size() != 1) return "'" + ps.key + "' must be a single number";
    for (double v : params[i]) {
      if (!std::isfinite(v)) return "'" + ps.key + "' must be finite";
      if (ps.integer && v != std::floor(v)) return "'" + ps.key + "' must be an integer";
    }
  }
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  switch (spec.kind) {
    case ModelKind::gemm:
    case ModelKind::grouped_gemm:
      if (s("tile_m") < 1 || s("tile_n") < 1) return "'tile_m' and 'tile_n' must be at least 1";
      if (!(s("efficiency_max") > 0)) return "'efficiency_max' must be > 0";
      if (s("k_half") < 0) return "'k_half' must be >= 0";
      if (spec.kind == ModelKind::gemm && s("wave_tail") < 0) return "'wave_tail' must be >= 0";
      if (spec.kind == ModelKind::grouped_gemm) {
        const auto& wt = a("wave_tail");
        const auto& co = a("call_overhead_s");
        if (wt.size() > 1 || co.size() != wt.size()) {
          return "'wave_tail' and 'call_overhead_s' are optional: both absent, or one number each in [ ]";
        }
        if (!wt.empty() && (wt[0] < 0 || co[0] < 0)) return "'wave_tail' and 'call_overhead_s' must be >= 0";
      }
      if (s("overhead_s") < 0) return "'overhead_s' must be >= 0";
      if (!(s("memory_bandwidth_bytes_per_s") > 0)) return "'memory_bandwidth_bytes_per_s' must be > 0";
      {
        // Optional residual correction: all keys or none; one centre per log factor.
        const auto& r = a("correction_log_factor");
        std::vector<std::string> shape_keys;
        for (const auto& ps : spec.params) {
          if (ps.key.rfind("correction_", 0) == 0 && ps.integer) shape_keys.push_back(ps.key);
        }
        const auto& h = a("correction_bandwidth");
        const auto& w0 = a("correction_prior_weight");
        if (r.empty()) {
          bool any = !h.empty() || !w0.empty();
          for (const auto& k : shape_keys) any = any || !a(k).empty();
          if (any) return "the residual correction needs 'correction_log_factor' with its other correction_* keys";
          return std::nullopt;
        }
        for (const auto& k : shape_keys) {
          if (a(k).size() != r.size()) return "'" + k + "' must have one entry per 'correction_log_factor' entry";
          for (double v : a(k)) {
            if (!(v >= 1 && v <= 9.007199254740992e15)) return "'" + k + "' entries must be positive integers";
          }
        }
        for (double v : r) {
          if (!(std::fabs(v) <= 5)) return "'correction_log_factor' entries must be in [-5, 5]";
        }
        if (h.size() != 1 || !(h[0] > 0)) return "'correction_bandwidth' must be one number > 0 in [ ]";
        if (w0.size() != 1 || !(w0[0] >= 0)) return "'correction_prior_weight' must be one number >= 0 in [ ]";
      }
      return std::nullopt;
    case ModelKind::attention:
      if (s("tile_q") < 1) return "'tile_q' must be at least 1";
      if (!(s("efficiency_max") > 0)) return "'efficiency_max' must be > 0";
      if (s("s_half") < 0 || s("d_half") < 0) return "'s_half' and 'd_half' must be >= 0";
      if (s("overhead_s") < 0) return "'overhead_s' must be >= 0";
      if (!(s("memory_bandwidth_bytes_per_s") > 0)) return "'memory_bandwidth_bytes_per_s' must be > 0";
      if (const auto& ps = a("pair_s"); ps.size() > 1 || (!ps.empty() && ps[0] < 0)) {
        return "'pair_s' is optional: absent, or one number >= 0 in [ ]";
      }
      return std::nullopt;
    case ModelKind::linear: {
      if (s("alpha_s") < 0) return "'alpha_s' must be >= 0";
      const auto& bw = a("bandwidths_bytes_per_s");
      const auto& kn = a("knots_bytes");
      if (bw.empty()) return "'bandwidths_bytes_per_s' needs at least one segment";
      if (kn.size() + 1 != bw.size()) return "'knots_bytes' must have one entry fewer than 'bandwidths_bytes_per_s'";
      for (double v : bw) {
        if (!(v > 0)) return "'bandwidths_bytes_per_s' entries must be > 0";
      }
      for (std::size_t i = 0; i < kn.size(); ++i) {
        if (!(kn[i] > 0) || (i > 0 && !(kn[i] > kn[i - 1]))) return "'knots_bytes' must be positive and increasing";
      }
      return std::nullopt;
    }
    case ModelKind::kernel_terms:
      for (const auto& ps : spec.params) {
        if (!(s(ps.key) >= 0)) return "'" + ps.key + "' must be >= 0";
      }
      return std::nullopt;
    case ModelKind::collective: {
      const auto& n = a("group_size");
      if (n.empty()) return "'group_size' needs at least one group size";
      for (const char* k : {"alpha_s", "beta_max_bytes_per_s", "s_half_bytes", "gamma"}) {
        if (a(k).size() != n.size()) return std::string("'") + k + "' must have one entry per group size";
      }
      for (std::size_t i = 0; i < n.size(); ++i) {
        if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) {
          return "'group_size' entries must be between 2 and 1048576 and increasing";
        }
        if (a("alpha_s")[i] < 0) return "'alpha_s' entries must be >= 0";
        if (!(a("beta_max_bytes_per_s")[i] > 0)) return "'beta_max_bytes_per_s' entries must be > 0";
        if (a("s_half_bytes")[i] < 0) return "'s_half_bytes' entries must be >= 0";
        if (!(a("gamma")[i] > 0 && a("gamma")[i] <= 1)) return "'gamma' entries must be in (0, 1]";
      }
      // Optional per-size correction knots: parallel arrays, each knot of a measured group size,
      // sorted by (group size, bytes) with distinct sizes per group size.
      const auto& kn = a("correction_group_size");
      const auto& kb = a("correction_bytes");
      const auto& kr = a("correction_log_factor");
      if (kb.size() != kn.size() || kr.size() != kn.size()) {
        return "'correction_group_size', 'correction_bytes' and 'correction_log_factor' must have the same length";
      }
      for (std::size_t i = 0; i < kn.size(); ++i) {
        if (std::find(n.begin(), n.end(), kn[i]) == n.end()) {
          return "'correction_group_size' entries must be measured group sizes (entries of 'group_size')";
        }
        if (!(kb[i] >= 1)) return "'correction_bytes' entries must be >= 1";
        if (i > 0 && (kn[i] < kn[i - 1] || (kn[i] == kn[i - 1] && !(kb[i] > kb[i - 1])))) {
          return "correction knots must be sorted by group size, then by increasing 'correction_bytes'";
        }
        if (!(std::fabs(kr[i]) <= 5)) return "'correction_log_factor' entries must be in [-5, 5]";
      }
      return std::nullopt;
    }
    case ModelKind::constant:
      if (!(s("value_s") > 0)) return "'value_s' must be > 0";
      return std::nullopt;
    case ModelKind::gemm_call:
      if (!(s("t_one_s") > 0)) return "'t_one_s' must be > 0";
      if (!(s("t_extra_s") >= 0)) return "'t_extra_s' must be >= 0";
      if (!(s("split_ratio") >= 0) || !std::isfinite(s("split_ratio"))) return "'split_ratio' must be a finite number >= 0";
      return std::nullopt;
    case ModelKind::stream_cycle: {
      const auto& n = a("streams");
      if (n.empty()) return "'streams' needs at least one stream count";
      if (a("extra_s").size() != n.size()) return "'extra_s' must have one entry per stream count";
      for (std::size_t i = 0; i < n.size(); ++i) {
        if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) {
          return "'streams' entries must be between 2 and 1048576 and increasing";
        }
        if (!(a("extra_s")[i] > 0) || !std::isfinite(a("extra_s")[i])) return "'extra_s' entries must be > 0";
      }
      return std::nullopt;
    }
    case ModelKind::grouped_call:
      if (!(s("t_one_s") > 0)) return "'t_one_s' must be > 0";
      if (!(s("t_run_s") >= 0)) return "'t_run_s' must be >= 0";
      return std::nullopt;
    case ModelKind::concurrency: {
      const auto& n = a("streams");
      if (n.empty()) return "'streams' needs at least one stream count";
      if (a("efficiency").size() != n.size()) return "'efficiency' must have one entry per stream count";
      for (std::size_t i = 0; i < n.size(); ++i) {
        if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) {
          return "'streams' entries must be between 2 and 1048576 and increasing";
        }
      }
      return std::nullopt;
    }
    case ModelKind::nccl_interference: {
      const auto& c = a("cases");
      if (c.empty()) return "'cases' needs at least one case";
      for (const char* k : {"held_sms", "gemm_factor", "attention_factor", "memory_factor"}) {
        if (a(k).size() != c.size()) return std::string("'") + k + "' must have one entry per case";
      }
      for (std::size_t i = 0; i < c.size(); ++i) {
        if (c[i] < 0 || c[i] > 1 || (i > 0 && !(c[i] > c[i - 1]))) {
          return "'cases' entries must be 0 (pending) or 1 (transfer), increasing";
        }
        if (a("held_sms")[i] < 0) return "'held_sms' entries must be >= 0";
        for (const char* k : {"gemm_factor", "attention_factor", "memory_factor"}) {
          if (!(a(k)[i] > 0)) return std::string("'") + k + "' entries must be > 0";
        }
      }
      return std::nullopt;
    }
    case ModelKind::nccl_memory:
      for (const char* k : {"communicator_bytes", "collective_bytes", "p2p_peer_bytes"}) {
        if (s(k) < 0) return std::string("'") + k + "' must be >= 0";
      }
      return std::nullopt;
  }
  return std::nullopt;
}

GemmModel decode_gemm(const Family& f, const Hardware& hw) { return gemm_of(f.spec(), f.params, hw); }
GroupedGemmModel decode_grouped_gemm(const Family& f, const Hardware& hw) { return grouped_of(f.spec(), f.params, hw); }
AttentionModel decode_attention(const Family& f, const Hardware& hw) { return attention_of(f.spec(), f.params, hw); }
LinearModel decode_linear(const Family& f) { return linear_of(f.spec(), f.params); }
KernelTermsModel decode_kernel_terms(const Family& f) { return kernel_terms_of(f.spec(), f.params); }
CollectiveModel decode_collective(const Family& f) { return collective_of(f.spec(), f.params); }
ConstantModel decode_constant(const Family& f) { return ConstantModel{scalar(f.spec(), f.params, "value_s")}; }
StreamCycleModel decode_stream_cycle(const Family& f) { return stream_cycle_of(f.spec(), f.params); }
GemmCallModel decode_gemm_call(const Family& f) { return gemm_call_of(f.spec(), f.params); }
GroupedCallModel decode_grouped_call(const Family& f) { return grouped_call_of(f.spec(), f.params); }
ConcurrencyModel decode_concurrency(const Family& f) { return concurrency_of(f.spec(), f.params); }
NcclInterferenceModel decode_nccl_interference(const Family& f, const Hardware& hw) {
  return nccl_interference_of(f.spec(), f.params, hw);
}
NcclMemoryModel decode_nccl_memory(const Family& f) { return nccl_memory_of(f.spec(), f.params); }

double measured_value(const FamilySpec& spec, const Point& p) {
  return spec.kind == ModelKind::nccl_memory ? p.inputs[2] : p.time.median_s;
}

}  // namespace threewalls::calibration::detail
