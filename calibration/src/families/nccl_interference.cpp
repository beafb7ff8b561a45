// Family module: compute kernels beside a resident NCCL kernel, nccl.interference, model
// nccl_resident_v2 (models.hpp NcclInterferenceModel; optional, absent: no slowdown).
#include <algorithm>

#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

NcclInterferenceModel nccl_interference_of(const FamilySpec& s, const Params& p) {
  NcclInterferenceModel m;
  for (double v : array(s, p, "cases")) m.cases.push_back(static_cast<int>(as_int(v)));
  m.gemm_tiles = array(s, p, "gemm_tiles");
  m.gemm_factor = array(s, p, "gemm_factor");
  m.attention_factor = array(s, p, "attention_factor");
  m.memory_factor = array(s, p, "memory_factor");
  m.grouped_tiles = array(s, p, "grouped_tiles");
  m.grouped_factor = array(s, p, "grouped_factor");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kNcclInterferenceFamily);
  s.model = "nccl_resident_v2";
  s.description =
      "compute kernels while an NCCL kernel is resident on the GPU (case 0: a receive waiting for its peer, 1: a "
      "large all-reduce transferring): GEMM t = alone G_c(T), the measured slowdown at the calibration's GEMMs, "
      "linear in ln T between them; grouped GEMM t = alone H_c(T), the same over its grouped GEMMs (G_c "
      "without them); attention t = alone a_c, memory-bound t = alone b_c";
  s.inputs = {{"case", true, "0: pending receive (spinning), 1: all-reduce transferring"},
              {"kernel", true, "0: GEMM, 1: attention, 2: memory-bound kernel, 3: grouped expert GEMM"},
              {"tiles", true, "128 x 128 output tiles of a GEMM, all groups' of a grouped GEMM (0 for other kernels)"},
              {"alone_s", false, "the kernel's time with no NCCL kernel resident, seconds"}};
  s.params = {{"cases", true, true, "measured cases, increasing"},
              {"gemm_tiles", false, true, "tiles of the measured GEMMs (the knots of G_c), ascending"},
              {"gemm_factor", false, true, "G_c at gemm_tiles, case-major (one run of gemm_tiles' length per case)"},
              {"attention_factor", false, true, "a_c: attention slowdown, per case"},
              {"memory_factor", false, true, "b_c: memory-bound kernel slowdown, per case"},
              {"grouped_tiles", false, true,
               "tiles of the measured grouped GEMMs (the knots of H_c), ascending (optional: absent, grouped "
               "GEMMs take G_c)",
               true},
              {"grouped_factor", false, true, "H_c at grouped_tiles, case-major (optional, with grouped_tiles)", true}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<NcclInterferenceModel::Sample> s;
  for (const auto& p : points) {
    s.push_back(
        {small_int(p.inputs[0], "case"), small_int(p.inputs[1], "kernel"), p.inputs[2], p.inputs[3], p.time.median_s});
  }
  const auto m = NcclInterferenceModel::fit(s);
  std::vector<double> cases(m.cases.begin(), m.cases.end());
  return round_all(
      {cases, m.gemm_tiles, m.gemm_factor, m.attention_factor, m.memory_factor, m.grouped_tiles, m.grouped_factor});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  const auto c = static_cast<NcclResidentCase>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 1));
  const auto k = static_cast<ComputeClass>(std::clamp<std::int64_t>(as_int(p.inputs[1]), 0, 3));
  return p.inputs[3] * nccl_interference_of(spec, params).factor(c, k, p.inputs[2]);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  const auto& c = a("cases");
  if (c.empty()) return "'cases' needs at least one case";
  for (const char* k : {"attention_factor", "memory_factor"}) {
    if (a(k).size() != c.size()) return std::string("'") + k + "' must have one entry per case";
  }
  const auto& t = a("gemm_tiles");
  if (t.empty()) return "'gemm_tiles' needs at least one tile count";
  for (std::size_t j = 0; j < t.size(); ++j) {
    if (!(t[j] > 0) || (j > 0 && !(t[j] > t[j - 1]))) return "'gemm_tiles' entries must be > 0, increasing";
  }
  if (a("gemm_factor").size() != c.size() * t.size()) {
    return "'gemm_factor' must have " + std::to_string(c.size() * t.size()) +
           " entries (one per case and gemm_tiles entry, case-major)";
  }
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (c[i] < 0 || c[i] > 1 || (i > 0 && !(c[i] > c[i - 1]))) {
      return "'cases' entries must be 0 (pending) or 1 (transfer), increasing";
    }
    for (const char* k : {"attention_factor", "memory_factor"}) {
      if (!(a(k)[i] > 0)) return std::string("'") + k + "' entries must be > 0";
    }
  }
  for (const double g : a("gemm_factor")) {
    if (!(g > 0)) return "'gemm_factor' entries must be > 0";
  }
  const auto& gt = a("grouped_tiles");
  for (std::size_t j = 0; j < gt.size(); ++j) {
    if (!(gt[j] > 0) || (j > 0 && !(gt[j] > gt[j - 1]))) return "'grouped_tiles' entries must be > 0, increasing";
  }
  if (a("grouped_factor").size() != c.size() * gt.size()) {
    return "'grouped_factor' must have " + std::to_string(c.size() * gt.size()) +
           " entries (one per case and grouped_tiles entry, case-major; none without grouped_tiles)";
  }
  for (const double g : a("grouped_factor")) {
    if (!(g > 0)) return "'grouped_factor' entries must be > 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.nccl_interference = nccl_interference_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& nccl_interference_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"nccl_interference", "", "nccl.interference",
                 "a compute kernel (CublasLt::gemm, Attention::forward/backward, backend::add) on GPU 0 alone and "
                 "while an NCCL kernel is resident on another stream: case 0 a backend::recv whose peer sends after "
                 "the kernels finished, case 1 a 1 GiB backend::all_reduce transferring",
                 "time of the kernel with NCCL resident; slowdown = time / alone_s"});
}

// ---- compute beside resident NCCL kernels ------------------------------------------------------
//
// Needs 2 GPUs (GPU 0 is measured, GPU 1 is the NCCL peer); on one GPU the group is not planned and
// the report names the families as not measured. Kernels are shapes of the calibration grids
// (GEMMs from plan_gemm's m and (n, k) lists, attention and element-wise as in their sections), so
// no validation scenario's shape is measured: GEMMs of one wave or less of 128 x 128 tiles on
// 132 SMs (88, 112 tiles), a few waves (192, 308) and many (1024, 2048), grouped expert GEMMs of
// 128 to 2816 tiles, the attention forward and backward, and the residual add at two sizes. Each in two cases: 0, a
// receive posted before the kernels whose peer sends only after they finished (the NCCL kernel spins, holding its SMs);
// 1, a 1 GiB all-reduce transferring throughout.
struct InterferenceGemm {
  std::int64_t m, n, k;
};
const std::vector<InterferenceGemm>& interference_gemms(bool full) {
  static const std::vector<InterferenceGemm> all{{1024, 1408, 2560}, {1792, 1024, 3072}, {320, 8192, 2048},
                                                 {1792, 2816, 1024}, {4096, 4096, 4096}, {8192, 4096, 4096}};
  static const std::vector<InterferenceGemm> quick{{1792, 1024, 3072}, {320, 8192, 2048}, {4096, 4096, 4096}};
  return full ? all : quick;
}

// Grouped expert GEMMs (forward, balanced groups, GroupedGemm as OpRunner runs it): few to many
// waves of output tiles.
struct InterferenceGrouped {
  std::int64_t groups, total_rows, n, k;
};
const std::vector<InterferenceGrouped>& interference_grouped(bool full) {
  static const std::vector<InterferenceGrouped> all{
      {32, 4096, 512, 2048}, {64, 8192, 1024, 2048}, {16, 16384, 1408, 2048}, {8, 32768, 1408, 1024}};
  static const std::vector<InterferenceGrouped> quick{{64, 8192, 1024, 2048}, {16, 16384, 1408, 2048}};
  return full ? all : quick;
}

void plan(GridPlan& p, int /*part*/) {
  if (p.gpus < 2) return;
  for (int kase = 0; kase <= 1; ++kase) {
    for (const auto& g : interference_gemms(p.full())) {
      PointSpec s;
      s.op = "nccl_interference";
      s.family = "nccl.interference";
      s.params = {{"case", d(kase)}, {"kernel", 0.0}, {"m", d(g.m)}, {"n", d(g.n)}, {"k", d(g.k)}};
      const double tiles = std::ceil(d(g.m) / 128.0) * std::ceil(d(g.n) / 128.0);
      s.inputs = {d(kase), 0.0, tiles, 0.0};  // alone_s: filled by the runner
      s.group_size = 2;
      s.flops = 2.0 * d(g.m) * d(g.n) * d(g.k);
      s.bytes = (d(g.m) * d(g.k) + d(g.k) * d(g.n) + d(g.m) * d(g.n)) * 2.0;
      p.points.push_back(std::move(s));
    }
    for (const auto& g : interference_grouped(p.full())) {
      PointSpec s;
      s.op = "nccl_interference";
      s.family = "nccl.interference";
      s.params = {{"case", d(kase)},
                  {"kernel", 3.0},
                  {"groups", d(g.groups)},
                  {"total_rows", d(g.total_rows)},
                  {"max_rows", d(g.total_rows / g.groups)},
                  {"n", d(g.n)},
                  {"k", d(g.k)}};
      const double tiles = std::ceil(d(g.total_rows) / 128.0) * std::ceil(d(g.n) / 128.0);
      s.inputs = {d(kase), 3.0, tiles, 0.0};
      s.group_size = 2;
      s.flops = 2.0 * d(g.total_rows) * d(g.n) * d(g.k);
      s.bytes = (d(g.total_rows) * d(g.k) + d(g.groups) * d(g.k) * d(g.n) + d(g.total_rows) * d(g.n)) * 2.0;
      p.points.push_back(std::move(s));
    }
    for (const bool backward : {false, true}) {
      // The attention section's 4096-token shape: 2 sequences, 16 heads of 128, causal.
      PointSpec s;
      s.op = "nccl_interference";
      s.family = "nccl.interference";
      s.params = {{"case", d(kase)},   {"kernel", 1.0}, {"backward", backward ? 1.0 : 0.0},
                  {"batch", 2.0},      {"seq", 4096.0}, {"heads", 16.0},
                  {"head_dim", 128.0}, {"causal", 1.0}};
      s.inputs = {d(kase), 1.0, 0.0, 0.0};
      s.group_size = 2;
      const double pairs = attention_pairs(4096, 4096, true);
      s.flops = 2.0 * 2.0 * 16.0 * pairs * (backward ? 5.0 * 128.0 : 2.0 * 128.0);
      p.points.push_back(std::move(s));
    }
    for (const std::int64_t e : {std::int64_t{4} * 1024 * 1024 + 40, std::int64_t{32} * 1024 * 1024 + 40}) {
      if (!p.full() && e > 8 * 1024 * 1024) continue;
      PointSpec s;
      s.op = "nccl_interference";
      s.family = "nccl.interference";
      s.params = {{"case", d(kase)}, {"kernel", 2.0}, {"elements", d(e)}};
      s.inputs = {d(kase), 2.0, 0.0, 0.0};
      s.group_size = 2;
      s.bytes = 6.0 * d(e);  // backend::add: read a, b, write out
      p.points.push_back(std::move(s));
    }
  }
}

}  // namespace

const ModuleGrid& nccl_interference_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
