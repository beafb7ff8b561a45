#pragma once
// The host probe every real run takes before its first step (docs/backend.md, Host probe):
// the library calls it times and the keys it writes to run.json (settings.executor.device.host_probe).
// One place for the backend that measures the calls and the cost model that charges the same calls
// (calibration::host_probe_scale, `threewalls compare`).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace threewalls::host_probe {

// OpRunner::run of an elementwise add of this many elements: one kernel launch through the
// executor's per-op path (host.kernel_launch + host.op_dispatch).
inline constexpr std::int64_t kAddElements = 4096;
inline constexpr std::string_view kOpLaunchKey = "op_launch_us";

// OpRunner::run of a cuBLASLt GEMM: two shapes of the calibration's host.gemm_call grid, one kernel
// and split over K (two).
struct GemmCall {
  std::string_view key;
  std::int64_t m, n, k;
};
inline constexpr std::array<GemmCall, 2> kGemmCalls{{{"gemm_call_m64_n2560_k640_us", 64, 2560, 640},
                                                    {"gemm_call_m128_n1024_k7168_us", 128, 1024, 7168}}};

// A PyTorch run's probe (python3 -m threewalls.runner): a one-element eager torch.add issued while
// the device is busy (threewalls.bench.framework's eager_op_us), the call behind host.framework_op:
// kernel_launch + framework_op. A probe with this key is a PyTorch run's and is scaled on it alone.
inline constexpr std::string_view kTorchEagerOpKey = "torch_eager_op_us";

// A run's probe against what a profile charges for the same calls (calibration::host_probe_scale
// computes it; `threewalls compare` prints it).
struct Scale {
  std::vector<std::string> keys;   // the probe's keys, in this header's order
  std::vector<double> probe_us;    // measured by the run
  std::vector<double> charged_us;  // what the model charges for the same call, times its host scale
  double scale = 1.0;              // sum(probe_us) / sum(charged_us)
};

}  // namespace threewalls::host_probe
