// Family module: expert-parallel dispatch and combine over RDMA with NVLink forwarding,
// dispatch.flex.network, model expert_dispatch_v1 (models.hpp ExpertDispatchModel; optional, absent:
// the simulator prices the network part of a flex dispatch on the network all-to-all curve). No grid:
// a node of this machine has no RDMA peer; the default profiles take published figures.
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

ExpertDispatchModel dispatch_of(const FamilySpec& s, const Params& p) {
  ExpertDispatchModel m;
  for (double n : array(s, p, "group_size")) m.group_size.push_back(static_cast<int>(as_int(n)));
  m.dispatch_bps = array(s, p, "dispatch_bytes_per_s");
  m.combine_bps = array(s, p, "combine_bytes_per_s");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kExpertDispatchFamily);
  s.model = "expert_dispatch_v1";
  s.description =
      "expert-parallel dispatch / combine kernels that send one copy of a token per destination node over RDMA "
      "and forward it over NVLink (DeepEP normal kernels): t = bytes / bandwidth(direction, n), bandwidth "
      "piecewise linear in log2 n between the group sizes, held outside them";
  s.inputs = {{"group_size", true, "expert-parallel ranks"},
              {"direction", true, "0: dispatch, 1: combine"},
              {"bytes", true, "RDMA bytes one GPU sends (de-duplicated per destination node)"}};
  s.params = {{"group_size", true, true, "group sizes with points, increasing"},
              {"dispatch_bytes_per_s", false, true, "dispatch RDMA bandwidth per group size, bytes/s"},
              {"combine_bytes_per_s", false, true, "combine RDMA bandwidth per group size, bytes/s"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<ExpertDispatchModel::Sample> s;
  for (const auto& p : points) {
    s.push_back(
        {small_int(p.inputs[0], "group_size"), small_int(p.inputs[1], "direction"), p.inputs[2], p.time.median_s});
  }
  const auto m = ExpertDispatchModel::fit(s);
  Params out(3);
  for (std::size_t i = 0; i < m.group_size.size(); ++i) {
    out[0].push_back(m.group_size[i]);
    out[1].push_back(m.dispatch_bps[i]);
    out[2].push_back(m.combine_bps[i]);
  }
  return round_all(out);
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  const int direction = as_int(p.inputs[1]) == 0 ? 0 : 1;
  return p.inputs[2] / dispatch_of(spec, params).bandwidth(static_cast<int>(as_int(p.inputs[0])), direction);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  const auto& n = array(spec, params, "group_size");
  if (n.empty()) return "'group_size' must not be empty";
  if (!increasing_counts(n)) return "'group_size' must be increasing group sizes of at least 2";
  for (const char* k : {"dispatch_bytes_per_s", "combine_bytes_per_s"}) {
    const auto& bw = array(spec, params, k);
    if (bw.size() != n.size()) return std::string("'") + k + "' must have one entry per group size";
    for (double b : bw) {
      if (!(b > 0)) return std::string("'") + k + "' must be > 0";
    }
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.expert_dispatch = dispatch_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& expert_dispatch_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store};
  return m;
}

// ---- benchmark grid: none (no RDMA peer on one node) ----------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& /*out*/) {}
void plan(GridPlan& /*p*/, int /*part*/) {}

}  // namespace

const ModuleGrid& expert_dispatch_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
