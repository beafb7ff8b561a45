// The simulator's costs: the typed models of a profile, decoded once at construction, evaluated per
// call. Each call states the equation of its family (full statements in models.hpp and
// docs/calibration.md). A family the profile lacks is an InputError at the call that needs it,
// naming the profile and what it has: never a silent default.
#include "threewalls/calibration/cost_model.hpp"

#include <array>
#include <map>
#include <cmath>
#include <optional>

#include "codec.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::calibration {

namespace {

constexpr std::array<std::string_view, 16> kHostNames = {
    "kernel_launch", "framework_op",     "event_record",  "stream_sync",         "gpu_read",
    "graph_launch",  "graph_node",       "collective_launch", "timing_marker",   "gemm_launch",
    "grouped_gemm_launch", "attention_launch", "attention_bwd_launch", "op_dispatch", "record_op",
    "stream_wait"};

template <class E>
std::size_t idx(E e) {
  return static_cast<std::size_t>(e);
}

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

struct CostModel::Impl {
  std::string id;
  std::string description;
  std::vector<std::string> have;
  Hardware hardware;
  std::array<std::optional<GemmModel>, 3> gemm;
  std::array<std::optional<GroupedGemmModel>, 3> grouped;
  std::array<std::optional<AttentionModel>, 2> attention;
  std::optional<LinearModel> elementwise;
  std::optional<LinearModel> norm;
  std::map<std::string, LinearModel, std::less<>> kernels;  // per-kernel memory-bound fits (optional)
  std::map<std::string, KernelTermsModel, std::less<>> kernel_terms;  // per-kernel shape fits (optional)
  std::array<std::optional<LinearModel>, 6> copy;
  std::array<std::array<std::optional<CollectiveModel>, 2>, 6> collective;
  std::array<std::optional<ConstantModel>, kHostNames.size()> host;
  std::optional<ConcurrencyModel> concurrency;
  std::optional<NcclInterferenceModel> nccl_interference;  // optional family (absent: no slowdown)
  std::optional<NcclMemoryModel> nccl_memory;              // optional family (absent: sim constants)
  std::optional<GemmCallModel> gemm_call;                  // optional: host.gemm_call
  std::optional<GroupedCallModel> grouped_call;            // optional: host.grouped_gemm_call
  std::optional<StreamCycleModel> stream_cycle;            // optional: host.stream_cycle

  [[noreturn]] void missing(const std::string& family) const {
    throw InputError(description + " has no model '" + family +
                     "' (it has: " + (have.empty() ? "nothing" : join(have)) +
                     "); measure it with `threewalls calibrate` or use a profile that has it");
  }

  Seconds host_cost(std::size_t i) const {
    return Seconds(need(host[i], [&] { return host_family(kHostNames[i]); }).time_s());
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
    const FamilySpec& s = f.spec();
    switch (s.kind) {
      case ModelKind::gemm:
        m.gemm[idx(s.dtype)] = detail::decode_gemm(f, hw);
        break;
      case ModelKind::grouped_gemm:
        m.grouped[idx(s.dtype)] = detail::decode_grouped_gemm(f, hw);
        break;
      case ModelKind::attention:
        m.attention[s.backward ? 1 : 0] = detail::decode_attention(f, hw);
        break;
      case ModelKind::linear: {
        auto lin = detail::decode_linear(f);
        if (f.name == kElementwiseFamily)
          m.elementwise = lin;
        else if (f.name == kNormFamily)
          m.norm = lin;
        else if (is_memory_kernel_family(f.name))
          m.kernels.insert_or_assign(f.name, lin);
        else {
          for (std::size_t d = 0; d < m.copy.size(); ++d) {
            if (f.name == copy_family(static_cast<CopyDirection>(d))) m.copy[d] = lin;
          }
        }
        break;
      }
      case ModelKind::kernel_terms:
        m.kernel_terms.insert_or_assign(f.name, detail::decode_kernel_terms(f));
        break;
      case ModelKind::collective:
        m.collective[idx(s.collective)][idx(s.scope)] = detail::decode_collective(f);
        break;
      case ModelKind::constant:
        for (std::size_t h = 0; h < kHostNames.size(); ++h) {
          if (f.name == host_family(kHostNames[h])) m.host[h] = detail::decode_constant(f);
        }
        break;
      case ModelKind::concurrency:
        m.concurrency = detail::decode_concurrency(f);
        break;
      case ModelKind::nccl_interference:
        m.nccl_interference = detail::decode_nccl_interference(f, hw);
        break;
      case ModelKind::nccl_memory:
        m.nccl_memory = detail::decode_nccl_memory(f);
        break;
      case ModelKind::gemm_call:
        m.gemm_call = detail::decode_gemm_call(f);
        break;
      case ModelKind::grouped_call:
        m.grouped_call = detail::decode_grouped_call(f);
        break;
      case ModelKind::stream_cycle:
        m.stream_cycle = detail::decode_stream_cycle(f);
        break;
    }
  }
}

CostModel::~CostModel() = default;
CostModel::CostModel(CostModel&&) noexcept = default;
CostModel& CostModel::operator=(CostModel&&) noexcept = default;

// t = max((F + tail 2 k Tm Tn SMs) / (P e_max k/(k+k_half)), B / BW) + t0   (GemmModel, "gemm_roofline_v2")
Seconds CostModel::gemm(std::int64_t m, std::int64_t n, std::int64_t k, Dtype dt, std::int64_t batch) const {
  require_non_negative(m, "gemm", "m");
  require_non_negative(n, "gemm", "n");
  require_non_negative(k, "gemm", "k");
  require_non_negative(batch, "gemm", "batch");
  return Seconds(impl_->need(impl_->gemm[idx(dt)], [&] { return gemm_family(dt); }).time_s(m, n, k, batch));
}

// t = max(waves 2 Tm Tn (k+k_half) / (P_sm e_max), B / BW) + t0   (GroupedGemmModel)
Seconds CostModel::grouped_gemm(std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows, std::int64_t n,
                                std::int64_t k, Dtype dt) const {
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

// t = max(F / (P e_max L/(L+s_half) d/(d+d_half) q), B / BW) + t0   (AttentionModel)
Seconds CostModel::attention(const AttentionShape& s, bool backward) const {
  for (auto [v, name] : {std::pair{s.batch, "batch"}, std::pair{s.seq_q, "seq_q"}, std::pair{s.seq_kv, "seq_kv"},
                         std::pair{s.heads, "heads"}, std::pair{s.kv_heads, "kv_heads"},
                         std::pair{s.head_dim_qk, "head_dim_qk"}, std::pair{s.head_dim_v, "head_dim_v"}}) {
    require_non_negative(v, "attention", name);
  }
  return Seconds(impl_->need(impl_->attention[backward ? 1 : 0], [&] { return attention_family(backward); }).time_s(s));
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

Seconds CostModel::copy(CopyDirection dir, Bytes bytes) const {
  require_bytes(bytes, "copy");
  return Seconds(impl_->need(impl_->copy[idx(dir)], [&] { return copy_family(dir); }).time_s(bytes.value));
}

// t = c(S) (alpha + (S f(n)) / beta_eff(S))   (CollectiveModel, c = 1 without correction knots)
CollectiveParams CostModel::collective_params(CollectiveKind kind, Bytes bytes, int group_size, Scope scope) const {
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

Seconds CostModel::collective(CollectiveKind kind, Bytes bytes, int group_size, Scope scope) const {
  const CollectiveParams p = collective_params(kind, bytes, group_size, scope);
  if (!(bytes.value > 0)) return p.latency;
  // The exact expression documented for flow simulators: alpha + (S * f) / beta_eff.
  return p.latency + Seconds((bytes.value * bus_bandwidth_factor(kind, group_size)) / p.bus_bandwidth.value);
}

// t = median of the measured points   (ConstantModel), one family per host cost.
Seconds CostModel::kernel_launch() const { return impl_->host_cost(0); }
Seconds CostModel::framework_op() const { return impl_->host_cost(1); }
Seconds CostModel::event_record() const { return impl_->host_cost(2); }
Seconds CostModel::stream_sync() const { return impl_->host_cost(3); }
Seconds CostModel::gpu_read() const { return impl_->host_cost(4); }
Seconds CostModel::graph_launch() const { return impl_->host_cost(5); }
Seconds CostModel::graph_node() const { return impl_->host_cost(6); }
Seconds CostModel::collective_launch() const { return impl_->host_cost(7); }
// Optional: 0 when the profile lacks it.
Seconds CostModel::timing_marker() const { return impl_->host[8] ? impl_->host_cost(8) : Seconds(0.0); }
// Library calls (optional families): the family's median when the profile has it, else
// kernel_launch.
Seconds CostModel::gemm_launch() const { return impl_->host[9] ? impl_->host_cost(9) : kernel_launch(); }
Seconds CostModel::grouped_gemm_launch() const { return impl_->host[10] ? impl_->host_cost(10) : kernel_launch(); }
Seconds CostModel::attention_launch() const { return impl_->host[11] ? impl_->host_cost(11) : kernel_launch(); }
Seconds CostModel::attention_bwd_launch() const { return impl_->host[12] ? impl_->host_cost(12) : kernel_launch(); }
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
Seconds CostModel::op_dispatch() const { return impl_->host[13] ? impl_->host_cost(13) : Seconds(0.0); }
std::optional<Seconds> CostModel::record_op() const {
  if (!impl_->host[14]) return std::nullopt;
  return impl_->host_cost(14);
}
Seconds CostModel::stream_wait() const { return impl_->host[15] ? impl_->host_cost(15) : event_record(); }
// extra(N) of host.stream_cycle (StreamCycleModel); 0 when the profile lacks it.
Seconds CostModel::stream_cycle_extra(int streams) const {
  return Seconds(impl_->stream_cycle ? impl_->stream_cycle->extra(streams) : 0.0);
}
bool CostModel::has_library_launch_costs() const {
  return impl_->host[9] || impl_->host[10] || impl_->host[11] || impl_->host[12] || impl_->gemm_call ||
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

FlopsPerSecond CostModel::peak_flops(Dtype dt) const { return FlopsPerSecond(impl_->hardware.peak_flop_per_s(dt)); }

// The measured copy bandwidth counted as read + write: twice the large-size rate of copy.d2d.
BytesPerSecond CostModel::hbm_bandwidth() const {
  const auto& d2d = impl_->need(impl_->copy[idx(CopyDirection::d2d)], [&] { return copy_family(CopyDirection::d2d); });
  return BytesPerSecond(2.0 * d2d.asymptotic_bandwidth_bytes_per_s());
}

int CostModel::sm_count() const { return impl_->hardware.sm_count; }

const std::string& CostModel::profile_id() const { return impl_->id; }

// t_with / t_alone = g_c ceil(T/(S-H_c))/ceil(T/S) (GEMM), a_c (attention), b_c (memory-bound)
// (NcclInterferenceModel, "nccl_resident_v1"); 1 without the family.
double CostModel::nccl_resident_slowdown(int nccl_case, int compute_class, double tiles) const {
  if (nccl_case < 0 || nccl_case > 1) {
    throw InputError("CostModel::nccl_resident_slowdown: case = " + std::to_string(nccl_case) +
                     " must be 0 (pending) or 1 (transfer)");
  }
  if (compute_class < 0 || compute_class > 2) {
    throw InputError("CostModel::nccl_resident_slowdown: compute_class = " + std::to_string(compute_class) +
                     " must be 0 (GEMM), 1 (attention) or 2 (memory-bound)");
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

}  // namespace threewalls::calibration
