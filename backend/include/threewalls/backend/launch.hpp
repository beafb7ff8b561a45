#pragma once
// Launching a real run (docs/backend.md, "Running"): all GPUs of one machine from one process (one
// thread per GPU), or one process per GPU started by MPI (`mpirun -np N threewalls run ...`; only in
// builds where MPI was found: THREEWALLS_HAVE_MPI). The world size must equal the number of GPUs
// used (or the MPI world), else a clear refusal naming both numbers.
#include <string>
#include <vector>

#include "threewalls/backend/executor.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::backend {

struct LaunchOptions {
  ExecutorOptions executor;
  // CUDA device ordinals to use, rank r on devices[r]; empty = every visible device in order.
  std::vector<int> devices;
};

// Whether this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK...).
[[nodiscard]] bool started_by_mpi();
// Whether this build can run under MPI.
[[nodiscard]] bool mpi_available();

// Sets CUDA_DEVICE_MAX_CONNECTIONS to the scenario's run.cuda_device_max_connections, as CUDA reads it
// when this process creates its first context (call before any CUDA call). An environment that already
// sets another value is an InputError naming both; the same value is kept.
void set_device_max_connections(const scenarios::Scenario& s);

// Runs `s` on this machine's GPUs, or as one rank of an MPI job when started_by_mpi(). Throws
// InputError for a world-size mismatch (naming both numbers), device lists that do not fit, or
// scenarios the backend cannot run; DeviceError/SystemError for device failures.
RunResult run_real(const scenarios::Scenario& s, const LaunchOptions& options);

// In an MPI job, after this process has reported its failure: stops every process of the job
// (MPI_Abort, does not return) so that none waits for it. Returns at once outside an MPI job.
void abort_mpi_job(int exit_code);

}  // namespace threewalls::backend
