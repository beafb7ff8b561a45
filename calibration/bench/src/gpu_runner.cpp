// The GPU PointRunner: the driver of the group benchmarks (families/<group>.cpp, one per calibrate
// group of the family table), one setup per section (op group), one measure per point, a
// correctness check per point. Every op runs the backend function that OpRunner runs for the
// matching StepGraph op (docs/backend.md, "OpRunner: op kind by op kind"), so the profile describes
// the kernels `threewalls run` launches. Also the machine's identity (detect_machine).
#include "threewalls/calibration/bench/gpu_runner.hpp"

#include <algorithm>
#include <ctime>
#include <stdexcept>

#include "default_profiles.hpp"
#include "families/bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/calibration/bench/hardware_info.hpp"
#include "threewalls/core/error.hpp"

namespace threewalls::calibration::bench {

namespace be = threewalls::backend;

// ---- machine identity ------------------------------------------------------------------------------

MachineIdentity detect_machine(int gpus_wanted, const std::string& gpu_kind) {
  std::string reason;
  const int visible = be::device_count(&reason);
  if (visible == 0) throw SystemError("no CUDA device: " + reason);
  if (gpus_wanted < 0 || gpus_wanted > visible) {
    throw InputError("--gpus " + std::to_string(gpus_wanted) + ": " + std::to_string(visible) +
                     " GPU(s) visible; allowed: 1 to " + std::to_string(visible) + " (0 = all)");
  }
  MachineIdentity id;
  id.gpus_available = visible;
  const int gpus = gpus_wanted == 0 ? visible : gpus_wanted;
  be::set_device(0);
  cudaDeviceProp prop{};
  TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  Hardware& hw = id.hardware;
  hw.gpu_name = prop.name;
  hw.gpu_kind = gpu_kind.empty() ? gpu_kind_of(hw.gpu_name) : gpu_kind;
  const auto& kinds = known_gpu_kinds();
  if (std::find(kinds.begin(), kinds.end(), hw.gpu_kind) == kinds.end()) {
    throw InputError("GPU '" + hw.gpu_name + "' is not a known kind" +
                     (gpu_kind.empty() ? "" : " ('" + gpu_kind + "' given)") +
                     "; pass --gpu-kind with one of: h100, h200 (the kinds profiles are shipped for)");
  }
  hw.sm_count = prop.multiProcessorCount;
  hw.memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) == cudaSuccess) hw.sm_clock_mhz = khz / 1000.0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess) hw.memory_clock_mhz = khz / 1000.0;
  static_cast<void>(cudaGetLastError());
  bool ok = false;
  const SmiQuery q = parse_smi_query(run_command(
      "nvidia-smi --id=0 --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader,nounits", ok));
  hw.driver_version = ok && !q.driver_version.empty() ? q.driver_version : "unknown (nvidia-smi not available)";
  if (q.max_sm_clock_mhz > 0) hw.sm_clock_mhz = q.max_sm_clock_mhz;
  if (q.max_memory_clock_mhz > 0) hw.memory_clock_mhz = q.max_memory_clock_mhz;
  if (!(hw.sm_clock_mhz > 0)) hw.sm_clock_mhz = 1.0;  // the format needs > 0; "unknown" is said in machine
  if (!(hw.memory_clock_mhz > 0)) hw.memory_clock_mhz = 1.0;
  int runtime = 0, driver_api = 0;
  TW_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  TW_CUDA_CHECK(cudaDriverGetVersion(&driver_api));
  hw.cuda_version = "runtime " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
                    ", driver API " + std::to_string(driver_api / 1000) + "." + std::to_string(driver_api % 1000 / 10);
  hw.nccl_version = be::nccl_version();
  hw.gpus_seen = visible;
  id.topology_text = run_command("nvidia-smi topo -m", ok);
  if (!ok) id.topology_text = "nvidia-smi topo -m could not be run";
  hw.links_seen = links_from_topology(id.topology_text, gpus);
  if (hw.links_seen.empty()) {
    hw.links_seen.push_back(gpus < 2 ? "none: one GPU used" : "unknown: no GPU matrix in `nvidia-smi topo -m`");
  }
  hw.machine = describe_machine() + "; " + std::to_string(gpus) + " of " + std::to_string(visible) + " GPUs used";
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  hw.date = date;
  // Datasheet peaks of the kind (the same numbers the default profile uses).
  const Hardware sheet = defaults::make_default_profile(hw.gpu_kind).hardware();
  hw.peak_bf16_flop_per_s = sheet.peak_bf16_flop_per_s;
  hw.peak_fp8_flop_per_s = sheet.peak_fp8_flop_per_s;
  hw.peak_fp32_flop_per_s = sheet.peak_fp32_flop_per_s;
  hw.hbm_bandwidth_datasheet_bytes_per_s = sheet.hbm_bandwidth_datasheet_bytes_per_s;
  return id;
}

namespace {

// The driver's side of the GPU runner: the device, the measuring stream with its timer and the
// cuBLASLt handle, and the benchmark of the current section (families/<group>.cpp).
class GpuRunner final : public PointRunner {
 public:
  explicit GpuRunner(const GpuRunnerOptions& o) {
    be::set_device(0);
    be::set_thread_rank(0);
    stream_ = std::make_unique<be::Stream>();
    timer_ = std::make_unique<detail::Timer>(stream_->get());
    lt_ = std::make_unique<be::CublasLt>();
    ctx_ = detail::BenchContext{o, steady_clock(), stream_->get(), timer_.get(), lt_.get()};
  }

  void begin_section(const std::string& section, const std::vector<PointSpec>& points) override {
    be::set_device(0);
    bench_.reset();
    const detail::GroupBenchFactory make = detail::group_bench(section);
    if (!make) throw std::logic_error("GPU runner: no benchmark for the calibrate group " + section);
    bench_ = make(ctx_);
    bench_->begin(points);
    TW_CUDA_CHECK(cudaStreamSynchronize(stream_->get()));
  }

  void end_section(const std::string& /*section*/) override {
    be::set_device(0);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    bench_.reset();
  }

  void measure(const StopRule& rule, Record& r) override {
    be::set_device(0);
    if (!bench_) throw std::logic_error("GPU runner: op " + r.point.op + " measured outside a section");
    bench_->measure(rule, r);
  }

 private:
  // Released in reverse order: the section's benchmark before the handle, timer and stream it uses.
  std::unique_ptr<be::Stream> stream_;
  std::unique_ptr<detail::Timer> timer_;
  std::unique_ptr<be::CublasLt> lt_;
  detail::BenchContext ctx_;
  std::unique_ptr<detail::GroupBench> bench_;
};

}  // namespace

std::unique_ptr<PointRunner> make_gpu_runner(const GpuRunnerOptions& options) {
  return std::make_unique<GpuRunner>(options);
}

}  // namespace threewalls::calibration::bench
