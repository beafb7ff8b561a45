// Memory-bound kernels against CPU references (double precision on bf16-rounded inputs).
// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "gpu_test_util.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;

constexpr double kTol = 1e-2;  // bf16 outputs

std::size_t at(std::int64_t r, std::int64_t c, std::int64_t cols) { return static_cast<std::size_t>(r * cols + c); }

TEST(FillRandom, IsSeededNeverZeroAndMatchesTheHostFormula) {
  TW_REQUIRE_GPU();
  const std::int64_t n = 100003;
  DeviceBuffer f(n * sizeof(float));
  fill_random(f.as<float>(), n, 42, 0.5F, nullptr);
  const auto got = download_f32(f, n);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_NE(got[static_cast<std::size_t>(i)], 0.0F) << i;
    ASSERT_EQ(got[static_cast<std::size_t>(i)], random_value(42, i, 0.5F)) << i;
    ASSERT_LE(std::fabs(got[static_cast<std::size_t>(i)]), 0.5F);
  }
  DeviceBuffer b(n * sizeof(bf16));
  fill_random(b.as<bf16>(), n, 43, 1.0F, nullptr);
  for (const float v : download_bf16(b, n)) ASSERT_NE(v, 0.0F);
}

TEST(Add, ResidualAddMatchesReferenceForOddSizes) {
  TW_REQUIRE_GPU();
  for (const std::int64_t n : {1, 7, 8, 4097}) {
    const auto a = round_bf16(random_floats(n, 1)), b = round_bf16(random_floats(n, 2));
    DeviceBuffer da = upload_bf16(a), db = upload_bf16(b), dc(n * sizeof(bf16));
    poison(dc);
    add(da.as<bf16>(), db.as<bf16>(), dc.as<bf16>(), n, nullptr);
    std::vector<double> ref(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = double(a[i]) + b[i];
    EXPECT_LT(rel_error(download_bf16(dc, n), ref), kTol) << n;
  }
}

TEST(SwiGlu, ForwardAndBackwardMatchReference) {
  TW_REQUIRE_GPU();
  const std::int64_t rows = 13, h = 37;
  const auto x = round_bf16(random_floats(rows * 2 * h, 3, 2.0F));
  const auto dy = round_bf16(random_floats(rows * h, 4));
  DeviceBuffer dx_in = upload_bf16(x), ddy = upload_bf16(dy), y(rows * h * 2), dx(rows * 2 * h * 2);
  poison(y);
  poison(dx);
  swiglu_fwd(dx_in.as<bf16>(), y.as<bf16>(), rows, h, nullptr);
  swiglu_bwd(ddy.as<bf16>(), dx_in.as<bf16>(), dx.as<bf16>(), rows, h, nullptr);
  std::vector<double> ry(static_cast<std::size_t>(rows * h)), rdx(static_cast<std::size_t>(rows * 2 * h));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < h; ++j) {
      const double g = x[at(r, j, 2 * h)], u = x[at(r, h + j, 2 * h)], d = dy[at(r, j, h)];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      ry[at(r, j, h)] = g * sig * u;
      rdx[at(r, j, 2 * h)] = d * u * sig * (1.0 + g * (1.0 - sig));
      rdx[at(r, h + j, 2 * h)] = d * g * sig;
    }
  }
  EXPECT_LT(rel_error(download_bf16(y, rows * h), ry), kTol);
  EXPECT_LT(rel_error(download_bf16(dx, rows * 2 * h), rdx), kTol);
}

// Transformer Engine's per-tensor fp8 cast: y = e4m3(scale x) rowwise, its transpose columnwise,
// the amax recorded; the amax pass of current scaling; the transpose of a weight kept in fp8.
TEST(Fp8Quantize, CastTransposeAndAmaxMatchTheHostConversion) {
  TW_REQUIRE_GPU();
  for (const auto& [rows, cols] :
       {std::pair<std::int64_t, std::int64_t>{37, 70}, {64, 128}, {1, 33}, {192, 320}, {1024, 2048}}) {
    const std::int64_t n = rows * cols;
    const auto x = round_bf16(random_floats(static_cast<std::size_t>(n), 11, 3.0F));
    double amax_ref = 0.0;
    for (const float v : x) amax_ref = std::max(amax_ref, static_cast<double>(std::fabs(v)));
    for (const float scale : {50.0F, 1000.0F}) {  // 1000: most values saturate at 448
      DeviceBuffer dx = upload_bf16(x), y(static_cast<std::size_t>(n)), yt(static_cast<std::size_t>(n));
      DeviceBuffer amax = upload_f32({0.0F}), amax_pass = upload_f32({0.5F});
      poison(y);
      poison(yt);
      quantize_fp8(dx.as<bf16>(), scale, y.as<fp8>(), yt.as<fp8>(), amax.as<float>(), rows, cols, nullptr);
      amax_bf16(dx.as<bf16>(), amax_pass.as<float>(), n, nullptr);
      const auto hy = download_fp8(y, static_cast<std::size_t>(n));
      const auto hyt = download_fp8(yt, static_cast<std::size_t>(n));
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
          const float want = static_cast<float>(fp8(x[at(r, c, cols)] * scale));
          ASSERT_EQ(hy[at(r, c, cols)], want) << rows << "x" << cols << " at " << r << "," << c;
          ASSERT_EQ(hyt[at(c, r, rows)], want) << rows << "x" << cols << " transposed at " << r << "," << c;
          ASSERT_LE(std::fabs(want), 448.0F);
        }
      }
      EXPECT_EQ(download_f32(amax, 1)[0], static_cast<float>(amax_ref));
      EXPECT_EQ(download_f32(amax_pass, 1)[0], static_cast<float>(std::max(amax_ref, 0.5)));
      // Inference: the rowwise copy alone, no amax.
      DeviceBuffer y2(static_cast<std::size_t>(n));
      poison(y2);
      quantize_fp8(dx.as<bf16>(), scale, y2.as<fp8>(), nullptr, nullptr, rows, cols, nullptr);
      EXPECT_EQ(download_fp8(y2, static_cast<std::size_t>(n)), hy);
      // The columnwise copy of an fp8 weight: its transpose.
      DeviceBuffer wt(static_cast<std::size_t>(n));
      poison(wt);
      transpose_fp8(y.as<fp8>(), wt.as<fp8>(), rows, cols, nullptr);
      EXPECT_EQ(download_fp8(wt, static_cast<std::size_t>(n)), hyt);
    }
  }
}

TEST(RmsNorm, ForwardAndBackwardMatchReference) {
  TW_REQUIRE_GPU();
  const std::int64_t rows = 9, hidden = 300;
  const float eps = 1e-5F;
  const auto x = round_bf16(random_floats(rows * hidden, 5, 3.0F));
  const auto g = round_bf16(random_floats(hidden, 6));
  const auto dy = round_bf16(random_floats(rows * hidden, 7));
  DeviceBuffer dxin = upload_bf16(x), dg = upload_bf16(g), ddy = upload_bf16(dy);
  DeviceBuffer y(rows * hidden * 2), rstd(rows * 4), dx(rows * hidden * 2), dgamma = upload_f32(std::vector<float>(hidden, 0.0F));
  poison(y);
  poison(dx);
  rmsnorm_fwd(dxin.as<bf16>(), dg.as<bf16>(), y.as<bf16>(), rstd.as<float>(), rows, hidden, eps, nullptr);
  rmsnorm_bwd(ddy.as<bf16>(), dxin.as<bf16>(), dg.as<bf16>(), rstd.as<float>(), dx.as<bf16>(), dgamma.as<float>(), rows,
              hidden, nullptr);
  std::vector<double> ry(x.size()), rdx(x.size()), rdg(static_cast<std::size_t>(hidden), 0.0), rr(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t j = 0; j < hidden; ++j) ss += double(x[at(r, j, hidden)]) * x[at(r, j, hidden)];
    const double rs = 1.0 / std::sqrt(ss / hidden + eps);
    rr[static_cast<std::size_t>(r)] = rs;
    double dot = 0;
    for (std::int64_t j = 0; j < hidden; ++j) {
      ry[at(r, j, hidden)] = x[at(r, j, hidden)] * rs * g[static_cast<std::size_t>(j)];
      dot += double(dy[at(r, j, hidden)]) * g[static_cast<std::size_t>(j)] * x[at(r, j, hidden)];
      rdg[static_cast<std::size_t>(j)] += double(dy[at(r, j, hidden)]) * x[at(r, j, hidden)] * rs;
    }
    for (std::int64_t j = 0; j < hidden; ++j) {
      rdx[at(r, j, hidden)] = rs * g[static_cast<std::size_t>(j)] * dy[at(r, j, hidden)] - x[at(r, j, hidden)] * dot * rs * rs * rs / hidden;
    }
  }
  EXPECT_LT(rel_error(download_bf16(y, x.size()), ry), kTol);
  EXPECT_LT(rel_error(download_f32(rstd, rows), rr), 1e-5);
  EXPECT_LT(rel_error(download_bf16(dx, x.size()), rdx), kTol);
  EXPECT_LT(rel_error(download_f32(dgamma, hidden), rdg), 1e-4);
}

TEST(LayerNorm, ForwardAndBackwardMatchReference) {
  TW_REQUIRE_GPU();
  const std::int64_t rows = 6, hidden = 129;
  const float eps = 1e-5F;
  auto x = random_floats(rows * hidden, 8, 2.0F);
  for (auto& v : x) v += 0.5F;  // a non-zero mean
  x = round_bf16(x);
  const auto g = round_bf16(random_floats(hidden, 9)), be = round_bf16(random_floats(hidden, 10));
  const auto dy = round_bf16(random_floats(rows * hidden, 11));
  DeviceBuffer dxin = upload_bf16(x), dg = upload_bf16(g), dbe = upload_bf16(be), ddy = upload_bf16(dy);
  DeviceBuffer y(x.size() * 2), mean(rows * 4), rstd(rows * 4), dx(x.size() * 2);
  DeviceBuffer dgam = upload_f32(std::vector<float>(hidden, 0.0F)), dbet = upload_f32(std::vector<float>(hidden, 0.0F));
  poison(y);
  poison(dx);
  layernorm_fwd(dxin.as<bf16>(), dg.as<bf16>(), dbe.as<bf16>(), y.as<bf16>(), mean.as<float>(), rstd.as<float>(), rows,
                hidden, eps, nullptr);
  layernorm_bwd(ddy.as<bf16>(), dxin.as<bf16>(), dg.as<bf16>(), mean.as<float>(), rstd.as<float>(), dx.as<bf16>(),
                dgam.as<float>(), dbet.as<float>(), rows, hidden, nullptr);
  std::vector<double> ry(x.size()), rdx(x.size()), rdg(static_cast<std::size_t>(hidden), 0.0), rdb(static_cast<std::size_t>(hidden), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < hidden; ++j) mu += x[at(r, j, hidden)];
    mu /= hidden;
    for (std::int64_t j = 0; j < hidden; ++j) var += (x[at(r, j, hidden)] - mu) * (x[at(r, j, hidden)] - mu);
    const double rs = 1.0 / std::sqrt(var / hidden + eps);
    double m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < hidden; ++j) {
      const double xh = (x[at(r, j, hidden)] - mu) * rs;
      ry[at(r, j, hidden)] = xh * g[static_cast<std::size_t>(j)] + be[static_cast<std::size_t>(j)];
      const double gd = double(g[static_cast<std::size_t>(j)]) * dy[at(r, j, hidden)];
      m1 += gd;
      m2 += gd * xh;
      rdg[static_cast<std::size_t>(j)] += dy[at(r, j, hidden)] * xh;
      rdb[static_cast<std::size_t>(j)] += dy[at(r, j, hidden)];
    }
    m1 /= hidden;
    m2 /= hidden;
    for (std::int64_t j = 0; j < hidden; ++j) {
      const double xh = (x[at(r, j, hidden)] - mu) * rs;
      rdx[at(r, j, hidden)] = rs * (double(g[static_cast<std::size_t>(j)]) * dy[at(r, j, hidden)] - m1 - xh * m2);
    }
  }
  EXPECT_LT(rel_error(download_bf16(y, x.size()), ry), kTol);
  EXPECT_LT(rel_error(download_bf16(dx, x.size()), rdx), kTol);
  EXPECT_LT(rel_error(download_f32(dgam, hidden), rdg), 1e-4);
  EXPECT_LT(rel_error(download_f32(dbet, hidden), rdb), 1e-4);
}

TEST(Embedding, GatherAndScatterAddMatchReferenceWithRepeatedIds) {
  TW_REQUIRE_GPU();
  const std::int64_t vocab = 50, hidden = 24, tokens = 40;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) ids[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7) % 13);  // repeats
  const auto table = round_bf16(random_floats(vocab * hidden, 12));
  const auto dout = round_bf16(random_floats(tokens * hidden, 13));
  DeviceBuffer dids = upload_i32(ids), dtab = upload_bf16(table), ddo = upload_bf16(dout), out(tokens * hidden * 2);
  DeviceBuffer dgrad = upload_f32(std::vector<float>(static_cast<std::size_t>(vocab * hidden), 0.0F));
  poison(out);
  embedding_fwd(dids.as<std::int32_t>(), dtab.as<bf16>(), out.as<bf16>(), tokens, hidden, vocab, nullptr);
  embedding_bwd(dids.as<std::int32_t>(), ddo.as<bf16>(), dgrad.as<float>(), tokens, hidden, vocab, nullptr);
  std::vector<double> rout(static_cast<std::size_t>(tokens * hidden)), rgrad(static_cast<std::size_t>(vocab * hidden), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      const std::int64_t id = ids[static_cast<std::size_t>(t)];
      rout[at(t, j, hidden)] = table[at(id, j, hidden)];
      rgrad[at(id, j, hidden)] += dout[at(t, j, hidden)];
    }
  }
  EXPECT_EQ(rel_error(download_bf16(out, tokens * hidden), rout), 0.0);
  EXPECT_LT(rel_error(download_f32(dgrad, vocab * hidden), rgrad), 1e-6);
}

TEST(CrossEntropy, VocabParallelPiecesMatchReferenceOnOneShard) {
  TW_REQUIRE_GPU();
  const std::int64_t tokens = 11, shard = 1000, start = 2000;
  const auto logits = round_bf16(random_floats(tokens * shard, 14, 4.0F));
  std::vector<std::int32_t> targets(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) targets[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(start + (t * 97) % shard);
  targets[3] = 5;  // not in this shard: contributes a zero target logit
  DeviceBuffer dl = upload_bf16(logits), dt = upload_i32(targets);
  DeviceBuffer mx(tokens * 4), se(tokens * 4), tl(tokens * 4), loss(tokens * 4), dlog(tokens * shard * 2);
  DeviceBuffer dloss = upload_f32(std::vector<float>(static_cast<std::size_t>(tokens), 0.5F));
  poison(dlog);
  xent_max(dl.as<bf16>(), mx.as<float>(), tokens, shard, nullptr);
  xent_sum_exp(dl.as<bf16>(), mx.as<float>(), dt.as<std::int32_t>(), start, se.as<float>(), tl.as<float>(), tokens, shard,
               nullptr);
  xent_loss(mx.as<float>(), se.as<float>(), tl.as<float>(), loss.as<float>(), tokens, nullptr);
  xent_bwd(dl.as<bf16>(), mx.as<float>(), se.as<float>(), dt.as<std::int32_t>(), start, dloss.as<float>(), dlog.as<bf16>(),
           tokens, shard, nullptr);
  std::vector<double> rloss(static_cast<std::size_t>(tokens)), rd(static_cast<std::size_t>(tokens * shard));
  for (std::int64_t t = 0; t < tokens; ++t) {
    double m = -1e30, s = 0;
    for (std::int64_t j = 0; j < shard; ++j) m = std::max(m, double(logits[at(t, j, shard)]));
    for (std::int64_t j = 0; j < shard; ++j) s += std::exp(logits[at(t, j, shard)] - m);
    const std::int64_t local = targets[static_cast<std::size_t>(t)] - start;
    const double tlog = (local >= 0 && local < shard) ? logits[at(t, local, shard)] : 0.0;
    rloss[static_cast<std::size_t>(t)] = std::log(s) + m - tlog;
    for (std::int64_t j = 0; j < shard; ++j) {
      rd[at(t, j, shard)] = 0.5 * (std::exp(logits[at(t, j, shard)] - m) / s - (j == local ? 1.0 : 0.0));
    }
  }
  EXPECT_LT(rel_error(download_f32(loss, tokens), rloss), 1e-4);
  EXPECT_LT(rel_error(download_bf16(dlog, tokens * shard), rd), kTol);
}

TEST(Adam, StepMatchesReference) {
  TW_REQUIRE_GPU();
  const std::int64_t n = 1000;
  const auto w = random_floats(n, 15), g = random_floats(n, 16, 0.1F), m = random_floats(n, 17, 0.01F);
  auto v = random_floats(n, 18, 0.001F);
  for (auto& x : v) x = std::fabs(x);
  DeviceBuffer dw = upload_f32(w), dg = upload_f32(g), dm = upload_f32(m), dv = upload_f32(v), wb(n * 2);
  poison(wb);
  AdamParams p;
  p.step = 3;
  adam_step(dw.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(), wb.as<bf16>(), n, p, nullptr);
  std::vector<double> rw(static_cast<std::size_t>(n)), rm(rw.size()), rv(rw.size());
  for (std::size_t i = 0; i < rw.size(); ++i) {
    rm[i] = p.beta1 * double(m[i]) + (1 - p.beta1) * double(g[i]);
    rv[i] = p.beta2 * double(v[i]) + (1 - p.beta2) * double(g[i]) * g[i];
    const double mh = rm[i] / (1 - std::pow(double(p.beta1), 3)), vh = rv[i] / (1 - std::pow(double(p.beta2), 3));
    rw[i] = w[i] - p.lr * (mh / (std::sqrt(vh) + p.eps) + p.weight_decay * w[i]);
  }
  EXPECT_LT(rel_error(download_f32(dw, n), rw), 1e-6);
  EXPECT_LT(rel_error(download_f32(dm, n), rm), 1e-6);
  EXPECT_LT(rel_error(download_f32(dv, n), rv), 1e-6);
  EXPECT_LT(rel_error(download_bf16(wb, n), rw), kTol);
}

TEST(Adam, StepZeroIsAnInputError) {
  TW_REQUIRE_GPU();
  AdamParams p;
  p.step = 0;
  EXPECT_THROW(adam_step(nullptr, nullptr, nullptr, nullptr, nullptr, 10, p, nullptr), InputError);
}

}  // namespace
}  // namespace threewalls::backend
