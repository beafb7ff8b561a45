// Family module: per-process device memory by stage, device.memory, model device_memory_v1
// (models.hpp DeviceMemoryModel; optional, absent: the memory model's fixed constants). Its points
// measure bytes (input `bytes`); their times are the stages' host seconds, kept for reference.
#include <algorithm>

#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

constexpr const char* kParams[DeviceMemoryModel::kStages] = {
    "context_bytes", "modules_bytes", "blas_bytes", "blas_further_bytes", "cudnn_bytes", "granularity_bytes"};

DeviceMemoryModel device_memory_of(const FamilySpec& s, const Params& p) {
  DeviceMemoryModel m;
  m.context_bytes = scalar(s, p, kParams[0]);
  m.modules_bytes = scalar(s, p, kParams[1]);
  m.blas_bytes = scalar(s, p, kParams[2]);
  m.blas_further_bytes = scalar(s, p, kParams[3]);
  m.cudnn_bytes = scalar(s, p, kParams[4]);
  m.granularity_bytes = scalar(s, p, kParams[5]);
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  FamilySpec s;
  s.measured_only = true;
  s.name = std::string(kDeviceMemoryFamily);
  s.model = "device_memory_v1";
  s.description =
      "per-process device memory (cudaMemGetInfo) by stage in a fresh CUDA context on one GPU: the context, the first "
      "kernel launches, the first cuBLASLt handle with the backend's workspace and first GEMMs, a second one, one "
      "cuDNN "
      "handle with the "
      "fused-attention graphs of a typical shape, the allocation granularity; parameters are the stages' median bytes "
      "(points' times: the stages' host seconds, for reference)";
  s.inputs = {{"stage", true,
               "0: CUDA context, 1: first kernel launches, 2: first cuBLASLt handle and workspace, 3: further "
               "cuBLASLt handle, 4: cuDNN handle and fused attention, 5: allocation granularity"},
              {"repeat", true, "repeat of the measurement (a fresh context each)"},
              {"bytes", true, "device bytes the stage took on the measured GPU"}};
  s.params = {{kParams[0], false, false, "the CUDA context, per process"},
              {kParams[1], false, false, "the backend's kernel modules, per process"},
              {kParams[2], false, false, "the first OpRunner's cuBLASLt, cuBLAS, workspace and GEMM modules"},
              {kParams[3], false, false, "per further OpRunner (device stream with ops): cuBLASLt, cuBLAS, workspace"},
              {kParams[4], false, false, "per OpRunner that runs fused attention: cuDNN handle, graphs, workspace"},
              {kParams[5], false, false, "device bytes per allocation are a multiple of this"}};
  out.push_back(s);
}

Params fit(const FamilySpec& /*spec*/, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<DeviceMemoryModel::Sample> s;
  for (const auto& p : points) s.push_back({small_int(p.inputs[0], "stage"), p.inputs[2]});
  const auto m = DeviceMemoryModel::fit(s);
  return round_all({{m.context_bytes},
                    {m.modules_bytes},
                    {m.blas_bytes},
                    {m.blas_further_bytes},
                    {m.cudnn_bytes},
                    {m.granularity_bytes}});
}

// The measured quantity of this family is bytes (measured): the fit errors are over bytes.
double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return device_memory_of(spec, params)
      .stage_bytes(static_cast<int>(std::clamp<std::int64_t>(as_int(p.inputs[0]), 0, DeviceMemoryModel::kStages - 1)));
}

double measured(const Point& p) { return p.inputs[2]; }

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  for (const char* k : kParams) {
    if (scalar(spec, params, k) < 0) return std::string("'") + k + "' must be >= 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.device_memory = device_memory_of(f.spec(), f.params);
}

}  // namespace

const FamilyModule& device_memory_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, measured};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"device_memory", "", std::string(kDeviceMemoryFamily),
                 "cudaMemGetInfo on GPU 0 around the stages of a fresh CUDA context: its creation, the first launches "
                 "of the backend's kernels, the first and a second CublasLt with their first GEMMs, one FusedAttention "
                 "(cuDNN) forward and backward at b2 s4096 h16 d128 causal, a 1-byte cudaMalloc",
                 "bytes taken by the stage (time: the stage's host seconds)"});
}

// Every stage of every repeat is a point, on one GPU (calibration/bench/src/families/device.cpp
// measures them in the section's setup, each repeat in a fresh CUDA context).
void plan(GridPlan& p, int /*part*/) {
  for (int repeat = 0; repeat < DeviceMemoryModel::kRepeats; ++repeat) {
    for (int stage = 0; stage < DeviceMemoryModel::kStages; ++stage) {
      PointSpec s;
      s.op = "device_memory";
      s.family = std::string(kDeviceMemoryFamily);
      s.params = {{"stage", d(stage)}, {"repeat", d(repeat)}};
      s.inputs = {d(stage), d(repeat), 0.0};  // bytes: filled by the runner
      p.points.push_back(std::move(s));
    }
  }
}

}  // namespace

const ModuleGrid& device_memory_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
