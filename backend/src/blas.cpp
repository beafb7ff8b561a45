#include "threewalls/backend/blas.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstring>
#include <string>
#include <unordered_map>

#include "threewalls/backend/error.hpp"

namespace threewalls::backend {

GemmShape linear_gemm(GemmLayout layout, std::int64_t m, std::int64_t n, std::int64_t k, GemmType type) {
  GemmShape s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.type = type;
  switch (layout) {
    case GemmLayout::forward: s.ta = Trans::n; s.tb = Trans::t; break;
    case GemmLayout::dgrad: s.ta = Trans::n; s.tb = Trans::n; break;
    case GemmLayout::wgrad: s.ta = Trans::t; s.tb = Trans::n; break;
  }
  if (type == GemmType::e4m3) {  // Hopper fp8 runs only in the forward ("TN") layout; see blas.hpp
    s.ta = Trans::n;
    s.tb = Trans::t;
  }
  return s;
}

namespace {

struct PlanKey {
  std::int64_t v[14];
  bool operator==(const PlanKey& o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};
struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const {
    std::size_t h = 1469598103934665603ULL;
    for (const std::int64_t x : k.v) h = (h ^ static_cast<std::size_t>(x)) * 1099511628211ULL;
    return h;
  }
};


std::int64_t packed_ld(Trans t, std::int64_t rows_if_n, std::int64_t cols_if_n) {
  // Row-major storage: a non-transposed [r, c] matrix has row length c; transposed, the stored
  // matrix is [c, r] with row length r.
  return t == Trans::n ? cols_if_n : rows_if_n;
}

std::string shape_text(const GemmShape& s) {
  return "gemm m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
         " batch=" + std::to_string(s.batch) + " ta=" + (s.ta == Trans::n ? "n" : "t") +
         " tb=" + (s.tb == Trans::n ? "n" : "t") + (s.type == GemmType::e4m3 ? " fp8" : " bf16");
}

}  // namespace

// A cuBLASLt matmul plan (descriptors and the heuristic's algorithm) of one shape on one handle.
struct CublasLt::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  Plan(Plan&& o) noexcept : op(o.op), a(o.a), b(o.b), c(o.c), algo(o.algo) { o.op = nullptr; o.a = o.b = o.c = nullptr; }
  Plan& operator=(Plan&&) = delete;
  ~Plan() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

struct CublasLt::Impl {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  DeviceBuffer workspace;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;
  ~Impl() {
    plans.clear();
    if (blas != nullptr) cublasDestroy(blas);
    if (lt != nullptr) cublasLtDestroy(lt);
  }
};

CublasLt::CublasLt(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  TW_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));
  TW_CUBLAS_CHECK(cublasCreate(&impl_->blas));
  impl_->workspace = DeviceBuffer(workspace_bytes);
  TW_CUBLAS_CHECK(cublasSetWorkspace(impl_->blas, impl_->workspace.data(), impl_->workspace.size()));
}
CublasLt::~CublasLt() = default;
CublasLt::CublasLt(CublasLt&&) noexcept = default;
CublasLt& CublasLt::operator=(CublasLt&&) noexcept = default;
cublasLtContext* CublasLt::lt() const { return impl_->lt; }
cublasContext* CublasLt::blas() const { return impl_->blas; }
void* CublasLt::workspace() const { return impl_->workspace.data(); }
std::size_t CublasLt::workspace_size() const { return impl_->workspace.size(); }
std::size_t CublasLt::cached_plans() const { return impl_->plans.size(); }

bool CublasLt::prepare(const GemmShape& shape) {
  bool built = false;
  static_cast<void>(plan_of(shape, &built));
  return built;
}

void CublasLt::gemm(const GemmShape& s, const void* a, const void* b, void* c, cudaStream_t stream) {
  const Plan& p = plan_of(s, nullptr);
  const float alpha = s.alpha;
  const float beta = s.beta;
  TW_CUBLAS_CHECK(cublasLtMatmul(impl_->lt, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &p.algo,
                                 impl_->workspace.data(), impl_->workspace.size(), stream));
}

const CublasLt::Plan& CublasLt::plan_of(const GemmShape& s, bool* built) {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0) {
    throw InputError(rank_prefix() + shape_text(s) + ": every dimension must be positive");
  }
  const bool f8 = s.type == GemmType::e4m3;
  if (f8 && (s.ta != Trans::n || s.tb != Trans::t || s.m % 16 != 0 || s.n % 16 != 0 || s.k % 16 != 0)) {
    throw InputError(rank_prefix() + shape_text(s) +
                     ": fp8 GEMMs need ta=n, tb=t (forward layout) and m, n, k multiples of 16");
  }
  // Row-major C[m,n] = op(A) op(B) is column-major C^T[n,m] = op(B)^T op(A)^T: cuBLAS's "A" is our
  // B and its "B" is our A, with the same transpose flags (see blas.hpp for the storage shapes).
  const std::int64_t lda = s.lda > 0 ? s.lda : packed_ld(s.ta, s.m, s.k);
  const std::int64_t ldb = s.ldb > 0 ? s.ldb : packed_ld(s.tb, s.k, s.n);
  const std::int64_t ldc = s.ldc > 0 ? s.ldc : s.n;
  const std::int64_t stride_a = s.stride_a > 0 ? s.stride_a : s.m * s.k;
  const std::int64_t stride_b = s.stride_b > 0 ? s.stride_b : s.k * s.n;
  const std::int64_t stride_c = s.stride_c > 0 ? s.stride_c : s.m * s.n;
  const bool accumulate = s.beta != 0.0F;
  const PlanKey key{{static_cast<std::int64_t>(s.ta), static_cast<std::int64_t>(s.tb), s.m, s.n, s.k, s.batch, lda, ldb,
                     ldc, stride_a, stride_b, stride_c, static_cast<std::int64_t>(s.type), accumulate ? 1 : 0}};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    Plan p;
    const cudaDataType_t in_type = f8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    TW_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = s.tb == Trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;  // cuBLAS A = our B
    const cublasOperation_t op_b = s.ta == Trans::n ? CUBLAS_OP_N : CUBLAS_OP_T;  // cuBLAS B = our A
    TW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    TW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    // Column-major shapes of the stored matrices.
    const auto rows_a = static_cast<std::uint64_t>(s.tb == Trans::n ? s.n : s.k);
    const auto cols_a = static_cast<std::uint64_t>(s.tb == Trans::n ? s.k : s.n);
    const auto rows_b = static_cast<std::uint64_t>(s.ta == Trans::n ? s.k : s.m);
    const auto cols_b = static_cast<std::uint64_t>(s.ta == Trans::n ? s.m : s.k);
    TW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_type, rows_a, cols_a, ldb));
    TW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_type, rows_b, cols_b, lda));
    TW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, static_cast<std::uint64_t>(s.n),
                                               static_cast<std::uint64_t>(s.m), ldc));
    if (s.batch > 1) {
      const auto count = static_cast<std::int32_t>(s.batch);
      for (auto [layout, stride] : {std::pair{p.a, stride_b}, std::pair{p.b, stride_a}, std::pair{p.c, stride_c}}) {
        TW_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        TW_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof stride));
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    TW_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t ws = impl_->workspace.size();
    TW_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(impl_->lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      throw DeviceError(rank_prefix() + "cublasLtMatmulAlgoGetHeuristic found no algorithm for " + shape_text(s) +
                        " (" + cublasGetStatusString(st) + ")");
    }
    p.algo = result.algo;
    it = impl_->plans.emplace(key, std::move(p)).first;
    if (built != nullptr) *built = true;
  }
  return it->second;
}

}  // namespace threewalls::backend
