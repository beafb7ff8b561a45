#include "threewalls/backend/op_runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "threewalls/backend/copies.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/scenarios/parameters.hpp"

namespace threewalls::backend {

using scenarios::Collective;
using scenarios::CopyKind;
using scenarios::DType;
using scenarios::Op;
using scenarios::OpKind;

namespace {

std::string describe(const Op& op) {
  std::string s = std::string("op ") + scenarios::to_string(op.kind) + " (phase " + std::to_string(op.phase) +
                  ", layer " + std::to_string(op.layer) + ", microbatch " + std::to_string(op.microbatch) + ", shape [";
  for (std::size_t i = 0; i < op.shape.size(); ++i) s += (i ? "," : "") + std::to_string(op.shape[i]);
  return s + "], flags " + std::to_string(op.flags) + ")";
}

[[noreturn]] void unsupported(const Op& op, const std::string& why) {
  throw InputError(rank_prefix() + describe(op) + ": " + why);
}

// The op's attention shape with its key/value heads (GQA) for the fused and decode kernels; the
// unfused kernel reads one key/value head per query head (a framework repeats K and V to GQA's heads).
// The sliding window (shape[7]) reaches the fused and unfused kernels; a decode step's shape has none
// (the StepGraph gives it the window's keys as seq_kv), and the decode kernel refuses one.
AttentionShape attention_shape(const Op& op, bool unfused) {
  const auto& s = op.shape;
  AttentionShape a{s[0], s[1], s[2], s[3], s[4], s[5], (op.flags & scenarios::kCausal) != 0};
  a.kv_heads = unfused ? 0 : scenarios::attention_kv_heads(op);
  a.window = s[7];
  return a;
}

// The kernel an attention op runs on: scenarios::attention_kernel, except that a decode shape the
// split-KV kernel does not take (head dims) runs on the fused kernel.
scenarios::AttentionKernel kernel_of(const Op& op) {
  const scenarios::AttentionKernel k = scenarios::attention_kernel(op);
  if (k == scenarios::AttentionKernel::decode && !decode_attention_supports(attention_shape(op, false))) {
    return scenarios::AttentionKernel::fused;
  }
  return k;
}

// The shape the op's kernel (kernel_of) runs.
AttentionShape kernel_shape(const Op& op) {
  return attention_shape(op, kernel_of(op) == scenarios::AttentionKernel::unfused);
}

bool backward(const Op& op) { return (op.flags & scenarios::kBackward) != 0; }

GemmLayout layout_of(const Op& op) {
  if ((op.flags & scenarios::kWgrad) != 0) return GemmLayout::wgrad;
  if (backward(op)) return GemmLayout::dgrad;
  return GemmLayout::forward;
}

std::size_t b16(std::int64_t n) { return static_cast<std::size_t>(std::max<std::int64_t>(n, 0)) * 2; }
std::size_t b32(std::int64_t n) { return static_cast<std::size_t>(std::max<std::int64_t>(n, 0)) * 4; }

void require_positive(const Op& op, int count) {
  for (int i = 0; i < count; ++i) {
    if (op.shape[static_cast<std::size_t>(i)] <= 0) {
      unsupported(op, "shape[" + std::to_string(i) + "] must be positive");
    }
  }
}

// Element-wise ops say what they compute (Op::sub, scenarios::ElementwiseKind). GeLU (forward and
// backward) and the gradient-norm reduction have no kernel of their own: they run the copy / add
// kernel with the same memory traffic (the ops are memory-bound, so the time is what matters). The
// fp8 cast runs the per-tensor cast(-transpose) kernel for every recipe (block scales are not
// computed: at most 1/32 byte per element of their traffic), from an fp8 source (a weight kept in
// fp8, Op::dtype fp8) the transpose.
enum class Elementwise : std::uint8_t { copy, add, swiglu, swiglu_bwd, quantize, amax };
Elementwise elementwise_of(const Op& op) {
  switch (op.elementwise_kind()) {
    case scenarios::ElementwiseKind::add: return Elementwise::add;
    case scenarios::ElementwiseKind::copy: return Elementwise::copy;
    case scenarios::ElementwiseKind::swiglu: return Elementwise::swiglu;
    case scenarios::ElementwiseKind::swiglu_bwd: return Elementwise::swiglu_bwd;
    case scenarios::ElementwiseKind::gelu: return Elementwise::copy;
    case scenarios::ElementwiseKind::gelu_bwd: return Elementwise::add;
    case scenarios::ElementwiseKind::reduce: return Elementwise::copy;
    case scenarios::ElementwiseKind::quantize: return Elementwise::quantize;
    case scenarios::ElementwiseKind::amax: return Elementwise::amax;
  }
  return Elementwise::add;
}

// With a parameter state, the ops that work on it need no buffer slots (parameter_state.hpp).
bool on_state(const Op& op, const OpRunnerConfig& config) {
  return config.parameter_state != nullptr && scenarios::works_on_parameter_state(op);
}

// GroupedGemm's (n, k) are the forward layer's (output width, input width). A dgrad op's shape is
// the dgrad GEMM's own {rows, k_fwd, n_fwd} (C[rows, k_fwd] = dY[rows, n_fwd] W), forward and wgrad
// ops carry {rows, n_fwd, k_fwd} (see StepGraph expansion).
std::pair<std::int64_t, std::int64_t> grouped_nk(const Op& op) {
  if (layout_of(op) == GemmLayout::dgrad) return {op.shape[2], op.shape[1]};
  return {op.shape[1], op.shape[2]};
}

// permute/unpermute: rows = tokens * topk; topk from op.tokens when it divides the rows.
int topk_of(const Op& op) {
  const std::int64_t rows = op.shape[0];
  if (op.tokens > 0 && rows % op.tokens == 0 && rows / op.tokens <= 32) return static_cast<int>(rows / op.tokens);
  return 1;
}

std::size_t collective_elems(double bytes) {
  return static_cast<std::size_t>(std::max(1.0, std::floor(bytes / 2.0)));
}

}  // namespace

struct OpRunner::Routing {
  std::int64_t tokens = 0;
  int k = 1;
  DeviceBuffer ids, probs, counts, offsets, cursor, row_map;
};

void OpRunner::Need::merge(const Need& o) {
  for (int i = 0; i < kBf16Slots; ++i) bf16[i] = std::max(bf16[i], o.bf16[i]);
  for (int i = 0; i < kF32Slots; ++i) f32[i] = std::max(f32[i], o.f32[i]);
  for (int i = 0; i < kI32Slots; ++i) i32[i] = std::max(i32[i], o.i32[i]);
  for (int i = 0; i < kF8Slots; ++i) f8[i] = std::max(f8[i], o.f8[i]);
  pinned = std::max(pinned, o.pinned);
  pageable = std::max(pageable, o.pageable);
  disk_file = std::max(disk_file, o.disk_file);
}

OpRunner::OpRunner(OpRunnerConfig config, CommTable* comms)
    : cfg_(std::move(config)), comms_(comms), lt_(std::make_unique<CublasLt>()), read_flag_(64) {
  char name[64];
  std::snprintf(name, sizeof name, "/threewalls_disk_tier_%d_%d.bin", static_cast<int>(::getpid()), thread_rank());
  disk_path_ = cfg_.scratch_dir + name;
}

OpRunner::~OpRunner() {
  if (disk_bytes_ > 0) ::unlink(disk_path_.c_str());
}

OpRunner::Need OpRunner::need_of(const Op& op, const OpRunnerConfig& config) {
  Need n;
  const auto& s = op.shape;
  switch (op.kind) {
    case OpKind::gemm: {
      require_positive(op, 3);
      const std::int64_t batch = std::max<std::int64_t>(s[3], 1);
      const std::int64_t m = s[0], nn = s[1], k = s[2];
      if (op.dtype == DType::fp8) {
        if (m % 16 != 0 || nn % 16 != 0 || k % 16 != 0) unsupported(op, "fp8 GEMMs need m, n, k multiples of 16");
        n.f8[0] = static_cast<std::size_t>(m * k * batch);
        n.f8[1] = static_cast<std::size_t>(k * nn * batch);
      } else {
        n.bf16[0] = b16(m * k * batch);
        n.bf16[1] = b16(k * nn * batch);
      }
      n.bf16[2] = b16(m * nn * batch);
      break;
    }
    case OpKind::grouped_gemm: {
      require_positive(op, 4);
      if (op.dtype == DType::fp8) {
        unsupported(op, "fp8 grouped GEMM is not supported by this backend (cuBLAS 13.0 has no fp8 grouped GEMM for "
                        "Hopper); run the scenario with precision bf16");
      }
      const std::int64_t t = s[0], e = s[3];
      const auto [nn, k] = grouped_nk(op);
      static_cast<void>(expert_rows(t, e, s[4]));  // validates the split
      switch (layout_of(op)) {
        case GemmLayout::forward: n.bf16[0] = b16(t * k); n.bf16[1] = b16(e * nn * k); n.bf16[2] = b16(t * nn); break;
        case GemmLayout::dgrad: n.bf16[0] = b16(t * nn); n.bf16[1] = b16(e * nn * k); n.bf16[2] = b16(t * k); break;
        case GemmLayout::wgrad: n.bf16[0] = b16(t * nn); n.bf16[1] = b16(t * k); n.bf16[2] = b16(e * nn * k); break;
      }
      break;
    }
    case OpKind::attention: {
      require_positive(op, 6);
      const std::int64_t b = s[0], sq = s[1], skv = s[2], h = s[3], dqk = s[4], dv = s[5];
      if ((op.flags & scenarios::kCausal) != 0 && skv < sq) unsupported(op, "causal attention needs seq_kv >= seq_q");
      if (s[7] < 0 || (s[7] > 0 && (op.flags & scenarios::kCausal) == 0)) {
        unsupported(op, "a sliding window (shape[7] = " + std::to_string(s[7]) +
                            ") must be >= 0, and > 0 only with a causal mask");
      }
      if (scenarios::attention_kernel(op) != scenarios::AttentionKernel::unfused) {
        std::string why;
        if (!fused_attention_built(&why)) {
          unsupported(op, "fused attention is not available: " + why + "; set model.attention_impl = \"unfused\"");
        }
      }
      const std::int64_t kvh = kernel_shape(op).kv_head_count();  // K, V (and dK, dV) heads
      n.bf16[0] = b16(b * h * sq * dqk);
      if (config.parameter_state == nullptr || config.parameter_state->kv_cache(op) == nullptr) {
        n.bf16[1] = b16(b * kvh * skv * dqk);
        n.bf16[2] = b16(b * kvh * skv * dv);
      }  // else: K and V are the KV cache's (parameter_state.hpp)
      n.bf16[3] = b16(b * h * sq * dv);
      n.f32[0] = b32(b * h * sq);
      if (backward(op)) {
        n.bf16[4] = b16(b * h * sq * dv);
        n.bf16[5] = b16(b * h * sq * dqk);
        n.bf16[6] = b16(b * kvh * skv * dqk);
        n.bf16[7] = b16(b * kvh * skv * dv);
      }
      break;
    }
    case OpKind::elementwise: {
      require_positive(op, 1);
      const std::int64_t e = s[0];
      if (on_state(op, config)) break;  // the gradient norm reads the gradient buffer
      switch (elementwise_of(op)) {
        case Elementwise::copy: n.bf16[0] = b16(e); n.bf16[1] = b16(e); break;
        case Elementwise::add: n.bf16[0] = b16(e); n.bf16[1] = b16(e); n.bf16[2] = b16(e); break;
        case Elementwise::swiglu: n.bf16[0] = b16(2 * e); n.bf16[1] = b16(e); break;
        case Elementwise::swiglu_bwd: n.bf16[0] = b16(e); n.bf16[1] = b16(2 * e); n.bf16[2] = b16(2 * e); break;
        case Elementwise::quantize: {
          if (s[1] <= 0 || s[2] <= 0 || s[1] * s[2] != e)
            unsupported(op, "an fp8 cast needs shape {rows x cols, rows, cols}");
          const auto elems = static_cast<std::size_t>(e);
          if (op.dtype == DType::fp8) {
            n.f8[0] = elems;  // the fp8 weight, transposed
          } else {
            n.bf16[0] = b16(e);
            n.f8[0] = elems;
          }
          if (s[3] != 0) n.f8[1] = elems;
          n.f32[0] = b32(1);
          break;
        }
        case Elementwise::amax:
          n.bf16[0] = b16(e);
          n.f32[0] = b32(1);
          break;
      }
      break;
    }
    case OpKind::norm: {
      require_positive(op, 2);
      const std::int64_t rows = s[0], hidden = s[1];
      n.bf16[0] = b16(rows * hidden);
      n.bf16[1] = b16(std::max(rows * hidden, hidden));
      n.bf16[2] = b16(rows * hidden);
      n.bf16[3] = b16(hidden);
      n.f32[0] = b32(rows);
      if (backward(op)) n.f32[1] = b32(hidden);
      if (op.norm_kind() == scenarios::NormKind::layernorm) {
        n.f32[2] = b32(rows);
        if (backward(op)) n.f32[3] = b32(hidden);
      }
      break;
    }
    case OpKind::softmax_topk: {
      require_positive(op, 3);
      const std::int64_t t = s[0], e = s[1], k = s[2];
      if (e > 1024 || k > 32 || k > e) unsupported(op, "softmax_topk supports experts <= 1024 and topk <= min(32, experts)");
      n.bf16[0] = b16(t * e);
      n.i32[0] = b32(t * k);
      n.f32[0] = b32(t * k);
      n.i32[1] = b32(e);
      if (backward(op)) n.bf16[1] = b16(t * e);
      break;
    }
    case OpKind::permute:
    case OpKind::unpermute: {
      require_positive(op, 2);
      const std::int64_t rows = s[0], hidden = s[1];
      const int k = topk_of(op);
      if (k > config.route_experts) unsupported(op, "topk larger than OpRunnerConfig::route_experts");
      const std::int64_t tokens = rows / k;
      n.bf16[0] = b16(rows * hidden);
      n.bf16[1] = b16(rows * hidden);
      if (op.kind == OpKind::unpermute && backward(op)) {
        n.bf16[2] = b16(rows * hidden);
        n.f32[0] = b32(tokens * k);
      }
      break;
    }
    case OpKind::embedding: {
      require_positive(op, 2);
      const std::int64_t t = s[0], hidden = s[1];
      n.i32[2] = b32(t);
      n.bf16[0] = b16(t * hidden);
      if (backward(op)) {
        n.f32[0] = b32(config.embedding_rows * hidden);
      } else {
        n.bf16[1] = b16(config.embedding_rows * hidden);
      }
      break;
    }
    case OpKind::cross_entropy: {
      require_positive(op, 2);
      const std::int64_t t = s[0], v = s[1];
      n.bf16[0] = b16(t * v);
      for (int i = 0; i < 4; ++i) n.f32[i] = b32(t);
      n.i32[3] = b32(t);
      if (backward(op)) n.bf16[1] = b16(t * v);
      break;
    }
    case OpKind::optimizer: {
      require_positive(op, 1);
      if (config.parameter_state != nullptr) {
        // master, m, v; the gradients and the bf16 weights are the parameter state's.
        for (int i : {0, 2, 3}) n.f32[i] = b32(s[0]);
      } else {
        for (int i = 0; i < 4; ++i) n.f32[i] = b32(s[0]);
        n.bf16[0] = b16(s[0]);
      }
      break;
    }
    case OpKind::copy: {
      const auto bytes = static_cast<std::size_t>(std::max(0.0, op.bytes > 0.0 ? op.bytes : static_cast<double>(s[0])));
      if (bytes == 0) unsupported(op, "copy of 0 bytes");
      switch (op.copy_kind()) {
        case CopyKind::h2d_pinned:
        case CopyKind::d2h_pinned: n.pinned = bytes; n.bf16[0] = bytes; break;
        case CopyKind::h2d_pageable:
        case CopyKind::d2h_pageable: n.pageable = bytes; n.bf16[0] = bytes; break;
        case CopyKind::d2d: n.bf16[0] = bytes; n.bf16[1] = bytes; break;
        case CopyKind::disk_read: n.pinned = round_up_direct(bytes); n.disk_file = bytes; break;
        default: unsupported(op, "unknown CopyKind " + std::to_string(op.sub));
      }
      break;
    }
    case OpKind::collective: {
      if (op.bytes <= 0.0) unsupported(op, "collective of 0 bytes");
      if (op.collective() > Collective::broadcast) unsupported(op, "unknown Collective " + std::to_string(op.sub));
      if (on_state(op, config)) break;  // in place on the parameter state
      const auto bytes = static_cast<std::size_t>(op.bytes);
      const auto g = static_cast<std::size_t>(std::max<int>(op.group_size, 1));
      n.bf16[0] = bytes + 2 * g;  // slack for per-member rounding
      n.bf16[1] = bytes + 2 * g;
      break;
    }
    case OpKind::send:
    case OpKind::recv: {
      if (op.bytes <= 0.0) unsupported(op, "point-to-point transfer of 0 bytes");
      n.bf16[op.kind == OpKind::send ? 0 : 1] = static_cast<std::size_t>(op.bytes) + 2;
      break;
    }
    case OpKind::host:
      unsupported(op, "host ops run on the executor's host thread, not on a stream (see OpRunner::gpu_read)");
  }
  return n;
}

void OpRunner::ensure(const Need& need) {
  bool grow = false;
  for (int i = 0; i < kBf16Slots; ++i) grow = grow || need.bf16[i] > have_.bf16[i];
  for (int i = 0; i < kF32Slots; ++i) grow = grow || need.f32[i] > have_.f32[i];
  for (int i = 0; i < kI32Slots; ++i) grow = grow || need.i32[i] > have_.i32[i];
  for (int i = 0; i < kF8Slots; ++i) grow = grow || need.f8[i] > have_.f8[i];
  grow = grow || need.pinned > have_.pinned || need.pageable > have_.pageable || need.disk_file > have_.disk_file;
  if (!grow) return;
  // Buffers in use by queued work must not be freed: wait for the device first.
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  grouped_.clear();  // plans hold pointers into the slots
  const cudaStream_t s = nullptr;
  const std::uint64_t seed = cfg_.seed * 1000003ULL;
  auto next_seed = [&] { return seed + (++fills_); };
  for (int i = 0; i < kBf16Slots; ++i) {
    if (need.bf16[i] > have_.bf16[i]) {
      bf16_[i] = DeviceBuffer();
      bf16_[i] = DeviceBuffer(need.bf16[i]);
      fill_random(bf16_[i].as<bf16>(), static_cast<std::int64_t>(need.bf16[i] / 2), next_seed(), 1.0F, s);
      have_.bf16[i] = need.bf16[i];
    }
  }
  for (int i = 0; i < kF32Slots; ++i) {
    if (need.f32[i] > have_.f32[i]) {
      f32_[i] = DeviceBuffer();
      f32_[i] = DeviceBuffer(need.f32[i]);
      // Positive: slot 3 is Adam's second moment; positive values are valid for every other use too.
      fill_random_positive(f32_[i].as<float>(), static_cast<std::int64_t>(need.f32[i] / 4), next_seed(), 1.0F, s);
      have_.f32[i] = need.f32[i];
    }
  }
  for (int i = 0; i < kI32Slots; ++i) {
    if (need.i32[i] > have_.i32[i]) {
      i32_[i] = DeviceBuffer();
      i32_[i] = DeviceBuffer(need.i32[i]);
      have_.i32[i] = need.i32[i];
    }
  }
  // Token ids (embedding) in [0, embedding_rows); targets (cross-entropy) in the smallest shard.
  if (have_.i32[2] > 0) {
    fill_random_ids(i32_[2].as<std::int32_t>(), static_cast<std::int64_t>(have_.i32[2] / 4), next_seed(),
                    static_cast<std::int32_t>(cfg_.embedding_rows), s);
  }
  if (have_.i32[3] > 0 && min_xent_shard_ > 0) {
    fill_random_ids(i32_[3].as<std::int32_t>(), static_cast<std::int64_t>(have_.i32[3] / 4), next_seed(),
                    static_cast<std::int32_t>(min_xent_shard_), s);
  }
  for (int i = 0; i < kF8Slots; ++i) {
    if (need.f8[i] > have_.f8[i]) {
      f8_[i] = DeviceBuffer();
      f8_[i] = DeviceBuffer(need.f8[i]);
      fill_random(f8_[i].as<fp8>(), static_cast<std::int64_t>(need.f8[i]), next_seed(), 1.0F, s);
      have_.f8[i] = need.f8[i];
    }
  }
  if (need.pinned > have_.pinned) {
    pinned_ = PinnedBuffer();
    pinned_ = PinnedBuffer(need.pinned);
    std::fill_n(static_cast<unsigned char*>(pinned_.data()), need.pinned, static_cast<unsigned char>(0x5A));
    have_.pinned = need.pinned;
  }
  if (need.pageable > have_.pageable) {
    pageable_.assign(need.pageable, static_cast<char>(0x5A));  // touched, so the pages exist
    have_.pageable = need.pageable;
  }
  if (need.disk_file > have_.disk_file) {
    // One slot per (layer, expert) key, up to kDiskSlots of the largest read (copies.hpp).
    disk_bytes_ = round_up_direct(need.disk_file) * disk_slots(need.disk_file);
    write_random_file(disk_path_, disk_bytes_, cfg_.seed);
    have_.disk_file = need.disk_file;
  }
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

OpRunner::Routing& OpRunner::routing(std::int64_t tokens, int k, cudaStream_t stream) {
  auto& slot = routings_[std::make_pair(tokens, k)];
  if (!slot) {
    auto r = std::make_unique<Routing>();
    r->tokens = tokens;
    r->k = k;
    const int e = cfg_.route_experts;
    r->ids = DeviceBuffer(b32(tokens * k));
    r->probs = DeviceBuffer(b32(tokens * k));
    r->counts = DeviceBuffer(b32(e));
    r->offsets = DeviceBuffer(b32(e + 1));
    r->cursor = DeviceBuffer(b32(e));
    r->row_map = DeviceBuffer(b32(tokens * k));
    DeviceBuffer logits(b16(tokens * e));
    fill_random(logits.as<bf16>(), tokens * e, cfg_.seed * 7919ULL + static_cast<std::uint64_t>(tokens * 31 + k), 2.0F,
                stream);
    softmax_topk(logits.as<bf16>(), r->ids.as<std::int32_t>(), r->probs.as<float>(), r->counts.as<std::int32_t>(),
                 tokens, e, k, true, stream);
    build_row_map(r->ids.as<std::int32_t>(), r->counts.as<std::int32_t>(), r->offsets.as<std::int32_t>(),
                  r->cursor.as<std::int32_t>(), r->row_map.as<std::int32_t>(), tokens, e, k, stream);
    TW_CUDA_CHECK(cudaStreamSynchronize(stream));  // `logits` dies here
    slot = std::move(r);
  }
  return *slot;
}

GroupedGemm& OpRunner::grouped(const Op& op, void* w) {
  const auto& s = op.shape;
  // w: the experts' weights (forward, dgrad) or their gradient (wgrad) in their own place.
  const GemmLayout layout = layout_of(op);
  const auto key = std::make_tuple(s[0], s[1], s[2], s[3], s[4], static_cast<int>(layout), static_cast<const void*>(w));
  auto& slot = grouped_[key];
  if (!slot) {
    const auto [n, k] = grouped_nk(op);
    const bool grad = layout == GemmLayout::wgrad;
    const auto* b = w != nullptr && !grad ? static_cast<const bf16*>(w) : bf16_[1].as<bf16>();
    auto* c = w != nullptr && grad ? static_cast<bf16*>(w) : bf16_[2].as<bf16>();
    slot = std::make_unique<GroupedGemm>(*lt_, layout, expert_rows(s[0], s[3], s[4]), n, k, bf16_[0].as<bf16>(), b, c,
                                         cfg_.grouped_impl);
  }
  return *slot;
}

namespace {
GemmShape gemm_shape(const Op& op) {
  const auto& s = op.shape;
  GemmShape g = linear_gemm(layout_of(op), s[0], s[1], s[2], op.dtype == DType::fp8 ? GemmType::e4m3 : GemmType::bfloat16);
  g.batch = std::max<std::int64_t>(s[3], 1);
  return g;
}
}  // namespace

void OpRunner::prepare_op(const Op& op) {
  if (op.kind == OpKind::host) return;  // executor's business
  const Need n = need_of(op);
  ensure(n);
  const cudaStream_t s = nullptr;
  switch (op.kind) {
    // Plans are made here, before the step, and a new one is run once: its cuBLASLt heuristic query
    // (0.2-0.3 ms) and the lazy load of a kernel not used before (2-6 ms) are not step time. A run with
    // per-step shapes (inference routing) meets new expert row counts at every step; a long run
    // pays those costs once per shape and the simulator does not charge them (docs/backend.md).
    case OpKind::gemm:
      if (lt_->prepare(gemm_shape(op))) run(op, s);
      break;
    case OpKind::grouped_gemm: {
      GroupedGemm& g = grouped(op, weight_ptr(op));
      if (g.prepare()) g.run(s);
      break;
    }
    case OpKind::permute:
    case OpKind::unpermute: {
      const int k = topk_of(op);
      static_cast<void>(routing(op.shape[0] / k, k, s));
      break;
    }
    case OpKind::attention: {
      const AttentionShape as = kernel_shape(op);
      switch (kernel_of(op)) {
        case scenarios::AttentionKernel::unfused: unfused_attention().reserve(as); break;
        case scenarios::AttentionKernel::fused: fused_attention().reserve(as, backward(op)); break;
        case scenarios::AttentionKernel::decode: decode_attention().reserve(as); break;
      }
      if (backward(op)) {  // real O and log-sum-exp for the backward to consume
        Op fwd = op;
        fwd.flags = static_cast<std::uint8_t>(op.flags & ~scenarios::kBackward);
        run_attention(fwd, s);
        TW_CUDA_CHECK(cudaStreamSynchronize(s));
      }
      break;
    }
    default: break;
  }
}

void OpRunner::prepare(const std::vector<Op>& ops) {
  Need all;
  for (const Op& op : ops) {
    if (op.kind == OpKind::host) continue;
    all.merge(need_of(op));
    if (op.kind == OpKind::cross_entropy) {
      min_xent_shard_ = min_xent_shard_ == 0 ? op.shape[1] : std::min(min_xent_shard_, op.shape[1]);
    }
  }
  ensure(all);
  place_parameters(ops);
  for (const Op& op : ops) prepare_op(op);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

std::size_t OpRunner::device_bytes() const {
  std::size_t total = lt_->workspace_size() + (attention_ ? cfg_.attention_workspace : 0) +
                      (fused_ ? fused_->workspace_bytes() : 0) + (decode_ ? decode_->workspace_bytes() : 0);
  for (const auto& b : bf16_) total += b.size();
  for (const auto& b : f32_) total += b.size();
  for (const auto& b : i32_) total += b.size();
  for (const auto& b : f8_) total += b.size();
  return total + weight_bytes_;
}

Attention& OpRunner::unfused_attention() {
  if (!attention_) attention_ = std::make_unique<Attention>(*lt_, cfg_.attention_workspace);
  return *attention_;
}

FusedAttention& OpRunner::fused_attention() {
  if (!fused_) fused_ = std::make_unique<FusedAttention>();
  return *fused_;
}

DecodeAttention& OpRunner::decode_attention() {
  if (!decode_) decode_ = std::make_unique<DecodeAttention>();
  return *decode_;
}

// q, k, v, o, dO in bf16 slots 0-4, dQ, dK, dV in 5-7, the log-sum-exp in f32 slot 0.
void OpRunner::run_attention(const Op& op, cudaStream_t stream) {
  const AttentionShape as = kernel_shape(op);
  const auto* q = bf16_[0].as<bf16>();
  const auto* k = bf16_[1].as<bf16>();
  const auto* v = bf16_[2].as<bf16>();
  if (void* kv = cfg_.parameter_state != nullptr ? cfg_.parameter_state->kv_cache(op) : nullptr) {
    // The layer's KV cache: keys, then values (scenarios::reads_kv_cache: they fit its share).
    k = static_cast<const bf16*>(kv);
    v = k + as.batch * as.kv_head_count() * as.seq_kv * as.head_dim_qk;
  }
  auto* o = bf16_[3].as<bf16>();
  auto* lse = f32_[0].as<float>();
  switch (kernel_of(op)) {
    case scenarios::AttentionKernel::unfused:
      if (backward(op)) {
        unfused_attention().backward(as, q, k, v, o, bf16_[4].as<bf16>(), lse, bf16_[5].as<bf16>(), bf16_[6].as<bf16>(),
                                     bf16_[7].as<bf16>(), stream);
      } else {
        unfused_attention().forward(as, q, k, v, o, lse, stream);
      }
      break;
    case scenarios::AttentionKernel::fused:
      if (backward(op)) {
        fused_attention().backward(as, q, k, v, o, bf16_[4].as<bf16>(), lse, bf16_[5].as<bf16>(), bf16_[6].as<bf16>(),
                                   bf16_[7].as<bf16>(), stream);
      } else {
        fused_attention().forward(as, q, k, v, o, lse, stream);
      }
      break;
    case scenarios::AttentionKernel::decode: decode_attention().forward(as, q, k, v, o, lse, stream); break;
  }
}

void* OpRunner::weight_ptr(const Op& op) const {
  const auto u = weight_of(op);
  return u ? placed(*u) : nullptr;
}

void* OpRunner::placed(const WeightUse& u) const {
  if (cfg_.parameter_state != nullptr) {
    if (void* at = cfg_.parameter_state->place(u)) return at;
  }
  const auto it = weight_at_.find(u.key);
  return it == weight_at_.end() || it->second.bytes < u.bytes ? nullptr : it->second.at;
}

// One lookup per launch (the executor's hot path); an op prepare() did not see is placed here.
void* OpRunner::weight_for(const Op& op) {
  const auto u = weight_of(op);
  if (!u) return nullptr;
  if (void* at = placed(*u)) return at;
  place_parameters({op});
  return placed(*u);
}

// Parameters new to this runner get their place (weights.hpp): one new arena per prepare, laid out
// by place_weights, while the arenas stay under twice the all-resident limit; past it a new tensor
// shares the first arena's memory round-robin (it may then be read warmer than in a deployment:
// a run that meets that many new parameters after its first prepare is not one we ship).
void OpRunner::place_parameters(const std::vector<Op>& ops) {
  // New tensors, and tensors that need more bytes than where they are (a grouped GEMM over more
  // experts than before), in first-use order, each with the most bytes any op asks for.
  const std::vector<WeightUse> fresh =
      backend::weight_tensors(ops, [this](const WeightUse& u) { return placed(u) != nullptr; });
  if (fresh.empty()) return;
  if (l2_bytes_ == 0) {
    int dev = 0;
    int l2 = 0;
    TW_CUDA_CHECK(cudaGetDevice(&dev));
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    l2_bytes_ = static_cast<std::size_t>(std::max(l2, 1 << 20));
  }
  std::vector<std::size_t> sizes;
  std::size_t largest = 0;
  for (const WeightUse& u : fresh) {
    sizes.push_back(u.bytes);
    largest = std::max(largest, u.bytes);
  }
  const WeightPlacement p = place_weights(sizes, l2_bytes_);
  const std::size_t cap = 12 * (l2_bytes_ + largest);
  const cudaStream_t s = nullptr;
  auto fill = [&](void* at, std::size_t bytes, scenarios::DType dt) {
    const std::uint64_t seed = cfg_.seed * 1000003ULL + (++fills_);
    if (dt == DType::fp8) {
      fill_random(static_cast<fp8*>(at), static_cast<std::int64_t>(bytes), seed, 1.0F, s);
    } else {
      fill_random(static_cast<bf16*>(at), static_cast<std::int64_t>(bytes / 2), seed, 1.0F, s);
    }
  };
  if (weight_arenas_.empty() || weight_bytes_ + p.arena_bytes <= cap) {
    DeviceBuffer arena(p.arena_bytes);
    auto* base = static_cast<char*>(arena.data());
    fill(base, p.arena_bytes, DType::bf16);
    for (std::size_t i = 0; i < fresh.size(); ++i) {
      weight_at_[fresh[i].key] = Placed{base + p.offsets[i], fresh[i].bytes};
      if (fresh[i].key.dtype == DType::fp8) fill(base + p.offsets[i], fresh[i].bytes, DType::fp8);
    }
    weight_bytes_ += p.arena_bytes;
    weight_arenas_.push_back(std::move(arena));
  } else {
    DeviceBuffer& first = weight_arenas_.front();
    for (const WeightUse& u : fresh) {
      const std::size_t aligned = weight_aligned(u.bytes);
      if (aligned > first.size()) {  // larger than the first arena: a place of its own
        DeviceBuffer own(aligned);
        fill(own.data(), aligned, u.key.dtype);
        weight_at_[u.key] = Placed{own.data(), u.bytes};
        weight_bytes_ += aligned;
        weight_arenas_.push_back(std::move(own));
        continue;
      }
      if (weight_wrap_ + aligned > first.size()) weight_wrap_ = 0;
      weight_at_[u.key] = Placed{static_cast<char*>(first.data()) + weight_wrap_, u.bytes};
      weight_wrap_ += aligned;
    }
  }
  TW_CUDA_CHECK(cudaDeviceSynchronize());  // the fills are done before any stream reads them
}

void OpRunner::gpu_read(cudaStream_t stream) {
  if (have_.i32[1] == 0) ensure([] { Need n; n.i32[1] = 4; return n; }());
  TW_CUDA_CHECK(cudaMemcpyAsync(read_flag_.data(), i32_[1].data(), sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void OpRunner::run(const Op& op, cudaStream_t stream) {
  if (op.kind == OpKind::host) static_cast<void>(need_of(op));  // throws the host-op message
  if (op.kind == OpKind::cross_entropy && (min_xent_shard_ == 0 || op.shape[1] < min_xent_shard_)) {
    min_xent_shard_ = op.shape[1];
    have_.i32[3] = 0;  // refill targets for the smaller shard
  }
  ensure(need_of(op));
  const auto& s = op.shape;
  switch (op.kind) {
    case OpKind::gemm: {
      const GemmShape g = gemm_shape(op);
      void* w = weight_for(op);  // B (forward, dgrad) or C (wgrad: the gradient); nullptr: none
      const bool grad = (op.flags & scenarios::kWgrad) != 0;
      if (op.dtype == DType::fp8) {
        lt_->gemm(g, f8_[0].data(), w != nullptr ? w : f8_[1].data(), bf16_[2].data(), stream);
      } else {
        lt_->gemm(g, bf16_[0].data(), w != nullptr && !grad ? w : bf16_[1].data(),
                  w != nullptr && grad ? w : bf16_[2].data(), stream);
      }
      break;
    }
    case OpKind::grouped_gemm:
      grouped(op, weight_for(op)).run(stream);
      break;
    case OpKind::attention: run_attention(op, stream); break;
    case OpKind::elementwise: {
      const std::int64_t e = s[0];
      if (on_state(op, cfg_)) {  // the gradient norm: a copy of the gradient buffer's first half over its second
        auto* g = static_cast<char*>(cfg_.parameter_state->gradients());
        copy_d2d(g + b16(e), g, b16(e), stream);
        break;
      }
      switch (elementwise_of(op)) {
        case Elementwise::copy: copy_d2d(bf16_[1].data(), bf16_[0].data(), b16(e), stream); break;
        case Elementwise::add: add(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), bf16_[2].as<bf16>(), e, stream); break;
        case Elementwise::swiglu: swiglu_fwd(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), 1, e, stream); break;
        case Elementwise::swiglu_bwd:
          swiglu_bwd(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), bf16_[2].as<bf16>(), 1, e, stream);
          break;
        case Elementwise::quantize:
          if (op.dtype == DType::fp8) {
            transpose_fp8(f8_[0].as<fp8>(), f8_[1].as<fp8>(), s[1], s[2], stream);
          } else {
            quantize_fp8(bf16_[0].as<bf16>(), 1.0F, f8_[0].as<fp8>(), s[3] != 0 ? f8_[1].as<fp8>() : nullptr,
                         f32_[0].as<float>(), s[1], s[2], stream);
          }
          break;
        case Elementwise::amax: amax_bf16(bf16_[0].as<bf16>(), f32_[0].as<float>(), e, stream); break;
      }
      break;
    }
    case OpKind::norm:
      if (op.norm_kind() == scenarios::NormKind::layernorm) {
        // LayerNorm: gamma = beta = bf16[3] (same values, real reads); mean f32[0], rstd f32[2].
        if (backward(op)) {
          layernorm_bwd(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), bf16_[3].as<bf16>(), f32_[0].as<float>(),
                        f32_[2].as<float>(), bf16_[2].as<bf16>(), f32_[1].as<float>(), f32_[3].as<float>(), s[0], s[1],
                        stream);
        } else {
          layernorm_fwd(bf16_[0].as<bf16>(), bf16_[3].as<bf16>(), bf16_[3].as<bf16>(), bf16_[2].as<bf16>(),
                        f32_[0].as<float>(), f32_[2].as<float>(), s[0], s[1], 1e-5F, stream);
        }
      } else if (backward(op)) {
        rmsnorm_bwd(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), bf16_[3].as<bf16>(), f32_[0].as<float>(),
                    bf16_[2].as<bf16>(), f32_[1].as<float>(), s[0], s[1], stream);
      } else {
        rmsnorm_fwd(bf16_[0].as<bf16>(), bf16_[3].as<bf16>(), bf16_[2].as<bf16>(), f32_[0].as<float>(), s[0], s[1],
                    1e-5F, stream);
      }
      break;
    case OpKind::softmax_topk: {
      const int e = static_cast<int>(s[1]);
      const int k = static_cast<int>(s[2]);
      if (backward(op)) {
        softmax_topk_bwd(bf16_[0].as<bf16>(), i32_[0].as<std::int32_t>(), f32_[0].as<float>(), bf16_[1].as<bf16>(), s[0],
                         e, k, stream);
      } else {
        softmax_topk(bf16_[0].as<bf16>(), i32_[0].as<std::int32_t>(), f32_[0].as<float>(), i32_[1].as<std::int32_t>(),
                     s[0], e, k, true, stream);
      }
      break;
    }
    case OpKind::permute:
    case OpKind::unpermute: {
      const int k = topk_of(op);
      const std::int64_t tokens = s[0] / k;
      const std::int64_t hidden = s[1];
      Routing& r = routing(tokens, k, stream);
      const auto* map = r.row_map.as<std::int32_t>();
      if (op.kind == OpKind::permute) {
        if (backward(op)) {
          permute_bwd(bf16_[0].as<bf16>(), map, bf16_[1].as<bf16>(), tokens, k, hidden, stream);
        } else {
          permute_fwd(bf16_[0].as<bf16>(), map, bf16_[1].as<bf16>(), tokens, k, hidden, stream);
        }
      } else if (backward(op)) {
        unpermute_bwd(bf16_[0].as<bf16>(), bf16_[1].as<bf16>(), map, r.probs.as<float>(), bf16_[2].as<bf16>(),
                      f32_[0].as<float>(), tokens, k, hidden, stream);
      } else {
        unpermute_fwd(bf16_[0].as<bf16>(), map, r.probs.as<float>(), bf16_[1].as<bf16>(), tokens, k, hidden, stream);
      }
      break;
    }
    case OpKind::embedding:
      if (backward(op)) {
        embedding_bwd(i32_[2].as<std::int32_t>(), bf16_[0].as<bf16>(), f32_[0].as<float>(), s[0], s[1],
                      cfg_.embedding_rows, stream);
      } else {
        embedding_fwd(i32_[2].as<std::int32_t>(), bf16_[1].as<bf16>(), bf16_[0].as<bf16>(), s[0], s[1],
                      cfg_.embedding_rows, stream);
      }
      break;
    case OpKind::cross_entropy: {
      const std::int64_t t = s[0];
      const std::int64_t v = s[1];
      if (backward(op)) {
        xent_bwd(bf16_[0].as<bf16>(), f32_[0].as<float>(), f32_[1].as<float>(), i32_[3].as<std::int32_t>(), 0,
                 f32_[3].as<float>(), bf16_[1].as<bf16>(), t, v, stream);
      } else {
        xent_max(bf16_[0].as<bf16>(), f32_[0].as<float>(), t, v, stream);
        xent_sum_exp(bf16_[0].as<bf16>(), f32_[0].as<float>(), i32_[3].as<std::int32_t>(), 0, f32_[1].as<float>(),
                     f32_[2].as<float>(), t, v, stream);
        xent_loss(f32_[0].as<float>(), f32_[1].as<float>(), f32_[2].as<float>(), f32_[3].as<float>(), t, stream);
      }
      break;
    }
    case OpKind::optimizer: {
      // Gradients in, bf16 weights out: the parameter state's when there is one, else buffer slots.
      const ParameterState* st = cfg_.parameter_state;
      const auto* grad = st != nullptr ? static_cast<const float*>(st->gradients()) : f32_[1].as<float>();
      auto* weight = st != nullptr ? static_cast<bf16*>(st->weights()) : bf16_[0].as<bf16>();
      adam_step(f32_[0].as<float>(), grad, f32_[2].as<float>(), f32_[3].as<float>(), weight, s[0], AdamParams{},
                stream);
      break;
    }
    case OpKind::copy: run_copy(op, stream); break;
    case OpKind::collective: run_collective(op, stream); break;
    case OpKind::send:
    case OpKind::recv: run_p2p(op, stream); break;
    case OpKind::host: break;  // unreachable: need_of threw
  }
}

void OpRunner::run_copy(const Op& op, cudaStream_t stream) {
  const auto bytes =
      static_cast<std::size_t>(std::max(0.0, op.bytes > 0.0 ? op.bytes : static_cast<double>(op.shape[0])));
  switch (op.copy_kind()) {
    case CopyKind::h2d_pinned: copy_h2d(bf16_[0].data(), pinned_.data(), bytes, stream); break;
    case CopyKind::h2d_pageable: copy_h2d(bf16_[0].data(), pageable_.data(), bytes, stream); break;
    case CopyKind::d2h_pinned: copy_d2h(pinned_.data(), bf16_[0].data(), bytes, stream); break;
    case CopyKind::d2h_pageable: copy_d2h(pageable_.data(), bf16_[0].data(), bytes, stream); break;
    case CopyKind::d2d: copy_d2d(bf16_[1].data(), bf16_[0].data(), bytes, stream); break;
    case CopyKind::disk_read: {
      // Each (layer, expert) from its own slot of the file, as a deployment's expert files are.
      const auto key = static_cast<std::uint64_t>(std::max(0, static_cast<int>(op.layer))) * 1024U +
                       static_cast<std::uint64_t>(std::max(0, static_cast<int>(op.expert)));
      static_cast<void>(read_file_into(disk_path_, disk_slot_offset(have_.disk_file, key), bytes, pinned_));
      break;
    }
    default: unsupported(op, "unknown CopyKind " + std::to_string(op.sub));
  }
}

void OpRunner::run_collective(const Op& op, cudaStream_t stream) {
  if (comms_ == nullptr) unsupported(op, "collective op but this OpRunner has no CommTable");
  NcclComm& comm = comms_->comm(op.group);
  if (op.group_size > 0 && comm.size() != op.group_size) {
    unsupported(op, "group " + std::string(scenarios::to_string(op.group)) + " has " + std::to_string(comm.size()) +
                        " members but the op says " + std::to_string(op.group_size));
  }
  const auto n = static_cast<std::size_t>(comm.size());
  const std::size_t elems = collective_elems(op.bytes);
  void* in = bf16_[0].data();
  void* out = bf16_[1].data();
  if (on_state(op, cfg_)) {
    // In place on the parameter state, as Megatron's data-parallel buffers: reductions on the gradient
    // buffer, gathers on the weight buffer. NCCL's in-place forms: a reduce-scatter receives into its
    // member's chunk of the input, an all-gather sends from its member's chunk of the output.
    const ParameterState& st = *cfg_.parameter_state;
    const bool gather = op.collective() == Collective::all_gather;
    const std::size_t capacity = gather ? st.weight_capacity() : st.gradient_capacity();
    if (2 * elems > capacity) {
      unsupported(op, "the parameter state holds " + std::to_string(capacity) + " bytes, fewer than the op's");
    }
    auto* base = static_cast<char*>(gather ? st.weights() : st.gradients());
    const std::size_t chunk = 2 * std::max<std::size_t>(elems / n, 1) * static_cast<std::size_t>(comm.index());
    in = base;
    out = base;
    if (op.collective() == Collective::reduce_scatter) out = base + chunk;
    if (gather) in = base + chunk;
  }
  switch (op.collective()) {
    case Collective::all_reduce: all_reduce(in, out, elems, comm, stream); break;
    case Collective::all_gather: all_gather(in, out, std::max<std::size_t>(elems / n, 1), comm, stream); break;
    case Collective::reduce_scatter: reduce_scatter(in, out, std::max<std::size_t>(elems / n, 1), comm, stream); break;
    case Collective::broadcast: broadcast(in, out, elems, 0, comm, stream); break;
    case Collective::all_to_all: {
      if (!a2a_split_) {
        all_to_all(in, out, std::max<std::size_t>(elems / n, 1), comm, stream);
        break;
      }
      std::vector<std::size_t> sb(n), rb(n);
      a2a_split_(op, comm.size(), sb, rb);
      std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
      std::size_t so = 0, ro = 0;
      for (std::size_t p = 0; p < n; ++p) {
        sc[p] = sb[p] / 2;
        rc[p] = rb[p] / 2;
        sd[p] = so;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
      }
      if (2 * so > bf16_[0].size() || 2 * ro > bf16_[1].size()) {
        unsupported(op, "the all-to-all split sends or receives more than op.bytes; the buffers hold " +
                            std::to_string(bf16_[0].size()) + " bytes");
      }
      all_to_all_v(in, sc, sd, out, rc, rd, comm, stream);
      break;
    }
    default: unsupported(op, "unknown Collective " + std::to_string(op.sub));
  }
}

void OpRunner::run_p2p(const Op& op, cudaStream_t stream) {
  if (comms_ == nullptr) unsupported(op, "send/recv op but this OpRunner has no CommTable");
  NcclComm& comm = comms_->comm(op.group);
  int peer = comm.index() + op.peer;
  if (op.group == scenarios::Group::cp) {
    peer = ((peer % comm.size()) + comm.size()) % comm.size();  // context-parallel ring
  } else if (peer < 0 || peer >= comm.size()) {
    unsupported(op, "peer " + std::to_string(op.peer) + " of member " + std::to_string(comm.index()) +
                        " is outside group " + scenarios::to_string(op.group) + " of " + std::to_string(comm.size()));
  }
  const std::size_t elems = collective_elems(op.bytes);
  if (op.kind == OpKind::send) {
    send(bf16_[0].data(), elems, peer, comm, stream);
  } else {
    recv(bf16_[1].data(), elems, peer, comm, stream);
  }
}

}  // namespace threewalls::backend
