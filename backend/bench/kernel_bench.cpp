// kernel_bench: figures of the backend's kernels on the GPU it runs on.
//
//   kernel_bench [--quick] [--only gemm,grouped,attention,memory,copy,nccl,scenario] [--scenario FILE]
//                [--attention-shape B,S,H,KV,DQK,DV,CAUSAL[,WINDOW] ...]   (more training attention shapes,
//                                                                  fused and unfused; WINDOW: sliding window)
//                [--reference TORCH_SDPA_JSON]
//   kernel_bench --attention-shapes      (the attention cases as JSON, for scripts/torch_sdpa_reference.py)
//
// Prints one line per measurement: name, shape, median time and the rate (TFLOP/s for compute,
// GB/s for memory and copies, bus GB/s for collectives), the spread of the samples, and for the
// grouped GEMM the ratio to a dense GEMM of the same FLOPs. All inputs are seeded random data
// (never zeros). Collective bus bandwidth follows nccl-tests: all-reduce busbw = algbw * 2(n-1)/n,
// all-to-all busbw = algbw * (n-1)/n, algbw = size / time.
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/copies.hpp"
#include "threewalls/backend/decode_attention.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/fused_attention.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/backend/timing.hpp"
#include "threewalls/scenarios/loader.hpp"

#include <nlohmann/json.hpp>

namespace tw = threewalls::backend;

namespace {

bool g_quick = false;

tw::TimingOptions opts() {
  tw::TimingOptions o;
  o.warmup = g_quick ? 2 : 5;
  o.min_reps = g_quick ? 3 : 10;
  o.max_reps = g_quick ? 10 : 40;
  o.max_seconds = g_quick ? 0.5 : 1.5;
  return o;
}

void row(const std::string& name, const std::string& shape, const tw::TimingResult& t, double rate,
         const char* unit, const std::string& extra = "") {
  std::printf("%-28s %-44s %10.4f ms %9.1f %-7s spread %5.1f%% %s\n", name.c_str(), shape.c_str(), t.median_ms(), rate,
              unit, 100.0 * t.spread(), extra.c_str());
  std::fflush(stdout);
}

std::string dims(std::initializer_list<std::int64_t> d, const char* sep = "x") {
  std::string s;
  for (const auto v : d) s += (s.empty() ? "" : sep) + std::to_string(v);
  return s;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }
double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

tw::DeviceBuffer random_bf16(std::size_t n, std::uint64_t seed) {
  tw::DeviceBuffer b(n * sizeof(tw::bf16));
  tw::fill_random(b.as<tw::bf16>(), static_cast<std::int64_t>(n), seed, 1.0F, nullptr);
  return b;
}

// ---- dense GEMM ----
double dense_gemm(tw::CublasLt& lt, tw::Stream& s, tw::GemmLayout layout, std::int64_t m, std::int64_t n, std::int64_t k,
                  tw::GemmType type, const char* label) {
  const std::size_t in_bytes = type == tw::GemmType::e4m3 ? 1 : 2;
  tw::DeviceBuffer a(static_cast<std::size_t>(m * k) * in_bytes), b(static_cast<std::size_t>(k * n) * in_bytes);
  tw::DeviceBuffer c(static_cast<std::size_t>(m * n) * 2);
  if (type == tw::GemmType::e4m3) {
    tw::fill_random(a.as<tw::fp8>(), m * k, 1, 1.0F, s);
    tw::fill_random(b.as<tw::fp8>(), k * n, 2, 1.0F, s);
  } else {
    tw::fill_random(a.as<tw::bf16>(), m * k, 1, 1.0F, s);
    tw::fill_random(b.as<tw::bf16>(), k * n, 2, 1.0F, s);
  }
  const tw::GemmShape g = tw::linear_gemm(layout, m, n, k, type);
  const auto t = tw::time_device([&](cudaStream_t st) { lt.gemm(g, a.data(), b.data(), c.data(), st); }, s, opts());
  const double tf = tflops(2.0 * m * n * k, t.median_ms());
  row(label, dims({m, n, k}), t, tf, "TFLOP/s");
  return tf;
}

void bench_gemm(tw::CublasLt& lt, tw::Stream& s) {
  std::printf("\n# dense GEMM (cuBLASLt, bf16 in/out, fp32 accumulate; fp8 e4m3 in, bf16 out)\n");
  dense_gemm(lt, s, tw::GemmLayout::forward, 8192, 8192, 8192, tw::GemmType::bfloat16, "gemm bf16 fwd");
  dense_gemm(lt, s, tw::GemmLayout::dgrad, 8192, 8192, 8192, tw::GemmType::bfloat16, "gemm bf16 dgrad");
  dense_gemm(lt, s, tw::GemmLayout::wgrad, 8192, 8192, 8192, tw::GemmType::bfloat16, "gemm bf16 wgrad");
  dense_gemm(lt, s, tw::GemmLayout::forward, 16384, 8192, 4096, tw::GemmType::bfloat16, "gemm bf16 fwd");
  for (const std::int64_t m : {1024, 16384}) {
    dense_gemm(lt, s, tw::GemmLayout::forward, m, 1408, 2048, tw::GemmType::bfloat16, "gemm bf16 fwd (expert)");
  }
  dense_gemm(lt, s, tw::GemmLayout::forward, 8192, 8192, 8192, tw::GemmType::e4m3, "gemm fp8 fwd");
}

// ---- grouped GEMM vs dense at equal FLOPs ----
void bench_grouped(tw::CublasLt& lt, tw::Stream& s) {
  std::printf("\n# grouped expert GEMM vs one dense GEMM of the same FLOPs (target: grouped >= 85%% of dense)\n");
  struct Case {
    std::int64_t experts, rows, n, k;
    std::int64_t hot;  // rows of expert 0 (imbalance); 0 = balanced
  };
  std::vector<Case> cases{{64, 768, 1408, 2048, 0}, {64, 512, 1408, 2048, 0}, {64, 768, 1408, 2048, 3 * 768},
                          {8, 4096, 14336, 4096, 0}};
  if (g_quick) cases.resize(2);
  for (const Case& c : cases) {
    const std::int64_t total = c.experts * c.rows;
    const std::vector<std::int64_t> rows =
        tw::expert_rows(total, c.experts, c.hot > 0 ? c.hot : c.rows);
    tw::DeviceBuffer a = random_bf16(static_cast<std::size_t>(total * c.k), 3);
    tw::DeviceBuffer w = random_bf16(static_cast<std::size_t>(c.experts * c.n * c.k), 4);
    tw::DeviceBuffer y(static_cast<std::size_t>(total * c.n) * 2);
    const double flops = 2.0 * total * c.n * c.k;
    // Dense reference: the same tokens through one weight of [n, k].
    const tw::GemmShape g = tw::linear_gemm(tw::GemmLayout::forward, total, c.n, c.k);
    const auto td = tw::time_device([&](cudaStream_t st) { lt.gemm(g, a.data(), w.data(), y.data(), st); }, s, opts());
    const double dense_tf = tflops(flops, td.median_ms());
    const std::string shape = std::to_string(c.experts) + " experts x " + std::to_string(c.rows) + " n" +
                              std::to_string(c.n) + " k" + std::to_string(c.k) + (c.hot > 0 ? " hot " + std::to_string(c.hot) : "");
    row("dense same flops", dims({total, c.n, c.k}), td, dense_tf, "TFLOP/s");
    // Strided batched (only possible when balanced): what one batched kernel reaches.
    if (c.hot == 0) {
      tw::GemmShape gb = tw::linear_gemm(tw::GemmLayout::forward, c.rows, c.n, c.k);
      gb.batch = c.experts;
      gb.stride_a = c.rows * c.k;
      gb.stride_b = c.n * c.k;
      gb.stride_c = c.rows * c.n;
      const auto tb = tw::time_device([&](cudaStream_t st) { lt.gemm(gb, a.data(), w.data(), y.data(), st); }, s, opts());
      const double tf = tflops(flops, tb.median_ms());
      char extra[64];
      std::snprintf(extra, sizeof extra, "%.1f%% of dense", 100.0 * tf / dense_tf);
      row("strided batched (balanced)", shape, tb, tf, "TFLOP/s", extra);
    }
    for (const tw::GroupedImpl impl : {tw::GroupedImpl::lt_batched, tw::GroupedImpl::lt_batched_streams,
                                       tw::GroupedImpl::cublas_grouped, tw::GroupedImpl::lt_loop, tw::GroupedImpl::lt_streams}) {
      try {
        tw::GroupedGemm gg(lt, tw::GemmLayout::forward, rows, c.n, c.k, a.as<tw::bf16>(), w.as<tw::bf16>(),
                           y.as<tw::bf16>(), impl, 4);
        const auto t = tw::time_device([&](cudaStream_t st) { gg.run(st); }, s, opts());
        const double tf = tflops(flops, t.median_ms());
        char extra[64];
        std::snprintf(extra, sizeof extra, "%.1f%% of dense", 100.0 * tf / dense_tf);
        row(std::string("grouped ") + tw::to_string(impl), shape, t, tf, "TFLOP/s", extra);
      } catch (const std::exception& e) {
        std::printf("grouped %-20s %s: FAILED: %s\n", tw::to_string(impl), shape.c_str(), e.what());
      }
    }
    // The same grouped GEMM in the backward layouts.
    for (const tw::GroupedImpl impl : {tw::GroupedImpl::lt_batched, tw::GroupedImpl::cublas_grouped})
    for (const tw::GemmLayout layout : {tw::GemmLayout::dgrad, tw::GemmLayout::wgrad}) {
      try {
        // dgrad: A = dY [T, n], B = W, C = dX [T, k]; wgrad: A = dY [T, n], B = X [T, k], C = dW.
        tw::DeviceBuffer dy = random_bf16(static_cast<std::size_t>(total * c.n), 5);
        tw::DeviceBuffer out(static_cast<std::size_t>(std::max(total * c.k, c.experts * c.n * c.k)) * 2);
        const tw::bf16* b = layout == tw::GemmLayout::dgrad ? w.as<tw::bf16>() : a.as<tw::bf16>();
        tw::GroupedGemm gg(lt, layout, rows, c.n, c.k, dy.as<tw::bf16>(), b, out.as<tw::bf16>(), impl);
        const auto t = tw::time_device([&](cudaStream_t st) { gg.run(st); }, s, opts());
        const double tf = tflops(flops, t.median_ms());
        char extra[64];
        std::snprintf(extra, sizeof extra, "%.1f%% of dense fwd", 100.0 * tf / dense_tf);
        row(std::string("grouped ") + tw::to_string(impl) + (layout == tw::GemmLayout::dgrad ? " dgrad" : " wgrad"), shape,
            t, tf, "TFLOP/s", extra);
      } catch (const std::exception& e) {
        std::printf("grouped backward %s: FAILED: %s\n", shape.c_str(), e.what());
      }
    }
  }
}

// ---- attention ----
// The attention cases: one list, printed as JSON by --attention-shapes for
// scripts/torch_sdpa_reference.py, so the reference measures exactly these shapes.
struct AttentionCase {
  const char* name;
  tw::AttentionShape shape;
  bool decode;  // one query per sequence over a KV cache (forward only)
};

// Shapes given with --attention-shape (training shapes: forward and backward), named by their shape.
std::vector<std::pair<std::string, tw::AttentionShape>> g_extra_attention;

// "B,S,H,KV,DQK,DV,CAUSAL[,WINDOW]" (causal 0 or 1; WINDOW, the keys each query sees, > 0 only when
// causal, 0 or absent: none) as a self-attention shape of S tokens; nullopt when malformed.
std::optional<tw::AttentionShape> parse_attention_shape(const std::string& text) {
  std::vector<std::int64_t> v;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t next = text.find(',', pos);
    const std::string part = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    try {
      std::size_t used = 0;
      v.push_back(std::stoll(part, &used));
      if (used != part.size()) return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  if (v.size() < 7 || v.size() > 8 || v[6] < 0 || v[6] > 1) return std::nullopt;
  for (std::size_t i = 0; i < 6; ++i) {
    if (v[i] <= 0) return std::nullopt;
  }
  tw::AttentionShape s{v[0], v[1], v[1], v[2], v[4], v[5], v[6] == 1};
  s.kv_heads = v[3];
  if (v.size() == 8) {
    if (v[7] < 0 || (v[7] > 0 && !s.causal)) return std::nullopt;
    s.window = v[7];
  }
  return s;
}

std::vector<AttentionCase> attention_cases() {
  auto gqa = [](tw::AttentionShape s, std::int64_t kv) {
    s.kv_heads = kv;
    return s;
  };
  std::vector<AttentionCase> c{
      {"mha causal", {2, 4096, 4096, 16, 128, 128, true}, false},
      {"gqa causal", gqa({2, 4096, 4096, 32, 128, 128, true}, 8), false},
      {"mla causal", {2, 4096, 4096, 16, 192, 128, true}, false},
      {"mha full", {2, 4096, 4096, 16, 128, 128, false}, false},
      {"decode gqa", gqa({32, 1, 4096, 32, 128, 128, true}, 8), true},
      {"decode mha long", {8, 1, 32768, 32, 128, 128, true}, true},
      {"decode gqa16", gqa({16, 1, 8192, 64, 128, 128, true}, 4), true},
      {"decode mla", gqa({64, 1, 8192, 16, 192, 128, true}, 2), true},
      {"decode small", gqa({1, 1, 2048, 32, 128, 128, true}, 8), true},
  };
  if (g_quick) c.erase(c.begin() + 3, c.begin() + 4);
  for (const auto& [name, shape] : g_extra_attention) c.push_back({name.c_str(), shape, false});
  return c;
}

void print_attention_cases() {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : attention_cases()) {
    const auto& s = c.shape;
    out.push_back({{"name", c.name},
                   {"key", tw::describe(s)},
                   {"batch", s.batch},
                   {"seq_q", s.seq_q},
                   {"seq_kv", s.seq_kv},
                   {"heads", s.heads},
                   {"kv_heads", s.kv_head_count()},
                   {"head_dim_qk", s.head_dim_qk},
                   {"head_dim_v", s.head_dim_v},
                   {"causal", s.causal},
                   {"window", s.window},
                   {"directions", c.decode ? nlohmann::json{"fwd"} : nlohmann::json{"fwd", "bwd"}}});
  }
  std::printf("%s\n", out.dump(1).c_str());
}

// PyTorch's best time per (shape key, direction) from scripts/torch_sdpa_reference.py's JSON.
struct Reference {
  std::map<std::pair<std::string, std::string>, std::pair<double, std::string>> best;  // -> (ms, backend)
  std::string source;
};

Reference load_reference(const std::string& path) {
  Reference r;
  if (path.empty()) return r;
  std::ifstream in(path);
  if (!in) throw threewalls::InputError(path + ": cannot open the --reference file");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw threewalls::InputError(path + ": not JSON: " + e.what());
  }
  r.source = path + " (torch " + j.value("torch", std::string("?")) + ", " + j.value("device", std::string("?")) + ")";
  for (const auto& e : j.at("results")) {
    if (!e.contains("median_ms")) continue;  // a backend that could not run the shape
    const auto key = std::make_pair(e.at("key").get<std::string>(), e.at("direction").get<std::string>());
    const double ms = e.at("median_ms").get<double>();
    auto it = r.best.find(key);
    if (it == r.best.end() || ms < it->second.first) r.best[key] = {ms, e.at("backend").get<std::string>()};
  }
  return r;
}

tw::TimingOptions attention_opts() {
  tw::TimingOptions o;  // CUDA events, warm-up, median of at least 20 (5 with --quick)
  o.warmup = g_quick ? 2 : 5;
  o.min_reps = g_quick ? 5 : 20;
  o.max_reps = g_quick ? 10 : 40;
  o.max_seconds = g_quick ? 0.5 : 3.0;
  return o;
}

struct AttentionRun {
  tw::TimingResult fwd, bwd;
  bool has_bwd = false;
};

void compare_to_reference(const Reference& ref, const AttentionCase& c, const char* direction, double ours_ms) {
  if (ref.source.empty()) return;
  const auto it = ref.best.find({tw::describe(c.shape), direction});
  if (it == ref.best.end()) {
    std::printf("  vs torch %-4s %-18s no reference time for this shape\n", direction, c.name);
    return;
  }
  std::printf("  vs torch %-4s %-18s ours %.4f ms, torch %s %.4f ms: ratio %.3f (ours / max(flash, cudnn) by speed)\n",
              direction, c.name, ours_ms, it->second.second.c_str(), it->second.first, it->second.first / ours_ms);
}

void bench_attention(tw::CublasLt& lt, tw::Stream& s, const std::string& reference) {
  std::printf(
      "\n# attention: fused (cuDNN SDPA graph) vs unfused (cuBLASLt batched GEMMs + masked softmax), decode\n"
      "# (split-KV kernel); model FLOPs (causal: visible pairs); decode rate = K/V bytes read / time\n");
  const Reference ref = load_reference(reference);
  if (!ref.source.empty()) std::printf("# reference: %s\n", ref.source.c_str());
  tw::Attention unfused(lt);
  std::unique_ptr<tw::FusedAttention> fused;
  std::string why;
  if (tw::fused_attention_built(&why)) {
    fused = std::make_unique<tw::FusedAttention>();
  } else {
    std::printf("# fused attention not measured: %s\n", why.c_str());
  }
  tw::DecodeAttention decode;
  for (const AttentionCase& c : attention_cases()) {
    const tw::AttentionShape& sh = c.shape;
    // The unfused path reads one K/V head per query head: GQA runs it with K/V expanded.
    tw::AttentionShape expanded = sh;
    expanded.kv_heads = 0;
    const std::int64_t bh = sh.batch * sh.heads;
    tw::DeviceBuffer q = random_bf16(static_cast<std::size_t>(bh * sh.seq_q * sh.head_dim_qk), 6);
    tw::DeviceBuffer k = random_bf16(static_cast<std::size_t>(bh * sh.seq_kv * sh.head_dim_qk), 7);
    tw::DeviceBuffer v = random_bf16(static_cast<std::size_t>(bh * sh.seq_kv * sh.head_dim_v), 8);
    tw::DeviceBuffer o(static_cast<std::size_t>(bh * sh.seq_q * sh.head_dim_v) * 2);
    tw::DeviceBuffer d_o = random_bf16(static_cast<std::size_t>(bh * sh.seq_q * sh.head_dim_v), 9);
    tw::DeviceBuffer lse(static_cast<std::size_t>(bh * sh.seq_q) * 4);
    tw::DeviceBuffer dq(q.size()), dk(k.size()), dv(v.size());
    const std::string shape = tw::describe(sh);
    const bool gqa = sh.kv_head_count() != sh.heads;
    const std::string unfused_label = std::string(c.name) + (gqa ? " unfused (kv expanded)" : " unfused");
    auto rate = [&](const tw::TimingResult& t, bool backward, const tw::AttentionShape& as) {
      return c.decode ? gbps(tw::decode_kv_bytes(as), t.median_ms())
                      : tflops(tw::attention_flops(as, backward), t.median_ms());
    };
    const char* unit = c.decode ? "GB/s(KV)" : "TFLOP/s";
    auto fwd = [&](auto&& impl, const tw::AttentionShape& as) {
      return tw::time_device(
          [&](cudaStream_t st) {
            impl.forward(as, q.as<tw::bf16>(), k.as<tw::bf16>(), v.as<tw::bf16>(), o.as<tw::bf16>(), lse.as<float>(),
                         st);
          },
          s, attention_opts());
    };
    auto bwd = [&](auto&& impl, const tw::AttentionShape& as) {
      return tw::time_device(
          [&](cudaStream_t st) {
            impl.backward(as, q.as<tw::bf16>(), k.as<tw::bf16>(), v.as<tw::bf16>(), o.as<tw::bf16>(),
                          d_o.as<tw::bf16>(), lse.as<float>(), dq.as<tw::bf16>(), dk.as<tw::bf16>(), dv.as<tw::bf16>(),
                          st);
          },
          s, attention_opts());
    };
    // Unfused: forward, then backward (which consumes the forward's lse).
    unfused.reserve(expanded);
    const auto uf = fwd(unfused, expanded);
    row(unfused_label + " fwd", shape, uf, rate(uf, false, c.decode ? sh : expanded), unit);
    std::optional<tw::TimingResult> ub;
    if (!c.decode) {
      ub = bwd(unfused, expanded);
      row(unfused_label + " bwd", shape, *ub, rate(*ub, true, expanded), unit);
    }
    if (c.decode) {
      decode.reserve(sh);
      const auto t = tw::time_device(
          [&](cudaStream_t st) {
            decode.forward(sh, q.as<tw::bf16>(), k.as<tw::bf16>(), v.as<tw::bf16>(), o.as<tw::bf16>(), lse.as<float>(),
                           st);
          },
          s, attention_opts());
      char extra[96];
      std::snprintf(extra, sizeof extra, "%.2fx unfused, %d splits", uf.median_ms() / t.median_ms(), decode.splits(sh));
      row(std::string(c.name) + " split-kv", shape, t, rate(t, false, sh), unit, extra);
      compare_to_reference(ref, c, "fwd", t.median_ms());
    }
    if (!fused) continue;
    try {
      fused->reserve(sh, !c.decode);
      const auto ff = fwd(*fused, sh);
      // A windowed plan names the form of its window mask (tw::WindowMask).
      auto mask_of = [&](bool backward) {
        const auto m = fused->window_mask(sh, backward);
        return m ? std::string(", ") + tw::window_mask_name(*m) + " mask" : std::string();
      };
      char extra[96];
      std::snprintf(extra, sizeof extra, "%.2fx unfused%s", uf.median_ms() / ff.median_ms(), mask_of(false).c_str());
      row(std::string(c.name) + " fused fwd", shape, ff, rate(ff, false, sh), unit, extra);
      if (!c.decode) compare_to_reference(ref, c, "fwd", ff.median_ms());
      if (!c.decode) {
        const auto fb = bwd(*fused, sh);
        std::snprintf(extra, sizeof extra, "%.2fx unfused%s", ub->median_ms() / fb.median_ms(), mask_of(true).c_str());
        row(std::string(c.name) + " fused bwd", shape, fb, rate(fb, true, sh), unit, extra);
        compare_to_reference(ref, c, "bwd", fb.median_ms());
      }
    } catch (const std::exception& e) {
      std::printf("%s fused: FAILED: %s\n", c.name, e.what());
    }
  }
}

// ---- memory-bound kernels ----
void bench_memory(tw::Stream& s) {
  std::printf("\n# memory-bound kernels (GB/s = bytes read + written / time)\n");
  const std::int64_t n = std::int64_t{1} << 28;  // 256 Mi elements, 512 MiB bf16
  tw::DeviceBuffer a = random_bf16(static_cast<std::size_t>(n), 10), b = random_bf16(static_cast<std::size_t>(n), 11);
  tw::DeviceBuffer c(static_cast<std::size_t>(n) * 2);
  auto t = tw::time_device([&](cudaStream_t st) { tw::copy_d2d(c.data(), a.data(), static_cast<std::size_t>(n) * 2, st); }, s, opts());
  row("d2d copy (cudaMemcpyAsync)", "512 MiB", t, gbps(2.0 * 2 * n, t.median_ms()), "GB/s");
  t = tw::time_device([&](cudaStream_t st) { tw::add(a.as<tw::bf16>(), b.as<tw::bf16>(), c.as<tw::bf16>(), n, st); }, s, opts());
  row("residual add", dims({n}), t, gbps(3.0 * 2 * n, t.median_ms()), "GB/s");
  const std::int64_t rows = 16384, hidden = 7168;
  tw::DeviceBuffer gamma = random_bf16(static_cast<std::size_t>(hidden), 12), rstd(static_cast<std::size_t>(rows) * 4);
  tw::DeviceBuffer dg(static_cast<std::size_t>(hidden) * 4);
  t = tw::time_device([&](cudaStream_t st) {
        tw::rmsnorm_fwd(a.as<tw::bf16>(), gamma.as<tw::bf16>(), c.as<tw::bf16>(), rstd.as<float>(), rows, hidden, 1e-5F, st);
      }, s, opts());
  row("rmsnorm fwd", dims({rows, hidden}), t, gbps(2.0 * 2 * rows * hidden, t.median_ms()), "GB/s");
  t = tw::time_device([&](cudaStream_t st) {
        tw::rmsnorm_bwd(b.as<tw::bf16>(), a.as<tw::bf16>(), gamma.as<tw::bf16>(), rstd.as<float>(), c.as<tw::bf16>(),
                        dg.as<float>(), rows, hidden, st);
      }, s, opts());
  row("rmsnorm bwd", dims({rows, hidden}), t, gbps(3.0 * 2 * rows * hidden, t.median_ms()), "GB/s");
  const std::int64_t h = 18432;
  const std::int64_t srows = 4096;  // x [srows, 2h] fits in `a` (256 Mi elements)
  t = tw::time_device([&](cudaStream_t st) { tw::swiglu_fwd(a.as<tw::bf16>(), c.as<tw::bf16>(), srows, h, st); }, s, opts());
  row("swiglu fwd", dims({srows, h}), t, gbps(3.0 * 2 * srows * h, t.median_ms()), "GB/s");
  // Routing + permute at a DeepSeek-like shape: 16384 tokens, 256 experts, top-8, hidden 7168.
  const std::int64_t tokens = 4096;
  const int experts = 256, topk = 8;
  tw::DeviceBuffer logits = random_bf16(static_cast<std::size_t>(tokens * experts), 13);
  tw::DeviceBuffer ids(static_cast<std::size_t>(tokens * topk) * 4), probs(ids.size()), counts(experts * 4);
  tw::DeviceBuffer offsets((experts + 1) * 4), cursor(experts * 4), map(ids.size());
  t = tw::time_device([&](cudaStream_t st) {
        tw::softmax_topk(logits.as<tw::bf16>(), ids.as<std::int32_t>(), probs.as<float>(), counts.as<std::int32_t>(),
                         tokens, experts, topk, true, st);
      }, s, opts());
  row("softmax_topk", dims({tokens, experts, topk}), t, gbps(2.0 * tokens * experts, t.median_ms()), "GB/s");
  tw::build_row_map(ids.as<std::int32_t>(), counts.as<std::int32_t>(), offsets.as<std::int32_t>(),
                    cursor.as<std::int32_t>(), map.as<std::int32_t>(), tokens, experts, topk, s);
  const std::int64_t hid = 7168;
  t = tw::time_device([&](cudaStream_t st) {
        tw::permute_fwd(a.as<tw::bf16>(), map.as<std::int32_t>(), c.as<tw::bf16>(), tokens, topk, hid, st);
      }, s, opts());
  row("permute fwd", dims({tokens * topk, hid}), t, gbps(2.0 * 2 * tokens * topk * hid, t.median_ms()), "GB/s");
  t = tw::time_device([&](cudaStream_t st) {
        tw::unpermute_fwd(c.as<tw::bf16>(), map.as<std::int32_t>(), probs.as<float>(), b.as<tw::bf16>(), tokens, topk, hid, st);
      }, s, opts());
  row("unpermute fwd", dims({tokens * topk, hid}), t, gbps(2.0 * (tokens * topk + tokens) * hid, t.median_ms()), "GB/s");
}

// ---- copies ----
void bench_copies(tw::Stream& s) {
  std::printf("\n# host <-> device copies\n");
  for (const std::size_t bytes : {std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{256} << 20}) {
    tw::DeviceBuffer d(bytes);
    tw::PinnedBuffer p(bytes);
    std::memset(p.data(), 0x5A, bytes);
    std::vector<char> pageable(bytes, 0x5A);
    const std::string size = tw::format_size(bytes);
    auto t = tw::time_device([&](cudaStream_t st) { tw::copy_h2d(d.data(), p.data(), bytes, st); }, s, opts());
    row("h2d pinned", size, t, gbps(static_cast<double>(bytes), t.median_ms()), "GB/s");
    t = tw::time_device([&](cudaStream_t st) { tw::copy_d2h(p.data(), d.data(), bytes, st); }, s, opts());
    row("d2h pinned", size, t, gbps(static_cast<double>(bytes), t.median_ms()), "GB/s");
    t = tw::time_device([&](cudaStream_t st) { tw::copy_h2d(d.data(), pageable.data(), bytes, st); }, s, opts());
    row("h2d pageable", size, t, gbps(static_cast<double>(bytes), t.median_ms()), "GB/s");
    t = tw::time_device([&](cudaStream_t st) { tw::copy_d2h(pageable.data(), d.data(), bytes, st); }, s, opts());
    row("d2h pageable", size, t, gbps(static_cast<double>(bytes), t.median_ms()), "GB/s");
  }
  // Disk tier: a file read into pinned memory (O_DIRECT where supported).
  const std::size_t bytes = std::size_t{256} << 20;
  const std::string path = "/tmp/threewalls_kernel_bench.bin";
  tw::write_random_file(path, bytes, 1);
  tw::PinnedBuffer p(tw::round_up_direct(bytes));
  bool direct = false;
  const auto t = tw::time_device([&](cudaStream_t) { direct = tw::read_file_into(path, 0, bytes, p).direct; }, s, opts());
  row("disk read -> pinned", tw::format_size(bytes), t, gbps(static_cast<double>(bytes), t.median_ms()), "GB/s",
      direct ? "(O_DIRECT; host time)" : "(buffered, page cache; host time)");
  std::remove(path.c_str());
}

// ---- the compute/memory ops of one rank class of a scenario, through OpRunner ----
void bench_scenario(const std::string& path, tw::Stream& s) {
  std::printf("\n# OpRunner over the compute, memory and copy ops of rank class 0 of %s (comm and host ops left out)\n",
              path.c_str());
  const threewalls::scenarios::Scenario sc = threewalls::scenarios::load_scenario(path);
  const threewalls::scenarios::StepGraph graph = threewalls::scenarios::expand(sc, 0);
  std::vector<threewalls::scenarios::Op> ops;
  for (const auto& op : graph.classes.front().ops) {
    if (op.kind != threewalls::scenarios::OpKind::host && !op.is_comm()) ops.push_back(op);
  }
  tw::OpRunner runner(tw::OpRunnerConfig{});
  runner.prepare(ops);
  for (const auto& op : ops) runner.run(op, s);  // warm-up: plans, heuristics
  s.synchronize();
  tw::EventPool pool(true);
  std::vector<tw::EventPool::Lease> marks;
  marks.reserve(ops.size() + 1);
  marks.push_back(pool.acquire());
  marks.back().event().record(s);
  for (const auto& op : ops) {
    runner.run(op, s);
    marks.push_back(pool.acquire());
    marks.back().event().record(s);
  }
  s.synchronize();
  std::map<std::string, std::pair<double, int>> by_kind;
  double total = 0.0, flops = 0.0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const double ms = tw::Event::elapsed_ms(marks[i].event(), marks[i + 1].event());
    auto& e = by_kind[threewalls::scenarios::to_string(ops[i].kind)];
    e.first += ms;
    ++e.second;
    total += ms;
    flops += ops[i].flops;
  }
  for (const auto& [kind, v] : by_kind) std::printf("  %-16s %6d ops %10.3f ms\n", kind.c_str(), v.second, v.first);
  std::printf("  %-16s %6zu ops %10.3f ms  %.1f TFLOP/s over the op FLOPs  (device memory %s)\n", "total", ops.size(), total,
              flops / (total * 1e-3) / 1e12, tw::format_size(runner.device_bytes()).c_str());
}

// ---- NCCL (one thread per GPU) ----
void bench_nccl(int gpus) {
  std::printf("\n# NCCL collectives over %d GPUs (bus bandwidth, nccl-tests definitions)\n", gpus);
  if (gpus < 2) {
    std::printf("skipped: needs >= 2 GPUs, found %d\n", gpus);
    return;
  }
  using threewalls::scenarios::Group;
  const threewalls::scenarios::Layout layout(1, 1, gpus, 1, 1, gpus, 1, gpus);
  const tw::UniqueIdTable ids = tw::UniqueIdTable::create(layout, {Group::dp});
  std::vector<std::string> lines(static_cast<std::size_t>(gpus));
  auto rank_main = [&](int rank) {
    try {
      tw::set_device(rank);
      tw::set_thread_rank(rank);
      tw::CommTable table = tw::CommTable::create(layout, rank, ids, {Group::dp}, std::chrono::seconds(120));
      tw::NcclComm& c = table.comm(Group::dp);
      tw::Stream s;
      const std::size_t max_bytes = std::size_t{1} << 30;
      tw::DeviceBuffer in = random_bf16(max_bytes / 2, 20 + static_cast<std::uint64_t>(rank)), out(max_bytes);
      const double n = gpus;
      for (std::size_t bytes = std::size_t{64} << 20; bytes <= max_bytes; bytes *= 4) {
        const std::size_t count = bytes / 2;
        tw::TimingOptions o = opts();
        o.max_reps = 20;
        const auto ta = tw::time_device([&](cudaStream_t st) { tw::all_reduce(in.data(), out.data(), count, c, st); }, s, o);
        const auto tt = tw::time_device(
            [&](cudaStream_t st) { tw::all_to_all(in.data(), out.data(), count / static_cast<std::size_t>(gpus), c, st); }, s, o);
        // nccl-tests' and PyTorch's way: kLoop calls back to back between two events, the mean per
        // call (launch gaps and the ranks' skew overlap with the previous call instead of adding).
        constexpr int kLoop = 20;
        tw::TimingOptions lo = opts();
        lo.warmup = 1;
        lo.min_reps = 3;
        lo.max_reps = 5;
        auto per_call = [&](tw::TimingResult r) {
          for (double& x : r.samples_ms) x /= kLoop;
          return r;
        };
        const auto la = per_call(tw::time_device(
            [&](cudaStream_t st) {
              for (int i = 0; i < kLoop; ++i) tw::all_reduce(in.data(), out.data(), count, c, st);
            },
            s, lo));
        const auto lt = per_call(tw::time_device(
            [&](cudaStream_t st) {
              for (int i = 0; i < kLoop; ++i)
                tw::all_to_all(in.data(), out.data(), count / static_cast<std::size_t>(gpus), c, st);
            },
            s, lo));
        if (rank == 0) {
          row("all_reduce", tw::format_size(bytes), ta, gbps(static_cast<double>(bytes), ta.median_ms()) * 2 * (n - 1) / n, "busGB/s");
          row("all_to_all", tw::format_size(bytes), tt, gbps(static_cast<double>(bytes), tt.median_ms()) * (n - 1) / n, "busGB/s");
          row("all_reduce x20 back to back", tw::format_size(bytes), la,
              gbps(static_cast<double>(bytes), la.median_ms()) * 2 * (n - 1) / n, "busGB/s");
          row("all_to_all x20 back to back", tw::format_size(bytes), lt,
              gbps(static_cast<double>(bytes), lt.median_ms()) * (n - 1) / n, "busGB/s");
        }
      }
    } catch (const std::exception& e) {
      lines[static_cast<std::size_t>(rank)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (const auto& l : lines) {
    if (!l.empty()) std::printf("nccl FAILED: %s\n", l.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> only;
  std::string scenario, reference;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--scenario" && i + 1 < argc) {
      scenario = argv[++i];
    } else if (a == "--reference" && i + 1 < argc) {
      reference = argv[++i];
    } else if (a == "--attention-shape" && i + 1 < argc) {
      const std::string text = argv[++i];
      const auto shape = parse_attention_shape(text);
      if (!shape) {
        std::fprintf(stderr,
                     "kernel_bench: --attention-shape '%s': expected B,S,H,KV,DQK,DV,CAUSAL[,WINDOW] (positive "
                     "integers, causal 0 or 1, WINDOW >= 0 keys per query and > 0 only with causal 1), e.g. "
                     "1,4096,64,64,192,128,1 or 1,4096,64,8,64,64,1,128\n",
                     text.c_str());
        return threewalls::kExitInputError;
      }
      g_extra_attention.emplace_back(std::string("shape ").append(text), *shape);
    } else if (a == "--attention-shapes") {
      print_attention_cases();
      return 0;
    } else if (a == "--quick") {
      g_quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      std::string list = argv[++i];
      std::size_t pos = 0;
      while (pos != std::string::npos) {
        const std::size_t next = list.find(',', pos);
        only.insert(list.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
        pos = next == std::string::npos ? next : next + 1;
      }
    } else {
      std::fprintf(stderr,
                   "kernel_bench: unknown argument '%s'\nusage: kernel_bench [--quick] [--only "
                   "gemm,grouped,attention,memory,copy,nccl,scenario] [--scenario FILE] [--reference TORCH_SDPA_JSON] "
                   "[--attention-shape B,S,H,KV,DQK,DV,CAUSAL[,WINDOW] ...] | --attention-shapes\n",
                   a.c_str());
      return threewalls::kExitInputError;
    }
  }
  const auto want = [&](const char* s) { return only.empty() || only.count(s) != 0; };
  try {
    std::string reason;
    const int gpus = tw::device_count(&reason);
    if (gpus == 0) {
      std::fprintf(stderr, "kernel_bench: no CUDA device: %s\n", reason.c_str());
      return threewalls::kExitSystemError;
    }
    tw::set_device(0);
    cudaDeviceProp prop{};
    TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    TW_CUDA_CHECK(cudaDriverGetVersion(&driver));
    TW_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("# kernel_bench: %s, %d SMs, %.0f GiB, driver %d, runtime %d, NCCL %s, %d GPU(s)%s\n", prop.name,
                prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30), driver, runtime,
                tw::nccl_version().c_str(), gpus, g_quick ? ", quick" : "");
    std::printf("%-28s %-44s %13s %17s\n", "what", "shape", "median", "rate");
    tw::CublasLt lt;
    tw::Stream s;
    if (want("gemm")) bench_gemm(lt, s);
    if (want("grouped")) bench_grouped(lt, s);
    if (want("attention")) bench_attention(lt, s, reference);
    if (want("memory")) bench_memory(s);
    if (want("copy")) bench_copies(s);
    if (want("nccl")) bench_nccl(gpus);
    if (!scenario.empty() && want("scenario")) bench_scenario(scenario, s);
  } catch (const threewalls::InputError& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return threewalls::kExitInputError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return threewalls::kExitSystemError;
  }
  return 0;
}
