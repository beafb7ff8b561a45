#include "threewalls/backend/fused_attention.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"

#ifdef THREEWALLS_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace threewalls::backend {

const char* window_mask_name(WindowMask m) { return m == WindowMask::band ? "band" : "conjunction"; }

#ifndef THREEWALLS_HAVE_CUDNN

bool fused_attention_built(std::string* reason) {
  if (reason != nullptr) {
    *reason = "this build has no cuDNN (CMake found no cudnn.h / libcudnn; install cuDNN 9 and reconfigure)";
  }
  return false;
}

struct FusedAttention::Impl {};

FusedAttention::FusedAttention(WindowMask) {
  std::string why;
  static_cast<void>(fused_attention_built(&why));
  throw DeviceError(rank_prefix() + "fused attention: " + why + "; run with attention_impl = \"unfused\"");
}
FusedAttention::~FusedAttention() = default;
void FusedAttention::forward(const AttentionShape&, const bf16*, const bf16*, const bf16*, bf16*, float*,
                             cudaStream_t) {}
void FusedAttention::backward(const AttentionShape&, const bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                              const float*, bf16*, bf16*, bf16*, cudaStream_t) {}
void FusedAttention::reserve(const AttentionShape&, bool) {}
std::size_t FusedAttention::workspace_bytes() const { return 0; }
std::size_t FusedAttention::plans() const { return 0; }
std::optional<WindowMask> FusedAttention::window_mask(const AttentionShape&, bool) const { return std::nullopt; }

#else

bool fused_attention_built(std::string* reason) {
  if (reason != nullptr) reason->clear();
  return true;
}

namespace {

[[noreturn]] void throw_cudnn(cudnnStatus_t st, const char* call, const char* file, int line) {
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw DeviceError(rank_prefix() + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                    cudnnGetErrorString(st) + (detail[0] != '\0' ? std::string(" (") + detail + ")" : std::string()));
}

#define TW_CUDNN_CHECK(call)                                                            \
  do {                                                                                  \
    const cudnnStatus_t tw_st_ = (call);                                                \
    if (tw_st_ != CUDNN_STATUS_SUCCESS) throw_cudnn(tw_st_, #call, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { TW_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&&) = delete;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  [[nodiscard]] cudnnBackendDescriptor_t get() const { return d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const void* value) {
    TW_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, value));
  }
  void set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize() { TW_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

struct Tensor {
  cudnnBackendDescriptor_t desc = nullptr;
  std::int64_t uid = 0;
  std::vector<std::int64_t> dim, stride;
};

using Dims = std::vector<std::int64_t>;

// Row-major strides of `dim` ({b, h, s, d} -> {h s d, s d, d, 1}).
Dims packed(const Dims& dim) {
  Dims st(dim.size(), 1);
  for (std::size_t i = dim.size() - 1; i-- > 0;) st[i] = st[i + 1] * dim[i + 1];
  return st;
}

// Swaps the last two axes of a tensor view (a transpose without moving data).
std::pair<Dims, Dims> transposed(Dims dim, Dims stride) {
  std::swap(dim[2], dim[3]);
  std::swap(stride[2], stride[3]);
  return {dim, stride};
}

// A host scalar passed by value at execution (scale, -inf, mask offset).
struct ByValue {
  std::int64_t uid = 0;
  union {
    float f;
    std::int32_t i;
  } value{};
};

// Builds one operation graph: tensors and operations, all descriptors kept until the plan dies.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  Tensor tensor(const Dims& dim, const Dims& stride, cudnnDataType_t type, bool is_virtual) {
    Descriptor& d = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    Tensor t{d.get(), next_uid_++, dim, stride};
    const std::int64_t align = 16;
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(dim.size()), dim.data());
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(stride.size()), stride.data());
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
    d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    d.finalize();
    return t;
  }
  // A tensor of row-major layout.
  Tensor dense(const Dims& dim, cudnnDataType_t type, bool is_virtual) {
    return tensor(dim, packed(dim), type, is_virtual);
  }
  // The transpose (last two axes swapped) of a row-major tensor of `dim`, as a view of its memory.
  Tensor dense_transposed(const Dims& dim, cudnnDataType_t type, bool is_virtual) {
    const auto [tdim, tstride] = transposed(dim, packed(dim));
    return tensor(tdim, tstride, type, is_virtual);
  }
  Tensor scalar_f32(float v, std::vector<ByValue>& values) {
    ByValue b;
    b.value.f = v;
    return scalar(CUDNN_DATA_FLOAT, b, values);
  }
  Tensor scalar_i32(std::int32_t v, std::vector<ByValue>& values) {
    ByValue b;
    b.value.i = v;
    return scalar(CUDNN_DATA_INT32, b, values);
  }

  // y = mode(x [, b [, t]]); `y` given or a new virtual tensor shaped like x of `type`.
  Tensor pointwise(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b, const Tensor* t, cudnnDataType_t type,
                   cudnnDataType_t math, const Tensor* y = nullptr, std::int64_t axis = -1) {
    Descriptor& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    const Tensor out = y != nullptr ? *y : tensor(x.dim, x.stride, type, true);
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->desc);
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t->desc);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out.desc);
    op.finalize();
    ops_.push_back(op.get());
    return out;
  }
  Tensor binary(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor& b, const Tensor* y = nullptr) {
    return pointwise(mode, x, &b, nullptr, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, y);
  }
  Tensor unary(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* y = nullptr) {
    return pointwise(mode, x, nullptr, nullptr, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, y);
  }

  void matmul(const Tensor& a, const Tensor& b, const Tensor& c) {
    Descriptor& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    mm.finalize();
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    op.finalize();
    ops_.push_back(op.get());
  }
  void reduction(cudnnReduceTensorOp_t mode, const Tensor& x, const Tensor& y) {
    Descriptor& red = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    red.finalize();
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    op.finalize();
    ops_.push_back(op.get());
  }
  void reshape(const Tensor& x, const Tensor& y) {
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
    op.finalize();
    ops_.push_back(op.get());
  }

  // Finalises the graph and keeps the first engine configuration (heuristics mode A, then the
  // fallback list) whose plan finalises. Returns false when none does.
  bool plan(std::string& why) {
    Descriptor& graph = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops_.size()),
              ops_.data());
    if (const cudnnStatus_t st = cudnnBackendFinalize(graph.get()); st != CUDNN_STATUS_SUCCESS) {
      why = std::string("the operation graph was rejected: ") + cudnnGetErrorString(st) + last_error();
      return false;
    }
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
      heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
      std::int64_t count = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr) != CUDNN_STATUS_SUCCESS ||
          count <= 0) {
        continue;
      }
      std::vector<Descriptor> configs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (std::int64_t i = 0; i < count; ++i) {
        configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        raw.push_back(configs.back().get());
      }
      std::int64_t got = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &got, raw.data()) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      for (std::int64_t i = 0; i < got; ++i) {
        Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[static_cast<std::size_t>(i)]);
        if (const cudnnStatus_t st = cudnnBackendFinalize(plan.get()); st != CUDNN_STATUS_SUCCESS) {
          why = std::string("no engine configuration finalised (last: ") + cudnnGetErrorString(st) + last_error() + ")";
          continue;
        }
        std::int64_t ws = 0;
        std::int64_t n = 0;
        TW_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                1, &n, &ws));
        plan_workspace_ = static_cast<std::size_t>(ws);
        descriptors_.push_back(std::move(configs[static_cast<std::size_t>(i)]));
        descriptors_.push_back(std::move(plan));
        plan_ = descriptors_.back().get();
        return true;
      }
    }
    if (why.empty()) why = "cuDNN's heuristics offered no engine for this graph";
    return false;
  }

  [[nodiscard]] cudnnBackendDescriptor_t plan_descriptor() const { return plan_; }
  [[nodiscard]] std::size_t plan_workspace() const { return plan_workspace_; }
  std::deque<Descriptor> take_descriptors() { return std::move(descriptors_); }

 private:
  static std::string last_error() {
    char detail[512] = {};
    cudnnGetLastErrorString(detail, sizeof detail);
    return detail[0] != '\0' ? std::string(": ") + detail : std::string();
  }
  Descriptor& keep(cudnnBackendDescriptorType_t type) {
    descriptors_.emplace_back(type);
    return descriptors_.back();
  }
  Tensor scalar(cudnnDataType_t type, ByValue b, std::vector<ByValue>& values) {
    Descriptor& d = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const Dims one{1, 1, 1, 1};
    Tensor t{d.get(), next_uid_++, one, one};
    const bool by_value = true;
    const std::int64_t align = 16;
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, one.data());
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, one.data());
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
    d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    d.finalize();
    b.uid = t.uid;
    values.push_back(b);
    return t;
  }

  cudnnHandle_t handle_;
  std::int64_t next_uid_ = 1;
  std::deque<Descriptor> descriptors_;  // a deque: references stay valid as descriptors are added
  std::vector<cudnnBackendDescriptor_t> ops_;
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::size_t plan_workspace_ = 0;
};

WindowMask other(WindowMask m) { return m == WindowMask::band ? WindowMask::conjunction : WindowMask::band; }

// Where each tensor of a plan binds at execution.
enum Slot : std::uint8_t { kQ, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kRowDot, kDQAccum, kSlots };

}  // namespace

struct FusedAttention::Impl {
  struct Plan {
    std::deque<Descriptor> descriptors;
    cudnnBackendDescriptor_t plan = nullptr;
    std::size_t plan_workspace = 0;  // cuDNN's own scratch
    // Tensors we place in the workspace after cuDNN's scratch (backward: the row dot products and
    // the fp32 dQ accumulator), in bytes.
    std::size_t row_dot_bytes = 0, dq_accum_bytes = 0;
    std::int64_t uid[kSlots] = {};
    std::vector<ByValue> by_value;
    std::optional<WindowMask> window_mask;  // the sliding window's form in this graph (none without one)
    // The variant pack of the last call, reused while the pointers stay the same (the steady state
    // of a run: a variant pack costs host time to build).
    std::vector<void*> pack_ptrs;
    std::unique_ptr<Descriptor> pack;
    [[nodiscard]] std::size_t workspace() const {
      return align(plan_workspace) + align(row_dot_bytes) + align(dq_accum_bytes);
    }
    static std::size_t align(std::size_t n) { return (n + 255) / 256 * 256; }
  };
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, bool, std::int64_t, bool>;

  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> plans;
  DeviceBuffer workspace;
  bool zero_dq_accum = false;  // cuDNN before 9.6 expects the dQ accumulator zeroed by the caller
  WindowMask first_window_mask = WindowMask::band;

  explicit Impl(WindowMask first) : first_window_mask(first) {
    TW_CUDNN_CHECK(cudnnCreate(&handle));
    zero_dq_accum = cudnnGetVersion() < 90600;
  }
  ~Impl() {
    plans.clear();  // descriptors before the handle
    if (handle != nullptr) cudnnDestroy(handle);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The window the mask applies: 0 without one, and for a window of seq_kv keys or more (every query
  // sees its whole causal prefix: the window hides nothing).
  static std::int64_t mask_window(const AttentionShape& s) {
    return s.causal && s.window > 0 && s.window < s.seq_kv ? s.window : 0;
  }

  static Key key_of(const AttentionShape& s, bool backward) {
    return {s.batch,       s.seq_q,      s.seq_kv, s.heads,        s.kv_head_count(),
            s.head_dim_qk, s.head_dim_v, s.causal, mask_window(s), backward};
  }

  // A graph no engine configuration plans: `why` says what cuDNN answered.
  struct Rejected {
    std::string why;
  };

  Plan build(const AttentionShape& s, bool backward, WindowMask form) {
    return backward ? build_backward(s, form) : build_forward(s, form);
  }

  // The plan for `s`: with a window, the preferred window form first, then the other; a shape no
  // form plans is unsupported(), naming what cuDNN answered for each.
  Plan build(const AttentionShape& s, bool backward) {
    if (mask_window(s) == 0) {
      try {
        return build(s, backward, WindowMask::band);
      } catch (const Rejected& r) {
        unsupported(s, backward, r.why);
      }
    }
    std::string whys;
    for (const WindowMask form : {first_window_mask, other(first_window_mask)}) {
      try {
        return build(s, backward, form);
      } catch (const Rejected& r) {
        whys += std::string(whys.empty() ? "" : "; ") + window_mask_name(form) + " mask: " + r.why;
      } catch (const DeviceError& e) {  // a descriptor of this form refused while the graph was built
        whys += std::string(whys.empty() ? "" : "; ") + window_mask_name(form) + " mask: " + e.what();
      }
    }
    unsupported(s, backward, whys);
  }

  Plan& plan_for(const AttentionShape& s, bool backward) {
    const Key key = key_of(s, backward);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    Plan p = build(s, backward);
    if (p.workspace() > workspace.size()) {
      TW_CUDA_CHECK(cudaDeviceSynchronize());  // the old workspace may be in use by queued work
      workspace = DeviceBuffer(p.workspace());
    }
    return plans.emplace(key, std::move(p)).first->second;
  }

  // Scaled scores with the causal mask (and the sliding window, in `form`) applied, masked entries
  // -inf; shared by both directions. Query row r's diagonal key is row' = r + seq_kv - seq_q
  // (bottom-right alignment); the causal mask keeps keys col <= row', the window w keys col > row' - w.
  static Tensor masked_scores(GraphBuilder& g, const AttentionShape& s, const Tensor& scores, Plan& p,
                              WindowMask form) {
    if (!s.causal) return scores;
    const std::int64_t window = mask_window(s);
    auto row_index = [&g](const Tensor& x) {
      return g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, nullptr,
                         2);
    };
    auto col_index = [&g](const Tensor& x) {
      return g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, nullptr,
                         3);
    };
    auto select = [&](const Tensor& x, const Tensor& keep) {
      const Tensor neg_inf = g.scalar_f32(-std::numeric_limits<float>::infinity(), p.by_value);
      return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, &keep, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT);
    };
    auto compare = [&g](cudnnPointwiseMode_t mode, const Tensor& a, const Tensor& b) {
      return g.pointwise(mode, a, &b, nullptr, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    };
    Tensor row = row_index(scores);
    const Tensor col = col_index(scores);
    if (s.seq_kv != s.seq_q) {  // row' = row + seq_kv - seq_q
      const Tensor skv = g.scalar_i32(static_cast<std::int32_t>(s.seq_kv), p.by_value);
      const Tensor sq = g.scalar_i32(static_cast<std::int32_t>(s.seq_q), p.by_value);
      row = g.pointwise(CUDNN_POINTWISE_ADD, row, &skv, nullptr, CUDNN_DATA_INT32, CUDNN_DATA_INT32, nullptr, 3);
      row = g.pointwise(CUDNN_POINTWISE_SUB, row, &sq, nullptr, CUDNN_DATA_INT32, CUDNN_DATA_INT32, nullptr, 3);
    }
    const Tensor causal_keep = compare(CUDNN_POINTWISE_CMP_GE, row, col);  // col <= row'
    if (window == 0) return select(scores, causal_keep);
    p.window_mask = form;
    if (form == WindowMask::conjunction) {
      // One select: keep (row' >= col) AND (col + w > row').
      const Tensor w = g.scalar_i32(static_cast<std::int32_t>(window), p.by_value);
      const Tensor col_w =
          g.pointwise(CUDNN_POINTWISE_ADD, col, &w, nullptr, CUDNN_DATA_INT32, CUDNN_DATA_INT32, nullptr, 3);
      const Tensor window_keep = compare(CUDNN_POINTWISE_CMP_GT, col_w, row);
      return select(scores, compare(CUDNN_POINTWISE_LOGICAL_AND, causal_keep, window_keep));
    }
    // band (cudnn-frontend's sliding window, its operations in its order): the causal select, then a
    // second select on its output, with its own indices, keeping col + (w - (seq_kv - seq_q)) > row;
    // the shift is a float scalar, as the frontend passes a fixed-length left bound.
    const Tensor causal = select(scores, causal_keep);
    const Tensor band_row = row_index(causal);
    const Tensor band_col = col_index(causal);
    const Tensor shift = g.scalar_f32(static_cast<float>(window - (s.seq_kv - s.seq_q)), p.by_value);
    const Tensor shifted_col =
        g.pointwise(CUDNN_POINTWISE_ADD, band_col, &shift, nullptr, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, nullptr, 3);
    return select(causal, compare(CUDNN_POINTWISE_CMP_GT, shifted_col, band_row));
  }

  [[noreturn]] static void unsupported(const AttentionShape& s, bool backward, const std::string& why) {
    throw DeviceError(rank_prefix() + "fused attention " + (backward ? "backward" : "forward") + " for " + describe(s) +
                      ": cuDNN " + std::to_string(cudnnGetVersion()) + " rejected the shape: " + why +
                      " (run with attention_impl = \"unfused\" for this shape)");
  }

  // Plans the graph built in `g` (throwing Rejected when no engine takes it) and records which
  // tensor each slot binds to.
  static void finish(GraphBuilder& g, Plan& p, std::initializer_list<std::pair<Slot, const Tensor*> > slots) {
    std::string why;
    if (!g.plan(why)) throw Rejected{why};
    p.plan = g.plan_descriptor();
    p.plan_workspace = g.plan_workspace();
    p.descriptors = g.take_descriptors();
    for (const auto& [slot, t] : slots) p.uid[slot] = t->uid;
  }

  Plan build_forward(const AttentionShape& s, WindowMask form) {
    const std::int64_t b = s.batch, h = s.heads, hk = s.kv_head_count(), sq = s.seq_q, skv = s.seq_kv;
    const std::int64_t dqk = s.head_dim_qk, dv = s.head_dim_v;
    Plan p;
    GraphBuilder g(handle);
    const Tensor q = g.dense({b, h, sq, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor kt = g.dense_transposed({b, hk, skv, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor v = g.dense({b, hk, skv, dv}, CUDNN_DATA_BFLOAT16, false);
    const Tensor o = g.dense({b, h, sq, dv}, CUDNN_DATA_BFLOAT16, false);
    const Tensor stats = g.dense({b, h, sq, 1}, CUDNN_DATA_FLOAT, false);
    const Dims score_dim{b, h, sq, skv};
    const Dims row_dim{b, h, sq, 1};

    const Tensor raw = g.dense(score_dim, CUDNN_DATA_FLOAT, true);
    g.matmul(q, kt, raw);
    const Tensor scale = g.scalar_f32(1.0F / std::sqrt(static_cast<float>(dqk)), p.by_value);
    const Tensor scores = masked_scores(g, s, g.binary(CUDNN_POINTWISE_MUL, raw, scale), p, form);
    // Softmax with its statistics: max, exp(x - max), sum, lse = max + log(sum), P = exp / sum.
    const Tensor mx = g.dense(row_dim, CUDNN_DATA_FLOAT, true);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, mx);
    const Tensor e = g.unary(CUDNN_POINTWISE_EXP, g.binary(CUDNN_POINTWISE_SUB, scores, mx));
    const Tensor sum = g.dense(row_dim, CUDNN_DATA_FLOAT, true);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
    g.binary(CUDNN_POINTWISE_ADD, mx, g.unary(CUDNN_POINTWISE_LOG, sum), &stats);
    const Tensor probs = g.dense(score_dim, CUDNN_DATA_BFLOAT16, true);
    g.binary(CUDNN_POINTWISE_DIV, e, sum, &probs);
    g.matmul(probs, v, o);

    finish(g, p, {{kQ, &q}, {kK, &kt}, {kV, &v}, {kO, &o}, {kStats, &stats}});
    return p;
  }

  Plan build_backward(const AttentionShape& s, WindowMask form) {
    const std::int64_t b = s.batch, h = s.heads, hk = s.kv_head_count(), sq = s.seq_q, skv = s.seq_kv;
    const std::int64_t dqk = s.head_dim_qk, dv = s.head_dim_v;
    Plan p;
    GraphBuilder g(handle);
    const Tensor q = g.dense({b, h, sq, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor kt = g.dense_transposed({b, hk, skv, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor vt = g.dense_transposed({b, hk, skv, dv}, CUDNN_DATA_BFLOAT16, false);
    const Tensor o = g.dense({b, h, sq, dv}, CUDNN_DATA_BFLOAT16, false);
    const Tensor d_o = g.dense({b, h, sq, dv}, CUDNN_DATA_BFLOAT16, false);
    const Tensor stats = g.dense({b, h, sq, 1}, CUDNN_DATA_FLOAT, false);
    const Tensor dq = g.dense({b, h, sq, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor dk = g.dense({b, hk, skv, dqk}, CUDNN_DATA_BFLOAT16, false);
    const Tensor d_v = g.dense({b, hk, skv, dv}, CUDNN_DATA_BFLOAT16, false);
    const Dims score_dim{b, h, sq, skv};
    const Dims row_dim{b, h, sq, 1};

    // D = rowsum(dO * O), kept in the workspace (fp32).
    const Tensor prod = g.binary(CUDNN_POINTWISE_MUL, d_o, o);
    const Tensor dsum = g.dense(row_dim, CUDNN_DATA_FLOAT, true);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dsum);
    const Tensor one = g.scalar_f32(1.0F, p.by_value);
    const Tensor row_dot = g.dense(row_dim, CUDNN_DATA_FLOAT, false);
    g.binary(CUDNN_POINTWISE_MUL, dsum, one, &row_dot);
    p.row_dot_bytes = static_cast<std::size_t>(b * h * sq) * sizeof(float);

    // P = exp(scale Q K^T - lse), masked.
    const Tensor raw = g.dense(score_dim, CUDNN_DATA_FLOAT, true);
    g.matmul(q, kt, raw);
    const Tensor scale = g.scalar_f32(1.0F / std::sqrt(static_cast<float>(dqk)), p.by_value);
    const Tensor shifted = g.binary(CUDNN_POINTWISE_SUB, g.binary(CUDNN_POINTWISE_MUL, raw, scale), stats);
    const Tensor probs = g.unary(CUDNN_POINTWISE_EXP, masked_scores(g, s, shifted, p, form));

    // dV = P^T dO (summed over the query heads of a kv head for GQA).
    const Tensor probs_t = g.dense_transposed(score_dim, CUDNN_DATA_BFLOAT16, true);
    g.reshape(probs, probs_t);
    if (hk == h) {
      g.matmul(probs_t, d_o, d_v);
    } else {
      const Tensor full = g.dense({b, h, skv, dv}, CUDNN_DATA_BFLOAT16, true);
      g.matmul(probs_t, d_o, full);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, d_v);
    }

    // dS = scale P (dO V^T - D).
    const Tensor dp = g.dense(score_dim, CUDNN_DATA_FLOAT, true);
    g.matmul(d_o, vt, dp);
    const Tensor ds = g.binary(CUDNN_POINTWISE_MUL,
                               g.binary(CUDNN_POINTWISE_MUL, g.binary(CUDNN_POINTWISE_SUB, dp, row_dot), probs), scale);

    // dK = dS^T Q (summed over query heads for GQA).
    const Tensor ds_t = g.dense_transposed(score_dim, CUDNN_DATA_BFLOAT16, true);
    g.reshape(ds, ds_t);
    if (hk == h) {
      g.matmul(ds_t, q, dk);
    } else {
      const Tensor full = g.dense({b, h, skv, dqk}, CUDNN_DATA_BFLOAT16, true);
      g.matmul(ds_t, q, full);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, dk);
    }

    // dQ = dS K, accumulated in fp32 in the workspace, then converted.
    // The view of K^T as K is a virtual fp32 tensor, as in the graph cuDNN's engines are built for.
    const Tensor k = g.dense({b, hk, skv, dqk}, CUDNN_DATA_FLOAT, true);
    g.reshape(kt, k);
    const Tensor dq_accum = g.dense({b, h, sq, dqk}, CUDNN_DATA_FLOAT, false);
    g.matmul(ds, k, dq_accum);
    g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, &dq);
    p.dq_accum_bytes = static_cast<std::size_t>(b * h * sq * dqk) * sizeof(float);

    finish(g, p,
           {{kQ, &q},
            {kK, &kt},
            {kV, &vt},
            {kO, &o},
            {kDO, &d_o},
            {kStats, &stats},
            {kDQ, &dq},
            {kDK, &dk},
            {kDV, &d_v},
            {kRowDot, &row_dot},
            {kDQAccum, &dq_accum}});
    return p;
  }

  void execute(Plan& p, const std::vector<std::pair<Slot, const void*> >& bound, cudaStream_t stream) {
    std::vector<std::int64_t> uids;
    std::vector<void*> ptrs;
    for (const auto& [slot, ptr] : bound) {
      uids.push_back(p.uid[slot]);
      ptrs.push_back(const_cast<void*>(ptr));  // NOLINT(cppcoreguidelines-pro-type-const-cast): cuDNN's void* API
    }
    auto* ws = static_cast<char*>(workspace.data());
    if (p.row_dot_bytes > 0) {
      char* row_dot = ws + Plan::align(p.plan_workspace);
      uids.push_back(p.uid[kRowDot]);
      ptrs.push_back(row_dot);
      uids.push_back(p.uid[kDQAccum]);
      char* accum = row_dot + Plan::align(p.row_dot_bytes);
      ptrs.push_back(accum);
      if (zero_dq_accum) TW_CUDA_CHECK(cudaMemsetAsync(accum, 0, p.dq_accum_bytes, stream));
    }
    for (ByValue& v : p.by_value) {
      uids.push_back(v.uid);
      ptrs.push_back(&v.value);
    }
    ptrs.push_back(ws);  // last: the workspace (part of the reuse key, not of the data pointers)
    if (!p.pack || p.pack_ptrs != ptrs) {
      auto pack = std::make_unique<Descriptor>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack->set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(uids.size()),
                uids.data());
      pack->set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(uids.size()),
                ptrs.data());
      void* ws_ptr = ws;
      pack->set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
      pack->finalize();
      p.pack = std::move(pack);
      p.pack_ptrs = std::move(ptrs);
    }
    TW_CUDNN_CHECK(cudnnSetStream(handle, stream));
    TW_CUDNN_CHECK(cudnnBackendExecute(handle, p.plan, p.pack->get()));
  }
};

FusedAttention::FusedAttention(WindowMask preferred) : impl_(std::make_unique<Impl>(preferred)) {}
FusedAttention::~FusedAttention() = default;

void FusedAttention::reserve(const AttentionShape& s, bool backward) {
  validate_attention(s, "fused attention");
  static_cast<void>(impl_->plan_for(s, false));
  if (backward) static_cast<void>(impl_->plan_for(s, true));
}

void FusedAttention::forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                             cudaStream_t stream) {
  validate_attention(s, "fused attention");
  Impl::Plan& p = impl_->plan_for(s, false);
  impl_->execute(p, {{kQ, q}, {kK, k}, {kV, v}, {kO, o}, {kStats, lse}}, stream);
}

void FusedAttention::backward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                              const bf16* d_o, const float* lse, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream) {
  validate_attention(s, "fused attention");
  Impl::Plan& p = impl_->plan_for(s, true);
  impl_->execute(p, {{kQ, q}, {kK, k}, {kV, v}, {kO, o}, {kDO, d_o}, {kStats, lse}, {kDQ, dq}, {kDK, dk}, {kDV, dv}},
                 stream);
}

std::size_t FusedAttention::workspace_bytes() const { return impl_->workspace.size(); }
std::size_t FusedAttention::plans() const { return impl_->plans.size(); }
std::optional<WindowMask> FusedAttention::window_mask(const AttentionShape& s, bool backward) const {
  const auto it = impl_->plans.find(Impl::key_of(s, backward));
  return it != impl_->plans.end() ? it->second.window_mask : std::nullopt;
}

#endif  // THREEWALLS_HAVE_CUDNN

}  // namespace threewalls::backend
