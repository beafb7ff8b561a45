#pragma once
// Dense and grouped GEMMs through cuBLASLt / cuBLAS.
//
// Conventions (row-major everywhere, as PyTorch and Megatron store tensors):
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C
//   op(X) = X (Trans::n) or X^T (Trans::t); A is stored [m,k] (n) or [k,m] (t); B is stored [k,n]
//   (n) or [n,k] (t). Leading dimensions default to the packed row length.
// A transformer linear layer with weight W[out=n, in=k] (PyTorch layout) and input X[m, k]:
//   forward  Y[m,n]  = X W^T      -> gemm(Trans::n, Trans::t)  (GemmLayout::forward)
//   dgrad    dX[m,k] = dY W       -> gemm(Trans::n, Trans::n)  (GemmLayout::dgrad)
//   wgrad    dW[n,k] = dY^T X     -> gemm(Trans::t, Trans::n)  (GemmLayout::wgrad)
// bf16 inputs and outputs with fp32 accumulation (CUBLAS_COMPUTE_32F). fp8 (e4m3) inputs with bf16
// output are supported in the layout Hopper's fp8 kernels require (forward, "TN" in cuBLAS terms);
// Transformer Engine runs fp8 dgrad/wgrad the same way on transposed copies, so callers that only
// need the cost of an fp8 dgrad/wgrad run a forward-layout GEMM of the same m, n, k.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "threewalls/backend/handles.hpp"

struct cublasLtContext;
struct cublasContext;

namespace threewalls::backend {

using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

enum class Trans : std::uint8_t { n, t };
enum class GemmLayout : std::uint8_t { forward, dgrad, wgrad };
enum class GemmType : std::uint8_t { bfloat16, e4m3 };  // input type; output is always bf16 here

struct GemmShape {
  Trans ta = Trans::n;
  Trans tb = Trans::n;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;                          // strided batch
  std::int64_t lda = 0, ldb = 0, ldc = 0;          // 0 = packed (row length of the stored matrix)
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch members; 0 = packed
  GemmType type = GemmType::bfloat16;
  float alpha = 1.0F;
  float beta = 0.0F;
};

// The transposes of a transformer linear layer's GEMM (see the header comment).
[[nodiscard]] GemmShape linear_gemm(GemmLayout layout, std::int64_t m, std::int64_t n, std::int64_t k,
                                    GemmType type = GemmType::bfloat16);

// cuBLASLt handle, a cuBLAS handle (for the grouped GEMM API), a workspace and a cache of matmul
// plans (descriptors and the heuristic's algorithm, keyed by shape), so that a repeated shape costs
// one cublasLtMatmul call. One per rank thread; not thread-safe. Work on different streams
// concurrently needs one CublasLt per stream (the workspace is shared by its calls).
class CublasLt {
 public:
  static constexpr std::size_t kDefaultWorkspace = 32U << 20;  // 32 MiB: NVIDIA's advice for Hopper
  explicit CublasLt(std::size_t workspace_bytes = kDefaultWorkspace);
  ~CublasLt();
  CublasLt(CublasLt&&) noexcept;
  CublasLt& operator=(CublasLt&&) noexcept;
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // C = alpha op(A) op(B) + beta C on `stream`. bf16: A, B, C bf16. fp8: A, B e4m3, C bf16; only
  // shape.ta == n, shape.tb == t (forward layout), m, n, k multiples of 16. Throws DeviceError
  // when cuBLASLt has no algorithm for the shape.
  void gemm(const GemmShape& shape, const void* a, const void* b, void* c, cudaStream_t stream);
  // Plans `shape` on this handle without running it (the cuBLASLt heuristic query, 0.2-0.3 ms for a
  // new shape on H100): true when the plan is new. `gemm` plans a shape it has not seen itself.
  bool prepare(const GemmShape& shape);

  [[nodiscard]] cublasLtContext* lt() const;
  [[nodiscard]] cublasContext* blas() const;  // cublasHandle_t
  [[nodiscard]] void* workspace() const;
  [[nodiscard]] std::size_t workspace_size() const;
  [[nodiscard]] std::size_t cached_plans() const;

 private:
  struct Impl;
  struct Plan;
  const Plan& plan_of(const GemmShape& shape, bool* built);
  std::unique_ptr<Impl> impl_;
};

// ---- grouped expert GEMM ----
// One GEMM per local expert e with rows[e] token rows (imbalanced allowed, zero allowed), sharing
// n and k. Tokens are expert-contiguous (after permute): expert e's rows start at sum(rows[<e]).
//   forward: Y_e[rows_e, n] = X_e[rows_e, k] W_e^T, W_e [n, k]   A = X [T,k], B = W [E,n,k], C = Y [T,n]
//   dgrad:   dX_e[rows_e, k] = dY_e[rows_e, n] W_e,  W_e [n, k]  A = dY [T,n], B = W [E,n,k], C = dX [T,k]
//   wgrad:   dW_e[n, k] = dY_e^T[n, rows_e] X_e[rows_e, k]       A = dY [T,n], B = X [T,k], C = dW [E,n,k]
// FLOPs = 2 * T * n * k for each layout (T = sum of rows).
enum class GroupedImpl : std::uint8_t {
  lt_batched,      // consecutive experts with equal rows form one strided-batched cuBLASLt matmul
                   // (balanced: a single call; OpRunner's hot-expert splits: three calls). Default:
                   // measured 99.8% of dense on H100 for 64 x 768 (docs/backend.md)
  lt_batched_streams,  // lt_batched with its matmuls spread over side streams (runs overlap)
  cublas_grouped,  // cublasGemmGroupedBatchedEx, experts of equal shape merged into one group
  lt_loop,         // one cuBLASLt matmul per expert on the stream (the "sequential experts" way)
  lt_streams,      // one cuBLASLt matmul per expert spread over side streams, forked/joined by events
};
[[nodiscard]] const char* to_string(GroupedImpl impl);

class GroupedGemm {
 public:
  // Prepares device pointer arrays for the given rows per expert and buffers (host work and one
  // synchronous upload: call it before timing). `run` then only launches, and can be captured in a
  // CUDA graph. bf16 only. Buffers must outlive the object.
  GroupedGemm(CublasLt& lt, GemmLayout layout, std::vector<std::int64_t> rows, std::int64_t n, std::int64_t k,
              const bf16* a, const bf16* b, bf16* c, GroupedImpl impl = GroupedImpl::lt_batched,
              int side_streams = 4);
  ~GroupedGemm();
  GroupedGemm(GroupedGemm&&) noexcept;
  GroupedGemm& operator=(GroupedGemm&&) noexcept;
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  void run(cudaStream_t stream);
  // Plans every matmul `run` issues on the handles it issues them on: true when one was new
  // (cublas_grouped plans inside cuBLAS: false).
  bool prepare();
  [[nodiscard]] double flops() const;
  [[nodiscard]] GroupedImpl impl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rows per expert for `total` rows over `groups` experts with at most `max_rows` in one: expert 0
// gets max_rows (the hot expert), the others share the rest evenly (the first ones get the
// remainder). Balanced when max_rows <= ceil(total / groups). Throws InputError when impossible.
[[nodiscard]] std::vector<std::int64_t> expert_rows(std::int64_t total, std::int64_t groups, std::int64_t max_rows);

}  // namespace threewalls::backend
