// Family module: attention_fused, attention_fused.fwd / attention_fused.bwd, model attention_tiles_v2
// (models.hpp AttentionModel, scheduled form, one efficiency per head dimension and mask): the 128-row
// tiles of each (batch, head), each with the time its keys (forward) or queries (backward) take at the
// efficiency of its kernel (head dimension, causal or not), placed one by one on the SM that frees first. What the
// backend's fused attention (cuDNN's flash-attention graph, FusedAttention) costs; the scores never reach memory, so
// the blocked form of the unfused kernel does not apply. Profiles of the v1 form (one saturating head-dimension curve,
// attention_tiles_v1) still load and simulate with it.
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

constexpr std::string_view kModelV1 = "attention_tiles_v1";
constexpr std::string_view kModelV2 = "attention_tiles_v2";

bool is_v1(const FamilySpec& s) { return s.model == kModelV1; }

void add_specs(std::vector<FamilySpec>& out) {
  for (bool bwd : {false, true}) {
    FamilySpec s;
    s.measured_only = true;
    s.name = attention_fused_family(bwd);
    s.model = std::string(kModelV2);
    s.backward = bwd;
    s.description = std::string("fused attention ") + (bwd ? "backward" : "forward") +
                    " (bf16, flash-style through cuDNN): 128-row tiles of (k_i + s_half) units at P e(d_qk, mask), "
                    "e per measured head dimension (linear between them) and mask, list-scheduled on the SMs in "
                    "launch order: t = max(makespan, B / BW) + t0";
    s.inputs = attention_inputs();
    s.params = {
        {"tile_q", true, false, "query rows per CTA"},
        {"s_half", false, false, "keys per tile's row at which a tile's fixed cost equals its work"},
        {"overhead_s", false, false, "t0: fixed time per kernel, seconds"},
        {"memory_bandwidth_bytes_per_s", false, false, "HBM read+write bandwidth of the memory-bound limit"},
        {"head_dims", true, true, "measured head dimensions d_qk, increasing"},
        {"efficiency", false, true, "fraction of the bf16 peak at each head dimension of head_dims, causal mask"},
        {"efficiency_unmasked", false, true, "fraction of the bf16 peak at each head dimension of head_dims, no mask"}};
    s.reads = {copy_family(CopyKind::d2d)};
    out.push_back(s);
  }
}

void add_older_specs(std::vector<FamilySpec>& out) {
  for (bool bwd : {false, true}) {
    FamilySpec s;
    s.measured_only = true;
    s.name = attention_fused_family(bwd);
    s.model = std::string(kModelV1);
    s.backward = bwd;
    s.description =
        std::string("fused attention ") + (bwd ? "backward" : "forward") +
        " (bf16, flash-style through cuDNN): 128-row tiles of (k_i + s_half) units at P e_max d/(d+d_half), "
        "list-scheduled on the SMs in launch order: t = max(makespan, B / BW) + t0";
    s.inputs = attention_inputs();
    s.params = attention_wave_params();
    s.reads = {copy_family(CopyKind::d2d)};
    out.push_back(s);
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) {
  std::vector<AttentionModel::Sample> s;
  for (const auto& p : points) s.push_back({attention_shape(p.inputs), p.time.median_s});
  const auto m =
      AttentionModel::fit_per_head_dim(s, spec.backward, device_of(*ctx.hardware, DType::bf16), memory_bandwidth(ctx));
  return round_all({{static_cast<double>(m.tile_q)},
                    {m.s_half},
                    {m.overhead_s},
                    {m.memory_bandwidth_bytes_per_s},
                    m.head_dims,
                    m.head_dim_efficiency,
                    m.head_dim_efficiency_unmasked});
}

AttentionModel attention_tiles_of(const FamilySpec& spec, const Params& params, const Hardware& hw) {
  if (is_v1(spec)) {
    AttentionModel m = attention_wave_of(spec, params, hw);
    m.scheduled = true;
    return m;
  }
  AttentionModel m = attention_common_of(spec, params, hw);
  m.head_dims = array(spec, params, "head_dims");
  m.head_dim_efficiency = array(spec, params, "efficiency");
  m.head_dim_efficiency_unmasked = array(spec, params, "efficiency_unmasked");
  m.scheduled = true;
  return m;
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  if (is_v1(spec)) return check_attention_wave(spec, params);
  if (auto why = check_attention_common(spec, params)) return why;
  const auto& dims = array(spec, params, "head_dims");
  if (dims.empty()) return "'head_dims' must name at least one head dimension";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (!(dims[i] > 0) || (i > 0 && !(dims[i] > dims[i - 1]))) return "'head_dims' must be positive and increasing";
  }
  for (const char* key : {"efficiency", "efficiency_unmasked"}) {
    const auto& eff = array(spec, params, key);
    if (eff.size() != dims.size()) {
      return "'" + std::string(key) + "' must have one entry per head dimension (" + std::to_string(dims.size()) +
             "), has " + std::to_string(eff.size());
    }
    for (const double e : eff) {
      if (!(e > 0) || e > 1) return "every '" + std::string(key) + "' must be in (0, 1]";
    }
  }
  return std::nullopt;
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  return attention_tiles_of(spec, params, hw).time_s(attention_shape(p.inputs));
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.attention_fused[f.spec().backward ? 1 : 0] = attention_tiles_of(f.spec(), f.params, hw);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  if (const auto t = cm.fused_attention(attention_shape(in), spec.backward)) return t->value;
  return std::nullopt;
}

}  // namespace

const FamilyModule& attention_fused_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost, add_older_specs};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

// Fused attention (FusedAttention, cuDNN's flash-attention graph): MHA, GQA and MLA-like head
// layouts over sequences of 128 to 32768 (latency-bound short rows to compute-bound long ones),
// causal and not, with a few off-grid held-out shapes.
void add_fused_attention(GridPlan& p, bool backward, std::int64_t b, std::int64_t sq, std::int64_t h, std::int64_t kv,
                         std::int64_t dqk, std::int64_t dv, bool causal, bool held_out = false) {
  const double pairs = attention_pairs(sq, sq, causal);
  const double fwd_flops = 2.0 * d(b) * d(h) * pairs * d(dqk + dv);
  if (fwd_flops > kMaxFusedAttentionFlops || d(b) * d(kv) * d(sq) * d(dqk + dv) * 2.0 > kMaxKvBytes) return;
  PointSpec s;
  s.op = backward ? "attention_fused_bwd" : "attention_fused_fwd";
  s.family = backward ? "attention_fused.bwd" : "attention_fused.fwd";
  s.params = {{"batch", d(b)},     {"seq_q", d(sq)},        {"seq_kv", d(sq)},     {"heads", d(h)},
              {"kv_heads", d(kv)}, {"head_dim_qk", d(dqk)}, {"head_dim_v", d(dv)}, {"causal", causal ? 1.0 : 0.0}};
  s.inputs = {d(b), d(sq), d(sq), d(h), d(kv), d(dqk), d(dv), causal ? 1.0 : 0.0};
  s.held_out = held_out;
  s.flops = backward ? 2.0 * d(b) * d(h) * pairs * d(3 * dqk + 2 * dv) : fwd_flops;
  // Q, O (query heads) and K, V (key/value heads) read or written once (backward: their gradients too).
  s.bytes = (backward ? 2.0 : 1.0) * 2.0 * d(b) * d(sq) * (d(h) + d(kv)) * d(dqk + dv);
  p.points.push_back(std::move(s));
}

void plan_attention_fused(GridPlan& p, bool backward) {
  struct Heads {
    std::int64_t h, kv, dqk, dv;
  };
  // MHA, GQA 4 and 8, MLA-like (d_qk 192, d_v 128), small heads.
  const std::vector<Heads> layouts{
      {16, 16, 128, 128}, {32, 8, 128, 128}, {16, 16, 192, 128}, {32, 32, 64, 64}, {64, 8, 128, 128}};
  const std::vector<std::int64_t> seqs = p.full() ? std::vector<std::int64_t>{256, 512, 1024, 2048, 4096, 8192, 16384}
                                                  : std::vector<std::int64_t>{1024, 2048, 4096};
  std::size_t i = 0;
  for (const auto sq : seqs) {
    for (const bool causal : {true, false}) {
      const Heads l = layouts[i++ % layouts.size()];
      add_fused_attention(p, backward, std::max<std::int64_t>(1, 16384 / sq), sq, l.h, l.kv, l.dqk, l.dv, causal);
    }
  }
  // Short rows (latency-bound) and one long sequence (compute-bound), in both modes.
  add_fused_attention(p, backward, 64, 128, 16, 16, 128, 128, true);
  add_fused_attention(p, backward, 1, 16384, 16, 4, 128, 128, true);
  add_fused_attention(p, backward, 2, 4096, 16, 16, 128, 128, true);  // the reference shape of kernel_bench
  // Few query tiles (one micro-batch of one sequence, as pipeline and expert-parallel layouts run):
  // under a wave of 128-row tiles to four, partial last waves, where the launch and tail costs are a
  // large share of the time and the 16,384-token points above cannot tell them apart.
  add_fused_attention(p, backward, 1, 1024, 8, 8, 128, 128, true);   // 64 tiles: half a wave
  add_fused_attention(p, backward, 1, 2048, 20, 4, 128, 128, true);  // 320 tiles: 2.4 waves
  if (p.full()) {
    add_fused_attention(p, backward, 1, 2048, 10, 10, 128, 128, false);  // 160 tiles: 1.2 waves
    add_fused_attention(p, backward, 1, 4096, 14, 14, 128, 128, true);   // 448 tiles: 3.4 waves
    add_fused_attention(p, backward, 2, 1024, 16, 16, 128, 128, false);
    add_fused_attention(p, backward, 1, 1024, 32, 32, 64, 64, true);
    add_fused_attention(p, backward, 4, 512, 24, 8, 128, 128, true);
    add_fused_attention(p, backward, 1, 2048, 16, 16, 192, 128, true);
    add_fused_attention(p, backward, 1, 1536, 16, 8, 128, 128, true, true);  // 192 tiles, held out
  }
  if (p.full()) {  // other token counts, so the fit sees batch and sequence apart
    add_fused_attention(p, backward, 1, 32768, 8, 8, 128, 128, true);
    add_fused_attention(p, backward, 32, 256, 32, 8, 128, 128, false);
    add_fused_attention(p, backward, 1, 3072, 16, 4, 128, 128, true);
    add_fused_attention(p, backward, 16, 768, 32, 32, 96, 96, false);
    add_fused_attention(p, backward, 3, 3000, 24, 8, 128, 128, true, true);
    add_fused_attention(p, backward, 8, 1536, 16, 16, 192, 128, false, true);
  } else {
    add_fused_attention(p, backward, 3, 3000, 24, 8, 128, 128, true, true);
  }
}

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"attention_fused_fwd", "", "attention_fused.fwd",
                 "FusedAttention::forward (cuDNN's flash-attention graph; kv_heads < heads for GQA)",
                 "FLOPs 2 b h pairs (dqk + dv), pairs = visible (query, key) pairs; bytes Q, K, V, O once"});
  out.push_back({"attention_fused_bwd", "", "attention_fused.bwd", "FusedAttention::backward after one forward",
                 "FLOPs 2 b h pairs (3 dqk + 2 dv); bytes Q, K, V, O, dO, dQ, dK, dV once"});
}

void plan(GridPlan& p, int /*part*/) {
  plan_attention_fused(p, false);
  plan_attention_fused(p, true);
}

}  // namespace

const ModuleGrid& attention_fused_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
