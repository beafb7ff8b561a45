// Attention forward/backward (causal, non-causal, sliding window, decode, chunked) against a double
// CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "attention_reference.hpp"
#include "gpu_test_util.hpp"
#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/core/attention_mask.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

void check_attention(const AttentionShape& s, std::size_t workspace, bool backward, std::uint32_t seed) {
  SCOPED_TRACE(describe(s));
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

AttentionShape windowed(AttentionShape s, std::int64_t window) {
  s.window = window;
  return s;
}

// Query blocks are 512 rows: a window shorter than a block (each block multiplies a band of keys
// from its first row's window start), longer than one (a block's keys span earlier blocks' rows),
// more keys than queries (bottom-right aligned), and a window covering every key (causal).
TEST(Attention, SlidingWindowForwardAndBackwardMatchReference) {
  TW_REQUIRE_GPU();
  check_attention(windowed({1, 1100, 1100, 2, 64, 64, true}, 100), Attention::kDefaultWorkspace, true, 7);
  check_attention(windowed({1, 1300, 1300, 2, 64, 64, true}, 700), Attention::kDefaultWorkspace, true, 8);
  check_attention(windowed({1, 600, 1000, 2, 64, 32, true}, 300), Attention::kDefaultWorkspace, true, 9);
  check_attention(windowed({1, 64, 128, 2, 64, 64, true}, 1000), Attention::kDefaultWorkspace, true, 10);
}

TEST(Attention, SlidingWindowChunkedOverQueryBlocksAndHeadsMatchesReference) {
  TW_REQUIRE_GPU();
  // 40 KiB of workspace: blocks of tens of rows, each against its own band of keys.
  check_attention(windowed({2, 150, 150, 3, 64, 64, true}, 40), 40 << 10, true, 11);
  check_attention(windowed({1, 100, 170, 2, 32, 48, true}, 7), 40 << 10, true, 12);
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

TEST(Attention, WindowWithoutCausalOrNegativeIsAnInputErrorNamingTheShape) {
  for (const AttentionShape& s :
       {windowed({1, 128, 128, 2, 64, 64, false}, 16), windowed({1, 128, 128, 2, 64, 64, true}, -1)}) {
    try {
      validate_attention(s, "test");
      FAIL() << "accepted " << describe(s);
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(describe(s)), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(validate_attention(windowed({1, 128, 128, 2, 64, 64, true}, 16), "test"));
  EXPECT_NO_THROW(validate_attention(windowed({1, 128, 128, 2, 64, 64, true}, 500), "test"));  // masks nothing more
}

TEST(AttentionFlops, CausalCountsOnlyVisiblePairs) {
  const AttentionShape full{1, 4, 4, 1, 8, 8, false};
  const AttentionShape causal{1, 4, 4, 1, 8, 8, true};
  EXPECT_DOUBLE_EQ(attention_flops(full, false), 2.0 * 16 * 16);
  EXPECT_DOUBLE_EQ(attention_flops(causal, false), 2.0 * 10 * 16);
  EXPECT_DOUBLE_EQ(attention_flops(causal, true), 2.5 * 2.0 * 10 * 16);
  // Bottom-right aligned: 3 queries over 5 keys see 3, 4 and 5 keys.
  EXPECT_DOUBLE_EQ(attention_flops({2, 3, 5, 3, 8, 4, true}, false), 2.0 * 6 * 12 * 12);
}

TEST(AttentionFlops, SlidingWindowCountsTheBandsPairs) {
  // 4 queries, window 2: 1 + 2 + 2 + 2 keys.
  EXPECT_DOUBLE_EQ(attention_flops(windowed({1, 4, 4, 1, 8, 8, true}, 2), false), 2.0 * 7 * 16);
  for (const AttentionShape& s :
       {windowed({2, 4096, 4096, 64, 64, 64, true}, 128), windowed({1, 1000, 3000, 8, 128, 128, true}, 1500),
        windowed({1, 300, 300, 4, 192, 128, true}, 5000)}) {
    SCOPED_TRACE(describe(s));
    const double per_pair = 2.0 * static_cast<double>(s.batch * s.heads) * (s.head_dim_qk + s.head_dim_v);
    EXPECT_DOUBLE_EQ(attention_flops(s, false), per_pair * causal_pairs(s.seq_q, s.seq_kv, s.window));
    EXPECT_DOUBLE_EQ(attention_flops(s, true), 2.5 * per_pair * causal_pairs(s.seq_q, s.seq_kv, s.window));
  }
  // A window as long as the keys counts what the causal mask does.
  EXPECT_DOUBLE_EQ(attention_flops(windowed({1, 300, 300, 4, 64, 64, true}, 300), false),
                   attention_flops({1, 300, 300, 4, 64, 64, true}, false));
}

// causal_key_range (the kernels' and the reference's mask) against the mask written out pair by pair:
// key j of query i is kept when j <= i + seq_kv - seq_q and, with a window w, j > i + seq_kv - seq_q - w.
TEST(AttentionMask, KeyRangeIsTheBandOfTheCausalMask) {
  for (const auto& [sq, skv, w] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{7, 7, 0},
                                   {7, 7, 3},
                                   {5, 12, 4},
                                   {5, 12, 20},
                                   {1, 9, 2},
                                   {16, 16, 1}}) {
    double pairs = 0;
    for (std::int64_t i = 0; i < sq; ++i) {
      const KeyRange r = causal_key_range(i, sq, skv, w);
      for (std::int64_t j = 0; j < skv; ++j) {
        const std::int64_t diagonal = i + skv - sq;
        const bool kept = j <= diagonal && (w == 0 || j > diagonal - w);
        EXPECT_EQ(kept, j >= r.lo && j < r.hi)
            << "sq " << sq << " skv " << skv << " w " << w << " query " << i << " key " << j;
        pairs += kept ? 1.0 : 0.0;
      }
    }
    EXPECT_DOUBLE_EQ(pairs, causal_pairs(sq, skv, w)) << "sq " << sq << " skv " << skv << " w " << w;
  }
}

}  // namespace
}  // namespace threewalls::backend
