// The table of group benchmarks and what they share.
#include "bench.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"

namespace threewalls::calibration::bench::detail {

namespace be = threewalls::backend;

void GroupBench::sync() const { TW_CUDA_CHECK(cudaStreamSynchronize(s())); }

void GroupBench::device(const Work& w, bool batch, const StopRule& rule, Record& r) const {
  measure_device(rule, ctx_.clock, *ctx_.timer, s(), w, batch, r);
}

GroupBenchFactory group_bench(std::string_view group) {
  static const std::vector<std::pair<std::string_view, GroupBenchFactory>> table = {
#define THREEWALLS_CALIBRATION_FAMILY(module, group) {#group, &make_##group##_bench},
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY
  };
  for (const auto& [name, factory] : table) {
    if (name == group) return factory;
  }
  return nullptr;
}

be::DeviceBuffer random_bf16(std::size_t elements, std::uint64_t seed, cudaStream_t s) {
  be::DeviceBuffer b(std::max<std::size_t>(elements, 1) * 2);
  be::fill_random(b.as<be::bf16>(), static_cast<std::int64_t>(elements), seed, 1.0F, s);
  return b;
}

std::string check_gemm(const be::GemmShape& g, const void* a, const void* b, const void* c, bool fp8) {
  CheckLog log(std::string("C = op(A) op(B) against a CPU dot product (") + (fp8 ? "e4m3" : "bf16") + " inputs)");
  const std::int64_t m = g.m, n = g.n, k = g.k;
  const std::vector<std::pair<std::int64_t, std::int64_t>> at{
      {0, 0}, {m - 1, n - 1}, {m / 2, n / 3}, {m / 3, n - 1}, {m - 1, 0}};
  for (const auto& [i, j] : at) {
    const bool ta = g.ta == be::Trans::t, tb = g.tb == be::Trans::t;
    // op(A)[i, l]: A stored [m, k] (n) or [k, m] (t); op(B)[l, j]: B stored [k, n] (n) or [n, k] (t).
    const std::int64_t a_first = ta ? i : i * k, a_stride = ta ? m : 1;
    const std::int64_t b_first = tb ? j * k : j, b_stride = tb ? 1 : n;
    const auto av = fp8 ? download_fp8(a, a_first, k, a_stride) : download_bf16(a, a_first, k, a_stride);
    const auto bv = fp8 ? download_fp8(b, b_first, k, b_stride) : download_bf16(b, b_first, k, b_stride);
    double ref = 0.0, norm = 0.0;
    for (std::int64_t l = 0; l < k; ++l) {
      const double p = av[sz(l)] * bv[sz(l)];
      ref += p;
      norm += p * p;
    }
    const double got = download_bf16(c, i * n + j, 1)[0];
    log.expect_near(got, ref, 0.02 * std::sqrt(norm) + 0.01 * std::fabs(ref) + 1e-6,
                    "C[" + std::to_string(i) + "," + std::to_string(j) + "]");
  }
  return log.passed();
}

AttnRef attention_row(const be::AttentionShape& s, const void* q, const void* k, const void* v, std::int64_t row) {
  const auto qv = download_bf16(q, row * s.head_dim_qk, s.head_dim_qk);
  const auto kv = download_bf16(k, 0, s.seq_kv * s.head_dim_qk);
  const auto vv = download_bf16(v, 0, s.seq_kv * s.head_dim_v);
  const std::int64_t last = s.causal ? std::min(s.seq_kv - 1, row + s.seq_kv - s.seq_q) : s.seq_kv - 1;
  AttnRef r;
  r.p.assign(sz(s.seq_kv), 0.0);
  r.o.assign(sz(s.head_dim_v), 0.0);
  double mx = -1e300;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim_qk));
  for (std::int64_t j = 0; j <= last; ++j) {
    double dot = 0.0;
    for (std::int64_t d = 0; d < s.head_dim_qk; ++d) dot += qv[sz(d)] * kv[sz(j * s.head_dim_qk + d)];
    r.p[sz(j)] = dot * scale;
    mx = std::max(mx, r.p[sz(j)]);
  }
  double sum = 0.0;
  for (std::int64_t j = 0; j <= last; ++j) sum += (r.p[sz(j)] = std::exp(r.p[sz(j)] - mx));
  for (std::int64_t j = 0; j <= last; ++j) {
    r.p[sz(j)] /= sum;
    for (std::int64_t d = 0; d < s.head_dim_v; ++d) r.o[sz(d)] += r.p[sz(j)] * vv[sz(j * s.head_dim_v + d)];
  }
  return r;
}

Rotation::Rotation(const be::DeviceBuffer& buf, std::size_t bytes, std::size_t run_bytes, std::size_t max_copies)
    : base_(static_cast<char*>(buf.data())), stride_((std::max<std::size_t>(bytes, 1) + 255) / 256 * 256) {
  const std::size_t fit = bytes > buf.size() ? 0 : 1 + (buf.size() - bytes) / stride_;
  const std::size_t want =
      (kRotationBytes + std::max<std::size_t>(run_bytes, 1) - 1) / std::max<std::size_t>(run_bytes, 1);
  count_ = std::clamp<std::size_t>(std::min(fit, want), 1, max_copies);
  if (fit == 0) throw std::logic_error("calibration buffer smaller than one operand");
}

std::string rotation_note(const Rotation& a, const Rotation& b, const Rotation& c) {
  return "; operands rotate through " + std::to_string(a.count()) + "/" + std::to_string(b.count()) + "/" +
         std::to_string(c.count()) + " copies (cold L2)";
}

LaunchCounter::LaunchCounter(cudaStream_t s) : buf_(sizeof(int)) {
  TW_CUDA_CHECK(cudaMemsetAsync(buf_.data(), 0, sizeof(int), s));
}

int LaunchCounter::read(cudaStream_t s) const {
  TW_CUDA_CHECK(cudaStreamSynchronize(s));
  int v = 0;
  TW_CUDA_CHECK(cudaMemcpy(&v, buf_.data(), sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

std::string LaunchCounter::expect(cudaStream_t s, int before, long long launched, const char* what) const {
  const int got = read(s) - before;
  if (got != launched) {
    throw std::runtime_error(std::string("correctness check failed: ") + what + ": " + std::to_string(got) + " of " +
                             std::to_string(launched) + " counting kernels ran");
  }
  return std::string("passed: all ") + std::to_string(launched) + " counting kernels ran (" + what + ")";
}

}  // namespace threewalls::calibration::bench::detail
