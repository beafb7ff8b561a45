// The calibrate group "kernels": OpRunner's launch sequences of softmax_topk, permute, unpermute,
// embedding, cross_entropy and optimizer ops (backend/src/op_runner.cpp, OpRunner::run), on buffers
// of each point's shape, each checked against a CPU reference after timing.
#include "bench.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/calibration/kernel_terms.hpp"

namespace threewalls::calibration::bench::detail {

namespace be = threewalls::backend;

namespace {

std::size_t at_least_one(std::int64_t v) { return static_cast<std::size_t>(std::max<std::int64_t>(v, 1)); }

be::DeviceBuffer bf16_random(std::int64_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  be::DeviceBuffer b(at_least_one(n) * 2);
  be::fill_random(b.as<be::bf16>(), n, seed, scale, s);
  return b;
}
be::DeviceBuffer f32_random(std::int64_t n, std::uint64_t seed, bool positive, cudaStream_t s) {
  be::DeviceBuffer b(at_least_one(n) * 4);
  if (positive) {
    be::fill_random_positive(b.as<float>(), n, seed, 1.0F, s);
  } else {
    be::fill_random(b.as<float>(), n, seed, 1.0F, s);
  }
  return b;
}

std::vector<std::int32_t> download_i32(const void* base, std::int64_t first, std::int64_t count) {
  std::vector<std::int32_t> h(at_least_one(count));
  TW_CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const std::int32_t*>(base) + first,
                           static_cast<std::size_t>(count) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  return h;
}

// OpRunner::routing: random router logits over route_experts, softmax_topk (renormalised), then
// build_row_map.
struct Routing {
  be::DeviceBuffer ids, probs, counts, offsets, cursor, row_map;
  Routing(std::int64_t tokens, int k, std::uint64_t seed, cudaStream_t s) {
    const int e = be::OpRunnerConfig{}.route_experts;
    ids = be::DeviceBuffer(at_least_one(tokens * k) * 4);
    probs = be::DeviceBuffer(at_least_one(tokens * k) * 4);
    counts = be::DeviceBuffer(at_least_one(e) * 4);
    offsets = be::DeviceBuffer(at_least_one(e + 1) * 4);
    cursor = be::DeviceBuffer(at_least_one(e) * 4);
    row_map = be::DeviceBuffer(at_least_one(tokens * k) * 4);
    const be::DeviceBuffer logits = bf16_random(tokens * e, seed, 2.0F, s);
    be::softmax_topk(logits.as<be::bf16>(), ids.as<std::int32_t>(), probs.as<float>(), counts.as<std::int32_t>(),
                     tokens, e, k, true, s);
    be::build_row_map(ids.as<std::int32_t>(), counts.as<std::int32_t>(), offsets.as<std::int32_t>(),
                      cursor.as<std::int32_t>(), row_map.as<std::int32_t>(), tokens, e, k, s);
    TW_CUDA_CHECK(cudaStreamSynchronize(s));  // `logits` dies here
  }
};

// Softmax of a row and its top-k (ties: lower expert id first, as the kernel).
struct TopK {
  std::vector<double> p;
  std::vector<int> ids;
};
TopK topk_of(const std::vector<double>& logits, int k) {
  TopK r;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const double l : logits) sum += std::exp(l - mx);
  for (const double l : logits) r.p.push_back(std::exp(l - mx) / sum);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  r.ids.assign(order.begin(), order.begin() + k);
  return r;
}

std::vector<std::int64_t> check_tokens(std::int64_t tokens) { return {0, tokens / 2, tokens - 1}; }

// Measures one point of the group: allocates its buffers, fills them with seeded random data, runs
// the launch sequence OpRunner runs for the op (the routing of permute / unpermute built as
// OpRunner::routing builds it), times it with measure_device and checks the output. Fills the
// record's samples, reps, stop, rel_ci and check.
void measure_kernel_point(const StopRule& rule, const Clock& clock, Timer& timer, cudaStream_t s, std::uint64_t seed,
                          Record& r) {
  const PointSpec& p = r.point;
  const std::string& op = p.op;
  auto device = [&](const Work& w) { measure_device(rule, clock, timer, s, w, true, r); };
  auto sync = [&] { TW_CUDA_CHECK(cudaStreamSynchronize(s)); };

  if (op == "softmax_topk_fwd" || op == "softmax_topk_bwd") {
    const std::int64_t t = p.iparam("tokens");
    const int e = static_cast<int>(p.iparam("experts"));
    const int k = static_cast<int>(p.iparam("topk"));
    const be::DeviceBuffer logits = bf16_random(t * e, seed + 1, 2.0F, s);
    be::DeviceBuffer ids(at_least_one(t * k) * 4), probs(at_least_one(t * k) * 4), counts(at_least_one(e) * 4);
    auto* L = logits.as<be::bf16>();
    auto* I = ids.as<std::int32_t>();
    auto* P = probs.as<float>();
    auto* C = counts.as<std::int32_t>();
    if (op == "softmax_topk_fwd") {
      device([&](cudaStream_t st) { be::softmax_topk(L, I, P, C, t, e, k, true, st); });
      sync();
      CheckLog log(
          "top-k ids (ties: lower id) and renormalised probabilities of rows against a CPU softmax; "
          "expert counts sum to tokens x topk");
      for (const auto row : check_tokens(t)) {
        const TopK ref = topk_of(download_bf16(L, row * e, e), k);
        const auto got_ids = download_i32(I, row * k, k);
        const auto got_p = download_f32(P, row * k, k);
        double chosen = 0.0;
        for (const int id : ref.ids) chosen += ref.p[static_cast<std::size_t>(id)];
        for (int i = 0; i < k; ++i) {
          const auto iu = static_cast<std::size_t>(i);
          log.expect_near(got_ids[iu], ref.ids[iu], 0.5, "row " + std::to_string(row) + " id " + std::to_string(i));
          const double want = ref.p[static_cast<std::size_t>(ref.ids[iu])] / chosen;
          log.expect_near(got_p[iu], want, 1e-3 * want + 1e-6,
                          "row " + std::to_string(row) + " prob " + std::to_string(i));
        }
      }
      const auto cnt = download_i32(C, 0, e);
      log.expect_near(static_cast<double>(std::accumulate(cnt.begin(), cnt.end(), std::int64_t{0})),
                      static_cast<double>(t * k), 0.5, "sum of counts");
      r.check = log.passed();
    } else {
      const be::DeviceBuffer dprobs = f32_random(t * k, seed + 2, false, s);
      be::DeviceBuffer dlogits(at_least_one(t * e) * 2);
      be::softmax_topk(L, I, P, C, t, e, k, true, s);  // the ids the backward follows
      auto* D = dprobs.as<float>();
      auto* G = dlogits.as<be::bf16>();
      device([&](cudaStream_t st) { be::softmax_topk_bwd(L, I, D, G, t, e, k, st); });
      sync();
      CheckLog log("router backward dlogits = p (dp - sum_i p[id_i] dprobs_i) of rows (relative L2)");
      for (const auto row : check_tokens(t)) {
        const TopK ref = topk_of(download_bf16(L, row * e, e), k);
        const auto gi = download_i32(I, row * k, k);
        const auto dp = download_f32(D, row * k, k);
        std::vector<double> dpe(static_cast<std::size_t>(e), 0.0);
        double dot = 0.0;
        for (int i = 0; i < k; ++i) {
          const auto id = static_cast<std::size_t>(gi[static_cast<std::size_t>(i)]);
          dpe[id] = dp[static_cast<std::size_t>(i)];
          dot += ref.p[id] * dp[static_cast<std::size_t>(i)];
        }
        std::vector<double> want(static_cast<std::size_t>(e));
        for (std::size_t j = 0; j < want.size(); ++j) want[j] = ref.p[j] * (dpe[j] - dot);
        log.expect_near(rel_l2(download_bf16(G, row * e, e), want), 0.0, 0.02, "row " + std::to_string(row));
      }
      r.check = log.passed();
    }
    return;
  }

  if (op == "permute_fwd" || op == "permute_bwd" || op == "unpermute_fwd" || op == "unpermute_bwd") {
    const std::int64_t t = p.iparam("tokens");
    const int k = static_cast<int>(p.iparam("topk"));
    const std::int64_t h = p.iparam("hidden");
    const Routing route(t, k, seed + 3, s);
    const auto* map = route.row_map.as<std::int32_t>();
    const auto* probs = route.probs.as<float>();
    const std::int64_t rows = t * k;
    const be::DeviceBuffer a = bf16_random(rows * h, seed + 4, 1.0F, s);  // x / dout / expert_out
    const be::DeviceBuffer dy = bf16_random(t * h, seed + 5, 1.0F, s);    // unpermute_bwd's dy
    be::DeviceBuffer out(at_least_one(rows * h) * 2), dprobs(at_least_one(rows) * 4);
    const auto* A = a.as<be::bf16>();
    auto* O = out.as<be::bf16>();
    const std::vector<std::int64_t> cols{0, h / 2, h - 1};
    if (op == "permute_fwd") {
      device([&](cudaStream_t st) { be::permute_fwd(A, map, O, t, k, h, st); });
    } else if (op == "permute_bwd") {
      device([&](cudaStream_t st) { be::permute_bwd(A, map, O, t, k, h, st); });
    } else if (op == "unpermute_fwd") {
      device([&](cudaStream_t st) { be::unpermute_fwd(A, map, probs, O, t, k, h, st); });
    } else {
      device([&](cudaStream_t st) {
        be::unpermute_bwd(dy.as<be::bf16>(), A, map, probs, O, dprobs.as<float>(), t, k, h, st);
      });
    }
    sync();
    CheckLog log(op + " rows through the row map of build_row_map against a CPU gather");
    for (const auto tok : check_tokens(t)) {
      const auto m = download_i32(map, tok * k, k);
      const auto pr = download_f32(probs, tok * k, k);
      for (const auto j : cols) {
        const std::string where = "token " + std::to_string(tok) + " column " + std::to_string(j);
        if (op == "permute_fwd") {
          for (int i = 0; i < k; ++i) {
            const std::int64_t row = m[static_cast<std::size_t>(i)];
            log.expect_near(download_bf16(O, row * h + j, 1)[0], download_bf16(A, tok * h + j, 1)[0], 1e-30, where);
          }
        } else if (op == "unpermute_bwd") {
          const double g = download_bf16(dy.data(), tok * h + j, 1)[0];
          for (int i = 0; i < k; ++i) {
            const std::int64_t row = m[static_cast<std::size_t>(i)];
            const double want = pr[static_cast<std::size_t>(i)] * g;
            log.expect_near(download_bf16(O, row * h + j, 1)[0], want, 0.01 * std::fabs(want) + 1e-6, where);
          }
        } else {
          double want = 0.0, mag = 0.0;
          for (int i = 0; i < k; ++i) {
            const std::int64_t row = m[static_cast<std::size_t>(i)];
            const double w = op == "unpermute_fwd" ? pr[static_cast<std::size_t>(i)] : 1.0;
            const double v = w * download_bf16(A, row * h + j, 1)[0];
            want += v;
            mag += std::fabs(v);
          }
          log.expect_near(download_bf16(O, tok * h + j, 1)[0], want, 0.01 * mag + 1e-6, where);
        }
      }
      if (op == "unpermute_bwd") {  // dprobs[t, 0] = dot(dy[t, :], expert_out[row, :])
        const auto g = download_bf16(dy.data(), tok * h, h);
        const auto x = download_bf16(A, static_cast<std::int64_t>(m[0]) * h, h);
        double dot = 0.0, mag = 0.0;
        for (std::size_t j = 0; j < g.size(); ++j) {
          dot += g[j] * x[j];
          mag += std::fabs(g[j] * x[j]);
        }
        log.expect_near(download_f32(dprobs.data(), tok * k, 1)[0], dot, 1e-3 * mag + 1e-5,
                        "dprobs of token " + std::to_string(tok));
      }
    }
    r.check = log.passed();
    return;
  }

  if (op == "embedding_fwd" || op == "embedding_bwd") {
    const std::int64_t t = p.iparam("tokens");
    const std::int64_t h = p.iparam("hidden");
    const std::int64_t vocab = be::OpRunnerConfig{}.embedding_rows;
    be::DeviceBuffer ids(at_least_one(t) * 4);
    be::fill_random_ids(ids.as<std::int32_t>(), t, seed + 6, static_cast<std::int32_t>(vocab), s);
    const auto* I = ids.as<std::int32_t>();
    const be::DeviceBuffer rows = bf16_random(t * h, seed + 7, 1.0F, s);  // dout (bwd)
    if (op == "embedding_fwd") {
      const be::DeviceBuffer table = bf16_random(vocab * h, seed + 8, 1.0F, s);
      be::DeviceBuffer out(at_least_one(t * h) * 2);
      device([&](cudaStream_t st) { be::embedding_fwd(I, table.as<be::bf16>(), out.as<be::bf16>(), t, h, vocab, st); });
      sync();
      CheckLog log("out[t] = table[ids[t]]");
      for (const auto tok : check_tokens(t)) {
        const std::int64_t id = download_i32(I, tok, 1)[0];
        for (const std::int64_t j : {std::int64_t{0}, h - 1}) {
          log.expect_near(download_bf16(out.data(), tok * h + j, 1)[0], download_bf16(table.data(), id * h + j, 1)[0],
                          1e-30, "token " + std::to_string(tok) + " column " + std::to_string(j));
        }
      }
      r.check = log.passed();
    } else {
      be::DeviceBuffer dtable(at_least_one(vocab * h) * 4);
      TW_CUDA_CHECK(cudaMemsetAsync(dtable.data(), 0, dtable.size(), s));
      auto* D = dtable.as<float>();
      device([&](cudaStream_t st) { be::embedding_bwd(I, rows.as<be::bf16>(), D, t, h, vocab, st); });
      // One fresh run for the check: dtable[ids[0], 0] = sum of dout[t, 0] over tokens with that id.
      TW_CUDA_CHECK(cudaMemsetAsync(dtable.data(), 0, dtable.size(), s));
      be::embedding_bwd(I, rows.as<be::bf16>(), D, t, h, vocab, s);
      sync();
      const auto all = download_i32(I, 0, t);
      const auto col = download_bf16(rows.data(), 0, t, h);
      CheckLog log("dtable[id, 0] = sum of dout[t, 0] over the tokens with that id (one fresh run)");
      for (const auto tok : check_tokens(t)) {
        const std::int32_t id = all[static_cast<std::size_t>(tok)];
        double want = 0.0, mag = 0.0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (all[i] != id) continue;
          want += col[i];
          mag += std::fabs(col[i]);
        }
        log.expect_near(download_f32(D, static_cast<std::int64_t>(id) * h, 1)[0], want, 1e-5 * mag + 1e-6,
                        "id " + std::to_string(id));
      }
      r.check = log.passed();
    }
    return;
  }

  if (op == "cross_entropy_fwd" || op == "cross_entropy_bwd") {
    const std::int64_t t = p.iparam("tokens");
    const std::int64_t v = p.iparam("shard");
    const be::DeviceBuffer logits = bf16_random(t * v, seed + 9, 4.0F, s);
    be::DeviceBuffer targets(at_least_one(t) * 4), row_max(at_least_one(t) * 4), sum_exp(at_least_one(t) * 4),
        target_logit(at_least_one(t) * 4), loss(at_least_one(t) * 4);
    be::fill_random_ids(targets.as<std::int32_t>(), t, seed + 10, static_cast<std::int32_t>(v), s);
    const auto* L = logits.as<be::bf16>();
    const auto* T = targets.as<std::int32_t>();
    auto* M = row_max.as<float>();
    auto* S = sum_exp.as<float>();
    auto* TL = target_logit.as<float>();
    auto* LS = loss.as<float>();
    auto fwd = [=](cudaStream_t st) {
      be::xent_max(L, M, t, v, st);
      be::xent_sum_exp(L, M, T, 0, S, TL, t, v, st);
      be::xent_loss(M, S, TL, LS, t, st);
    };
    auto ref_row = [&](std::int64_t tok, double& mx, double& sum, double& tl) {
      const auto row = download_bf16(L, tok * v, v);
      mx = *std::max_element(row.begin(), row.end());
      sum = 0.0;
      for (const double x : row) sum += std::exp(x - mx);
      tl = row[static_cast<std::size_t>(download_i32(T, tok, 1)[0])];
      return row;
    };
    if (op == "cross_entropy_fwd") {
      device(fwd);
      sync();
      CheckLog log("loss = log sum exp(logits) - logit[target] of rows against a CPU reference");
      for (const auto tok : check_tokens(t)) {
        double mx = 0, sum = 0, tl = 0;
        static_cast<void>(ref_row(tok, mx, sum, tl));
        const double want = std::log(sum) + mx - tl;
        log.expect_near(download_f32(loss.data(), tok, 1)[0], want, 1e-3 * std::fabs(want) + 1e-3,
                        "token " + std::to_string(tok));
      }
      r.check = log.passed();
    } else {
      const be::DeviceBuffer dloss = f32_random(t, seed + 11, false, s);
      be::DeviceBuffer dlogits(at_least_one(t * v) * 2);
      fwd(s);  // the statistics the backward reads
      device(
          [&](cudaStream_t st) { be::xent_bwd(L, M, S, T, 0, dloss.as<float>(), dlogits.as<be::bf16>(), t, v, st); });
      sync();
      CheckLog log("dlogits = dloss (softmax - onehot(target)) of rows (relative L2)");
      for (const auto tok : check_tokens(t)) {
        double mx = 0, sum = 0, tl = 0;
        const auto row = ref_row(tok, mx, sum, tl);
        const double g = download_f32(dloss.data(), tok, 1)[0];
        const auto target = static_cast<std::size_t>(download_i32(T, tok, 1)[0]);
        std::vector<double> want(row.size());
        for (std::size_t j = 0; j < row.size(); ++j)
          want[j] = g * (std::exp(row[j] - mx) / sum - (j == target ? 1.0 : 0.0));
        log.expect_near(rel_l2(download_bf16(dlogits.data(), tok * v, v), want), 0.0, 0.02,
                        "token " + std::to_string(tok));
      }
      r.check = log.passed();
    }
    return;
  }

  if (op == "adam_step") {
    const std::int64_t n = p.iparam("parameters");
    const be::DeviceBuffer master = f32_random(n, seed + 12, false, s), grad = f32_random(n, seed + 13, false, s);
    const be::DeviceBuffer m = f32_random(n, seed + 14, false, s), v = f32_random(n, seed + 15, true, s);
    be::DeviceBuffer weight(at_least_one(n) * 2);
    auto* W = master.as<float>();
    auto* G = grad.as<float>();
    auto* Mm = m.as<float>();
    auto* V = v.as<float>();
    auto* B = weight.as<be::bf16>();
    const be::AdamParams ap{};  // OpRunner's
    device([&](cudaStream_t st) { be::adam_step(W, G, Mm, V, B, n, ap, st); });
    sync();
    // One more step, checked element by element against the AdamW update in double.
    const std::vector<std::int64_t> at{0, n / 2, n - 1};
    struct State {
      double w, g, m, v;
    };
    std::vector<State> before;
    for (const auto i : at) {
      before.push_back(
          {download_f32(W, i, 1)[0], download_f32(G, i, 1)[0], download_f32(Mm, i, 1)[0], download_f32(V, i, 1)[0]});
    }
    be::adam_step(W, G, Mm, V, B, n, ap, s);
    sync();
    CheckLog log("AdamW update of master weights and bf16 copy against a CPU reference (one step)");
    const double b1 = ap.beta1, b2 = ap.beta2, lr = ap.lr, eps = ap.eps, wd = ap.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, ap.step);
    const double bc2 = 1.0 - std::pow(b2, ap.step);
    for (std::size_t i = 0; i < at.size(); ++i) {
      const State& b = before[i];
      const double mi = b1 * b.m + (1.0 - b1) * b.g;
      const double vi = b2 * b.v + (1.0 - b2) * b.g * b.g;
      const double want = b.w - lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * b.w);
      const std::string where = "parameter " + std::to_string(at[i]);
      log.expect_near(download_f32(W, at[i], 1)[0], want, 1e-5 * std::fabs(want) + 1e-7, where);
      log.expect_near(download_bf16(B, at[i], 1)[0], bf16_round(want), 0.01 * std::fabs(want) + 1e-6,
                      where + " (bf16)");
    }
    r.check = log.passed();
    return;
  }
  throw std::logic_error("kernels group: no handler for op " + op);
}

class KernelsBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;
  // Every point allocates its own buffers (shapes differ too much to share them).
  void begin(const std::vector<PointSpec>& /*points*/) override {}
  void measure(const StopRule& rule, Record& r) override {
    measure_kernel_point(rule, ctx_.clock, *ctx_.timer, s(), opt().seed + 91, r);
  }
};

}  // namespace

std::unique_ptr<GroupBench> make_kernels_bench(const BenchContext& ctx) { return std::make_unique<KernelsBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
