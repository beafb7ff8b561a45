// Family module: attention_decode, model attention_decode_v2 (models.hpp DecodeAttentionModel, the
// waves form): the backend's split-KV decode attention (DecodeAttention), one query per sequence
// against a KV cache, costed by its launch geometry (core/decode_attention_geometry.hpp) on the
// profile's SMs: the busiest SM's blocks times the rounds of keys each walks, bounded below by the
// K/V stream, plus the combine over the splits. Profiles of the bytes-and-FLOPs form
// (attention_decode_v1) still load and simulate with it.
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

constexpr std::string_view kModelV1 = "attention_decode_v1";
constexpr std::string_view kModelV2 = "attention_decode_v2";

// Point columns: batch, heads, kv_heads, seq_kv, head_dim_qk, head_dim_v.
AttentionShape decode_shape(const std::vector<double>& in) {
  AttentionShape s;
  s.batch = as_int(in[0]);
  s.seq_q = 1;
  s.heads = as_int(in[1]);
  s.kv_heads = as_int(in[2]);
  s.seq_kv = as_int(in[3]);
  s.head_dim_qk = as_int(in[4]);
  s.head_dim_v = as_int(in[5]);
  s.causal = true;
  return s;
}

bool is_v1(const FamilySpec& s) { return s.model == kModelV1; }

DecodeAttentionModel decode_of(const FamilySpec& s, const Params& p, const Hardware& hw) {
  DecodeAttentionModel m;
  m.overhead_s = scalar(s, p, "overhead_s");
  if (is_v1(s)) {
    m.per_byte_s = scalar(s, p, "per_byte_s");
    m.per_flop_s = scalar(s, p, "per_flop_s");
    return m;
  }
  m.waves = true;
  m.sm_count = hw.sm_count;
  m.per_split_s = scalar(s, p, "per_split_s");
  m.per_round_dim_s = scalar(s, p, "per_round_dim_s");
  m.per_round_head_dim_s = scalar(s, p, "per_round_head_dim_s");
  m.bandwidth_bytes_per_s = scalar(s, p, "bandwidth_bytes_per_s");
  return m;
}

FamilySpec base_spec() {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kAttentionDecodeFamily);
  s.inputs = {{"batch", true, "sequences (one new query each)"},
              {"heads", true, "query heads"},
              {"kv_heads", true, "key/value heads (GQA: fewer than heads)"},
              {"seq_kv", true, "cached keys per sequence (KV length)"},
              {"head_dim_qk", true, "head dimension of Q and K"},
              {"head_dim_v", true, "head dimension of V"}};
  return s;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s = base_spec();
  s.model = std::string(kModelV2);
  s.description =
      "decode attention (bf16, split-KV, one query per sequence), waves of the kernel's blocks: "
      "t = t0 + S per_split + max(L R (dqk + dv) (per_round_dim + g per_round_head_dim), B / bandwidth), "
      "S splits, L = ceil(b kv_heads S / SMs), R rounds of 128 keys per block, g = heads / kv_heads, "
      "B = 2 b kv_heads seq_kv (dqk + dv)";
  s.params = {{"overhead_s", false, false, "t0: fixed time per call (the two launches), seconds"},
              {"per_split_s", false, false, "the combine kernel's time per split of the cache, seconds"},
              {"per_round_dim_s", false, false,
               "a block's round of 128 keys, seconds per head dimension (dqk + dv): reading the rows"},
              {"per_round_head_dim_s", false, false,
               "a block's round of 128 keys, seconds per query head and head dimension: scoring and summing"},
              {"bandwidth_bytes_per_s", false, false, "the K/V stream's limit, bytes per second"}};
  out.push_back(s);
}

void add_older_specs(std::vector<FamilySpec>& out) {
  FamilySpec s = base_spec();
  s.model = std::string(kModelV1);
  s.description =
      "decode attention (bf16, split-KV, one query per sequence): t = t0 + B per_byte + F per_flop, "
      "B = 2 b kv_heads seq_kv (dqk + dv), F = 2 b heads seq_kv (dqk + dv)";
  s.params = {{"overhead_s", false, false, "t0: fixed time per call (the split and combine kernels), seconds"},
              {"per_byte_s", false, false, "seconds per byte of K and V read (1 / the kernel's bandwidth)"},
              {"per_flop_s", false, false, "seconds per FLOP of the query heads beyond the read"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& ctx) {
  std::vector<DecodeAttentionModel::Sample> s;
  for (const auto& p : points) s.push_back({decode_shape(p.inputs), p.time.median_s});
  const auto m = DecodeAttentionModel::fit_waves(s, ctx.hardware->sm_count);
  return round_all(
      {{m.overhead_s}, {m.per_split_s}, {m.per_round_dim_s}, {m.per_round_head_dim_s}, {m.bandwidth_bytes_per_s}});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& hw) {
  return decode_of(spec, params, hw).time_s(decode_shape(p.inputs));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (s("overhead_s") < 0) return "'overhead_s' must be >= 0";
  if (is_v1(spec)) {
    if (!(s("per_byte_s") > 0)) return "'per_byte_s' must be > 0";
    if (s("per_flop_s") < 0) return "'per_flop_s' must be >= 0";
    return std::nullopt;
  }
  for (const char* k : {"per_split_s", "per_round_dim_s", "per_round_head_dim_s"}) {
    if (s(k) < 0) return "'" + std::string(k) + "' must be >= 0";
  }
  if (!(s("bandwidth_bytes_per_s") > 0)) return "'bandwidth_bytes_per_s' must be > 0";
  return std::nullopt;
}

void store(const Family& f, const Hardware& hw, DecodedModels& models) {
  models.attention_decode = decode_of(f.spec(), f.params, hw);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& /*spec*/, const std::vector<double>& in) {
  if (const auto t = cm.decode_attention(decode_shape(in))) return t->value;
  return std::nullopt;
}

}  // namespace

const FamilyModule& attention_decode_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost, add_older_specs};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

// Decode attention (DecodeAttention, split-KV): one query per sequence against caches of 512 to
// 32768 keys, batches 1 to 64, over the head layouts the kernel takes (query heads per KV head 1 to
// 16; up to 8 for d_qk 192). Points whose K and V exceed half of kMaxKvBytes are left out.
void add_decode_attention(GridPlan& p, std::int64_t b, std::int64_t h, std::int64_t kv, std::int64_t skv,
                          std::int64_t dqk, std::int64_t dv, bool held_out = false) {
  const double kv_bytes = 2.0 * d(b) * d(kv) * d(skv) * d(dqk + dv);
  if (kv_bytes > kMaxKvBytes / 2.0) return;
  PointSpec s;
  s.op = "attention_decode";
  s.family = "attention_decode";
  s.params = {{"batch", d(b)},    {"heads", d(h)},         {"kv_heads", d(kv)},
              {"seq_kv", d(skv)}, {"head_dim_qk", d(dqk)}, {"head_dim_v", d(dv)}};
  s.inputs = {d(b), d(h), d(kv), d(skv), d(dqk), d(dv)};
  s.held_out = held_out;
  s.flops = 2.0 * d(b) * d(h) * d(skv) * d(dqk + dv);
  s.bytes = kv_bytes;
  p.points.push_back(std::move(s));
}

void plan_attention_decode(GridPlan& p) {
  struct Heads {
    std::int64_t h, kv, dqk, dv;
  };
  // Query heads per KV head 1, 4, 8 and 16 at d 128; an MLA-like d_qk 192 at 8 and 1 (the latter is
  // how an MLA layer's decode runs: one KV head per query head); d 64.
  const std::vector<Heads> layouts{{32, 32, 128, 128}, {32, 8, 128, 128},  {32, 4, 128, 128}, {64, 4, 128, 128},
                                   {16, 2, 192, 128},  {16, 16, 192, 128}, {32, 8, 64, 64}};
  // Batches from one sequence (a few blocks on the GPU, the split count at its cap) to 64 (several
  // blocks per SM); caches whose splits hold exactly 256 keys (512, 8192, 32768) and some whose
  // splits hold a few keys more (1100, 3000, 12000), where a block's last round of keys is nearly
  // empty.
  const std::vector<std::int64_t> kvs =
      p.full() ? std::vector<std::int64_t>{512, 1100, 3000, 8192, 12000, 32768} : std::vector<std::int64_t>{1100, 8192};
  const std::vector<std::int64_t> batches =
      p.full() ? std::vector<std::int64_t>{1, 3, 5, 8, 16, 64} : std::vector<std::int64_t>{1, 5, 32};
  std::size_t i = 0;
  for (const auto skv : kvs) {
    for (const auto b : batches) {
      for (const std::size_t k : {i, i + 3}) {
        const Heads l = layouts[k % layouts.size()];
        add_decode_attention(p, b, l.h, l.kv, skv, l.dqk, l.dv);
      }
      ++i;
    }
  }
  add_decode_attention(p, 8, 64, 4, 4096, 128, 128);  // 16 query heads per KV head, one block per SM
  add_decode_attention(p, 24, 32, 8, 6000, 128, 128, true);
  if (p.full()) add_decode_attention(p, 6, 16, 16, 2500, 192, 128, true);
}

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"attention_decode", "", "attention_decode",
                 "DecodeAttention::forward (split-KV, one query per sequence, the cache filled to seq_kv)",
                 "bytes K and V read: 2 b kv_heads seq_kv (dqk + dv); FLOPs 2 b h seq_kv (dqk + dv)"});
}

void plan(GridPlan& p, int /*part*/) { plan_attention_decode(p); }

}  // namespace

const ModuleGrid& attention_decode_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
