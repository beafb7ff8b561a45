// Fused (cuDNN) attention and decode attention against the double CPU reference and against the
// unfused path: forward (O, log-sum-exp) and backward (dQ, dK, dV), causal and not, MHA, GQA and MLA
// head layouts, within bf16 tolerance.
#include <gtest/gtest.h>

#include <string>

#include "attention_reference.hpp"
#include "gpu_test_util.hpp"
#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/fused_attention.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

#define TW_REQUIRE_CUDNN()                                         \
  do {                                                             \
    std::string tw_why_;                                           \
    if (!fused_attention_built(&tw_why_)) GTEST_SKIP() << tw_why_; \
  } while (0)

struct Sizes {
  std::size_t q, k, v, o, rows;
};
Sizes sizes_of(const AttentionShape& s) {
  const auto bh = static_cast<std::size_t>(s.batch * s.heads);
  const auto bkv = static_cast<std::size_t>(s.batch * s.kv_head_count());
  const auto sq = static_cast<std::size_t>(s.seq_q), skv = static_cast<std::size_t>(s.seq_kv);
  const auto dqk = static_cast<std::size_t>(s.head_dim_qk), dv = static_cast<std::size_t>(s.head_dim_v);
  return {bh * sq * dqk, bkv * skv * dqk, bkv * skv * dv, bh * sq * dv, bh * sq};
}

void check_fused(const AttentionShape& s, std::uint32_t seed) {
  SCOPED_TRACE(describe(s));
  FusedAttention att;
  const Sizes n = sizes_of(s);
  const auto q = round_bf16(random_floats(n.q, seed, 2.0F)), k = round_bf16(random_floats(n.k, seed + 1, 2.0F));
  const auto v = round_bf16(random_floats(n.v, seed + 2)), d_o = round_bf16(random_floats(n.o, seed + 3));
  DeviceBuffer dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v), ddo = upload_bf16(d_o);
  DeviceBuffer o(n.o * 2), lse(n.rows * 4), gq(n.q * 2), gk(n.k * 2), gv(n.v * 2);
  for (DeviceBuffer* b : {&o, &lse, &gq, &gk, &gv}) poison(*b);
  att.forward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), o.as<bf16>(), lse.as<float>(), nullptr);
  const AttentionRef ref = cpu_attention(s, q, k, v, d_o);
  EXPECT_LT(rel_error(download_bf16(o, n.o), ref.o), 2e-2);
  EXPECT_LT(rel_error(download_f32(lse, n.rows), ref.lse), 5e-3);
  att.backward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), o.as<bf16>(), ddo.as<bf16>(), lse.as<float>(),
               gq.as<bf16>(), gk.as<bf16>(), gv.as<bf16>(), nullptr);
  EXPECT_LT(rel_error(download_bf16(gq, n.q), ref.dq), 3e-2);
  EXPECT_LT(rel_error(download_bf16(gk, n.k), ref.dk), 3e-2);
  EXPECT_LT(rel_error(download_bf16(gv, n.v), ref.dv), 3e-2);
}

AttentionShape with_kv(AttentionShape s, std::int64_t kv) {
  s.kv_heads = kv;
  return s;
}

TEST(FusedAttention, MhaCausalAndNotMatchReference) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused({2, 128, 128, 3, 64, 64, true}, 11);
  check_fused({1, 128, 192, 2, 128, 128, false}, 12);
}

TEST(FusedAttention, GqaFewerKvHeadsMatchesReference) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused(with_kv({1, 128, 128, 8, 128, 128, true}, 2), 13);
  check_fused(with_kv({2, 64, 128, 4, 64, 64, false}, 1), 14);
}

TEST(FusedAttention, MlaHeadDimsMatchReference) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused({1, 128, 128, 4, 192, 128, true}, 15);
  check_fused({1, 64, 128, 2, 192, 128, false}, 16);
}

TEST(FusedAttention, CausalWithLongerKeysIsBottomRightAligned) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused({1, 64, 192, 2, 64, 64, true}, 17);
}

// The two implementations on a shape too large for the CPU reference: same O, lse and gradients
// within bf16 tolerance; each backward consumes its own forward's lse.
TEST(FusedAttention, AgreesWithUnfusedOnALargerShape) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  const AttentionShape s{2, 1024, 1024, 8, 128, 128, true};
  const Sizes n = sizes_of(s);
  const auto q = round_bf16(random_floats(n.q, 21, 2.0F)), k = round_bf16(random_floats(n.k, 22, 2.0F));
  const auto v = round_bf16(random_floats(n.v, 23)), d_o = round_bf16(random_floats(n.o, 24));
  DeviceBuffer dq_in = upload_bf16(q), dk_in = upload_bf16(k), dv_in = upload_bf16(v), ddo = upload_bf16(d_o);
  CublasLt lt;
  Attention unfused(lt);
  FusedAttention fused;
  struct Out {
    DeviceBuffer o, lse, gq, gk, gv;
  };
  auto run = [&](bool use_fused) {
    Out r{DeviceBuffer(n.o * 2), DeviceBuffer(n.rows * 4), DeviceBuffer(n.q * 2), DeviceBuffer(n.k * 2),
          DeviceBuffer(n.v * 2)};
    if (use_fused) {
      fused.forward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), r.o.as<bf16>(), r.lse.as<float>(),
                    nullptr);
      fused.backward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), r.o.as<bf16>(), ddo.as<bf16>(),
                     r.lse.as<float>(), r.gq.as<bf16>(), r.gk.as<bf16>(), r.gv.as<bf16>(), nullptr);
    } else {
      unfused.forward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), r.o.as<bf16>(), r.lse.as<float>(),
                      nullptr);
      unfused.backward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), r.o.as<bf16>(), ddo.as<bf16>(),
                       r.lse.as<float>(), r.gq.as<bf16>(), r.gk.as<bf16>(), r.gv.as<bf16>(), nullptr);
    }
    return r;
  };
  const Out a = run(true), b = run(false);
  EXPECT_LT(rel_error(download_bf16(a.o, n.o), download_bf16(b.o, n.o)), 2e-2);
  EXPECT_LT(rel_error(download_f32(a.lse, n.rows), download_f32(b.lse, n.rows)), 5e-3);
  EXPECT_LT(rel_error(download_bf16(a.gq, n.q), download_bf16(b.gq, n.q)), 3e-2);
  EXPECT_LT(rel_error(download_bf16(a.gk, n.k), download_bf16(b.gk, n.k)), 3e-2);
  EXPECT_LT(rel_error(download_bf16(a.gv, n.v), download_bf16(b.gv, n.v)), 3e-2);
}

TEST(FusedAttention, PlansAreCachedPerShapeAndDirection) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  FusedAttention att;
  const AttentionShape s{1, 128, 128, 2, 64, 64, true};
  att.reserve(s, false);
  EXPECT_EQ(att.plans(), 1U);
  att.reserve(s, false);
  EXPECT_EQ(att.plans(), 1U);
  att.reserve(s, true);
  EXPECT_EQ(att.plans(), 2U);
  att.reserve({1, 256, 256, 2, 64, 64, true}, false);
  EXPECT_EQ(att.plans(), 3U);
  EXPECT_GT(att.workspace_bytes(), 0U);  // backward keeps its row sums and dQ accumulator there
}

TEST(FusedAttention, WithoutCudnnConstructionNamesTheUnfusedAlternative) {
  std::string why;
  if (fused_attention_built(&why)) {
    EXPECT_TRUE(why.empty());
    return;
  }
  try {
    FusedAttention att;
    FAIL() << "FusedAttention constructed without cuDNN";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("unfused"), std::string::npos) << e.what();
  }
}

void check_decode(const AttentionShape& s, std::int64_t capacity, std::uint32_t seed) {
  SCOPED_TRACE(describe(s) + " capacity " + std::to_string(capacity));
  DecodeAttention dec;
  const Sizes n = sizes_of(s);
  const auto q = round_bf16(random_floats(n.q, seed, 2.0F)), k = round_bf16(random_floats(n.k, seed + 1, 2.0F));
  const auto v = round_bf16(random_floats(n.v, seed + 2)), d_o = round_bf16(random_floats(n.o, seed + 3));
  // The cache holds `capacity` rows per kv head, of which the first seq_kv are the sequence.
  const auto bkv = static_cast<std::size_t>(s.batch * s.kv_head_count());
  const auto skv = static_cast<std::size_t>(s.seq_kv), cap = static_cast<std::size_t>(capacity);
  const auto dqk = static_cast<std::size_t>(s.head_dim_qk), dvd = static_cast<std::size_t>(s.head_dim_v);
  std::vector<float> kc(bkv * cap * dqk, 1e4F), vc(bkv * cap * dvd, 1e4F);  // rows past seq_kv must be ignored
  for (std::size_t g = 0; g < bkv; ++g) {
    std::copy_n(k.begin() + static_cast<std::ptrdiff_t>(g * skv * dqk), skv * dqk,
                kc.begin() + static_cast<std::ptrdiff_t>(g * cap * dqk));
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(g * skv * dvd), skv * dvd,
                vc.begin() + static_cast<std::ptrdiff_t>(g * cap * dvd));
  }
  DeviceBuffer dq_in = upload_bf16(q), dk_in = upload_bf16(kc), dv_in = upload_bf16(vc);
  DeviceBuffer o(n.o * 2), lse(n.rows * 4);
  poison(o);
  poison(lse);
  dec.forward(s, dq_in.as<bf16>(), dk_in.as<bf16>(), dv_in.as<bf16>(), o.as<bf16>(), lse.as<float>(), nullptr,
              capacity);
  const AttentionRef ref = cpu_attention(s, q, k, v, d_o);
  EXPECT_LT(rel_error(download_bf16(o, n.o), ref.o), 2e-2);
  EXPECT_LT(rel_error(download_f32(lse, n.rows), ref.lse), 5e-3);
}

AttentionShape decode_shape(std::int64_t b, std::int64_t skv, std::int64_t h, std::int64_t kv, std::int64_t dqk,
                            std::int64_t dv) {
  AttentionShape s{b, 1, skv, h, dqk, dv, true};
  s.kv_heads = kv;
  return s;
}

TEST(DecodeAttention, SplitKvMatchesReferenceForMhaGqaAndMla) {
  TW_REQUIRE_GPU();
  check_decode(decode_shape(2, 1000, 4, 4, 128, 128), 1000, 31);
  check_decode(decode_shape(3, 2049, 8, 2, 128, 128), 2100, 32);  // GQA, a cache with spare rows
  check_decode(decode_shape(1, 777, 16, 1, 64, 64), 777, 33);     // 16 query heads per kv head
  check_decode(decode_shape(2, 513, 4, 4, 192, 128), 600, 34);    // MLA head dims
  check_decode(decode_shape(1, 5, 2, 1, 256, 256), 5, 35);        // fewer keys than splits could take
}

TEST(DecodeAttention, SplitsGrowWithTheCacheNotPastIt) {
  TW_REQUIRE_GPU();
  DecodeAttention dec;
  EXPECT_EQ(dec.splits(decode_shape(1, 100, 8, 8, 128, 128)), 1);
  EXPECT_GT(dec.splits(decode_shape(1, 32768, 8, 8, 128, 128)), 1);
  EXPECT_LE(dec.splits(decode_shape(1, 32768, 8, 8, 128, 128)), 32768 / 256);
}

TEST(DecodeAttention, UnsupportedShapesAreInputErrors) {
  EXPECT_THROW(validate_decode_attention({1, 2, 100, 4, 128, 128, true}), InputError);         // seq_q 2
  EXPECT_THROW(validate_decode_attention({1, 1, 100, 4, 96, 96, true}), InputError);           // head dim 96
  EXPECT_THROW(validate_decode_attention(decode_shape(1, 100, 64, 2, 128, 128)), InputError);  // 32 per kv head
  EXPECT_THROW(validate_decode_attention(decode_shape(1, 100, 8, 3, 128, 128)), InputError);   // 8 % 3
  EXPECT_THROW(validate_decode_attention({1, 1, 100, 4, 128, 128, true}, 50), InputError);     // capacity < seq_kv
  EXPECT_NO_THROW(validate_decode_attention(decode_shape(4, 4096, 32, 8, 128, 128)));
}

TEST(AttentionShapes, DescribeNamesEveryDimension) {
  AttentionShape s{2, 4096, 4096, 32, 128, 128, true};
  s.kv_heads = 8;
  EXPECT_EQ(describe(s), "b2 sq4096 skv4096 h32 kv8 dqk128 dv128 causal");
  EXPECT_EQ(describe({1, 1, 10, 4, 192, 128, false}), "b1 sq1 skv10 h4 kv4 dqk192 dv128 full");
}

TEST(AttentionShapes, HeadsMustBeAMultipleOfKvHeads) {
  AttentionShape s{1, 8, 8, 6, 64, 64, false};
  s.kv_heads = 4;
  EXPECT_THROW(validate_attention(s, "test"), InputError);
  s.kv_heads = 3;
  EXPECT_NO_THROW(validate_attention(s, "test"));
}

}  // namespace
}  // namespace threewalls::backend
