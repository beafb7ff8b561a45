// Family module: NCCL device memory by stage, nccl.memory, model nccl_memory_v1 (models.hpp
// NcclMemoryModel; optional, absent: the simulator's constants). Its points measure bytes (input
// `bytes`); their times are the stages' host seconds, kept for reference.
#include <algorithm>

#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

NcclMemoryModel nccl_memory_of(const FamilySpec& s, const Params& p) {
  NcclMemoryModel m;
  m.communicator_bytes = scalar(s, p, "communicator_bytes");
  m.collective_bytes = scalar(s, p, "collective_bytes");
  m.p2p_peer_bytes = scalar(s, p, "p2p_peer_bytes");
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kNcclMemoryFamily);
  s.model = "nccl_memory_v1";
  s.description =
      "NCCL device memory (cudaMemGetInfo) by stage: communicator init, first collectives, first send/recv with a "
      "peer; parameters are the stages' median bytes (points' times: the stages' host seconds, for reference)";
  s.inputs = {{"stage", true, "0: communicator init, 1: first collectives, 2: first send/recv with a peer"},
              {"group_size", true, "ranks in the communicator"},
              {"bytes", true, "device bytes the stage allocated on the measured GPU"}};
  s.params = {{"communicator_bytes", false, false, "per communicator of more than one rank"},
              {"collective_bytes", false, false, "per communicator that runs collectives"},
              {"p2p_peer_bytes", false, false, "per peer this rank sends to or receives from"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<NcclMemoryModel::Sample> s;
  for (const auto& p : points) s.push_back({small_int(p.inputs[0], "stage"), p.inputs[2]});
  const auto m = NcclMemoryModel::fit(s);
  return round_all({{m.communicator_bytes}, {m.collective_bytes}, {m.p2p_peer_bytes}});
}

// The measured quantity of this family is bytes (measured): the fit errors are over bytes.
double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return nccl_memory_of(spec, params)
      .stage_bytes(static_cast<int>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, 2)));
}

double measured(const Point& p) { return p.inputs[2]; }

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  for (const char* k : {"communicator_bytes", "collective_bytes", "p2p_peer_bytes"}) {
    if (scalar(spec, params, k) < 0) return std::string("'") + k + "' must be >= 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.nccl_memory = nccl_memory_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& nccl_memory_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, measured};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"nccl_memory", "", "nccl.memory",
                 "cudaMemGetInfo on GPU 0 around NCCL stages of a fresh 2-GPU pair of communicators: init, the first "
                 "all-reduces (1 MiB, 1 GiB), the first send/recv in both directions",
                 "bytes allocated by the stage (time: the stage's host seconds)"});
}

// Needs 2 GPUs (GPU 0 is measured, GPU 1 is the NCCL peer); on one GPU the group is not planned and
// the report names the families as not measured. Measured before nccl.interference: it needs fresh
// communicators (the stages are measured in the section's setup).
void plan(GridPlan& p, int /*part*/) {
  if (p.gpus < 2) return;
  for (int stage = 0; stage <= 2; ++stage) {
    PointSpec s;
    s.op = "nccl_memory";
    s.family = "nccl.memory";
    s.params = {{"stage", static_cast<double>(stage)}, {"group_size", 2.0}};
    s.inputs = {static_cast<double>(stage), 2.0, 0.0};  // bytes: filled by the runner
    s.group_size = 2;
    p.points.push_back(std::move(s));
  }
}

}  // namespace

const ModuleGrid& nccl_memory_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
