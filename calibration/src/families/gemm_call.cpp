// Family module: host time of one cuBLASLt GEMM call, host.gemm_call, model gemm_call_v1 (models.hpp
// GemmCallModel): the shape-aware form of host.gemm_launch (optional; the simulator prefers it).
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

GemmCallModel gemm_call_of(const FamilySpec& s, const Params& p) {
  return GemmCallModel{scalar(s, p, "t_one_s"), scalar(s, p, "t_extra_s"), scalar(s, p, "split_ratio")};
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kGemmCallFamily);
  s.model = "gemm_call_v1";
  s.description =
      "host time of one cuBLASLt GEMM call as OpRunner makes it, one launch or more (split-K: a reduction kernel or a "
      "memset): "
      "t = t_one + t_extra [k / (ceil(m/128) ceil(n/128)) >= split_ratio]";
  s.inputs = {
      {"m", true, "rows of C"},
      {"n", true, "columns of C"},
      {"k", true, "reduction length"},
      {"nodes", true, "graph nodes one call launched (kernels and memsets), counted by graph capture (0: unknown)"}};
  s.params = {
      {"t_one_s", false, false, "host time of a call that launches one kernel, seconds"},
      {"t_extra_s", false, false, "host time of each further node of a split call, seconds"},
      {"split_ratio", false, false, "k per 128 x 128 output tile from which cuBLASLt splits K (0: never seen)"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<GemmCallModel::Sample> s;
  for (const auto& p : points) {
    s.push_back({as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]), static_cast<int>(as_int(p.inputs[3])),
                 p.time.median_s});
  }
  const auto m = GemmCallModel::fit(s);
  return round_all({{m.t_one_s}, {m.t_extra_s}, {m.split_ratio}});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return gemm_call_of(spec, params).time_s(as_int(p.inputs[0]), as_int(p.inputs[1]), as_int(p.inputs[2]));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto s = [&](std::string_view k) { return scalar(spec, params, k); };
  if (!(s("t_one_s") > 0)) return "'t_one_s' must be > 0";
  if (!(s("t_extra_s") >= 0)) return "'t_extra_s' must be >= 0";
  if (!(s("split_ratio") >= 0) || !std::isfinite(s("split_ratio"))) return "'split_ratio' must be a finite number >= 0";
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.gemm_call = gemm_call_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& gemm_call_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"host_gemm_launch", "", std::string(kGemmCallFamily),
                 "host time of one CublasLt::gemm call (cached plan, as OpRunner calls it) while a blocking kernel "
                 "holds the stream; the graph nodes one call launches (graph capture) are the point's input `nodes`",
                 "seconds per call"});
}

void plan(GridPlan& p, int /*part*/) {
  // Host time of one library call as OpRunner makes it, timed while a blocking kernel
  // holds the stream, so the device never drains the queue and only the host side is timed. The
  // shapes are no validation shape (the plan test checks). host.gemm_call predicts whether cuBLASLt
  // adds a split-K reduction kernel (a second launch) from k per 128 x 128 output tile, so the
  // points span that ratio: small-m GEMMs (the launch-bound expert GEMMs of a sequential MoE layer)
  // with k / tiles from 2 to ~1000, and a large one. The runner counts each call's graph nodes
  // (kernels, memsets; graph capture) into the input `nodes`. The quick grid keeps a one-node and a
  // split point on either side of the boundary the full grids find (179 and 512 per tile: 303 in
  // full H100 calibrations), so a quick host-only calibration (validate_suite's --host-recalibrate)
  // prices the expert GEMMs as the full one does (a quick grid with no point between 32 and 512,
  // and one at 512 that stays one node, puts the boundary at 677).
  struct G {
    std::int64_t m, n, k;
  };
  const std::vector<G> calls =
      !p.full() ? std::vector<G>{G{64, 2560, 640}, G{48, 1280, 1792}, G{96, 896, 3584}, G{128, 1024, 7168},
                                 G{3968, 4096, 2048}}
                : std::vector<G>{G{64, 2560, 640},  G{192, 1536, 1024}, G{128, 1024, 7168}, G{3968, 4096, 2048},
                                 G{32, 640, 2560},  G{48, 1280, 1792},  G{16, 2304, 1280},  G{96, 896, 3584},
                                 G{32, 1152, 5120}, G{64, 384, 6144},   G{256, 1664, 2304}, G{16, 5120, 896}};
  for (const G g : calls) {
    PointSpec s;
    s.op = "host_gemm_launch";
    s.family = std::string(kGemmCallFamily);
    s.params = {{"m", d(g.m)}, {"n", d(g.n)}, {"k", d(g.k)}};
    s.inputs = {d(g.m), d(g.n), d(g.k), 0.0};  // nodes: counted by the runner
    s.flops = 2.0 * d(g.m) * d(g.n) * d(g.k);
    p.points.push_back(std::move(s));
  }
}

}  // namespace

const ModuleGrid& gemm_call_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
