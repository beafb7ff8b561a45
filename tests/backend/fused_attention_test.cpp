// Fused (cuDNN) attention and decode attention against the double CPU reference and against the
// unfused path: forward (O, log-sum-exp) and backward (dQ, dK, dV), causal and not, with a sliding
// window, MHA, GQA and MLA head layouts, within bf16 tolerance.
#include <gtest/gtest.h>

#include <cstdio>
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

void check_fused(const AttentionShape& s, std::uint32_t seed, WindowMask preferred = WindowMask::band) {
  SCOPED_TRACE(describe(s) + ", " + window_mask_name(preferred) + " mask preferred");
  FusedAttention att(preferred);
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
  for (const bool backward : {false, true}) {  // which window form this cuDNN planned (the GPU log shows it)
    if (const auto m = att.window_mask(s, backward)) {
      std::printf("[   INFO   ] %s %s: %s mask (%s preferred)\n", describe(s).c_str(), backward ? "bwd" : "fwd",
                  window_mask_name(*m), window_mask_name(preferred));
    }
  }
}

AttentionShape with_kv(AttentionShape s, std::int64_t kv) {
  s.kv_heads = kv;
  return s;
}

AttentionShape windowed(AttentionShape s, std::int64_t window) {
  s.window = window;
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

// Sliding windows in each form of the mask (the preferred one, falling back to the other when cuDNN
// plans only that): shorter than the unfused kernel's 512-row query block, longer than one, more keys
// than queries (bottom-right aligned), GQA, and a window covering every key (the causal plan).
TEST(FusedAttention, SlidingWindowMatchesReference) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  for (const WindowMask preferred : {WindowMask::band, WindowMask::conjunction}) {
    check_fused(windowed({1, 640, 640, 2, 64, 64, true}, 100), 41, preferred);
    check_fused(windowed({1, 1152, 1152, 2, 64, 64, true}, 600), 42, preferred);
    check_fused(windowed({1, 256, 640, 2, 64, 64, true}, 200), 43, preferred);
    check_fused(with_kv(windowed({1, 256, 256, 8, 128, 128, true}, 64), 2), 44, preferred);
  }
  check_fused(windowed({1, 128, 256, 2, 64, 64, true}, 256), 45);
}

// The two implementations on a shape too large for the CPU reference: same O, lse and gradients
// within bf16 tolerance; each backward consumes its own forward's lse.
void check_fused_against_unfused(const AttentionShape& s, std::uint32_t seed) {
  SCOPED_TRACE(describe(s));
  const Sizes n = sizes_of(s);
  const auto q = round_bf16(random_floats(n.q, seed, 2.0F)), k = round_bf16(random_floats(n.k, seed + 1, 2.0F));
  const auto v = round_bf16(random_floats(n.v, seed + 2)), d_o = round_bf16(random_floats(n.o, seed + 3));
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

TEST(FusedAttention, AgreesWithUnfusedOnALargerShape) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused_against_unfused({2, 1024, 1024, 8, 128, 128, true}, 21);
}

TEST(FusedAttention, AgreesWithUnfusedOnALargerWindowedShape) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_CUDNN();
  check_fused_against_unfused(windowed({1, 4096, 4096, 4, 64, 64, true}, 1024), 25);
  check_fused_against_unfused(windowed({1, 2048, 2048, 4, 128, 128, true}, 128), 29);
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
  EXPECT_FALSE(att.window_mask(s, false).has_value());
  // The window is part of the plan; one that covers every key is the causal plan.
  att.reserve(windowed(s, 32), false);
  EXPECT_EQ(att.plans(), 4U);
  EXPECT_TRUE(att.window_mask(windowed(s, 32), false).has_value());
  att.reserve(windowed(s, 64), false);
  EXPECT_EQ(att.plans(), 5U);
  att.reserve(windowed(s, 128), false);
  EXPECT_EQ(att.plans(), 5U);
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
  EXPECT_THROW(validate_decode_attention(windowed({1, 1, 100, 4, 128, 128, true}, 64)), InputError);  // window
  EXPECT_NO_THROW(validate_decode_attention(windowed({1, 1, 100, 4, 128, 128, true}, 100)));          // the whole cache
  EXPECT_NO_THROW(validate_decode_attention(decode_shape(4, 4096, 32, 8, 128, 128)));
}

TEST(AttentionShapes, DescribeNamesEveryDimension) {
  AttentionShape s{2, 4096, 4096, 32, 128, 128, true};
  s.kv_heads = 8;
  EXPECT_EQ(describe(s), "b2 sq4096 skv4096 h32 kv8 dqk128 dv128 causal");
  EXPECT_EQ(describe({1, 1, 10, 4, 192, 128, false}), "b1 sq1 skv10 h4 kv4 dqk192 dv128 full");
  s.window = 128;
  EXPECT_EQ(describe(s), "b2 sq4096 skv4096 h32 kv8 dqk128 dv128 causal w128");
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
