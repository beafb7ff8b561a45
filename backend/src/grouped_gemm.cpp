#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <string>

#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/error.hpp"

namespace threewalls::backend {

const char* to_string(GroupedImpl impl) {
  switch (impl) {
    case GroupedImpl::lt_batched: return "lt_batched";
    case GroupedImpl::lt_batched_streams: return "lt_batched_streams";
    case GroupedImpl::cublas_grouped: return "cublas_grouped";
    case GroupedImpl::lt_loop: return "lt_loop";
    case GroupedImpl::lt_streams: return "lt_streams";
  }
  return "?";
}

std::vector<std::int64_t> expert_rows(std::int64_t total, std::int64_t groups, std::int64_t max_rows) {
  if (groups <= 0 || total < 0) {
    throw InputError("grouped GEMM: groups = " + std::to_string(groups) + ", total rows = " + std::to_string(total) +
                     ": need groups > 0 and total rows >= 0");
  }
  const std::int64_t balanced = (total + groups - 1) / groups;
  if (max_rows <= balanced) {  // balanced: spread the remainder over the first experts
    std::vector<std::int64_t> rows(static_cast<std::size_t>(groups), total / groups);
    for (std::int64_t e = 0; e < total % groups; ++e) ++rows[static_cast<std::size_t>(e)];
    return rows;
  }
  if (max_rows > total) {
    throw InputError("grouped GEMM: max rows in a group " + std::to_string(max_rows) + " > total rows " +
                     std::to_string(total));
  }
  std::vector<std::int64_t> rows(static_cast<std::size_t>(groups), 0);
  rows[0] = max_rows;
  if (groups > 1) {
    const std::int64_t rest = total - max_rows;
    for (std::int64_t e = 1; e < groups; ++e) {
      rows[static_cast<std::size_t>(e)] = rest / (groups - 1) + ((e - 1) < rest % (groups - 1) ? 1 : 0);
    }
  } else {
    rows[0] = total;
  }
  return rows;
}

namespace {
// One expert's GEMM in blas.hpp's row-major terms.
struct Problem {
  GemmShape shape;
  const bf16* a = nullptr;
  const bf16* b = nullptr;
  bf16* c = nullptr;
};
}  // namespace

struct GroupedGemm::Impl {
  CublasLt* lt = nullptr;
  GroupedImpl impl = GroupedImpl::cublas_grouped;
  std::vector<Problem> problems;
  std::vector<Problem> runs;  // lt_batched: strided-batched matmuls over runs of equal-row experts
  double flops = 0.0;
  // cublas_grouped: host arrays (per problem: one group of size 1) and device pointer arrays.
  std::vector<cublasOperation_t> trans_a, trans_b;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;
  DeviceBuffer pointers;  // [A pointers | B pointers | C pointers], cuBLAS's A/B order
  // lt_streams
  std::vector<Stream> side;
  std::vector<CublasLt> side_lt;
  Event fork{false};
  std::vector<Event> joins;
};

GroupedGemm::GroupedGemm(CublasLt& lt, GemmLayout layout, std::vector<std::int64_t> rows, std::int64_t n,
                         std::int64_t k, const bf16* a, const bf16* b, bf16* c, GroupedImpl impl, int side_streams)
    : impl_(std::make_unique<Impl>()) {
  impl_->lt = &lt;
  impl_->impl = impl;
  if (n <= 0 || k <= 0) {
    throw InputError(rank_prefix() + "grouped GEMM: n = " + std::to_string(n) + ", k = " + std::to_string(k) +
                     ": both must be positive");
  }
  std::int64_t offset = 0;  // rows before this expert
  std::int64_t total = 0;
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t r = rows[e];
    if (r < 0) throw InputError(rank_prefix() + "grouped GEMM: expert " + std::to_string(e) + " has negative rows");
    total += r;
    if (r == 0) continue;
    Problem p;
    const auto weight = static_cast<std::ptrdiff_t>(e) * n * k;
    switch (layout) {
      case GemmLayout::forward:  // Y_e = X_e W_e^T
        p.shape = linear_gemm(GemmLayout::forward, r, n, k);
        p.a = a + offset * k;
        p.b = b + weight;
        p.c = c + offset * n;
        break;
      case GemmLayout::dgrad:  // dX_e[r,k] = dY_e[r,n] W_e[n,k]
        p.shape = linear_gemm(GemmLayout::dgrad, r, k, n);
        p.a = a + offset * n;
        p.b = b + weight;
        p.c = c + offset * k;
        break;
      case GemmLayout::wgrad:  // dW_e[n,k] = dY_e^T X_e
        p.shape = linear_gemm(GemmLayout::wgrad, n, k, r);
        p.a = a + offset * n;
        p.b = b + offset * k;
        p.c = c + weight;
        break;
    }
    impl_->problems.push_back(p);
    offset += r;
  }
  impl_->flops = 2.0 * static_cast<double>(total) * static_cast<double>(n) * static_cast<double>(k);

  if (impl == GroupedImpl::lt_batched || impl == GroupedImpl::lt_batched_streams) {
    std::int64_t off = 0;
    for (std::size_t e0 = 0; e0 < rows.size();) {
      const std::int64_t r = rows[e0];
      std::size_t e1 = e0 + 1;
      while (e1 < rows.size() && rows[e1] == r) ++e1;
      const auto len = static_cast<std::int64_t>(e1 - e0);
      const auto first = static_cast<std::ptrdiff_t>(e0);
      if (r > 0) {
        Problem p;
        switch (layout) {
          case GemmLayout::forward:
            p.shape = linear_gemm(GemmLayout::forward, r, n, k);
            p.shape.stride_a = r * k;
            p.shape.stride_b = n * k;
            p.shape.stride_c = r * n;
            p.a = a + off * k;
            p.b = b + first * n * k;
            p.c = c + off * n;
            break;
          case GemmLayout::dgrad:
            p.shape = linear_gemm(GemmLayout::dgrad, r, k, n);
            p.shape.stride_a = r * n;
            p.shape.stride_b = n * k;
            p.shape.stride_c = r * k;
            p.a = a + off * n;
            p.b = b + first * n * k;
            p.c = c + off * k;
            break;
          case GemmLayout::wgrad:
            p.shape = linear_gemm(GemmLayout::wgrad, n, k, r);
            p.shape.stride_a = r * n;
            p.shape.stride_b = r * k;
            p.shape.stride_c = n * k;
            p.a = a + off * n;
            p.b = b + off * k;
            p.c = c + first * n * k;
            break;
        }
        p.shape.batch = len;
        impl_->runs.push_back(p);
      }
      off += r * len;
      e0 = e1;
    }
  }

  if (impl == GroupedImpl::cublas_grouped && !impl_->problems.empty()) {
    const std::size_t g = impl_->problems.size();
    std::vector<const void*> ptrs(3 * g);
    for (std::size_t i = 0; i < g; ++i) {
      const Problem& p = impl_->problems[i];
      const GemmShape& s = p.shape;
      ptrs[i] = p.b;
      ptrs[g + i] = p.a;
      ptrs[2 * g + i] = p.c;
      // Problems of equal shape next to each other share one group (group_size > 1).
      if (i > 0 && impl_->problems[i - 1].shape.m == s.m && impl_->problems[i - 1].shape.n == s.n &&
          impl_->problems[i - 1].shape.k == s.k) {
        ++impl_->group_size.back();
        continue;
      }
      // Column-major view (see CublasLt::gemm): cuBLAS A = our B, cuBLAS B = our A, C^T[n,m].
      impl_->trans_a.push_back(s.tb == Trans::n ? CUBLAS_OP_N : CUBLAS_OP_T);
      impl_->trans_b.push_back(s.ta == Trans::n ? CUBLAS_OP_N : CUBLAS_OP_T);
      impl_->m.push_back(static_cast<int>(s.n));
      impl_->n.push_back(static_cast<int>(s.m));
      impl_->k.push_back(static_cast<int>(s.k));
      impl_->lda.push_back(static_cast<int>(s.tb == Trans::n ? s.n : s.k));
      impl_->ldb.push_back(static_cast<int>(s.ta == Trans::n ? s.k : s.m));
      impl_->ldc.push_back(static_cast<int>(s.n));
      impl_->group_size.push_back(1);
      impl_->alpha.push_back(1.0F);
      impl_->beta.push_back(0.0F);
    }
    impl_->pointers = DeviceBuffer(ptrs.size() * sizeof(void*));
    TW_CUDA_CHECK(cudaMemcpy(impl_->pointers.data(), ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  if (impl == GroupedImpl::lt_streams || impl == GroupedImpl::lt_batched_streams) {
    const int s = std::max(1, side_streams);
    for (int i = 0; i < s; ++i) {
      impl_->side.emplace_back();
      impl_->side_lt.emplace_back(std::size_t{8} << 20);
      impl_->joins.emplace_back(false);
    }
  }
}

GroupedGemm::~GroupedGemm() = default;
GroupedGemm::GroupedGemm(GroupedGemm&&) noexcept = default;
GroupedGemm& GroupedGemm::operator=(GroupedGemm&&) noexcept = default;
double GroupedGemm::flops() const { return impl_->flops; }
GroupedImpl GroupedGemm::impl() const { return impl_->impl; }

bool GroupedGemm::prepare() {
  Impl& d = *impl_;
  bool built = false;
  switch (d.impl) {
    case GroupedImpl::cublas_grouped: break;
    case GroupedImpl::lt_batched:
      for (const Problem& p : d.runs) built = d.lt->prepare(p.shape) || built;
      break;
    case GroupedImpl::lt_loop:
      for (const Problem& p : d.problems) built = d.lt->prepare(p.shape) || built;
      break;
    case GroupedImpl::lt_streams:
    case GroupedImpl::lt_batched_streams: {
      const std::vector<Problem>& work = d.impl == GroupedImpl::lt_streams ? d.problems : d.runs;
      for (std::size_t i = 0; i < work.size(); ++i) built = d.side_lt[i % d.side.size()].prepare(work[i].shape) || built;
      break;
    }
  }
  return built;
}

void GroupedGemm::run(cudaStream_t stream) {
  Impl& d = *impl_;
  if (d.problems.empty()) return;  // no rows at all: nothing to compute (flops() == 0)
  switch (d.impl) {
    case GroupedImpl::cublas_grouped: {
      const std::size_t g = d.problems.size();
      auto* const* ptrs = static_cast<void* const*>(d.pointers.data());
      TW_CUBLAS_CHECK(cublasSetStream(d.lt->blas(), stream));
      TW_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
          d.lt->blas(), d.trans_a.data(), d.trans_b.data(), d.m.data(), d.n.data(), d.k.data(), d.alpha.data(),
          const_cast<const void* const*>(ptrs), CUDA_R_16BF, d.lda.data(), const_cast<const void* const*>(ptrs + g),
          CUDA_R_16BF, d.ldb.data(), d.beta.data(), ptrs + 2 * g, CUDA_R_16BF, d.ldc.data(),
          static_cast<int>(d.group_size.size()), d.group_size.data(), CUBLAS_COMPUTE_32F));
      break;
    }
    case GroupedImpl::lt_batched:
      for (const Problem& p : d.runs) d.lt->gemm(p.shape, p.a, p.b, p.c, stream);
      break;
    case GroupedImpl::lt_loop:
      for (const Problem& p : d.problems) d.lt->gemm(p.shape, p.a, p.b, p.c, stream);
      break;
    case GroupedImpl::lt_streams:
    case GroupedImpl::lt_batched_streams: {
      const std::vector<Problem>& work = d.impl == GroupedImpl::lt_streams ? d.problems : d.runs;
      d.fork.record(stream);
      for (const Stream& s : d.side) TW_CUDA_CHECK(cudaStreamWaitEvent(s.get(), d.fork.get(), 0));
      for (std::size_t i = 0; i < work.size(); ++i) {
        const std::size_t j = i % d.side.size();
        const Problem& p = work[i];
        d.side_lt[j].gemm(p.shape, p.a, p.b, p.c, d.side[j].get());
      }
      for (std::size_t j = 0; j < d.side.size(); ++j) {
        d.joins[j].record(d.side[j].get());
        TW_CUDA_CHECK(cudaStreamWaitEvent(stream, d.joins[j].get(), 0));
      }
      break;
    }
  }
}

}  // namespace threewalls::backend
