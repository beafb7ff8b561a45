#include "threewalls/backend/error.hpp"

#include <cstdio>
#include <string>

namespace threewalls::backend {
namespace {
thread_local int g_thread_rank = -1;

// Strips the directories up to the repository folder so messages stay short and stable.
std::string short_file(const char* file) {
  std::string f(file);
  for (const char* root : {"/backend/", "/tests/"}) {
    const auto pos = f.rfind(root);
    if (pos != std::string::npos) return f.substr(pos + 1);
  }
  return f;
}

std::string where(const char* call, const char* file, int line) {
  return rank_prefix() + call + " failed at " + short_file(file) + ":" + std::to_string(line) + ": ";
}

const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}
}  // namespace

void set_thread_rank(int rank) { g_thread_rank = rank; }
int thread_rank() { return g_thread_rank; }
std::string rank_prefix() {
  return g_thread_rank < 0 ? std::string("rank ?: ") : "rank " + std::to_string(g_thread_rank) + ": ";
}

std::string format_size(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

namespace detail {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaErrorMemoryAllocation) throw_oom(err, call, file, line, 0);
  throw DeviceError(where(call, file, line) + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

void throw_oom(cudaError_t err, const char* call, const char* file, int line, std::size_t requested) {
  static_cast<void>(cudaGetLastError());  // clear the sticky-free allocation error before querying
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  int device = -1;
  std::string mem;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && cudaGetDevice(&device) == cudaSuccess) {
    mem = format_size(free_bytes) + " free of " + format_size(total_bytes) + " on device " + std::to_string(device);
  } else {
    mem = "free memory unknown (cudaMemGetInfo failed)";
  }
  const std::string req = requested > 0 ? "requested " + format_size(requested) + ", " : std::string();
  throw DeviceError(where(call, file, line) + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + "); " + req + mem);
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  throw DeviceError(where(call, file, line) + cublasGetStatusString(st) + " (" + cublas_status_name(st) + ")");
}

void throw_nccl(ncclResult_t res, const char* call, const char* file, int line, ncclComm_t comm) {
  std::string msg = where(call, file, line) + ncclGetErrorString(res);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  } else {
    const char* last = ncclGetLastError(nullptr);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  }
  throw DeviceError(msg);
}

}  // namespace detail
}  // namespace threewalls::backend
