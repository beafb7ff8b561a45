// Dense and grouped GEMMs against a double-precision CPU reference.
// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include <gtest/gtest.h>

#include <numeric>

#include "gpu_test_util.hpp"
#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

constexpr double kBf16Tol = 1e-2;

void check_gemm(CublasLt& lt, const GemmShape& g, std::uint32_t seed) {
  const std::size_t na = static_cast<std::size_t>(g.m * g.k);
  const std::size_t nb = static_cast<std::size_t>(g.k * g.n);
  const auto a = round_bf16(random_floats(na, seed));
  const auto b = round_bf16(random_floats(nb, seed + 1));
  DeviceBuffer da = upload_bf16(a);
  DeviceBuffer db = upload_bf16(b);
  DeviceBuffer dc(static_cast<std::size_t>(g.m * g.n) * sizeof(bf16));
  poison(dc);
  lt.gemm(g, da.data(), db.data(), dc.data(), nullptr);
  const auto got = download_bf16(dc, static_cast<std::size_t>(g.m * g.n));
  const auto ref = cpu_gemm(g.ta, g.tb, g.m, g.n, g.k, a, b);
  EXPECT_LT(rel_error(got, ref), kBf16Tol) << "m=" << g.m << " n=" << g.n << " k=" << g.k;
}

TEST(Gemm, Bf16MatchesCpuReferenceInForwardDgradAndWgradLayouts) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  std::uint32_t seed = 10;
  for (const GemmLayout layout : {GemmLayout::forward, GemmLayout::dgrad, GemmLayout::wgrad}) {
    check_gemm(lt, linear_gemm(layout, 96, 80, 64), seed++);
    check_gemm(lt, linear_gemm(layout, 40, 24, 136), seed++);  // not multiples of 64
  }
  // The fourth transpose combination, for completeness.
  GemmShape g = linear_gemm(GemmLayout::forward, 48, 32, 72);
  g.ta = Trans::t;
  g.tb = Trans::t;
  check_gemm(lt, g, seed++);
  EXPECT_GE(lt.cached_plans(), 7U);
}

TEST(Gemm, RepeatedShapeReusesItsPlan) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  check_gemm(lt, linear_gemm(GemmLayout::forward, 64, 64, 64), 1);
  check_gemm(lt, linear_gemm(GemmLayout::forward, 64, 64, 64), 2);
  EXPECT_EQ(lt.cached_plans(), 1U);
}

TEST(Gemm, StridedBatchMatchesPerMatrixReference) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  GemmShape g = linear_gemm(GemmLayout::forward, 32, 48, 64);
  g.batch = 3;
  const std::size_t na = 32 * 64, nb = 48 * 64, nc = 32 * 48;
  const auto a = round_bf16(random_floats(na * 3, 5));
  const auto b = round_bf16(random_floats(nb * 3, 6));
  DeviceBuffer da = upload_bf16(a), db = upload_bf16(b), dc(nc * 3 * sizeof(bf16));
  poison(dc);
  lt.gemm(g, da.data(), db.data(), dc.data(), nullptr);
  const auto got = download_bf16(dc, nc * 3);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> ai(a.begin() + static_cast<std::ptrdiff_t>(i * na), a.begin() + static_cast<std::ptrdiff_t>((i + 1) * na));
    const std::vector<float> bi(b.begin() + static_cast<std::ptrdiff_t>(i * nb), b.begin() + static_cast<std::ptrdiff_t>((i + 1) * nb));
    const std::vector<float> ci(got.begin() + static_cast<std::ptrdiff_t>(i * nc), got.begin() + static_cast<std::ptrdiff_t>((i + 1) * nc));
    EXPECT_LT(rel_error(ci, cpu_gemm(g.ta, g.tb, 32, 48, 64, ai, bi)), kBf16Tol) << "batch member " << i;
  }
}

TEST(Gemm, Fp8ForwardMatchesReferenceOnFp8Inputs) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  const std::int64_t m = 64, n = 48, k = 96;
  auto a = random_floats(static_cast<std::size_t>(m * k), 21);
  auto b = random_floats(static_cast<std::size_t>(n * k), 22);
  std::vector<fp8> ha(a.size()), hb(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) { ha[i] = fp8(a[i]); a[i] = static_cast<float>(ha[i]); }
  for (std::size_t i = 0; i < b.size(); ++i) { hb[i] = fp8(b[i]); b[i] = static_cast<float>(hb[i]); }
  DeviceBuffer da(ha.size()), db(hb.size()), dc(static_cast<std::size_t>(m * n) * sizeof(bf16));
  TW_CUDA_CHECK(cudaMemcpy(da.data(), ha.data(), ha.size(), cudaMemcpyHostToDevice));
  TW_CUDA_CHECK(cudaMemcpy(db.data(), hb.data(), hb.size(), cudaMemcpyHostToDevice));
  poison(dc);
  const GemmShape g = linear_gemm(GemmLayout::forward, m, n, k, GemmType::e4m3);
  lt.gemm(g, da.data(), db.data(), dc.data(), nullptr);
  const auto got = download_bf16(dc, static_cast<std::size_t>(m * n));
  EXPECT_LT(rel_error(got, cpu_gemm(Trans::n, Trans::t, m, n, k, a, b)), kBf16Tol);
}

TEST(Gemm, Fp8RejectsShapesHopperCannotRun) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  GemmShape g = linear_gemm(GemmLayout::forward, 30, 48, 96, GemmType::e4m3);
  EXPECT_THROW(lt.gemm(g, nullptr, nullptr, nullptr, nullptr), InputError);
}

TEST(ExpertRows, BalancedSplitSpreadsTheRemainder) {
  const auto r = expert_rows(10, 4, 3);
  EXPECT_EQ(r, (std::vector<std::int64_t>{3, 3, 2, 2}));
}

TEST(ExpertRows, HotExpertGetsMaxRowsAndOthersShareTheRest) {
  const auto r = expert_rows(100, 5, 40);
  EXPECT_EQ(r, (std::vector<std::int64_t>{40, 15, 15, 15, 15}));
  EXPECT_EQ(std::accumulate(r.begin(), r.end(), std::int64_t{0}), 100);
}

TEST(ExpertRows, MaxRowsAboveTotalIsAnInputError) {
  EXPECT_THROW(static_cast<void>(expert_rows(10, 4, 11)), InputError);
  EXPECT_THROW(static_cast<void>(expert_rows(10, 0, 3)), InputError);
}

// CPU reference of one grouped GEMM (layouts as in blas.hpp).
std::vector<double> grouped_reference(GemmLayout layout, const std::vector<std::int64_t>& rows, std::int64_t n,
                                      std::int64_t k, const std::vector<float>& a, const std::vector<float>& b) {
  const std::int64_t total = std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
  const auto e_count = static_cast<std::int64_t>(rows.size());
  std::vector<double> c;
  switch (layout) {
    case GemmLayout::forward: c.assign(static_cast<std::size_t>(total * n), 0.0); break;
    case GemmLayout::dgrad: c.assign(static_cast<std::size_t>(total * k), 0.0); break;
    case GemmLayout::wgrad: c.assign(static_cast<std::size_t>(e_count * n * k), 0.0); break;
  }
  std::int64_t off = 0;
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::int64_t r = rows[static_cast<std::size_t>(e)];
    for (std::int64_t i = 0; i < r; ++i) {
      const std::int64_t t = off + i;
      if (layout == GemmLayout::forward) {  // Y[t, j] = sum_p X[t, p] W_e[j, p]
        for (std::int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (std::int64_t p = 0; p < k; ++p) acc += double(a[static_cast<std::size_t>(t * k + p)]) * b[static_cast<std::size_t>(e * n * k + j * k + p)];
          c[static_cast<std::size_t>(t * n + j)] = acc;
        }
      } else if (layout == GemmLayout::dgrad) {  // dX[t, p] = sum_j dY[t, j] W_e[j, p]
        for (std::int64_t p = 0; p < k; ++p) {
          double acc = 0;
          for (std::int64_t j = 0; j < n; ++j) acc += double(a[static_cast<std::size_t>(t * n + j)]) * b[static_cast<std::size_t>(e * n * k + j * k + p)];
          c[static_cast<std::size_t>(t * k + p)] = acc;
        }
      } else {  // dW_e[j, p] += dY[t, j] X[t, p]
        for (std::int64_t j = 0; j < n; ++j) {
          for (std::int64_t p = 0; p < k; ++p) {
            c[static_cast<std::size_t>(e * n * k + j * k + p)] += double(a[static_cast<std::size_t>(t * n + j)]) * b[static_cast<std::size_t>(t * k + p)];
          }
        }
      }
    }
    off += r;
  }
  return c;
}

TEST(GroupedGemm, ImbalancedCountsMatchReferenceForEveryImplementationAndLayout) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  // An empty expert, tiny ones, and runs of equal rows (batched together by lt_batched).
  const std::vector<std::int64_t> rows{37, 0, 5, 64, 1, 19, 16, 16, 16, 40, 40, 0, 0, 7};
  const std::int64_t n = 40, k = 24, e = static_cast<std::int64_t>(rows.size());
  const std::int64_t total = std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
  std::uint32_t seed = 100;
  for (const GroupedImpl impl :
       {GroupedImpl::lt_batched, GroupedImpl::lt_batched_streams, GroupedImpl::cublas_grouped, GroupedImpl::lt_loop,
        GroupedImpl::lt_streams}) {
    for (const GemmLayout layout : {GemmLayout::forward, GemmLayout::dgrad, GemmLayout::wgrad}) {
      std::size_t na = 0, nb = 0, nc = 0;
      switch (layout) {
        case GemmLayout::forward: na = total * k; nb = e * n * k; nc = total * n; break;
        case GemmLayout::dgrad: na = total * n; nb = e * n * k; nc = total * k; break;
        case GemmLayout::wgrad: na = total * n; nb = total * k; nc = e * n * k; break;
      }
      const auto a = round_bf16(random_floats(na, seed++));
      const auto b = round_bf16(random_floats(nb, seed++));
      DeviceBuffer da = upload_bf16(a), db = upload_bf16(b), dc(nc * sizeof(bf16));
      TW_CUDA_CHECK(cudaMemset(dc.data(), 0, dc.size()));  // the empty expert's dW is not written
      GroupedGemm gg(lt, layout, rows, n, k, da.as<bf16>(), db.as<bf16>(), dc.as<bf16>(), impl, 3);
      EXPECT_DOUBLE_EQ(gg.flops(), 2.0 * total * n * k);
      Stream s;
      gg.run(s);
      s.synchronize();
      const auto got = download_bf16(dc, nc);
      EXPECT_LT(rel_error(got, grouped_reference(layout, rows, n, k, a, b)), kBf16Tol)
          << to_string(impl) << " layout " << static_cast<int>(layout);
    }
  }
}

TEST(GroupedGemm, CapturesIntoACudaGraph) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  const std::vector<std::int64_t> rows{16, 48, 48, 8};
  const std::int64_t n = 32, k = 64, total = 120;
  const auto a = round_bf16(random_floats(total * k, 7));
  const auto b = round_bf16(random_floats(4 * n * k, 8));
  for (const GroupedImpl impl :
       {GroupedImpl::lt_batched, GroupedImpl::lt_batched_streams, GroupedImpl::cublas_grouped, GroupedImpl::lt_loop,
        GroupedImpl::lt_streams}) {
    DeviceBuffer da = upload_bf16(a), db = upload_bf16(b), dc(total * n * sizeof(bf16));
    poison(dc);
    GroupedGemm gg(lt, GemmLayout::forward, rows, n, k, da.as<bf16>(), db.as<bf16>(), dc.as<bf16>(), impl, 2);
    Stream s;
    gg.run(s);  // warm-up outside capture: plans and heuristics are built here
    s.synchronize();
    poison(dc);
    CudaGraph::begin_capture(s);
    gg.run(s);
    CudaGraph g = CudaGraph::end_capture(s);
    GraphExec exec(g);
    exec.launch(s);
    s.synchronize();
    EXPECT_LT(rel_error(download_bf16(dc, total * n), grouped_reference(GemmLayout::forward, rows, n, k, a, b)), kBf16Tol)
        << to_string(impl);
  }
}

}  // namespace
}  // namespace threewalls::backend
