// Routing: softmax/top-k, row map, permute/unpermute forward and backward.
// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu_test_util.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

struct CpuRouting {
  std::vector<std::int32_t> ids;
  std::vector<double> probs;
  std::vector<std::int32_t> counts;
};

CpuRouting cpu_topk(const std::vector<float>& logits, std::int64_t tokens, int experts, int k, bool renorm) {
  CpuRouting r;
  r.counts.assign(static_cast<std::size_t>(experts), 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> p(static_cast<std::size_t>(experts));
    double mx = -1e30, s = 0;
    for (int e = 0; e < experts; ++e) mx = std::max(mx, double(logits[static_cast<std::size_t>(t * experts + e)]));
    for (int e = 0; e < experts; ++e) s += (p[static_cast<std::size_t>(e)] = std::exp(logits[static_cast<std::size_t>(t * experts + e)] - mx));
    std::vector<int> order(static_cast<std::size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)]; });
    double chosen = 0;
    for (int i = 0; i < k; ++i) chosen += p[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] / s;
    for (int i = 0; i < k; ++i) {
      const int e = order[static_cast<std::size_t>(i)];
      r.ids.push_back(e);
      const double pe = p[static_cast<std::size_t>(e)] / s;
      r.probs.push_back(renorm ? pe / chosen : pe);
      ++r.counts[static_cast<std::size_t>(e)];
    }
  }
  return r;
}

// Logits with distinct values per row so the top-k order is unambiguous even in bf16.
std::vector<float> distinct_logits(std::int64_t tokens, int experts, std::uint32_t seed) {
  std::vector<float> l(static_cast<std::size_t>(tokens * experts));
  std::vector<int> perm(static_cast<std::size_t>(experts));
  std::mt19937 gen(seed);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    for (int e = 0; e < experts; ++e) l[static_cast<std::size_t>(t * experts + e)] = -4.0F + 8.0F * static_cast<float>(perm[static_cast<std::size_t>(e)]) / static_cast<float>(experts);
  }
  return round_bf16(l);
}

TEST(SoftmaxTopk, IdsProbabilitiesAndCountsMatchReference) {
  TW_REQUIRE_GPU();
  for (const auto& [experts, k] : std::vector<std::pair<int, int>>{{8, 2}, {64, 6}, {160, 8}, {1024, 4}}) {
    const std::int64_t tokens = 77;
    const auto logits = distinct_logits(tokens, experts, static_cast<std::uint32_t>(experts));
    DeviceBuffer dl = upload_bf16(logits), ids(tokens * k * 4), probs(tokens * k * 4), counts(static_cast<std::size_t>(experts) * 4);
    poison(ids);
    poison(probs);
    poison(counts);
    for (const bool renorm : {true, false}) {
      softmax_topk(dl.as<bf16>(), ids.as<std::int32_t>(), probs.as<float>(), counts.as<std::int32_t>(), tokens, experts, k,
                   renorm, nullptr);
      const CpuRouting ref = cpu_topk(logits, tokens, experts, k, renorm);
      EXPECT_EQ(download_i32(ids, tokens * k), ref.ids) << experts << "/" << k;
      EXPECT_EQ(download_i32(counts, experts), ref.counts) << experts << "/" << k;
      EXPECT_LT(rel_error(download_f32(probs, tokens * k), ref.probs), 1e-5) << experts << "/" << k;
    }
  }
}

TEST(SoftmaxTopk, UnsupportedExpertCountIsAnInputError) {
  TW_REQUIRE_GPU();
  EXPECT_THROW(softmax_topk(nullptr, nullptr, nullptr, nullptr, 1, 2048, 2, true, nullptr), InputError);
  EXPECT_THROW(softmax_topk(nullptr, nullptr, nullptr, nullptr, 1, 8, 9, true, nullptr), InputError);
}

TEST(SoftmaxTopk, BackwardMatchesReference) {
  TW_REQUIRE_GPU();
  const std::int64_t tokens = 21;
  const int experts = 40, k = 3;
  const auto logits = distinct_logits(tokens, experts, 5);
  const CpuRouting rt = cpu_topk(logits, tokens, experts, k, false);
  const auto dprobs = random_floats(tokens * k, 6);
  DeviceBuffer dl = upload_bf16(logits), ids = upload_i32(rt.ids), dp = upload_f32(dprobs), out(tokens * experts * 2);
  poison(out);
  softmax_topk_bwd(dl.as<bf16>(), ids.as<std::int32_t>(), dp.as<float>(), out.as<bf16>(), tokens, experts, k, nullptr);
  std::vector<double> ref(static_cast<std::size_t>(tokens * experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> p(static_cast<std::size_t>(experts)), g(static_cast<std::size_t>(experts), 0.0);
    double mx = -1e30, s = 0, dot = 0;
    for (int e = 0; e < experts; ++e) mx = std::max(mx, double(logits[static_cast<std::size_t>(t * experts + e)]));
    for (int e = 0; e < experts; ++e) s += (p[static_cast<std::size_t>(e)] = std::exp(logits[static_cast<std::size_t>(t * experts + e)] - mx));
    for (auto& x : p) x /= s;
    for (int i = 0; i < k; ++i) {
      const auto e = static_cast<std::size_t>(rt.ids[static_cast<std::size_t>(t * k + i)]);
      g[e] += dprobs[static_cast<std::size_t>(t * k + i)];
      dot += p[e] * dprobs[static_cast<std::size_t>(t * k + i)];
    }
    for (int e = 0; e < experts; ++e) ref[static_cast<std::size_t>(t * experts + e)] = p[static_cast<std::size_t>(e)] * (g[static_cast<std::size_t>(e)] - dot);
  }
  EXPECT_LT(rel_error(download_bf16(out, tokens * experts), ref), 1e-2);
}

// A routing on the device: ids/probs/counts and the row map.
struct DeviceRouting {
  DeviceBuffer ids, probs, counts, offsets, cursor, row_map;
};
DeviceRouting make_routing(std::int64_t tokens, int experts, int k, std::uint32_t seed) {
  DeviceRouting r;
  const auto logits = distinct_logits(tokens, experts, seed);
  DeviceBuffer dl = upload_bf16(logits);
  r.ids = DeviceBuffer(tokens * k * 4);
  r.probs = DeviceBuffer(tokens * k * 4);
  r.counts = DeviceBuffer(static_cast<std::size_t>(experts) * 4);
  r.offsets = DeviceBuffer(static_cast<std::size_t>(experts + 1) * 4);
  r.cursor = DeviceBuffer(static_cast<std::size_t>(experts) * 4);
  r.row_map = DeviceBuffer(tokens * k * 4);
  softmax_topk(dl.as<bf16>(), r.ids.as<std::int32_t>(), r.probs.as<float>(), r.counts.as<std::int32_t>(), tokens, experts,
               k, true, nullptr);
  build_row_map(r.ids.as<std::int32_t>(), r.counts.as<std::int32_t>(), r.offsets.as<std::int32_t>(),
                r.cursor.as<std::int32_t>(), r.row_map.as<std::int32_t>(), tokens, experts, k, nullptr);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  return r;
}

TEST(RowMap, EveryRowLandsInsideItsExpertSegmentExactlyOnce) {
  TW_REQUIRE_GPU();
  const std::int64_t tokens = 300;
  const int experts = 16, k = 4;
  DeviceRouting r = make_routing(tokens, experts, k, 9);
  const auto ids = download_i32(r.ids, tokens * k);
  const auto offsets = download_i32(r.offsets, experts + 1);
  const auto map = download_i32(r.row_map, tokens * k);
  EXPECT_EQ(offsets.front(), 0);
  EXPECT_EQ(offsets.back(), tokens * k);
  std::vector<int> seen(static_cast<std::size_t>(tokens * k), 0);
  for (std::size_t i = 0; i < map.size(); ++i) {
    const auto e = static_cast<std::size_t>(ids[i]);
    ASSERT_GE(map[i], offsets[e]) << i;
    ASSERT_LT(map[i], offsets[e + 1]) << i;
    ++seen[static_cast<std::size_t>(map[i])];
  }
  for (const int s : seen) EXPECT_EQ(s, 1);
}

TEST(Permute, ForwardThenUnpermuteWithUnitWeightsRoundTrips) {
  TW_REQUIRE_GPU();
  const std::int64_t tokens = 123, hidden = 72;  // hidden % 8 == 0: vector path
  const int experts = 8, k = 2;
  DeviceRouting r = make_routing(tokens, experts, k, 11);
  const auto x = round_bf16(random_floats(tokens * hidden, 12));
  DeviceBuffer dx = upload_bf16(x), perm(tokens * k * hidden * 2), back(tokens * hidden * 2);
  poison(perm);
  poison(back);
  permute_fwd(dx.as<bf16>(), r.row_map.as<std::int32_t>(), perm.as<bf16>(), tokens, k, hidden, nullptr);
  // permute_bwd sums the k copies: 2x, exactly representable.
  permute_bwd(perm.as<bf16>(), r.row_map.as<std::int32_t>(), back.as<bf16>(), tokens, k, hidden, nullptr);
  std::vector<double> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = 2.0 * x[i];
  EXPECT_EQ(rel_error(download_bf16(back, x.size()), ref), 0.0);
  // Each permuted row is the token row it came from.
  const auto p = download_bf16(perm, tokens * k * hidden);
  const auto map = download_i32(r.row_map, tokens * k);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < k; ++i) {
      const auto row = static_cast<std::size_t>(map[static_cast<std::size_t>(t * k + i)]);
      for (std::int64_t j = 0; j < hidden; ++j) ASSERT_EQ(p[row * hidden + static_cast<std::size_t>(j)], x[static_cast<std::size_t>(t * hidden + j)]);
    }
  }
}

TEST(Unpermute, ForwardAndBackwardMatchReferenceWithOddHidden) {
  TW_REQUIRE_GPU();
  const std::int64_t tokens = 50, hidden = 33;  // scalar path
  const int experts = 6, k = 3;
  DeviceRouting r = make_routing(tokens, experts, k, 13);
  const auto eo = round_bf16(random_floats(tokens * k * hidden, 14));
  const auto dy = round_bf16(random_floats(tokens * hidden, 15));
  DeviceBuffer deo = upload_bf16(eo), ddy = upload_bf16(dy), y(tokens * hidden * 2), deo_grad(tokens * k * hidden * 2), dprobs(tokens * k * 4);
  poison(y);
  poison(deo_grad);
  poison(dprobs);
  unpermute_fwd(deo.as<bf16>(), r.row_map.as<std::int32_t>(), r.probs.as<float>(), y.as<bf16>(), tokens, k, hidden, nullptr);
  unpermute_bwd(ddy.as<bf16>(), deo.as<bf16>(), r.row_map.as<std::int32_t>(), r.probs.as<float>(), deo_grad.as<bf16>(),
                dprobs.as<float>(), tokens, k, hidden, nullptr);
  const auto map = download_i32(r.row_map, tokens * k);
  const auto probs = download_f32(r.probs, tokens * k);
  std::vector<double> ry(static_cast<std::size_t>(tokens * hidden), 0.0), rg(eo.size(), 0.0), rp(static_cast<std::size_t>(tokens * k), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < k; ++i) {
      const auto ti = static_cast<std::size_t>(t * k + i);
      const auto row = static_cast<std::size_t>(map[ti]);
      for (std::int64_t j = 0; j < hidden; ++j) {
        const auto tj = static_cast<std::size_t>(t * hidden + j);
        ry[tj] += probs[ti] * double(eo[row * hidden + static_cast<std::size_t>(j)]);
        rg[row * hidden + static_cast<std::size_t>(j)] = probs[ti] * double(dy[tj]);
        rp[ti] += double(dy[tj]) * eo[row * hidden + static_cast<std::size_t>(j)];
      }
    }
  }
  EXPECT_LT(rel_error(download_bf16(y, ry.size()), ry), 1e-2);
  EXPECT_LT(rel_error(download_bf16(deo_grad, rg.size()), rg), 1e-2);
  EXPECT_LT(rel_error(download_f32(dprobs, rp.size()), rp), 1e-5);
}

}  // namespace
}  // namespace threewalls::backend
