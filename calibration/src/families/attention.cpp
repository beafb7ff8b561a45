// Family module: attention, attention.fwd / attention.bwd, model attention_wave_v1 (models.hpp
// AttentionModel), in its v1 form or the blocked form of the backend's unfused attention (pair_s).
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"
#include "threewalls/calibration/fit.hpp"

namespace threewalls::calibration::detail {

// ---- shared with attention_fused (the same equation, v1 form only) ----

std::vector<InputSpec> attention_inputs() {
  return {{"batch", true, "sequences"},
          {"seq_q", true, "query length"},
          {"seq_kv", true, "key/value length"},
          {"heads", true, "query heads"},
          {"kv_heads", true, "key/value heads (GQA: fewer than heads)"},
          {"head_dim_qk", true, "head dimension of Q and K"},
          {"head_dim_v", true, "head dimension of V"},
          {"causal", true, "1 for a causal (bottom-right aligned) mask, 0 for none"}};
}

std::vector<ParamSpec> attention_wave_params() {
  return {{"tile_q", true, false, "query rows per CTA"},
          {"efficiency_max", false, false, "e_max: fraction of the bf16 peak at long sequences and large head dims"},
          {"s_half", false, false, "keys per query row at which the sequence efficiency is half"},
          {"d_half", false, false, "head dimension at which the head-dim efficiency is half"},
          {"overhead_s", false, false, "t0: fixed time per kernel, seconds"},
          {"memory_bandwidth_bytes_per_s", false, false, "HBM read+write bandwidth of the memory-bound limit"}};
}

AttentionShape attention_shape(const std::vector<double>& in) {
  AttentionShape s;
  s.batch = as_int(in[0]);
  s.seq_q = as_int(in[1]);
  s.seq_kv = as_int(in[2]);
  s.heads = as_int(in[3]);
  s.kv_heads = as_int(in[4]);
  s.head_dim_qk = as_int(in[5]);
  s.head_dim_v = as_int(in[6]);
  s.causal = as_int(in[7]) != 0;
  return s;
}

AttentionModel attention_common_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  AttentionModel m;
  m.tile_q = static_cast<int>(as_int(scalar(s, p, "tile_q")));
  m.s_half = scalar(s, p, "s_half");
  m.overhead_s = scalar(s, p, "overhead_s");
  m.memory_bandwidth_bytes_per_s = scalar(s, p, "memory_bandwidth_bytes_per_s");
  m.backward = s.backward;
  m.device = device_of(hw, DType::bf16);
  return m;
}

AttentionModel attention_wave_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  AttentionModel m = attention_common_of(s, p, hw);
  m.efficiency_max = scalar(s, p, "efficiency_max");
  m.d_half = scalar(s, p, "d_half");
  return m;
}

Params attention_wave_params_of(const AttentionModel& m) {
  return {{static_cast<double>(m.tile_q)}, {m.efficiency_max}, {m.s_half}, {m.d_half}, {m.overhead_s},
          {m.memory_bandwidth_bytes_per_s}};
}

std::optional<std::string> check_attention_common(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (s("tile_q") < 1) return "'tile_q' must be at least 1";
  if (s("s_half") < 0) return "'s_half' must be >= 0";
  if (s("overhead_s") < 0) return "'overhead_s' must be >= 0";
  if (!(s("memory_bandwidth_bytes_per_s") > 0)) return "'memory_bandwidth_bytes_per_s' must be > 0";
  return std::nullopt;
}

std::optional<std::string> check_attention_wave(const FamilySpec& spec, const Params& params) {
  if (auto why = check_attention_common(spec, params)) return why;
  if (!(scalar(spec, params, "efficiency_max") > 0)) return "'efficiency_max' must be > 0";
  if (scalar(spec, params, "d_half") < 0) return "'d_half' must be >= 0";
  return std::nullopt;
}

namespace {

AttentionModel attention_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  AttentionModel m = attention_wave_of(s, p, hw);
  // Optional: present = blocked form (the backend's unfused attention); absent (older profiles) = v1.
  if (const auto& ps = array(s, p, "pair_s"); !ps.empty()) {
    m.blocked = true;
    m.pair_s = ps.at(0);
  }
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  for (bool bwd : {false, true}) {
    FamilySpec s;
    s.name = attention_family(bwd);
    s.model = "attention_wave_v1";
    s.backward = bwd;
    s.description = std::string("attention ") + (bwd ? "backward" : "forward") +
                    " (bf16): t = max(F / (P e_max L/(L+s_half) d/(d+d_half) q) [+ b h pairs pair_s], B / BW) + t0";
    s.inputs = attention_inputs();
    s.params = attention_wave_params();
    s.params.push_back({"pair_s", false, true,
                        "blocked form (optional, one number): seconds per computed (query, key) pair and head, the "
                        "score matrix's passes through memory in the backend's unfused attention; with it, pairs are "
                        "whole 512-row causal blocks",
                        true});
    s.reads = {copy_family(CopyKind::d2d)};
    out.push_back(s);
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) {
  const Hardware& hw = *ctx.hardware;
  std::vector<AttentionModel::Sample> s;
  for (const auto& p : points) s.push_back({attention_shape(p.inputs), p.time.median_s});
  // Both forms; the blocked one (the backend's unfused attention, one more parameter) only where it
  // fits the points better: a measured calibration of threewalls' kernel, not the fused curve the
  // default profiles are generated from (docs/calibration.md, "Attention").
  const auto v1 = AttentionModel::fit(s, spec.backward, device_of(hw, DType::bf16), memory_bandwidth(ctx), false);
  const std::vector<double> measured = measured_medians(points);
  auto median_error = [&](const AttentionModel& m) {
    std::vector<double> predicted;
    for (const auto& x : s) predicted.push_back(m.time_s(x.shape));
    return fit::relative_error_stats(predicted, measured).median;
  };
  AttentionModel m = v1;
  if (s.size() >= 5) {
    const auto blocked = AttentionModel::fit(s, spec.backward, device_of(hw, DType::bf16), memory_bandwidth(ctx), true);
    if (median_error(blocked) < median_error(v1)) m = blocked;
  }
  Params out = attention_wave_params_of(m);
  out.emplace_back();
  if (m.blocked) out[6] = {m.pair_s};
  return round_all(out);
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  return attention_of(spec, params, hw).time_s(attention_shape(p.inputs));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  if (auto why = check_attention_wave(spec, params)) return why;
  if (const auto& ps = array(spec, params, "pair_s"); ps.size() > 1 || (!ps.empty() && ps[0] < 0)) {
    return "'pair_s' is optional: absent, or one number >= 0 in [ ]";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.attention[f.spec().backward ? 1 : 0] = attention_of(f.spec(), f.params, hw);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  return cm.attention(attention_shape(in), spec.backward).value;
}

}  // namespace

const FamilyModule& attention_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_attention(GridPlan& p, bool backward, std::int64_t b, std::int64_t sq, std::int64_t skv, std::int64_t h,
                   std::int64_t dqk, std::int64_t dv, bool causal) {
  const double pairs = attention_pairs(sq, skv, causal);
  const double fwd_flops = 2.0 * d(b) * d(h) * pairs * d(dqk + dv);
  if (fwd_flops > kMaxAttentionFlops || d(b) * d(h) * d(skv) * d(dqk + dv) * 2.0 > kMaxKvBytes) return;
  PointSpec s;
  s.op = backward ? "attention_bwd" : "attention_fwd";
  s.family = backward ? "attention.bwd" : "attention.fwd";
  s.params = {{"batch", d(b)},
              {"seq_q", d(sq)},
              {"seq_kv", d(skv)},
              {"heads", d(h)},
              {"head_dim_qk", d(dqk)},
              {"head_dim_v", d(dv)},
              {"causal", causal ? 1.0 : 0.0}};
  s.inputs = {d(b), d(sq), d(skv), d(h), d(h), d(dqk), d(dv), causal ? 1.0 : 0.0};
  // Model FLOPs (visible pairs only): forward 2 b h pairs (dqk + dv); backward 2 b h pairs (3 dqk + 2 dv).
  s.flops = backward ? 2.0 * d(b) * d(h) * pairs * d(3 * dqk + 2 * dv) : fwd_flops;
  // Q, K, V, O read/written once (backward: also dO, dQ, dK, dV).
  s.bytes = (backward ? 2.0 : 1.0) * 2.0 * d(b) * d(h) * (d(sq) + d(skv)) * d(dqk + dv);
  p.points.push_back(std::move(s));
}

void plan_attention(GridPlan& p, bool backward) {
  struct Hd {
    std::int64_t h, dqk, dv;
  };
  const std::vector<Hd> hds{{16, 128, 128}, {32, 64, 64}, {8, 192, 128}, {24, 128, 128}};
  const std::vector<std::int64_t> seqs = p.full() ? std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192, 16384}
                                                  : std::vector<std::int64_t>{1024, 2048, 4096};
  int i = 0;
  for (const auto s : seqs) {
    for (const bool causal : {true, false}) {
      const Hd hd = hds[static_cast<std::size_t>(i % 4)];
      const std::int64_t b = std::max<std::int64_t>(1, 8192 / s);  // 8k tokens (1 sequence from 8k up)
      add_attention(p, backward, b, s, s, hd.h, hd.dqk, hd.dv, causal);
      ++i;
    }
  }
  if (p.full()) {  // a second token count, so the fit sees batch and sequence apart
    add_attention(p, backward, 1, 3072, 3072, 16, 128, 128, true);
    add_attention(p, backward, 2, 6144, 6144, 8, 128, 128, true);
    add_attention(p, backward, 16, 768, 768, 32, 96, 96, false);
  }
  if (!backward) {  // decode: one query against a KV cache (memory bound); no backward exists
    const std::vector<std::int64_t> kv =
        p.full() ? std::vector<std::int64_t>{1024, 4096, 16384, 32768} : std::vector<std::int64_t>{4096, 32768};
    for (const auto skv : kv) {
      for (const std::int64_t b : {8, 32}) add_attention(p, false, b, 1, skv, 32, 128, 128, true);
    }
  }
}

void add_ops(std::vector<OpInfo>& out) {
  out.push_back(
      {"attention_fwd", "", "attention.fwd", "Attention::forward (unfused: cuBLASLt batched GEMMs + masked softmax)",
       "FLOPs 2 b h pairs (dqk + dv), pairs = visible (query, key) pairs; decode rows report KV bytes / time"});
  out.push_back({"attention_bwd", "", "attention.bwd", "Attention::backward after one forward",
                 "FLOPs 2 b h pairs (3 dqk + 2 dv)"});
}

void plan(GridPlan& p, int /*part*/) {
  plan_attention(p, false);
  plan_attention(p, true);
}

}  // namespace

const ModuleGrid& attention_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
