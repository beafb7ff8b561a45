// One process per GPU under MPI (compiled only when CMake found MPI: THREEWALLS_HAVE_MPI). MPI is
// used by the main thread only: NCCL unique ids broadcast from rank 0, barriers around the run
// directory, the measured peaks gathered to rank 0 for summary.json.
#include <dlfcn.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "threewalls/backend/cuda_device.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/launch.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/profiler/record.hpp"

namespace threewalls::backend {

std::vector<CommId> make_nccl_ids(std::size_t count);

namespace detail {
namespace {

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw SystemError(std::string("run: ") + call + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

// The library MPI_Init_thread resolved to. A binary that also links SimGrid (whose SMPI exports
// MPI_* too) resolves it to SMPI unless the MPI library comes first in its load order, and SMPI's
// MPI_Init aborts the process; threewalls-gpu, which runs `run`, does not link SimGrid
// (cli/CMakeLists.txt). Refuse with the reason instead.
std::string mpi_library_if_smpi() {
  Dl_info info{};
  const auto fn = &MPI_Init_thread;
  void* addr = nullptr;
  static_assert(sizeof(fn) == sizeof(addr));
  std::memcpy(&addr, &fn, sizeof(addr));
  if (dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return {};
  const std::string lib = info.dli_fname;
  return lib.find("simgrid") != std::string::npos ? lib : std::string();
}

void check_mpi_is_not_smpi() {
  const std::string lib = mpi_library_if_smpi();
  if (!lib.empty()) {
    throw SystemError("run: MPI_Init_thread resolves to " + lib +
                      " (SimGrid's SMPI), not to the MPI library: this binary was linked with SimGrid ahead of "
                      "MPI; link MPI first, or run the command through threewalls-gpu (cli/CMakeLists.txt)");
  }
}

}  // namespace

void mpi_abort(int exit_code) {
  if (!mpi_library_if_smpi().empty()) return;  // SMPI's functions abort outside smpirun
  int init = 0;
  int fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init != 0 && fin == 0) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

RunResult run_mpi(const scenarios::Scenario& s, const LaunchOptions& options) {
  check_mpi_is_not_smpi();
  int init = 0;
  MPI_Initialized(&init);
  if (init == 0) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int world = s.world_size();
  if (size != world) {
    throw InputError(s.source_path + ": the scenario's world is " + std::to_string(world) +
                     " GPU(s) ([cluster] gpus_per_node x nodes) but the MPI job has " + std::to_string(size) +
                     " process(es); start it with `mpirun -np " + std::to_string(world) + " threewalls run ...`");
  }
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  std::string reason;
  const int visible = device_count(&reason);
  if (visible == 0) throw SystemError("rank " + std::to_string(rank) + ": no usable CUDA device: " + reason);
  int device = local;
  if (!options.devices.empty()) {
    if (local >= static_cast<int>(options.devices.size())) {
      throw InputError("rank " + std::to_string(rank) + ": --devices lists " + std::to_string(options.devices.size()) +
                       " device(s) but this is process " + std::to_string(local) + " on its node");
    }
    device = options.devices[static_cast<std::size_t>(local)];
  }
  if (device >= visible) {
    throw InputError("rank " + std::to_string(rank) + ": process " + std::to_string(local) +
                     " on its node wants CUDA device " + std::to_string(device) + " but only " +
                     std::to_string(visible) + " are visible");
  }

  // One clock for every process: microseconds since rank 0's start on the system clock.
  struct Start {
    char iso[64];
    std::int64_t sys_us;
  } start{};
  if (rank == 0) {
    const std::string iso = profiler::iso8601_utc_now();
    std::strncpy(start.iso, iso.c_str(), sizeof start.iso - 1);
    start.sys_us = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  }
  mpi_check(MPI_Bcast(&start, sizeof start, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(start time)");

  ProcessContext pc;
  pc.local_ranks = {rank};
  pc.creator = rank == 0;
  pc.start_time = start.iso;
  const std::int64_t t0 = start.sys_us;
  pc.host_now_us = [t0] {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count() -
                               t0);
  };
  pc.make_comm_ids = [rank](std::size_t count) {
    std::vector<CommId> ids = rank == 0 ? make_nccl_ids(count) : std::vector<CommId>(count);
    if (count > 0) {
      mpi_check(MPI_Bcast(ids.data(), static_cast<int>(count * sizeof(CommId)), MPI_BYTE, 0, MPI_COMM_WORLD),
                "MPI_Bcast(NCCL unique ids)");
    }
    return ids;
  };
  pc.barrier = [] { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
  pc.gather = [rank, size](const std::vector<double>& local_values) {
    const double mine = local_values.empty() ? 0.0 : local_values.front();
    std::vector<double> all(rank == 0 ? static_cast<std::size_t>(size) : 0);
    mpi_check(MPI_Gather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD), "MPI_Gather(peaks)");
    return all;
  };
  const DeviceFactory factory = [device](int r, int /*local_index*/) { return std::make_unique<CudaDevice>(r, device); };
  RunResult result = execute(s, pc, factory, options.executor);
  MPI_Finalize();
  return result;
}

}  // namespace detail
}  // namespace threewalls::backend
