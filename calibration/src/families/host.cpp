// Family module: host costs, host.<name>, model median_v1 (models.hpp ConstantModel): one family per
// HostCost (decoded.hpp), named and described here.
#include <array>
#include <utility>

#include "decoded.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

// Name and meaning of each HostCost, in enum order (the families' file order).
constexpr std::array<std::pair<std::string_view, std::string_view>, kHostCosts> kHost = {{
    {"kernel_launch", "host time of one eager kernel launch"},
    {"framework_op", "extra host time per op of a framework (eager dispatch), on top of the kernel launch"},
    {"event_record", "host time of one CUDA event record"},
    {"stream_sync", "host cost of synchronising an idle stream"},
    {"gpu_read", "a small device-to-host read that blocks the host"},
    {"graph_launch", "host time of one CUDA-graph launch"},
    {"graph_node", "device-side cost per node of a CUDA graph"},
    {"collective_launch", "host time to enqueue one NCCL call"},
    {"timing_marker",
     "device time one timing marker (cudaEventRecord around a recorded op) adds to its stream "
     "(calibration/tools/timed_op_gap.cu: half the extra time per event-bracketed kernel)"},
    // Optional (profiles without them charge kernel_launch for these calls): host time of one
    // library call, timed while a blocking kernel holds the stream.
    {"gemm_launch", "host time of one cached-plan cuBLASLt GEMM call (CublasLt::gemm as OpRunner calls it)"},
    {"grouped_gemm_launch", "host time of one prepared grouped-GEMM call (GroupedGemm::run, OpRunner's impl)"},
    {"attention_launch", "host time of one attention forward call (Attention::forward)"},
    {"attention_bwd_launch", "host time of one attention backward call (Attention::backward)"},
    // Optional: the executor's own per-op host path, measured against the launch.
    {"op_dispatch", "extra host time of OpRunner::run for an op over the bare kernel launch it makes"},
    {"record_op",
     "extra host time of a recorded op in threewalls run (end-marker query, start and end markers, host clock, "
     "the record) over the unrecorded launch"},
    {"stream_wait",
     "host time of one cudaStreamWaitEvent on a stream other than the event's, over 16 rotating streams, as "
     "threewalls run waits across streams"},
}};

void add_specs(std::vector<FamilySpec>& out) {
  for (const auto& [what, desc] : kHost) {
    FamilySpec s;
    s.name = host_family(what);
    s.model = "median_v1";
    s.description = std::string(desc) + ": t = median of the points";
    s.params = {{"value_s", false, false, "the median, seconds"}};
    out.push_back(s);
  }
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  return round_all({{ConstantModel::fit(measured_medians(points)).value_s}});
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& /*p*/, const Hardware& /*hw*/) {
  return scalar(spec, params, "value_s");
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  if (!(scalar(spec, params, "value_s") > 0)) return "'value_s' must be > 0";
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  for (std::size_t h = 0; h < kHost.size(); ++h) {
    if (f.name == host_family(kHost[h].first)) models.host[h] = ConstantModel{scalar(f.spec(), f.params, "value_s")};
  }
}

}  // namespace

std::string_view host_cost_name(HostCost c) { return kHost.at(idx(c)).first; }

const FamilyModule& host_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr};
  return m;
}

}  // namespace threewalls::calibration::detail
