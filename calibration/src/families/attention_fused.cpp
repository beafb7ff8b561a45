// Family module: attention_fused, attention_fused.fwd / attention_fused.bwd, model attention_wave_v1
// (models.hpp AttentionModel) in its v1 form: a FLOP roofline whose efficiency rises with the keys
// per query row and the head dimension, over the waves of 128-row query tiles. What the backend's
// fused attention (cuDNN's flash-attention graph, FusedAttention) costs; the scores never reach
// memory, so the blocked form of the unfused kernel does not apply.
#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

void add_specs(std::vector<FamilySpec>& out) {
  for (bool bwd : {false, true}) {
    FamilySpec s;
    s.name = attention_fused_family(bwd);
    s.model = "attention_wave_v1";
    s.backward = bwd;
    s.description =
        std::string("fused attention ") + (bwd ? "backward" : "forward") +
        " (bf16, flash-style through cuDNN): t = max(F / (P e_max L/(L+s_half) d/(d+d_half) q), B / BW) + t0";
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
      AttentionModel::fit(s, spec.backward, device_of(*ctx.hardware, DType::bf16), memory_bandwidth(ctx), false);
  return round_all(attention_wave_params_of(m));
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  return attention_wave_of(spec, params, hw).time_s(attention_shape(p.inputs));
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.attention_fused[f.spec().backward ? 1 : 0] = attention_wave_of(f.spec(), f.params, hw);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  if (const auto t = cm.fused_attention(attention_shape(in), spec.backward)) return t->value;
  return std::nullopt;
}

}  // namespace

const FamilyModule& attention_fused_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check_attention_wave, store, nullptr, cost};
  return m;
}

}  // namespace threewalls::calibration::detail
