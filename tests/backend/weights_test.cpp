// Parameter placement (backend/weights.hpp), host-only: which tensor a GEMM op reads or writes, and
// that placed tensors sharing memory are far enough apart in issue order to be cold in L2.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "gpu_test_util.hpp"
#include "threewalls/backend/weights.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::backend {
namespace {
using scenarios::kBackward;
using scenarios::kWgrad;
using scenarios::Op;
using scenarios::OpKind;

Op gemm(scenarios::OpShape shape, std::uint8_t flags = 0, OpKind kind = OpKind::gemm) {
  Op op;
  op.kind = kind;
  op.shape = shape;
  op.flags = flags;
  op.layer = 3;
  op.expert = 5;
  return op;
}

TEST(Weights, ForwardDgradAndWgradOfOneLinearNameOneTensor) {
  // Forward {tokens, out, in}, dgrad {tokens, in, out}, wgrad {in, out, tokens} (StepGraph expansion).
  const auto f = weight_of(gemm({16, 4096, 1024, 1, 0, 0}));
  const auto d = weight_of(gemm({16, 1024, 4096, 1, 0, 0}, kBackward));
  const auto w = weight_of(gemm({1024, 4096, 16, 1, 0, 0}, kBackward | kWgrad));
  ASSERT_TRUE(f && d && w);
  EXPECT_EQ(f->key, d->key);
  EXPECT_EQ(f->key.out, 4096);
  EXPECT_EQ(f->key.in, 1024);
  EXPECT_EQ(f->bytes, 4096U * 1024U * 2U);
  EXPECT_EQ(w->key.grad, 1);
  WeightKey as_weight = w->key;
  as_weight.grad = 0;
  EXPECT_EQ(as_weight, f->key);  // the gradient of that tensor, in a place of its own
  // The other projection of the same expert, and the same projection of another expert, differ.
  EXPECT_NE(weight_of(gemm({16, 1024, 4096, 1, 0, 0}))->key, f->key);
  Op other = gemm({16, 4096, 1024, 1, 0, 0});
  other.expert = 6;
  EXPECT_NE(weight_of(other)->key, f->key);
  other.expert = 5;
  other.layer = 4;
  EXPECT_NE(weight_of(other)->key, f->key);
  other.layer = 3;
  other.microbatch = 7;  // micro-batches share the weights
  EXPECT_EQ(weight_of(other)->key, f->key);
}

TEST(Weights, GroupedGemmTensorsHoldEveryExpert) {
  const auto f = weight_of(gemm({1000, 256, 128, 8, 300, 0}, 0, OpKind::grouped_gemm));
  const auto d = weight_of(gemm({1000, 128, 256, 8, 300, 0}, kBackward, OpKind::grouped_gemm));
  const auto w = weight_of(gemm({1000, 256, 128, 8, 300, 1}, kBackward | kWgrad, OpKind::grouped_gemm));
  ASSERT_TRUE(f && d && w);
  EXPECT_EQ(f->key, d->key);
  EXPECT_EQ(f->bytes, 8U * 256U * 128U * 2U);
  EXPECT_EQ(w->key.grad, 1);
  EXPECT_EQ(w->bytes, f->bytes);
}

TEST(Weights, OtherOpsAndFp8GradientsHaveNone) {
  for (const OpKind k : {OpKind::attention, OpKind::elementwise, OpKind::norm, OpKind::permute, OpKind::copy}) {
    EXPECT_FALSE(weight_of(gemm({16, 16, 16, 1, 1, 1}, 0, k)));
  }
  Op f8 = gemm({16, 4096, 1024, 1, 0, 0});
  f8.dtype = scenarios::DType::fp8;
  ASSERT_TRUE(weight_of(f8));
  EXPECT_EQ(weight_of(f8)->bytes, 4096U * 1024U);
  f8.flags = kBackward | kWgrad;
  EXPECT_FALSE(weight_of(f8));
}

TEST(Weights, EveryExpertOfTheSwitchLayerHasItsOwnWeights) {
  const std::filesystem::path root = testing::source_root();
  const auto path = root / "scenarios/validation/host_overhead/switch_d1024_t1k_sequential_none.toml";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const scenarios::StepGraph g = scenarios::expand(scenarios::load_scenario(path), 0);
  std::map<std::int32_t, std::set<WeightKey>> by_expert;
  for (const Op& op : g.classes.at(0).ops) {
    if (op.expert < 0) continue;
    if (const auto u = weight_of(op)) by_expert[op.expert].insert(u->key);
  }
  ASSERT_EQ(by_expert.size(), 64U);
  std::set<WeightKey> all;
  for (const auto& [e, keys] : by_expert) {
    EXPECT_EQ(keys.size(), 2U) << "expert " << e << ": fc1 and fc2";
    all.insert(keys.begin(), keys.end());
  }
  EXPECT_EQ(all.size(), 128U);
}

// Bytes of the other tensors between i and j (i < j) in issue order, the shorter way round the step.
std::size_t apart(const std::vector<std::size_t>& aligned, std::size_t i, std::size_t j) {
  std::size_t fwd = 0;
  std::size_t total = 0;
  for (std::size_t x = 0; x < aligned.size(); ++x) {
    total += aligned[x];
    if (x > i && x < j) fwd += aligned[x];
  }
  return std::min(fwd, total - fwd - aligned[i] - aligned[j]);
}

void check_placement(const std::vector<std::size_t>& sizes, std::size_t l2) {
  const WeightPlacement p = place_weights(sizes, l2);
  ASSERT_EQ(p.offsets.size(), sizes.size());
  std::vector<std::size_t> aligned;
  std::size_t total = 0;
  std::size_t largest = 0;
  for (const std::size_t s : sizes) {
    aligned.push_back((s + kWeightAlign - 1) / kWeightAlign * kWeightAlign);
    total += aligned.back();
    largest = std::max(largest, aligned.back());
  }
  EXPECT_EQ(p.all_resident, total <= 6 * (l2 + largest));
  EXPECT_LE(p.arena_bytes, std::min(total, 6 * (l2 + largest)));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(p.offsets[i] % kWeightAlign, 0U);
    ASSERT_LE(p.offsets[i] + aligned[i], p.arena_bytes);
    for (std::size_t j = i + 1; j < sizes.size(); ++j) {
      const bool overlap = p.offsets[i] < p.offsets[j] + aligned[j] && p.offsets[j] < p.offsets[i] + aligned[i];
      if (!overlap) continue;
      ASSERT_FALSE(p.all_resident) << i << " and " << j << " share memory";
      ASSERT_GE(apart(aligned, i, j), 2 * l2) << "tensors " << i << " and " << j << " of " << sizes.size();
    }
  }
}

TEST(Weights, SmallModelsAreAllResident) {
  const std::size_t l2 = std::size_t{50} << 20;
  check_placement(std::vector<std::size_t>(128, std::size_t{2} << 20), l2);  // 256 MiB of 2 MiB experts
  const WeightPlacement p = place_weights({100, 300, 5000}, l2);
  EXPECT_TRUE(p.all_resident);
  EXPECT_EQ(p.offsets, (std::vector<std::size_t>{0, 256, 768}));
  EXPECT_EQ(p.arena_bytes, 768U + 5120U);
}

TEST(Weights, TensorsThatShareMemoryAreTwoL2sApartBothWaysRoundTheStep) {
  const std::size_t l2 = std::size_t{50} << 20;
  check_placement(std::vector<std::size_t>(128, std::size_t{8} << 20), l2);  // the Switch layer: 1 GiB
  check_placement(std::vector<std::size_t>(27 * 64 * 2, std::size_t{5767168}), l2);  // DeepSeek-V2-Lite's experts
  std::mt19937_64 rng(7);
  for (int t = 0; t < 60; ++t) {
    const std::size_t n = 1 + rng() % 300;
    std::vector<std::size_t> sizes(n);
    const int shape = t % 3;
    for (auto& s : sizes) {
      s = shape == 0 ? (std::size_t{1} << 20) * (1 + rng() % 16)
                     : shape == 1 ? 1 + rng() % (std::size_t{300} << 20) : (rng() % 4 == 0 ? std::size_t{200} << 20 : 4096);
    }
    check_placement(sizes, l2);
  }
}

}  // namespace
}  // namespace threewalls::backend
