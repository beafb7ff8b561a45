#include "threewalls/sim/op_coster.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/core/error.hpp"

namespace threewalls::sim {

namespace {

using scenarios::CopyKind;
using scenarios::Op;
using scenarios::OpKind;

std::int64_t at_least_1(std::int64_t v) { return v < 1 ? 1 : v; }

// The kernel threewalls run launches for an element-wise op (backend/src/op_runner.cpp,
// elementwise_of: GeLU and the reduction run the copy kernel, GeLU backward the add kernel). The fp8
// cast (one streaming read, one or two streaming writes) and the amax pass (a streaming read) are
// priced on the measured copy kernel's bandwidth by their own bytes: the profile has no fp8 cast
// family (docs/stepgraph.md, "FP8 quantisation").
std::string_view elementwise_kernel(const Op& op) {
  switch (op.elementwise_kind()) {
    case scenarios::ElementwiseKind::add:
    case scenarios::ElementwiseKind::gelu_bwd: return "elementwise_add";
    case scenarios::ElementwiseKind::copy:
    case scenarios::ElementwiseKind::gelu:
    case scenarios::ElementwiseKind::reduce:
    case scenarios::ElementwiseKind::quantize:
    case scenarios::ElementwiseKind::amax: return "elementwise_copy";
    case scenarios::ElementwiseKind::swiglu: return "elementwise_swiglu";
    case scenarios::ElementwiseKind::swiglu_bwd: return "elementwise_swiglu_bwd";
  }
  return "elementwise_add";
}

}  // namespace

FittedKernel fitted_kernel_of(const Op& op) {
  const auto& s = op.shape;
  const bool bwd = (op.flags & scenarios::kBackward) != 0;
  auto d = [](std::int64_t v) { return static_cast<double>(std::max<std::int64_t>(v, 0)); };
  switch (op.kind) {
    case OpKind::softmax_topk:
      return {bwd ? calibration::kSoftmaxTopkBwdFamily : calibration::kSoftmaxTopkFwdFamily, {d(s[0]), d(s[1]), d(s[2])}};
    case OpKind::permute:
    case OpKind::unpermute: {
      // OpRunner (backend/src/op_runner.cpp, topk_of): topk = rows / op.tokens when that divides and
      // is at most 32, else 1; the kernels run over rows / topk tokens.
      const std::int64_t rows = std::max<std::int64_t>(s[0], 0);
      std::int64_t k = 1;
      if (op.tokens > 0 && rows % op.tokens == 0 && rows / op.tokens <= 32) k = std::max<std::int64_t>(rows / op.tokens, 1);
      const std::string_view family =
          op.kind == OpKind::permute ? (bwd ? calibration::kPermuteBwdFamily : calibration::kPermuteFwdFamily)
                                     : (bwd ? calibration::kUnpermuteBwdFamily : calibration::kUnpermuteFwdFamily);
      return {family, {d(rows / k), d(k), d(s[1])}};
    }
    case OpKind::embedding:
      return {bwd ? calibration::kEmbeddingBwdFamily : calibration::kEmbeddingFwdFamily, {d(s[0]), d(s[1])}};
    case OpKind::cross_entropy:
      return {bwd ? calibration::kCrossEntropyBwdFamily : calibration::kCrossEntropyFwdFamily, {d(s[0]), d(s[1])}};
    case OpKind::optimizer: return {calibration::kAdamStepFamily, {d(s[0])}};
    case OpKind::norm:
      if (op.norm_kind() == scenarios::NormKind::rmsnorm) {
        return {bwd ? calibration::kRmsnormBwdFamily : calibration::kRmsnormFwdFamily, {d(s[0]), d(s[1])}};
      }
      return {bwd ? calibration::kLayernormBwdFamily : calibration::kLayernormFwdFamily, {d(s[0]), d(s[1])}};
    default: break;
  }
  throw std::logic_error(std::string("fitted_kernel_of asked for a ") + scenarios::to_string(op.kind) + " op");
}

std::optional<FittedKernel> pytorch_kernel_of(const Op& op) {
  const auto& s = op.shape;
  const bool bwd = (op.flags & scenarios::kBackward) != 0;
  auto d = [](std::int64_t v) { return static_cast<double>(std::max<std::int64_t>(v, 0)); };
  // The twin's name as the kernel_terms table (its owner) stores it.
  auto twin = [](std::string_view backend) -> std::string_view {
    const std::string name = calibration::pytorch_twin(backend);
    const calibration::KernelTermsFamily* k = calibration::find_kernel_terms_family(name);
    if (!k) throw std::logic_error("kernel_terms table has no " + name);
    return k->name;
  };
  switch (op.kind) {
    case OpKind::softmax_topk:
    case OpKind::cross_entropy:
    case OpKind::optimizer:
    case OpKind::norm: {
      FittedKernel fk = fitted_kernel_of(op);
      return FittedKernel{twin(fk.family), std::move(fk.inputs)};
    }
    case OpKind::permute:
    case OpKind::unpermute: {
      const double rows = d(s[0]);
      if (s[2] <= 0) {
        // A pure reordering (the alltoall dispatcher's sort of the received rows by local expert and
        // its inverse): one index_select, whichever direction, which is F.embedding's forward
        // (at::embedding gathers with index_select) over a table of the rows; backward, index_select's
        // backward, the permute backward's zeroed index_add_ with one row per token.
        if ((op.flags & scenarios::kBackward) != 0)
          return FittedKernel{twin(calibration::kPermuteBwdFamily), {rows, 1.0, d(s[1])}};
        return FittedKernel{twin(calibration::kEmbeddingFwdFamily), {rows, d(s[1]), rows}};
      }
      const double tokens = d(s[2]);
      if (op.expert >= 0 && op.kind == OpKind::permute && !bwd) {
        // An eager loop's gather of one expert's rows (Hugging Face's hidden_states[token_idx]): one
        // index kernel over the tokens, as index_select (F.embedding's forward) is, not the
        // dispatcher's permute (a sort of every token's choices and a gather of all of them).
        return FittedKernel{twin(calibration::kEmbeddingFwdFamily), {rows, d(s[1]), tokens}};
      }
      return FittedKernel{twin(fitted_kernel_of(op).family), {tokens, tokens > 0 ? rows / tokens : 1.0, d(s[1])}};
    }
    case OpKind::embedding: return FittedKernel{twin(fitted_kernel_of(op).family), {d(s[0]), d(s[1]), d(s[2])}};
    case OpKind::attention:
      if (scenarios::attention_kernel(op) != scenarios::AttentionKernel::decode) return std::nullopt;
      return FittedKernel{calibration::kPytorchAttentionDecodeFamily,
                          {d(s[0]), d(s[2]), d(s[3]), d(scenarios::attention_kv_heads(op)), d(s[4]) + d(s[5])}};
    case OpKind::elementwise:
      switch (op.elementwise_kind()) {
        case scenarios::ElementwiseKind::swiglu: return FittedKernel{calibration::kPytorchSwigluFwdFamily, {d(s[0])}};
        case scenarios::ElementwiseKind::swiglu_bwd:
          return FittedKernel{calibration::kPytorchSwigluBwdFamily, {d(s[0])}};
        case scenarios::ElementwiseKind::gelu: return FittedKernel{calibration::kPytorchGeluFwdFamily, {d(s[0])}};
        case scenarios::ElementwiseKind::gelu_bwd: return FittedKernel{calibration::kPytorchGeluBwdFamily, {d(s[0])}};
        case scenarios::ElementwiseKind::add:
          if (bwd) return FittedKernel{calibration::kPytorchAddBwdFamily, {d(s[0])}};
          return std::nullopt;
        case scenarios::ElementwiseKind::reduce: return FittedKernel{calibration::kPytorchGradNormFamily, {d(s[0])}};
        default: return std::nullopt;
      }
    default: return std::nullopt;
  }
}

std::optional<HostBody> pytorch_host_body_of(const Op& op, bool records_autograd) {
  const bool bwd = (op.flags & scenarios::kBackward) != 0;
  const double autograd = bwd || records_autograd ? 1.0 : 0.0;
  auto body = [&](std::string_view family, double share = 1.0) {
    return HostBody{std::string(family), autograd, share, {}};
  };
  switch (op.kind) {
    case OpKind::gemm:
      return bwd ? body(calibration::kPytorchHostLinearBwdFamily, 0.5) : body(calibration::kPytorchHostLinearFwdFamily);
    case OpKind::attention:
      if (scenarios::attention_kernel(op) == scenarios::AttentionKernel::decode) break;  // pytorch.attention_decode's
      return body(bwd ? calibration::kPytorchHostAttentionBwdFamily : calibration::kPytorchHostAttentionFwdFamily);
    case OpKind::permute:
    case OpKind::unpermute: {
      if (op.expert < 0) break;
      // An eager loop's gather (a permute) or scatter (an unpermute), forward or backward (the
      // backward op keeps its forward op's kind).
      if (op.kind == OpKind::permute) {
        return body(bwd ? calibration::kPytorchHostExpertGatherBwdFamily
                        : calibration::kPytorchHostExpertGatherFwdFamily);
      }
      const std::string_view weighted =
          bwd ? calibration::kPytorchHostExpertScatterBwdFamily : calibration::kPytorchHostExpertScatterFwdFamily;
      if (op.row_weights() == scenarios::RowWeights::weighted) return body(weighted);
      HostBody b = body(bwd ? calibration::kPytorchHostExpertScatterUnweightedBwdFamily
                            : calibration::kPytorchHostExpertScatterUnweightedFwdFamily);
      b.fallback = std::string(weighted);
      return b;
    }
    case OpKind::optimizer: return std::nullopt;  // a host loop per tensor: the per-launch costs
    default: break;
  }
  const auto fk = pytorch_kernel_of(op);
  if (!fk || fk->family == calibration::kPytorchGradNormFamily) return std::nullopt;
  const std::string name = calibration::pytorch_host_twin(fk->family);
  if (!calibration::find_kernel_terms_family(name)) throw std::logic_error("kernel_terms table has no " + name);
  return body(name);
}

CostModelCoster::CostModelCoster(const calibration::CostModel& model, double host_scale, double disk_scale,
                                 scenarios::Framework framework)
    : model_(model), host_scale_(host_scale), disk_scale_(disk_scale), framework_(framework) {
  if (!(host_scale > 0.0) || !std::isfinite(host_scale)) {
    throw InputError("host scale " + std::to_string(host_scale) + " must be a positive number");
  }
  if (!(disk_scale > 0.0) || !std::isfinite(disk_scale)) {
    throw InputError("disk scale " + std::to_string(disk_scale) + " must be a positive number");
  }
  const double k = host_scale;
  host_.kernel_launch = model.kernel_launch() * k;
  host_.collective_launch = model.collective_launch() * k;
  host_.graph_launch = model.graph_launch() * k;
  host_.graph_node = model.graph_node();  // device time
  host_.stream_sync = model.stream_sync() * k;
  host_.gpu_read = model.gpu_read() * k;
  host_.framework_op = model.framework_op() * k;
  host_.event_record = model.event_record() * k;
  host_.timing_marker = model.timing_marker();  // device time
  // Library-call launch costs (each falls back to kernel_launch in the cost model when the profile
  // lacks its family).
  const auto scaled = [k](std::optional<Seconds> v) { return v ? std::optional<Seconds>(*v * k) : v; };
  host_.gemm_launch = scaled(model.gemm_launch());
  host_.grouped_gemm_launch = scaled(model.grouped_gemm_launch());
  host_.attention_launch = scaled(model.attention_launch());
  host_.attention_bwd_launch = scaled(model.attention_bwd_launch());
  host_.op_dispatch = model.op_dispatch() * k;
  host_.record_op = scaled(model.record_op());
  host_.stream_wait = scaled(model.stream_wait());
  host_.framework_backward_op = scaled(model.framework_backward_op());
  host_.framework_sync = scaled(model.framework_sync());
  host_.framework_attention_plan = scaled(model.framework_attention_plan());
  host_.framework_autograd_op = scaled(model.framework_autograd_op());
  host_.framework_record_op = scaled(model.framework_record_op());
}

Seconds CostModelCoster::stream_cycle_extra(int streams) const { return model_.stream_cycle_extra(streams) * host_scale_; }
std::optional<Seconds> CostModelCoster::framework_stream_extra(int streams) const {
  const auto x = model_.framework_stream_extra(streams);
  if (!x) return std::nullopt;
  return *x * host_scale_;
}

std::optional<Seconds> CostModelCoster::library_launch(const Op& op) const {
  const auto& s = op.shape;
  if (op.kind == OpKind::gemm) {
    return model_.gemm_launch(at_least_1(s[0]), at_least_1(s[1]), at_least_1(s[2]), at_least_1(s[3])) * host_scale_;
  }
  if (op.kind == OpKind::grouped_gemm && s[0] > 0) {
    return model_.grouped_gemm_launch(at_least_1(s[3]), s[0], at_least_1(s[4])) * host_scale_;
  }
  return std::nullopt;
}

std::size_t CostModelCoster::KernelKeyHash::operator()(const KernelKey& k) const {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 0x100000001b3ULL + (h >> 29); };
  for (const std::int64_t v : k.shape) mix(static_cast<std::uint64_t>(v));
  mix(std::bit_cast<std::uint64_t>(k.bytes));
  mix((static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.tokens)) << 32) |
      (static_cast<std::uint64_t>(k.kind) << 24) | (static_cast<std::uint64_t>(k.sub) << 16) |
      (static_cast<std::uint64_t>(k.dtype) << 8) | k.flags);
  return static_cast<std::size_t>(h);
}

Seconds CostModelCoster::kernel_time(const Op& op) const {
  const KernelKey key{op.shape, op.bytes, op.tokens, op.kind, op.sub, op.dtype, op.flags};
  if (const auto it = kernel_times_.find(key); it != kernel_times_.end()) return it->second;
  const Seconds t = compute_kernel_time(op);
  kernel_times_.emplace(key, t);
  return t;
}

std::optional<Seconds> CostModelCoster::framework_body_host(const Op& op, bool records_autograd) const {
  if (framework_ != scenarios::Framework::pytorch_eager) return std::nullopt;
  const auto b = pytorch_host_body_of(op, records_autograd);
  if (!b) return std::nullopt;
  auto t = model_.fitted_kernel(b->family, {b->autograd});
  if (!t && !b->fallback.empty()) t = model_.fitted_kernel(b->fallback, {b->autograd});
  if (!t) return std::nullopt;
  return Seconds(t->value * b->share * host_scale_);
}

Seconds CostModelCoster::compute_kernel_time(const Op& op) const {
  const auto& s = op.shape;
  if (framework_ == scenarios::Framework::pytorch_eager) {
    if (const auto fk = pytorch_kernel_of(op)) {
      if (const auto t = model_.fitted_kernel(fk->family, fk->inputs)) return *t;
    }
  }
  switch (op.kind) {
    case OpKind::gemm:
      return model_.gemm(at_least_1(s[0]), at_least_1(s[1]), at_least_1(s[2]), op.dtype, at_least_1(s[3]));
    case OpKind::grouped_gemm: {
      const std::int64_t total = s[0];
      const std::int64_t n = at_least_1(s[1]);
      const std::int64_t k = at_least_1(s[2]);
      const std::int64_t groups = at_least_1(s[3]);
      if (total <= 0) return Seconds(0.0);
      if (s[5] == 1) {
        // wgrad: group g computes dW_g (n x k) reducing over its r_g rows. Same FLOPs as groups GEMMs
        // of n rows, k columns and a reduction of the mean rows per group.
        const std::int64_t mean_rows = at_least_1(total / groups);
        return model_.grouped_gemm(groups, n * groups, n, k, mean_rows, op.dtype);
      }
      return model_.grouped_gemm(groups, total, at_least_1(s[4]), n, k, op.dtype);
    }
    case OpKind::attention: {
      // The kernel the op runs on (scenarios::attention_kernel) by its own fit when the profile has
      // it; else, and for the unfused kernel, by the attention fits (substitution() says so).
      calibration::AttentionShape a;
      a.batch = at_least_1(s[0]);
      a.seq_q = at_least_1(s[1]);
      a.seq_kv = at_least_1(s[2]);
      a.heads = at_least_1(s[3]);
      a.kv_heads = at_least_1(scenarios::attention_kv_heads(op));
      a.head_dim_qk = at_least_1(s[4]);
      a.head_dim_v = at_least_1(s[5]);
      a.causal = (op.flags & scenarios::kCausal) != 0;
      a.window = s[7];
      const bool backward = (op.flags & scenarios::kBackward) != 0;
      std::optional<Seconds> own;
      switch (scenarios::attention_kernel(op)) {
        case scenarios::AttentionKernel::fused: own = model_.fused_attention(a, backward); break;
        case scenarios::AttentionKernel::decode: own = model_.decode_attention(a); break;
        case scenarios::AttentionKernel::unfused: break;
      }
      return own ? *own : model_.attention(a, backward);
    }
    case OpKind::elementwise: return model_.memory_kernel(elementwise_kernel(op), Bytes(op.bytes));
    case OpKind::norm: {
      // threewalls run's RMSNorm or LayerNorm kernel, forward or backward: by its rows x hidden fit
      // (kernel_terms_v1), else by its bytes fit, else by the pooled norm fit (a profile may
      // have neither a LayerNorm fit nor any rows x hidden fit).
      const FittedKernel fk = fitted_kernel_of(op);
      if (const auto t = model_.fitted_kernel(fk.family, fk.inputs)) return *t;
      // The bytes fit of the same kernel is named after its calibrate op (the family's `op`).
      return model_.memory_kernel(calibration::find_kernel_terms_family(fk.family)->op, Bytes(op.bytes));
    }
    case OpKind::softmax_topk:
    case OpKind::permute:
    case OpKind::unpermute:
    case OpKind::embedding:
    case OpKind::cross_entropy:
    case OpKind::optimizer: {
      // The launch sequence threewalls run uses, by its own shape fit (kernel_terms_v1); the pooled
      // elementwise(bytes) fit when the profile predates those families.
      const FittedKernel fk = fitted_kernel_of(op);
      if (const auto t = model_.fitted_kernel(fk.family, fk.inputs)) return *t;
      return model_.elementwise(Bytes(op.bytes));
    }
    case OpKind::copy: return model_.copy(op.copy_kind(), Bytes(op.bytes));
    case OpKind::collective:
    case OpKind::send:
    case OpKind::recv:
    case OpKind::host: break;
  }
  throw std::logic_error(std::string("kernel_time asked for a ") + scenarios::to_string(op.kind) + " op");
}

std::optional<std::string> CostModelCoster::substitution(const Op& op) const {
  if (framework_ == scenarios::Framework::pytorch_eager) {
    if (const auto b = pytorch_host_body_of(op, true); b && !b->fallback.empty()) {
      // Whether the profile has a host family does not depend on its input: ask with 1.
      if (!model_.fitted_kernel(b->family, {1.0}) && model_.fitted_kernel(b->fallback, {1.0})) {
        return "run.framework = \"pytorch_eager\": an eager expert loop's scatter without router weights (its "
               "rows' weights applied by moe_unpermute after the experts) is charged the host time of " +
               b->fallback + ", the weighted scatter's: the profile has no " + b->family +
               " (python3 -m threewalls.bench.pytorch_kernels measures it)";
      }
    }
    if (const auto fk = pytorch_kernel_of(op)) {
      // Whether the profile has the family does not depend on the shape: ask with ones.
      if (!model_.fitted_kernel(fk->family, std::vector<double>(fk->inputs.size(), 1.0))) {
        // One sentence for a profile without any of them, else one per missing family.
        bool any = false;
        for (const auto& k : calibration::kernel_terms_families()) {
          if (k.points_of == "python" && model_.fitted_kernel(k.name, std::vector<double>(k.inputs.size(), 1.0))) {
            any = true;
            break;
          }
        }
        if (!any) {
          return std::string(
              "run.framework = \"pytorch_eager\": the profile has no pytorch.* kernel families: the memory-bound "
              "ops are priced with threewalls run's kernels, not PyTorch's (python3 -m "
              "threewalls.bench.pytorch_kernels measures them; docs/simulator.md, \"Framework kernels\")");
        }
        return "run.framework = \"pytorch_eager\": " + std::string(scenarios::to_string(op.kind)) +
               " ops are priced with threewalls run's kernels: the profile has no " + std::string(fk->family) +
               " (PyTorch's kernels; python3 -m threewalls.bench.pytorch_kernels measures them)";
      }
      return std::nullopt;  // priced by PyTorch's own family
    }
  }
  if (op.kind != OpKind::attention) return std::nullopt;
  switch (scenarios::attention_kernel(op)) {
    case scenarios::AttentionKernel::unfused: return std::nullopt;
    case scenarios::AttentionKernel::fused: {
      const bool backward = (op.flags & scenarios::kBackward) != 0;
      if (model_.has_fused_attention(backward)) return std::nullopt;
      return std::string(
          "fused attention (model.attention_impl = \"fused\") is costed from the unfused attention "
          "fits (attention.fwd, attention.bwd): the profile has no fused attention family (attention_fused.fwd, "
          "attention_fused.bwd)");
    }
    case scenarios::AttentionKernel::decode:
      if (model_.has_decode_attention()) return std::nullopt;
      return std::string(
          "decode attention (fused, one query per sequence) is costed from the unfused attention "
          "fit (attention.fwd): the profile has no decode attention family (attention_decode)");
  }
  return std::nullopt;
}

Seconds CostModelCoster::copy_time(CopyKind kind, Bytes bytes) const {
  const Seconds t = model_.copy(kind, bytes);
  return kind == CopyKind::disk_read ? t * disk_scale_ : t;
}

CommParams CostModelCoster::comm_params(Collective kind, Bytes bytes, int group_size, LinkScope scope) const {
  const auto p = model_.collective_params(kind, bytes, group_size, scope);
  return CommParams{p.latency, p.bus_bandwidth};
}

double CostModelCoster::stream_concurrency(int streams, double fraction) const {
  return model_.stream_concurrency(streams, fraction);
}

int CostModelCoster::sm_count() const { return model_.sm_count(); }

double CostModelCoster::nccl_resident_slowdown(int nccl_case, int compute_class, double tiles) const {
  return model_.nccl_resident_slowdown(nccl_case, compute_class, tiles);
}

bool CostModelCoster::models_nccl_residency() const { return model_.has_nccl_interference(); }

std::optional<NcclMemoryParams> CostModelCoster::nccl_memory() const {
  const auto m = model_.nccl_memory();
  if (!m) return std::nullopt;
  return NcclMemoryParams{m->communicator, m->collective, m->p2p_peer};
}

std::optional<BytesPerSecond> CostModelCoster::expert_dispatch_bandwidth(int group_size, bool combine) const {
  return model_.expert_dispatch_bandwidth(group_size, combine);
}

std::optional<DeviceMemoryParams> CostModelCoster::device_memory() const {
  const auto m = model_.device_memory();
  if (!m) return std::nullopt;
  return DeviceMemoryParams{m->context, m->modules, m->blas, m->blas_further, m->cudnn, m->granularity};
}

}  // namespace threewalls::sim
