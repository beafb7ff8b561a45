// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "threewalls/core/attention_mask.hpp"

namespace threewalls::backend::testing {

AttentionRef cpu_attention(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const std::vector<float>& d_o) {
  const std::int64_t bh = s.batch * s.heads, sq = s.seq_q, skv = s.seq_kv, dq = s.head_dim_qk, dv = s.head_dim_v;
  const std::int64_t group = s.heads / s.kv_head_count();
  const std::int64_t bkv = s.batch * s.kv_head_count();
  const double scale = 1.0 / std::sqrt(double(dq));
  AttentionRef r;
  r.o.assign(static_cast<std::size_t>(bh * sq * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(bh * sq), 0.0);
  r.dq.assign(static_cast<std::size_t>(bh * sq * dq), 0.0);
  r.dk.assign(static_cast<std::size_t>(bkv * skv * dq), 0.0);
  r.dv.assign(static_cast<std::size_t>(bkv * skv * dv), 0.0);
  // Query head h (of all batch x heads) reads kv head kv_of(h) (of all batch x kv_heads).
  auto kv_of = [&](std::int64_t h) { return (h / s.heads) * s.kv_head_count() + (h % s.heads) / group; };
  auto Q = [&](std::int64_t h, std::int64_t i, std::int64_t d) {
    return double(q[static_cast<std::size_t>((h * sq + i) * dq + d)]);
  };
  auto K = [&](std::int64_t g, std::int64_t j, std::int64_t d) {
    return double(k[static_cast<std::size_t>((g * skv + j) * dq + d)]);
  };
  auto V = [&](std::int64_t g, std::int64_t j, std::int64_t d) {
    return double(v[static_cast<std::size_t>((g * skv + j) * dv + d)]);
  };
  auto DO = [&](std::int64_t h, std::int64_t i, std::int64_t d) {
    return double(d_o[static_cast<std::size_t>((h * sq + i) * dv + d)]);
  };
  for (std::int64_t h = 0; h < bh; ++h) {
    const std::int64_t g = kv_of(h);
    for (std::int64_t i = 0; i < sq; ++i) {
      // Keys [lo, lo + n) of query i; p[t] is key lo + t.
      const KeyRange keys = s.causal ? causal_key_range(i, sq, skv, s.window) : KeyRange{0, skv};
      const std::int64_t lo = keys.lo, n = std::max<std::int64_t>(keys.hi - keys.lo, 0);
      std::vector<double> p(static_cast<std::size_t>(n));
      double mx = -1e300;
      for (std::int64_t t = 0; t < n; ++t) {
        double acc = 0;
        for (std::int64_t d = 0; d < dq; ++d) acc += Q(h, i, d) * K(g, lo + t, d);
        p[static_cast<std::size_t>(t)] = acc * scale;
        mx = std::max(mx, p[static_cast<std::size_t>(t)]);
      }
      double sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (auto& x : p) x /= sum;
      r.lse[static_cast<std::size_t>(h * sq + i)] = mx + std::log(sum);
      for (std::int64_t d = 0; d < dv; ++d) {
        double acc = 0;
        for (std::int64_t t = 0; t < n; ++t) acc += p[static_cast<std::size_t>(t)] * V(g, lo + t, d);
        r.o[static_cast<std::size_t>((h * sq + i) * dv + d)] = acc;
      }
      double D = 0;
      for (std::int64_t d = 0; d < dv; ++d) D += DO(h, i, d) * r.o[static_cast<std::size_t>((h * sq + i) * dv + d)];
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t j = lo + t;
        double dp = 0;
        for (std::int64_t d = 0; d < dv; ++d) dp += DO(h, i, d) * V(g, j, d);
        const double pj = p[static_cast<std::size_t>(t)];
        const double ds = pj * (dp - D);
        for (std::int64_t d = 0; d < dv; ++d)
          r.dv[static_cast<std::size_t>((g * skv + j) * dv + d)] += pj * DO(h, i, d);
        for (std::int64_t d = 0; d < dq; ++d) {
          r.dq[static_cast<std::size_t>((h * sq + i) * dq + d)] += scale * ds * K(g, j, d);
          r.dk[static_cast<std::size_t>((g * skv + j) * dq + d)] += scale * ds * Q(h, i, d);
        }
      }
    }
  }
  return r;
}

}  // namespace threewalls::backend::testing
