#include "threewalls/scenarios/scenario.hpp"

#include <algorithm>

namespace threewalls::scenarios {

int ModelSpec::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_layers; ++l) n += layer_is_moe(l) ? 1 : 0;
  return n;
}

std::int64_t ModelSpec::padded_vocab_size(int tp) const {
  const std::int64_t multiple = 128LL * tp;
  return (static_cast<std::int64_t>(vocab_size) + multiple - 1) / multiple * multiple;
}

bool ExecOptions::graph_scope(const std::string& s) const {
  return std::find(cuda_graph_scope.begin(), cuda_graph_scope.end(), s) != cuda_graph_scope.end() ||
         std::find(cuda_graph_scope.begin(), cuda_graph_scope.end(), "full_iteration") != cuda_graph_scope.end();
}

bool TrainSpec::recompute_module(const std::string& m) const {
  return recompute_granularity == RecomputeGranularity::selective &&
         std::find(recompute_modules.begin(), recompute_modules.end(), m) != recompute_modules.end();
}

const char* to_string(AttentionKind v) {
  switch (v) {
    case AttentionKind::mha: return "mha";
    case AttentionKind::gqa: return "gqa";
    case AttentionKind::mla: return "mla";
  }
  return "?";
}
const char* to_string(Precision v) { return v == Precision::bf16 ? "bf16" : "fp8"; }
const char* to_string(GpuKind v) { return v == GpuKind::h100 ? "h100" : "h200"; }
const char* to_string(Dispatcher v) {
  switch (v) {
    case Dispatcher::alltoall: return "alltoall";
    case Dispatcher::allgather: return "allgather";
    case Dispatcher::flex: return "flex";
  }
  return "?";
}
const char* to_string(RecomputeGranularity v) {
  switch (v) {
    case RecomputeGranularity::none: return "none";
    case RecomputeGranularity::selective: return "selective";
    case RecomputeGranularity::full: return "full";
  }
  return "?";
}
const char* to_string(OffloadTier v) {
  switch (v) {
    case OffloadTier::hbm: return "hbm";
    case OffloadTier::host_pinned: return "host_pinned";
    case OffloadTier::nvme: return "nvme";
  }
  return "?";
}
std::string to_string(const ExpertExecution& v) {
  switch (v.kind) {
    case ExpertExecutionKind::sequential: return "sequential";
    case ExpertExecutionKind::grouped: return "grouped";
    case ExpertExecutionKind::streams: return "streams:" + std::to_string(v.streams);
  }
  return "?";
}

}  // namespace threewalls::scenarios
