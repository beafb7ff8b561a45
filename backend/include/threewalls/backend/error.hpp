#pragma once
// Error checking for CUDA runtime, cuBLAS(Lt) and NCCL calls.
//
// Every failing call becomes a threewalls::backend::DeviceError (a SystemError: exit code 3) whose
// message starts with the rank, then names the call text, file:line and the library's error string:
//   "rank 3: cudaMalloc(&ptr, bytes) failed at backend/src/handles.cpp:41: out of memory
//    (cudaErrorMemoryAllocation); requested 2.00 GiB, 1.25 GiB free of 79.1 GiB on device 0"
// The rank is a per-thread value the executor sets once per rank thread (set_thread_rank); it is -1
// ("rank ?") where nobody set it.
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "threewalls/core/error.hpp"

namespace threewalls::backend {

class DeviceError : public SystemError {
 public:
  using SystemError::SystemError;
};

// The rank this thread works for, used as the prefix of every error message it raises.
void set_thread_rank(int rank);
[[nodiscard]] int thread_rank();
// "rank 3: " (or "rank ?: ").
[[nodiscard]] std::string rank_prefix();

namespace detail {
[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t res, const char* call, const char* file, int line, ncclComm_t comm);
// An allocation of `requested` bytes failed: the message says what was requested and what was free.
[[noreturn]] void throw_oom(cudaError_t err, const char* call, const char* file, int line, std::size_t requested);
}  // namespace detail

// Human-readable byte count for messages ("1.50 GiB").
[[nodiscard]] std::string format_size(std::size_t bytes);

}  // namespace threewalls::backend

// Check macros: evaluate the call once; on failure throw DeviceError naming rank, call, file:line.
#define TW_CUDA_CHECK(call)                                                                 \
  do {                                                                                      \
    const cudaError_t tw_err_ = (call);                                                     \
    if (tw_err_ != cudaSuccess) ::threewalls::backend::detail::throw_cuda(tw_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch configuration error, if any.
// `what` is a string literal naming the kernel.
#define TW_CUDA_CHECK_LAUNCH(what)                                                           \
  do {                                                                                      \
    const cudaError_t tw_err_ = cudaGetLastError();                                         \
    if (tw_err_ != cudaSuccess) ::threewalls::backend::detail::throw_cuda(tw_err_, "launch of " what, __FILE__, __LINE__); \
  } while (0)

#define TW_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                        \
    const cublasStatus_t tw_st_ = (call);                                                     \
    if (tw_st_ != CUBLAS_STATUS_SUCCESS) ::threewalls::backend::detail::throw_cublas(tw_st_, #call, __FILE__, __LINE__); \
  } while (0)

// NCCL calls on blocking communicators, or where ncclInProgress is not expected.
#define TW_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    const ncclResult_t tw_res_ = (call);                                                      \
    if (tw_res_ != ncclSuccess) ::threewalls::backend::detail::throw_nccl(tw_res_, #call, __FILE__, __LINE__, nullptr); \
  } while (0)
