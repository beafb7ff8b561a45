#pragma once
// The GPU side of the calibration (CUDA builds only; this header itself has no CUDA types).
//
// detect_machine(): the hardware identity of the profile: CUDA device properties (name, SMs,
// memory), `nvidia-smi --query-gpu` (driver version, maximum SM and memory clocks), CUDA runtime
// and NCCL versions, the GPU count and the links between GPUs from `nvidia-smi topo -m`
// (hardware_info.hpp), the machine (host, CPU, RAM, InfiniBand devices), the date, and the datasheet
// peaks of the GPU kind (from the shipped default profile's generator).
//
// make_gpu_runner(): the PointRunner that measures every op of the table (plan.hpp) with the
// backend functions `threewalls run` launches for the matching StepGraph op (docs/backend.md's op
// table), on seeded random data, with a correctness check per point.
#include <memory>
#include <string>

#include "threewalls/calibration/bench/driver.hpp"
#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration::bench {

struct MachineIdentity {
  Hardware hardware;
  std::string topology_text;  // raw `nvidia-smi topo -m` output, or why there is none
  int gpus_available = 0;
};

// `gpus_wanted` = 0: all visible GPUs; more than visible is an InputError. `gpu_kind` empty:
// from the device name (an unknown GPU is an InputError asking for --gpu-kind). Throws
// SystemError when no CUDA device is usable.
MachineIdentity detect_machine(int gpus_wanted, const std::string& gpu_kind);

struct GpuRunnerOptions {
  Mode mode = Mode::full;
  int gpus = 1;                      // GPUs for collectives (group sizes 2..gpus)
  int sm_count = 0;                  // for the concurrency points' SM fraction
  std::string scratch_dir = "/tmp";  // where the disk-read file is written (and removed)
  std::uint64_t seed = 1;            // base seed of every buffer's random content
};
std::unique_ptr<PointRunner> make_gpu_runner(const GpuRunnerOptions& options);

}  // namespace threewalls::calibration::bench
