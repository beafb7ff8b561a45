// Attention forward/backward (causal, non-causal, decode, chunked) against a double CPU reference.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_reference.hpp"
#include "gpu_test_util.hpp"
#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/error.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

void check_attention(const AttentionShape& s, std::size_t workspace, bool backward, std::uint32_t seed) {
  CublasLt lt;
  Attention att(lt, workspace);
  const std::int64_t bh = s.batch * s.heads;
  const auto nq = static_cast<std::size_t>(bh * s.seq_q * s.head_dim_qk), nk = static_cast<std::size_t>(bh * s.seq_kv * s.head_dim_qk);
  const auto nv = static_cast<std::size_t>(bh * s.seq_kv * s.head_dim_v), no = static_cast<std::size_t>(bh * s.seq_q * s.head_dim_v);
  const auto q = round_bf16(random_floats(nq, seed, 2.0F)), k = round_bf16(random_floats(nk, seed + 1, 2.0F));
  const auto v = round_bf16(random_floats(nv, seed + 2)), d_o = round_bf16(random_floats(no, seed + 3));
  DeviceBuffer dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v), ddo = upload_bf16(d_o);
  DeviceBuffer o(no * 2), lse(static_cast<std::size_t>(bh * s.seq_q) * 4), gq(nq * 2), gk(nk * 2), gv(nv * 2);
  poison(o);
  poison(lse);
  poison(gq);
  poison(gk);
  poison(gv);
  att.forward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), o.as<bf16>(), lse.as<float>(), nullptr);
  const AttentionRef ref = cpu_attention(s, q, k, v, d_o);
  EXPECT_LT(rel_error(download_bf16(o, no), ref.o), 2e-2);
  EXPECT_LT(rel_error(download_f32(lse, static_cast<std::size_t>(bh * s.seq_q)), ref.lse), 5e-3);
  if (!backward) return;
  att.backward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), o.as<bf16>(), ddo.as<bf16>(), lse.as<float>(),
               gq.as<bf16>(), gk.as<bf16>(), gv.as<bf16>(), nullptr);
  EXPECT_LT(rel_error(download_bf16(gq, nq), ref.dq), 3e-2);
  EXPECT_LT(rel_error(download_bf16(gk, nk), ref.dk), 3e-2);
  EXPECT_LT(rel_error(download_bf16(gv, nv), ref.dv), 3e-2);
}

TEST(Attention, CausalForwardAndBackwardMatchReference) {
  TW_REQUIRE_GPU();
  check_attention({2, 150, 150, 3, 64, 64, true}, Attention::kDefaultWorkspace, true, 1);
}

TEST(Attention, ChunkedOverQueryBlocksAndHeadsMatchesReference) {
  TW_REQUIRE_GPU();
  // 40 KiB of workspace: backward holds two 20 KiB score buffers, so the queries run in blocks of
  // tens of rows, one or a few heads per chunk (causal: each block skips the keys it cannot see).
  check_attention({2, 150, 150, 3, 64, 64, true}, 40 << 10, true, 2);
  check_attention({1, 96, 160, 4, 32, 48, false}, 40 << 10, true, 3);
}

TEST(Attention, NonCausalWithDifferentHeadDimsMatchesReference) {
  TW_REQUIRE_GPU();
  check_attention({1, 40, 90, 2, 32, 48, false}, Attention::kDefaultWorkspace, true, 4);
}

TEST(Attention, CausalWithLongerKeysIsBottomRightAligned) {
  TW_REQUIRE_GPU();
  check_attention({1, 64, 128, 2, 64, 64, true}, Attention::kDefaultWorkspace, true, 5);
}

TEST(Attention, DecodeOneQueryOverALongCacheMatchesReference) {
  TW_REQUIRE_GPU();
  check_attention({2, 1, 3000, 4, 128, 128, true}, Attention::kDefaultWorkspace, true, 6);
}

TEST(Attention, CausalWithFewerKeysThanQueriesIsAnInputError) {
  TW_REQUIRE_GPU();
  CublasLt lt;
  Attention att(lt, 1 << 20);
  EXPECT_THROW(att.forward({1, 10, 5, 1, 64, 64, true}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), InputError);
}

TEST(AttentionFlops, CausalCountsOnlyVisiblePairs) {
  const AttentionShape full{1, 4, 4, 1, 8, 8, false};
  const AttentionShape causal{1, 4, 4, 1, 8, 8, true};
  EXPECT_DOUBLE_EQ(attention_flops(full, false), 2.0 * 16 * 16);
  EXPECT_DOUBLE_EQ(attention_flops(causal, false), 2.0 * 10 * 16);
  EXPECT_DOUBLE_EQ(attention_flops(causal, true), 2.5 * 2.0 * 10 * 16);
}

}  // namespace
}  // namespace threewalls::backend
