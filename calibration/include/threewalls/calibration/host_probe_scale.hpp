#pragma once
// A real run's host against a profile's: the run's host probe (run.json
// settings.executor.device.host_probe, core/host_probe.hpp) over what the cost model charges for the
// same calls. On the GPU VMs a launch-bound step moves with this ratio from one process to the next
// (docs/validation/host_overhead.md); `threewalls compare` prints it, and `threewalls sim
// --host-scale` takes it to simulate the step at the run's host speed.
#include <filesystem>
#include <optional>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/core/host_probe.hpp"
#include "threewalls/core/jsonl.hpp"

namespace threewalls::calibration {

using HostProbeScale = host_probe::Scale;

// op_launch_us against kernel_launch + op_dispatch, each GEMM call against gemm_launch(m, n, k); a
// PyTorch run's torch_eager_op_us alone against kernel_launch + framework_op;
// `host_scale` is the one the charges were simulated with (settings.simulator.host_scale). Nullopt
// when the probe lacks one of the keys or holds a value that is not a positive number (older runs).
std::optional<HostProbeScale> host_probe_scale(const OrderedJson& probe, const CostModel& model, double host_scale = 1.0);

// host_probe_scale against the profile at `profile_path` (loaded with Profile::load). Throws Error
// (InputError, SystemError) when the profile no longer loads.
std::optional<HostProbeScale> host_probe_scale_from_profile(const OrderedJson& probe,
                                                            const std::filesystem::path& profile_path,
                                                            double host_scale = 1.0);

}  // namespace threewalls::calibration
