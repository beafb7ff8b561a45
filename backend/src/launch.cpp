#include "threewalls/backend/launch.hpp"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "threewalls/backend/cuda_device.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/profiler/record.hpp"

namespace threewalls::backend {

#ifdef THREEWALLS_HAVE_MPI
namespace detail {
RunResult run_mpi(const scenarios::Scenario& s, const LaunchOptions& options);
void mpi_abort(int exit_code);
}  // namespace detail
#endif

bool started_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

bool mpi_available() {
#ifdef THREEWALLS_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void abort_mpi_job(int exit_code) {
#ifdef THREEWALLS_HAVE_MPI
  detail::mpi_abort(exit_code);
#else
  static_cast<void>(exit_code);
#endif
}

std::vector<CommId> make_nccl_ids(std::size_t count) {
  std::vector<CommId> ids(count);
  for (CommId& id : ids) {
    ncclUniqueId u{};
    TW_NCCL_CHECK(ncclGetUniqueId(&u));
    std::memcpy(id.bytes.data(), &u, sizeof u);
  }
  return ids;
}

void set_device_max_connections(const scenarios::Scenario& s) {
  const int want = s.run.cuda_device_max_connections;
  if (const char* have = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"); have != nullptr) {
    char* end = nullptr;
    const long v = std::strtol(have, &end, 10);
    if (end != have && *end == '\0' && v == want) return;
    throw InputError(s.source_path + ": the environment sets CUDA_DEVICE_MAX_CONNECTIONS=" + have +
                     " but the scenario's run.cuda_device_max_connections is " + std::to_string(want) +
                     " (8 when the scenario does not say); set the key to the value the run should use (1..32) "
                     "or unset the variable");
  }
  // Read by CUDA when it creates a context: this process has made no CUDA call yet.
  if (::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(want).c_str(), 1) != 0) {
    throw SystemError("run: could not set CUDA_DEVICE_MAX_CONNECTIONS in the environment");
  }
}

RunResult run_real(const scenarios::Scenario& s, const LaunchOptions& options) {
  set_device_max_connections(s);
  if (started_by_mpi()) {
#ifdef THREEWALLS_HAVE_MPI
    return detail::run_mpi(s, options);
#else
    throw InputError("run: started by an MPI launcher, but this threewalls was built without MPI (install an MPI "
                     "development package, e.g. libopenmpi-dev, and rebuild); run all GPUs of one machine from one "
                     "process instead");
#endif
  }
  std::string reason;
  const int visible = device_count(&reason);
  if (visible == 0) throw SystemError("run: no usable CUDA device: " + reason);
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int d = 0; d < visible; ++d) devices.push_back(d);
  }
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= visible) {
      throw InputError("run: --devices: device " + std::to_string(d) + " does not exist; " + std::to_string(visible) +
                       " CUDA device(s) are visible (0.." + std::to_string(visible - 1) + ")");
    }
    if (!seen.insert(d).second) throw InputError("run: --devices: device " + std::to_string(d) + " is listed twice");
  }
  const int world = s.world_size();
  if (static_cast<int>(devices.size()) != world) {
    throw InputError(s.source_path + ": the scenario's world is " + std::to_string(world) +
                     " GPU(s) ([cluster] gpus_per_node x nodes) but this run has " + std::to_string(devices.size()) +
                     " GPU(s) (" + (options.devices.empty() ? "visible devices" : "--devices") +
                     "); run it on exactly " + std::to_string(world) +
                     " GPUs (CUDA_VISIBLE_DEVICES or --devices), or across machines with `mpirun -np " +
                     std::to_string(world) + " threewalls run ...`");
  }
  ProcessContext pc;
  for (int r = 0; r < world; ++r) pc.local_ranks.push_back(r);
  pc.creator = true;
  pc.make_comm_ids = make_nccl_ids;
  pc.start_time = profiler::iso8601_utc_now();
  const DeviceFactory factory = [devices](int rank, int /*local_index*/) {
    return std::make_unique<CudaDevice>(rank, devices[static_cast<std::size_t>(rank)]);
  };
  return execute(s, pc, factory, options.executor);
}

}  // namespace threewalls::backend
