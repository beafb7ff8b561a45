// The simulator's costs: the typed models of a profile, decoded once at construction, evaluated per
// call. Each call states the equation of its family (full statements in models.hpp and
// docs/calibration.md). A family the profile lacks is an InputError at the call that needs it,
// naming the profile and what it has: never a silent default.
#include "threewalls/calibration/cost_model.hpp"

#include <array>
#include <map>
#include <cmath>
#include <optional>

#include "families/decoded.hpp"
#include "families/module.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::calibration {

namespace {

using detail::HostCost;
using detail::idx;

void require_non_negative(std::int64_t v, const char* call, const char* what) {
  if (v < 0)
    throw InputError(std::string("CostModel::") + call + ": " + what + " = " + std::to_string(v) + " must be >= 0");
}

void require_bytes(Bytes b, const char* call) {
  if (!(b.value >= 0) || !std::isfinite(b.value)) {
    throw InputError(std::string("CostModel::") + call + ": bytes must be a finite number >= 0");
  }
}

}  // namespace

struct CostModel::Impl : detail::DecodedModels {
  std::string id;
  std::string description;
  std::vector<std::string> have;
  Hardware hardware;

  [[noreturn]] void missing(const std::string& family) const {
    throw InputError(description + " has no model '" + family +
                     "' (it has: " + (have.empty() ? "nothing" : join(have)) +
                     "); measure it with `threewalls calibrate` or use a profile that has it");
  }

  Seconds host_cost(HostCost c) const {
    return Seconds(need(host[idx(c)], [&] { return host_family(detail::host_cost_name(c)); }).time_s());
  }
  [[nodiscard]] bool has(HostCost c) const { return host[idx(c)].has_value(); }
  // An optional host cost: the family's median when the profile has it, else `fallback()`.
  template <class Fallback>
  Seconds host_cost_or(HostCost c, Fallback fallback) const {
    return has(c) ? host_cost(c) : fallback();
  }

  // `family` is a callable giving the family's name, built only when it is missing (hot path).
  template <class T, class NameFn>
  const T& need(const std::optional<T>& m, NameFn family) const {
    if (!m) missing(family());
    return *m;
  }
};

CostModel::CostModel(const Profile& profile) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.id = profile.id();
  m.description = profile.describe();
  m.hardware = profile.hardware();
  const Hardware& hw = m.hardware;
  for (const auto& f : profile.families()) {
    m.have.push_back(f.name);
    detail::store_model(f, hw, m);
  }
}

CostModel::~CostModel() = default;
CostModel::CostModel(CostModel&&) noexcept = default;
CostModel& CostModel::operator=(CostModel&&) noexcept = default;

// t = max((F + tail 2 k Tm Tn SMs) / (P e_max k/(k+k_half)), B / BW) + t0   (GemmModel, "gemm_roofline_v2")
Seconds CostModel::gemm(std::int64_t m, std::int64_t n, std::int64_t k, DType dt, std::int64_t batch) const {
  require_non_negative(m, "gemm", "m");
  require_non_negative(n, "gemm", "n");
  require_non_negative(k, "gemm", "k");
  require_non_negative(batch, "gemm", "batch");
  return Seconds(impl_->need(impl_->gemm[idx(dt)], [&] { return gemm_family(dt); }).time_s(m, n, k, batch));
}

// t = max(waves 2 Tm Tn (k+k_half) / (P_sm e_max), B / BW) + t0   (GroupedGemmModel)
Seconds CostModel::grouped_gemm(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows, std::int64_t n,
                                std::int64_t k, DType dt) const {
  require_non_negative(groups, "grouped_gemm", "groups");
  require_non_negative(total_rows, "grouped_gemm", "total_rows");
  require_non_negative(max_rows, "grouped_gemm", "max_rows");
  require_non_negative(n, "grouped_gemm", "n");
  require_non_negative(k, "grouped_gemm", "k");
  if (max_rows > total_rows || (groups > 0 && max_rows * groups < total_rows)) {
    throw InputError("CostModel::grouped_gemm: max_rows = " + std::to_string(max_rows) +
                     " must lie between total_rows / groups (" +
                     std::to_string(groups > 0 ? (total_rows + groups - 1) / groups : 0) + ") and total_rows (" +
                     std::to_string(total_rows) + ")");
  }
  return Seconds(impl_->need(impl_->grouped[idx(dt)], [&] { return grouped_gemm_family(dt); })
                     .time_s(groups, total_rows, max_rows, n, k));
}

Seconds CostModel::attention(std::int64_t batch, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t heads,
                             std::int64_t head_dim_qk, std::int64_t head_dim_v, bool causal, bool backward) const {
  AttentionShape s;
  s.batch = batch;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.heads = heads;
  s.kv_heads = heads;
  s.head_dim_qk = head_dim_qk;
  s.head_dim_v = head_dim_v;
  s.causal = causal;
  return attention(s, backward);
}

namespace {
void require_attention_shape(const AttentionShape& s) {
  for (auto [v, name] : {std::pair{s.batch, "batch"}, std::pair{s.seq_q, "seq_q"}, std::pair{s.seq_kv, "seq_kv"},
                         std::pair{s.heads, "heads"}, std::pair{s.kv_heads, "kv_heads"},
                         std::pair{s.head_dim_qk, "head_dim_qk"}, std::pair{s.head_dim_v, "head_dim_v"}}) {
    require_non_negative(v, "attention", name);
  }
  require_non_negative(s.window, "attention", "window");
  if (s.window > 0 && !s.causal) {
    throw InputError("CostModel::attention: window = " + std::to_string(s.window) +
                     " needs a causal mask (a sliding window is the causal mask's band)");
  }
}
}  // namespace

// t = max(F / (P e_max L/(L+s_half) d/(d+d_half) q), B / BW) + t0   (AttentionModel)
Seconds CostModel::attention(const AttentionShape& s, bool backward) const {
  require_attention_shape(s);
  return Seconds(impl_->need(impl_->attention[backward ? 1 : 0], [&] { return attention_family(backward); }).time_s(s));
}

// attention_tiles_v1 (AttentionModel, scheduled form)
std::optional<Seconds> CostModel::fused_attention(const AttentionShape& s, bool backward) const {
  require_attention_shape(s);
  const auto& m = impl_->attention_fused[backward ? 1 : 0];
  if (!m) return std::nullopt;
  return Seconds(m->time_s(s));
}

bool CostModel::has_fused_attention(bool backward) const {
  return impl_->attention_fused[backward ? 1 : 0].has_value();
}

bool CostModel::has_decode_attention() const { return impl_->attention_decode.has_value(); }

// t = t0 + B per_byte + F per_flop   (DecodeAttentionModel)
std::optional<Seconds> CostModel::decode_attention(const AttentionShape& s) const {
  require_attention_shape(s);
  if (!impl_->attention_decode) return std::nullopt;
  return Seconds(impl_->attention_decode->time_s(s));
}

// t = alpha + bytes / beta (piecewise)   (LinearModel)
Seconds CostModel::elementwise(Bytes bytes) const {
  require_bytes(bytes, "elementwise");
  return Seconds(impl_->need(impl_->elementwise, [&] { return std::string(kElementwiseFamily); }).time_s(bytes.value));
}

Seconds CostModel::norm(Bytes bytes) const {
  require_bytes(bytes, "norm");
  return Seconds(impl_->need(impl_->norm, [&] { return std::string(kNormFamily); }).time_s(bytes.value));
}

Seconds CostModel::memory_kernel(std::string_view kernel_family, Bytes bytes) const {
  require_bytes(bytes, "memory_kernel");
  const auto it = impl_->kernels.find(kernel_family);
  if (it != impl_->kernels.end()) return Seconds(it->second.time_s(bytes.value));
  return kernel_family.rfind("norm", 0) == 0 ? norm(bytes) : elementwise(bytes);
}

// t = t0 + sum_j c_j prod_{i in F_j} x_i   (KernelTermsModel, "kernel_terms_v1")
std::optional<Seconds> CostModel::fitted_kernel(std::string_view kernel_family, const std::vector<double>& inputs) const {
  const KernelTermsFamily* k = find_kernel_terms_family(kernel_family);
  if (!k) {
    std::vector<std::string> names;
    for (const auto& f : kernel_terms_families()) names.push_back(f.name);
    throw InputError("CostModel::fitted_kernel: unknown kernel family '" + std::string(kernel_family) +
                     "'; known: " + join(names));
  }
  if (inputs.size() != k->inputs.size()) {
    throw InputError("CostModel::fitted_kernel: " + k->name + " takes " + std::to_string(k->inputs.size()) +
                     " inputs, " + std::to_string(inputs.size()) + " given");
  }
  for (const double v : inputs) {
    if (!(v >= 0) || !std::isfinite(v)) {
      throw InputError("CostModel::fitted_kernel: " + k->name + ": inputs must be finite numbers >= 0");
    }
  }
  const auto it = impl_->kernel_terms.find(kernel_family);
  if (it == impl_->kernel_terms.end()) return std::nullopt;
  return Seconds(it->second.time_s(inputs));
}

Seconds CostModel::copy(CopyKind dir, Bytes bytes) const {
  require_bytes(bytes, "copy");
  return Seconds(impl_->need(impl_->copy[idx(dir)], [&] { return copy_family(dir); }).time_s(bytes.value));
}

// t = c(S) (alpha + (S f(n)) / beta_eff(S))   (CollectiveModel, c = 1 without correction knots)
CollectiveParams CostModel::collective_params(Collective kind, Bytes bytes, int group_size, LinkScope scope) const {
  require_bytes(bytes, "collective_params");
  if (group_size < 1) {
    throw InputError("CostModel::collective_params: group_size = " + std::to_string(group_size) + " must be >= 1");
  }
  const auto& model =
      impl_->need(impl_->collective[idx(kind)][idx(scope)], [&] { return collective_family(kind, scope); });
  // With the per-size correction c: latency c alpha, bandwidth beta_eff / c (models.hpp).
  return CollectiveParams{Seconds(model.latency_s(bytes.value, group_size)),
                          BytesPerSecond(model.bus_bandwidth_bytes_per_s(bytes.value, group_size))};
}

Seconds CostModel::collective(Collective kind, Bytes bytes, int group_size, LinkScope scope) const {
  const CollectiveParams p = collective_params(kind, bytes, group_size, scope);
  if (!(bytes.value > 0)) return p.latency;
  // The exact expression documented for flow simulators: alpha + (S * f) / beta_eff.
  return p.latency + Seconds((bytes.value * bus_bandwidth_factor(kind, group_size)) / p.bus_bandwidth.value);
}

// t = median of the measured points   (ConstantModel), one family per host cost.
Seconds CostModel::kernel_launch() const { return impl_->host_cost(HostCost::kernel_launch); }
Seconds CostModel::framework_op() const { return impl_->host_cost(HostCost::framework_op); }
Seconds CostModel::event_record() const { return impl_->host_cost(HostCost::event_record); }
Seconds CostModel::stream_sync() const { return impl_->host_cost(HostCost::stream_sync); }
Seconds CostModel::gpu_read() const { return impl_->host_cost(HostCost::gpu_read); }
Seconds CostModel::graph_launch() const { return impl_->host_cost(HostCost::graph_launch); }
Seconds CostModel::graph_node() const { return impl_->host_cost(HostCost::graph_node); }
Seconds CostModel::collective_launch() const { return impl_->host_cost(HostCost::collective_launch); }
// Optional: 0 when the profile lacks it.
Seconds CostModel::timing_marker() const {
  return impl_->host_cost_or(HostCost::timing_marker, [&] { return Seconds(0.0); });
}
// Library calls (optional families): the family's median when the profile has it, else
// kernel_launch.
Seconds CostModel::gemm_launch() const {
  return impl_->host_cost_or(HostCost::gemm_launch, [&] { return kernel_launch(); });
}
Seconds CostModel::grouped_gemm_launch() const {
  return impl_->host_cost_or(HostCost::grouped_gemm_launch, [&] { return kernel_launch(); });
}
Seconds CostModel::attention_launch() const {
  return impl_->host_cost_or(HostCost::attention_launch, [&] { return kernel_launch(); });
}
Seconds CostModel::attention_bwd_launch() const {
  return impl_->host_cost_or(HostCost::attention_bwd_launch, [&] { return kernel_launch(); });
}
// Shape-aware forms (host.gemm_call: split-K predicted from k per output tile; host.grouped_gemm_call:
// one matmul per run of equal rows); the median families above when the profile lacks them.
Seconds CostModel::gemm_launch(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) const {
  if (impl_->gemm_call) return Seconds(impl_->gemm_call->time_s(m, n, k, batch));
  return gemm_launch();
}
Seconds CostModel::grouped_gemm_launch(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows) const {
  if (impl_->grouped_call) return Seconds(impl_->grouped_call->time_s(groups, total_rows, max_rows));
  return grouped_gemm_launch();
}
// The executor's per-op path (optional families): 0 / empty when the profile lacks them.
Seconds CostModel::op_dispatch() const {
  return impl_->host_cost_or(HostCost::op_dispatch, [&] { return Seconds(0.0); });
}
std::optional<Seconds> CostModel::record_op() const {
  if (!impl_->has(HostCost::record_op)) return std::nullopt;
  return impl_->host_cost(HostCost::record_op);
}
std::optional<Seconds> CostModel::framework_backward_op() const {
  if (!impl_->has(HostCost::framework_backward_op)) return std::nullopt;
  return impl_->host_cost(HostCost::framework_backward_op);
}
std::optional<Seconds> CostModel::framework_sync() const {
  if (!impl_->has(HostCost::framework_sync)) return std::nullopt;
  return impl_->host_cost(HostCost::framework_sync);
}
std::optional<Seconds> CostModel::framework_record_op() const {
  if (!impl_->has(HostCost::framework_record_op)) return std::nullopt;
  return impl_->host_cost(HostCost::framework_record_op);
}
std::optional<Seconds> CostModel::framework_autograd_op() const {
  if (!impl_->has(HostCost::framework_autograd_op)) return std::nullopt;
  return impl_->host_cost(HostCost::framework_autograd_op);
}
std::optional<Seconds> CostModel::framework_attention_plan() const {
  if (!impl_->has(HostCost::framework_attention_plan)) return std::nullopt;
  return impl_->host_cost(HostCost::framework_attention_plan);
}
Seconds CostModel::stream_wait() const {
  return impl_->host_cost_or(HostCost::stream_wait, [&] { return event_record(); });
}
// extra(N) of host.stream_cycle (StreamCycleModel); 0 when the profile lacks it.
Seconds CostModel::stream_cycle_extra(int streams) const {
  return Seconds(impl_->stream_cycle ? impl_->stream_cycle->extra(streams) : 0.0);
}
// extra(N) of host.framework_stream_op; empty when the profile lacks it.
std::optional<Seconds> CostModel::framework_stream_extra(int streams) const {
  if (!impl_->framework_stream) return std::nullopt;
  return Seconds(impl_->framework_stream->extra(streams));
}
bool CostModel::has_library_launch_costs() const {
  return impl_->has(HostCost::gemm_launch) || impl_->has(HostCost::grouped_gemm_launch) ||
         impl_->has(HostCost::attention_launch) || impl_->has(HostCost::attention_bwd_launch) || impl_->gemm_call ||
         impl_->grouped_call;
}

// s = min(n, 1/f)^e(n)   (ConcurrencyModel)
double CostModel::stream_concurrency(int streams, double sm_fraction) const {
  if (streams < 1)
    throw InputError("CostModel::stream_concurrency: streams = " + std::to_string(streams) + " must be >= 1");
  if (!(sm_fraction > 0 && sm_fraction <= 1)) {
    throw InputError("CostModel::stream_concurrency: sm_fraction must be in (0, 1]");
  }
  if (streams == 1) return 1.0;
  return impl_->need(impl_->concurrency, [&] { return std::string(kConcurrencyFamily); }).speedup(streams, sm_fraction);
}

FlopsPerSecond CostModel::peak_flops(DType dt) const { return FlopsPerSecond(impl_->hardware.peak_flop_per_s(dt)); }

// The measured copy bandwidth counted as read + write: twice the large-size rate of copy.d2d.
BytesPerSecond CostModel::hbm_bandwidth() const {
  const auto& d2d = impl_->need(impl_->copy[idx(CopyKind::d2d)], [&] { return copy_family(CopyKind::d2d); });
  return BytesPerSecond(2.0 * d2d.asymptotic_bandwidth_bytes_per_s());
}

int CostModel::sm_count() const { return impl_->hardware.sm_count; }

const std::string& CostModel::profile_id() const { return impl_->id; }

std::optional<Seconds> CostModel::predict_point(std::string_view family, const std::vector<double>& inputs) const {
  const FamilySpec* spec = find_family_spec(family);
  if (!spec) throw InputError("CostModel::predict_point: unknown calibration family '" + std::string(family) + "'");
  if (inputs.size() != spec->inputs.size()) {
    throw InputError("CostModel::predict_point: " + spec->name + " takes " + std::to_string(spec->inputs.size()) +
                     " inputs, " + std::to_string(inputs.size()) + " given");
  }
  const auto cost = detail::module_of(*spec).cost;
  if (!cost) return std::nullopt;
  const std::optional<double> t = cost(*this, *spec, inputs);
  if (!t) return std::nullopt;
  return Seconds(*t);
}

// t_with / t_alone = G_c(T) (GEMM), H_c(T) (grouped GEMM), a_c (attention), b_c (memory-bound) (NcclInterferenceModel,
// "nccl_resident_v2"); 1 without the family.
double CostModel::nccl_resident_slowdown(int nccl_case, int compute_class, double tiles) const {
  if (nccl_case < 0 || nccl_case > 1) {
    throw InputError("CostModel::nccl_resident_slowdown: case = " + std::to_string(nccl_case) +
                     " must be 0 (pending) or 1 (transfer)");
  }
  if (compute_class < 0 || compute_class > 3) {
    throw InputError("CostModel::nccl_resident_slowdown: compute_class = " + std::to_string(compute_class) +
                     " must be 0 (GEMM), 1 (attention), 2 (memory-bound) or 3 (grouped GEMM)");
  }
  if (!impl_->nccl_interference) return 1.0;
  return impl_->nccl_interference->factor(static_cast<NcclResidentCase>(nccl_case),
                                          static_cast<ComputeClass>(compute_class), tiles);
}

bool CostModel::has_nccl_interference() const { return impl_->nccl_interference.has_value(); }

std::optional<CostModel::NcclMemory> CostModel::nccl_memory() const {
  if (!impl_->nccl_memory) return std::nullopt;
  const NcclMemoryModel& m = *impl_->nccl_memory;
  return NcclMemory{Bytes(m.communicator_bytes), Bytes(m.collective_bytes), Bytes(m.p2p_peer_bytes)};
}

std::optional<BytesPerSecond> CostModel::expert_dispatch_bandwidth(int group_size, bool combine) const {
  if (!impl_->expert_dispatch) return std::nullopt;
  return BytesPerSecond(impl_->expert_dispatch->bandwidth(group_size, combine ? 1 : 0));
}

std::optional<CostModel::DeviceMemory> CostModel::device_memory() const {
  if (!impl_->device_memory) return std::nullopt;
  const DeviceMemoryModel& m = *impl_->device_memory;
  return DeviceMemory{Bytes(m.context_bytes),      Bytes(m.modules_bytes), Bytes(m.blas_bytes),
                      Bytes(m.blas_further_bytes), Bytes(m.cudnn_bytes),   Bytes(m.granularity_bytes)};
}

}  // namespace threewalls::calibration
