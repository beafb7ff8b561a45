// Family module: host costs, host.<name>, model median_v1 (models.hpp ConstantModel): one family per
// HostCost (decoded.hpp), named and described here.
#include <array>
#include <utility>

#include "decoded.hpp"
#include "grid_common.hpp"
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
    // Optional: an eager framework's (PyTorch's) autograd engine and device reads, measured by
    // python/threewalls/bench/framework.py; the simulator charges them for run.framework = "pytorch_eager".
    {"framework_backward_op",
     "host time per backward op of an eager framework on top of the kernel launch (its autograd engine's node and "
     "the C++ dispatch), in place of host.framework_op"},
    {"framework_sync",
     "host time of an eager framework's device-to-host read on an idle device (PyTorch: torch.where / nonzero of "
     "a boolean mask: its dispatch, launch, wait and read), in place of host.gpu_read"},
    {"framework_attention_plan",
     "host time an eager framework spends before its fused attention's first call at a shape it has not run "
     "(PyTorch's cuDNN SDPA builds and caches an execution plan per shape), on top of the call"},
    {"framework_autograd_op",
     "extra host time per forward op of an eager framework that records it for autograd (a training step's "
     "forward: the node, its saved tensors), on top of the kernel launch, in place of host.framework_op"},
    {"framework_record_op",
     "extra host time per timed op of an eager framework's recorded step (the reference runner's phases: CUDA "
     "events, backward marks, Python autograd functions), forward and backward alike, over the same op "
     "unrecorded, in place of host.record_op"},
}};

void add_specs(std::vector<FamilySpec>& out) {
  for (std::size_t h = 0; h < kHost.size(); ++h) {
    const auto& [what, desc] = kHost[h];
    FamilySpec s;
    s.name = host_family(what);
    // The costs from the library calls on (enum order) are optional: absent, the simulator charges
    // what cost_model.hpp says for each (a launch, a record, nothing).
    s.measured_only = h >= idx(HostCost::gemm_launch);
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

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  for (const char* h : {"kernel_launch", "event_record", "stream_sync", "gpu_read", "graph_launch", "graph_node",
                        "collective_launch"}) {
    out.push_back(
        {std::string("host_") + h, "", std::string("host.") + h, "see docs/calibration.md", "seconds per call"});
  }
  out.push_back(
      {"host_op_dispatch", "", "host.op_dispatch",
       "64 OpRunner::run calls of a 4096-element add against 64 bare kernel launches; the extra host time per "
       "call",
       "seconds per op"});
  out.push_back({"host_record_op", "", "host.record_op",
                 "64 recorded OpRunner::run calls (the executor's recording path: query of the previous end marker, "
                 "start marker when not shared, launch, host clock, end marker, StepRecorder record) against 64 plain "
                 "calls; the extra host time per op; the check harvests every record",
                 "seconds per op"});
  out.push_back({"host_stream_wait", "", "host.stream_wait",
                 "128 visits (a kernel on the main stream, an event recorded behind it, a kernel on the next of 16 "
                 "side streams) with and without a cudaStreamWaitEvent of that side stream on the event, "
                 "interleaved; the extra host time per visit",
                 "seconds per wait"});
  out.push_back({"host_attention_launch", "", "host.attention_launch",
                 "host time of one Attention::forward call while a blocking kernel holds the stream",
                 "seconds per call"});
  out.push_back({"host_attention_bwd_launch", "", "host.attention_bwd_launch",
                 "host time of one Attention::backward call while a blocking kernel holds the stream",
                 "seconds per call"});
  out.push_back({"host_timing_marker", "", "host.timing_marker",
                 "device time one timing-event record costs its stream: 48 residual adds (1M bf16) back to back "
                 "against the same adds each between two timing events, behind the blocker; half the extra time "
                 "per add (calibration/tools/timed_op_gap.cu measures the same with 3000 large kernels)",
                 "seconds per marker"});
}

// Part 0: the single-call overheads (one point each). Part 1: the attention forward and backward
// launchers (backend::Attention), measured after the other library calls (gemm_call, grouped_call).
void plan(GridPlan& p, int part) {
  if (part == 0) {
    for (const char* what : {"kernel_launch", "event_record", "stream_sync", "gpu_read", "graph_launch", "graph_node",
                             "collective_launch", "timing_marker", "op_dispatch", "record_op", "stream_wait"}) {
      PointSpec s;
      s.op = std::string("host_") + what;
      s.family = std::string("host.") + what;
      p.points.push_back(std::move(s));
    }
    return;
  }
  // Attention forward and backward launchers (backend::Attention), one small causal shape; two
  // families (on an H200 host the backward call costs ~2.7x the forward: 15 kernels against 6).
  for (const bool bwd : {false, true}) {
    PointSpec s;
    s.op = bwd ? "host_attention_bwd_launch" : "host_attention_launch";
    s.family = bwd ? "host.attention_bwd_launch" : "host.attention_launch";
    s.params = {{"batch", 2.0}, {"seq", 640.0}, {"heads", 10.0}, {"head_dim", 64.0}, {"backward", bwd ? 1.0 : 0.0}};
    p.points.push_back(std::move(s));
  }
}

}  // namespace

const ModuleGrid& host_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
