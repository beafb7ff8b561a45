#pragma once
// Hardware identity helpers that need no GPU (host-only, tested on text samples). The GPU side
// (gpu_runner.cpp) queries CUDA and runs `nvidia-smi`; the text it gets back is interpreted here.
//
// Links between GPUs come from the text of `nvidia-smi topo -m` (NVML is not linked: the matrix is
// what an engineer reads anyway, and it names NVLink counts and PCIe paths directly).
#include <string>
#include <vector>

namespace threewalls::calibration::bench {

// "h100" / "h200" from a CUDA device name ("NVIDIA H100 80GB HBM3", "NVIDIA H200"); empty when the
// name is neither.
std::string gpu_kind_of(const std::string& device_name);

// The GPU-to-GPU connections of a `nvidia-smi topo -m` matrix among the first `gpus` GPUs, one
// string per distinct kind with the pairs that have it, e.g.
//   "NV18 (NVLink, 18 links): 6 GPU pairs"   "SYS (PCIe across NUMA nodes): 2 GPU pairs"
// Empty when the text has no GPU matrix (or fewer than two GPUs).
std::vector<std::string> links_from_topology(const std::string& topo_text, int gpus);

// Fields of `nvidia-smi --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader,nounits`
// (first line). Missing or unparsable fields stay empty / 0.
struct SmiQuery {
  std::string driver_version;
  double max_sm_clock_mhz = 0.0;
  double max_memory_clock_mhz = 0.0;
};
SmiQuery parse_smi_query(const std::string& csv_text);

// "host <name>; CPU <model> (<n> logical CPUs); <x> GiB RAM; InfiniBand: <devices or none>" from /proc and /sys.
std::string describe_machine();

// Output of a shell command (stdout), or empty with `ok` false when it cannot be run.
std::string run_command(const std::string& command, bool& ok);

}  // namespace threewalls::calibration::bench
