#pragma once
// The causal attention mask, optionally with a sliding window: which keys a query sees. Queries and
// keys are aligned bottom-right (query i of seq_q sees key j of seq_kv when j <= i + seq_kv - seq_q, as
// FlashAttention and cuDNN align a causal mask); a window w > 0 also hides the keys more than w - 1
// before that diagonal, so each query sees at most w keys, itself included (Megatron's --window-size
// (w - 1, 0), Hugging Face's sliding_window = w). window = 0: no window. The scenario's model FLOPs,
// the calibration's attention cost forms and the backend's masks count the same pairs through these.
// C++17 (CUDA sources include it; causal_key_range is constexpr, so the backend's kernels call it
// under --expt-relaxed-constexpr).
#include <algorithm>
#include <cstdint>

namespace threewalls {

// The keys [lo, hi) of a query (lo >= hi: none).
struct KeyRange {
  std::int64_t lo = 0, hi = 0;
};

namespace detail {
// clamp(x, 0, n), without std::clamp (device code calls it).
constexpr std::int64_t clamp_to(std::int64_t x, std::int64_t n) { return x < 0 ? 0 : (x > n ? n : x); }
}  // namespace detail

// Keys query `row` sees (0 <= row < seq_q), as a range of key indices.
constexpr KeyRange causal_key_range(std::int64_t row, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t window) {
  const std::int64_t last = row + seq_kv - seq_q;  // the diagonal key
  return {window > 0 ? detail::clamp_to(last + 1 - window, seq_kv) : 0, detail::clamp_to(last + 1, seq_kv)};
}

// Number of keys query `row` sees (0 <= row < seq_q).
inline std::int64_t causal_keys_seen(std::int64_t row, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t window) {
  const KeyRange k = causal_key_range(row, seq_q, seq_kv, window);
  return std::max<std::int64_t>(k.hi - k.lo, 0);
}

// Queries that see key `key` (0 <= key < seq_kv).
inline std::int64_t causal_queries_seeing(std::int64_t key, std::int64_t seq_q, std::int64_t seq_kv,
                                          std::int64_t window) {
  const std::int64_t first = key - (seq_kv - seq_q);  // the query on the key's diagonal
  const std::int64_t lo = std::clamp<std::int64_t>(first, 0, seq_q);
  const std::int64_t hi = window > 0 ? std::clamp<std::int64_t>(first + window, 0, seq_q) : seq_q;
  return std::max<std::int64_t>(hi - lo, 0);
}

namespace detail {
// sum over t <= x of clamp(t, 0, n) (0 for x <= 0).
inline double clamped_prefix_sum(double x, double n) {
  if (x <= 0) return 0.0;
  if (x <= n) return x * (x + 1.0) / 2.0;
  return n * (n + 1.0) / 2.0 + (x - n) * n;
}
// sum over rows r in [0, seq_q) of clamp(r + c, 0, n).
inline double clamped_row_sum(double c, double seq_q, double n) {
  return clamped_prefix_sum(c + seq_q - 1.0, n) - clamped_prefix_sum(c - 1.0, n);
}
}  // namespace detail

// (query, key) pairs the mask keeps: the sum of causal_keys_seen over the queries, in closed form.
inline double causal_pairs(std::int64_t seq_q, std::int64_t seq_kv, std::int64_t window) {
  if (seq_q <= 0 || seq_kv <= 0) return 0.0;
  const double sq = static_cast<double>(seq_q);
  const double skv = static_cast<double>(seq_kv);
  const double c = skv - sq + 1.0;  // row r sees clamp(r + c, 0, skv) keys before the window
  double pairs = detail::clamped_row_sum(c, sq, skv);
  if (window > 0) pairs -= detail::clamped_row_sum(c - static_cast<double>(window), sq, skv);
  return pairs;
}

}  // namespace threewalls
