// The registry of model families (names, frozen model ids, point columns, parameters) and small
// value helpers. Names and model ids written to profile files are frozen: add, never rename.
#include <algorithm>
#include <stdexcept>

#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration {

const char* to_string(Dtype v) {
  switch (v) {
    case Dtype::bf16:
      return "bf16";
    case Dtype::fp8:
      return "fp8";
    case Dtype::fp32:
      return "fp32";
  }
  return "?";
}

const char* to_string(CopyDirection v) {
  switch (v) {
    case CopyDirection::h2d_pinned:
      return "h2d_pinned";
    case CopyDirection::h2d_pageable:
      return "h2d_pageable";
    case CopyDirection::d2h_pinned:
      return "d2h_pinned";
    case CopyDirection::d2h_pageable:
      return "d2h_pageable";
    case CopyDirection::d2d:
      return "d2d";
    case CopyDirection::disk_read:
      return "disk_read";
  }
  return "?";
}

const char* to_string(CollectiveKind v) {
  switch (v) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_to_all:
      return "all_to_all";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::send_recv:
      return "send_recv";
  }
  return "?";
}

const char* to_string(Scope v) {
  switch (v) {
    case Scope::nvlink:
      return "nvlink";
    case Scope::network:
      return "network";
  }
  return "?";
}

std::string gemm_family(Dtype dt) { return std::string("gemm.") + to_string(dt); }
std::string grouped_gemm_family(Dtype dt) { return std::string("grouped_gemm.") + to_string(dt); }
std::string attention_family(bool backward) { return backward ? "attention.bwd" : "attention.fwd"; }
std::string copy_family(CopyDirection dir) { return std::string("copy.") + to_string(dir); }
std::string collective_family(CollectiveKind kind, Scope scope) {
  return std::string("collective.") + to_string(kind) + "." + to_string(scope);
}
std::string host_family(std::string_view what) { return "host." + std::string(what); }

const std::vector<std::string>& known_gpu_kinds() {
  static const std::vector<std::string> kinds = {"h100", "h200"};
  return kinds;
}

namespace {

std::vector<FamilySpec> build_specs() {
  std::vector<FamilySpec> specs;
  const std::vector<ParamSpec> gemm_params = {
      {"tile_m", true, false, "rows of the output tile (chosen by the fit)"},
      {"tile_n", true, false, "columns of the output tile (chosen by the fit)"},
      {"efficiency_max", false, false, "e_max: fraction of the datasheet peak reached at large K"},
      {"k_half", false, false, "K at which the K-loop efficiency is half of e_max"},
      {"overhead_s", false, false, "t0: fixed time per kernel, seconds"},
      {"memory_bandwidth_bytes_per_s", false, false, "HBM read+write bandwidth of the memory-bound limit"},
  };
  // gemm_roofline_v2: the grouped model's parameters plus the wave tail.
  std::vector<ParamSpec> dense_params = gemm_params;
  dense_params[0].description = "rows of the tile the wave tail is counted in (128)";
  dense_params[1].description = "columns of the tile the wave tail is counted in (128)";
  dense_params.insert(dense_params.begin() + 4,
                      ParamSpec{"wave_tail", false, false,
                                "waves of tiles whose K loop every GEMM pays besides its FLOPs (fill and tail)"});
  // Optional residual correction (models.hpp ShapeCorrection): centres (the fit points'
  // shapes), their log residuals, the bandwidth and the prior weight. Absent: no correction.
  auto correction_params = [](std::vector<std::pair<std::string, std::string>> shape) {
    std::vector<ParamSpec> out;
    for (auto& [key, what] : shape) {
      out.push_back({"correction_" + key, true, true, "residual correction (optional): " + what + " of each centre", true});
    }
    out.push_back({"correction_log_factor", false, true,
                   "residual correction: r_j = ln(measured / model) at each centre (a fit point)", true});
    out.push_back({"correction_bandwidth", false, true,
                   "residual correction (one number): Gaussian kernel bandwidth h in log2 units of the shape", true});
    out.push_back({"correction_prior_weight", false, true,
                   "residual correction (one number): w0, the weight of a pseudo-point with r = 0", true});
    return out;
  };
  for (const auto& p : correction_params({{"m", "m"}, {"n", "n"}, {"k", "k"}})) dense_params.push_back(p);
  for (Dtype dt : {Dtype::bf16, Dtype::fp8, Dtype::fp32}) {
    FamilySpec s;
    s.name = gemm_family(dt);
    s.model = "gemm_roofline_v2";
    s.kind = ModelKind::gemm;
    s.dtype = dt;
    s.description =
        std::string("dense ") + to_string(dt) +
        " GEMM C[m,n] = A[m,k] B[k,n] x batch: t = max((F + tail 2 k Tm Tn SMs) / (P e_max k/(k+k_half)), B "
        "/ BW) + t0";
    s.inputs = {{"m", true, "rows of A and C"},
                {"n", true, "columns of B and C"},
                {"k", true, "inner dimension"},
                {"batch", true, "independent products in one call"}};
    s.params = dense_params;
    specs.push_back(s);
  }
  for (Dtype dt : {Dtype::bf16, Dtype::fp8, Dtype::fp32}) {
    FamilySpec s;
    s.name = grouped_gemm_family(dt);
    s.model = "grouped_gemm_wave_v1";
    s.kind = ModelKind::grouped_gemm;
    s.dtype = dt;
    s.description =
        std::string("grouped ") + to_string(dt) +
        " GEMM (one kernel, one GEMM per local expert): t = max(waves 2 Tm Tn (k+k_half) / (P_sm e_max), B / BW) + t0";
    s.inputs = {{"groups", true, "GEMMs in the group (local experts)"},
                {"total_rows", true, "rows (tokens) over all groups"},
                {"max_rows", true, "rows of the largest group"},
                {"n", true, "columns of each B and C"},
                {"k", true, "inner dimension"}};
    s.params = gemm_params;
    s.params[0].description = "rows of the tile (from the dense GEMM fit of the same dtype)";
    s.params[1].description = "columns of the tile (from the dense GEMM fit of the same dtype)";
    s.params[3].description = "K-loop half-efficiency point (from the dense GEMM fit of the same dtype)";
    // Optional: present, the batched-calls form (docs/calibration.md); absent, the wave form.
    s.params.push_back({"wave_tail", false, true,
                        "batched-calls form (optional, one number): the dense fit's wave tail", true});
    s.params.push_back({"call_overhead_s", false, true,
                        "batched-calls form (optional, one number): time of each further batched call, seconds",
                        true});
    for (const auto& p : correction_params({{"groups", "groups"},
                                            {"total_rows", "total_rows"},
                                            {"max_rows", "max_rows"},
                                            {"n", "n"},
                                            {"k", "k"}})) {
      s.params.push_back(p);
    }
    specs.push_back(s);
  }
  for (bool bwd : {false, true}) {
    FamilySpec s;
    s.name = attention_family(bwd);
    s.model = "attention_wave_v1";
    s.kind = ModelKind::attention;
    s.backward = bwd;
    s.description = std::string("attention ") + (bwd ? "backward" : "forward") +
                    " (bf16): t = max(F / (P e_max L/(L+s_half) d/(d+d_half) q) [+ b h pairs pair_s], B / BW) + t0";
    s.inputs = {{"batch", true, "sequences"},
                {"seq_q", true, "query length"},
                {"seq_kv", true, "key/value length"},
                {"heads", true, "query heads"},
                {"kv_heads", true, "key/value heads (GQA: fewer than heads)"},
                {"head_dim_qk", true, "head dimension of Q and K"},
                {"head_dim_v", true, "head dimension of V"},
                {"causal", true, "1 for a causal (bottom-right aligned) mask, 0 for none"}};
    s.params = {
        {"tile_q", true, false, "query rows per CTA"},
        {"efficiency_max", false, false, "e_max: fraction of the bf16 peak at long sequences and large head dims"},
        {"s_half", false, false, "keys per query row at which the sequence efficiency is half"},
        {"d_half", false, false, "head dimension at which the head-dim efficiency is half"},
        {"overhead_s", false, false, "t0: fixed time per kernel, seconds"},
        {"memory_bandwidth_bytes_per_s", false, false, "HBM read+write bandwidth of the memory-bound limit"},
        {"pair_s", false, true,
         "blocked form (optional, one number): seconds per computed (query, key) pair and head, the score matrix's "
         "passes through memory in the backend's unfused attention; with it, pairs are whole 512-row causal blocks",
         true}};
    specs.push_back(s);
  }
  const std::vector<ParamSpec> linear_params = {
      {"alpha_s", false, false, "latency: time of a zero-byte operation, seconds"},
      {"knots_bytes", false, true, "sizes where the bandwidth changes (empty: one segment)"},
      {"bandwidths_bytes_per_s", false, true, "bandwidth of each segment, smallest sizes first"},
  };
  auto linear = [&](std::string name, std::string what) {
    FamilySpec s;
    s.name = std::move(name);
    s.model = "linear_v1";
    s.kind = ModelKind::linear;
    s.description = std::move(what) + ": t = alpha + bytes / beta (piecewise by size)";
    s.inputs = {{"bytes", true, ""}};
    s.params = linear_params;
    return s;
  };
  specs.push_back(linear("elementwise", "memory-bound element-wise kernels (bytes read + written)"));
  specs.back().inputs[0].description = "bytes read + written";
  specs.push_back(linear("norm", "normalisation kernels (bytes read + written)"));
  specs.back().inputs[0].description = "bytes read + written";
  for (std::string_view k : kMemoryKernelFamilies) {
    specs.push_back(linear(std::string(k), "one memory-bound kernel, the calibration benchmark of the same name (bytes read + written)"));
    specs.back().inputs[0].description = "bytes read + written";
  }
  // Kernels whose time is not a function of bytes alone (kernel_terms.hpp, "kernel_terms_v1").
  for (const KernelTermsFamily& k : kernel_terms_families()) {
    FamilySpec s;
    s.name = k.name;
    s.model = "kernel_terms_v1";
    s.kind = ModelKind::kernel_terms;
    std::string eq = "t = t0";
    for (const auto& in : k.inputs) s.inputs.push_back({in.key, true, in.description});
    s.params.push_back({"overhead_s", false, false, "t0: fixed time of the launch sequence, seconds"});
    for (const auto& t : k.terms) {
      s.params.push_back({t.param, false, false, t.description + ", seconds"});
      eq += " + " + t.param;
      for (const int i : t.factors) eq += " " + k.inputs[static_cast<std::size_t>(i)].key;
    }
    s.description = k.what + ": " + eq;
    specs.push_back(s);
  }
  for (CopyDirection d : {CopyDirection::h2d_pinned, CopyDirection::h2d_pageable, CopyDirection::d2h_pinned,
                          CopyDirection::d2h_pageable, CopyDirection::d2d, CopyDirection::disk_read}) {
    specs.push_back(linear(copy_family(d), std::string("copy ") + to_string(d) + " (bytes copied)"));
    specs.back().inputs[0].description = "bytes copied";
  }
  for (Scope sc : {Scope::nvlink, Scope::network}) {
    for (CollectiveKind k : {CollectiveKind::all_reduce, CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                             CollectiveKind::all_to_all, CollectiveKind::broadcast, CollectiveKind::send_recv}) {
      FamilySpec s;
      s.name = collective_family(k, sc);
      s.model = "collective_hill_v1";
      s.kind = ModelKind::collective;
      s.collective = k;
      s.scope = sc;
      s.description = std::string("NCCL ") + to_string(k) + " over " + to_string(sc) +
                      ": t = alpha + S f(n) / beta_eff(S), beta_eff = beta_max S^g / (S^g + S_half^g), per group size";
      s.inputs = {{"group_size", true, "ranks in the group"},
                  {"bytes", true,
                   "nccl-tests size (all_reduce: buffer; all_gather: output; reduce_scatter: input; "
                   "all_to_all: bytes each rank sends; send_recv: message)"}};
      s.params = {{"group_size", true, true, "measured group sizes, increasing"},
                  {"alpha_s", false, true, "latency per group size, seconds"},
                  {"beta_max_bytes_per_s", false, true, "asymptotic bus bandwidth per group size"},
                  {"s_half_bytes", false, true, "size at which the bus bandwidth is half of beta_max (0: no ramp)"},
                  {"gamma", false, true, "steepness of the bandwidth ramp, in (0, 1]"},
                  {"correction_group_size", true, true,
                   "per-size correction knots (optional): group size of each knot", true},
                  {"correction_bytes", false, true, "per-size correction knots: measured size S_j, bytes", true},
                  {"correction_log_factor", false, true,
                   "per-size correction knots: r_j = ln(measured / smooth curve), interpolated in log2 S", true}};
      specs.push_back(s);
    }
  }
  const std::vector<std::pair<std::string, std::string>> host = {
      {"kernel_launch", "host time of one eager kernel launch"},
      {"framework_op", "extra host time per op of a framework (eager dispatch), on top of the kernel launch"},
      {"event_record", "host time of one CUDA event record"},
      {"stream_sync", "host cost of synchronising an idle stream"},
      {"gpu_read", "a small device-to-host read that blocks the host"},
      {"graph_launch", "host time of one CUDA-graph launch"},
      {"graph_node", "device-side cost per node of a CUDA graph"},
      {"collective_launch", "host time to enqueue one NCCL call"},
      {"timing_marker",
       "device time one timing marker (cudaEventRecord around a recorded op) adds to its stream "
       "(calibration/tools/timed_op_gap.cu: half the extra time per event-bracketed kernel)"},
      // Optional (profiles without them charge kernel_launch for these calls): host time of one
      // library call, timed while a blocking kernel holds the stream.
      {"gemm_launch", "host time of one cached-plan cuBLASLt GEMM call (CublasLt::gemm as OpRunner calls it)"},
      {"grouped_gemm_launch", "host time of one prepared grouped-GEMM call (GroupedGemm::run, OpRunner's impl)"},
      {"attention_launch", "host time of one attention forward call (Attention::forward)"},
      {"attention_bwd_launch", "host time of one attention backward call (Attention::backward)"},
      // Optional: the executor's own per-op host path, measured against the launch.
      {"op_dispatch", "extra host time of OpRunner::run for an op over the bare kernel launch it makes"},
      {"record_op",
       "extra host time of a recorded op in threewalls run (end-marker query, start and end markers, host clock, "
       "the record) over the unrecorded launch"},
      {"stream_wait",
       "host time of one cudaStreamWaitEvent on a stream other than the event's, over 16 rotating streams, as "
       "threewalls run waits across streams"},
  };
  for (const auto& [what, desc] : host) {
    FamilySpec s;
    s.name = host_family(what);
    s.model = "median_v1";
    s.kind = ModelKind::constant;
    s.description = desc + ": t = median of the points";
    s.params = {{"value_s", false, false, "the median, seconds"}};
    specs.push_back(s);
  }
  // Optional, shape-aware forms of host.gemm_launch and host.grouped_gemm_launch (the
  // simulator prefers them): the points are the same library calls, with their shapes as inputs.
  {
    FamilySpec s;
    s.name = std::string(kGemmCallFamily);
    s.model = "gemm_call_v1";
    s.kind = ModelKind::gemm_call;
    s.description =
        "host time of one cuBLASLt GEMM call as OpRunner makes it, one launch or more (split-K: a reduction kernel or a "
        "memset): "
        "t = t_one + t_extra [k / (ceil(m/128) ceil(n/128)) >= split_ratio]";
    s.inputs = {{"m", true, "rows of C"},
                {"n", true, "columns of C"},
                {"k", true, "reduction length"},
                {"nodes", true, "graph nodes one call launched (kernels and memsets), counted by graph capture (0: unknown)"}};
    s.params = {{"t_one_s", false, false, "host time of a call that launches one kernel, seconds"},
                {"t_extra_s", false, false, "host time of each further node of a split call, seconds"},
                {"split_ratio", false, false, "k per 128 x 128 output tile from which cuBLASLt splits K (0: never seen)"}};
    specs.push_back(s);
  }
  {
    FamilySpec s;
    s.name = std::string(kGroupedCallFamily);
    s.model = "grouped_call_v1";
    s.kind = ModelKind::grouped_call;
    s.description =
        "host time of one grouped-GEMM call of OpRunner (lt_batched: one cuBLASLt matmul per run of experts "
        "with equal rows): t = t_one + (runs - 1) t_run";
    s.inputs = {{"groups", true, "experts"},
                {"total_rows", true, "rows of all experts"},
                {"max_rows", true, "rows of the largest expert (the split of expert_rows)"},
                {"n", true, "output columns"},
                {"k", true, "reduction length"}};
    s.params = {{"t_one_s", false, false, "host time of a call of one run, seconds"},
                {"t_run_s", false, false, "host time of each further run (one more matmul), seconds"}};
    specs.push_back(s);
  }
  {
    FamilySpec s;
    s.name = std::string(kStreamCycleFamily);
    s.model = "stream_cycle_v1";
    s.kind = ModelKind::stream_cycle;
    s.description =
        "extra host time per launch when visits of 5 launches (kernel, GEMM call, kernel, GEMM call, kernel) rotate "
        "over N streams with a cuBLASLt handle each, over the same visits on one stream: median per N, "
        "log2-interpolated from extra(1) = 0";
    s.inputs = {{"streams", true, "streams the visits rotate over (>= 2)"}};
    s.params = {{"streams", true, true, "measured stream counts, increasing, >= 2"},
                {"extra_s", false, true, "extra host seconds per launch per measured stream count"}};
    specs.push_back(s);
  }
  {
    FamilySpec s;
    s.name = std::string(kConcurrencyFamily);
    s.model = "concurrency_v1";
    s.kind = ModelKind::concurrency;
    s.description = "multi-stream concurrency, f the running kernels' mean SM fraction: speed-up s = min(n, 1/f)^e(n)";
    s.inputs = {{"streams", true, "kernels run at once, one per stream"},
                {"sm_fraction", false, "fraction of the SMs one kernel occupies"},
                {"serial_s", false, "time of the same kernels back to back on one stream, seconds"}};
    s.params = {{"streams", true, true, "measured stream counts, increasing"},
                {"efficiency", false, true, "e(n) per measured stream count"}};
    specs.push_back(s);
  }
  {
    FamilySpec s;
    s.name = std::string(kNcclInterferenceFamily);
    s.model = "nccl_resident_v1";
    s.kind = ModelKind::nccl_interference;
    s.description =
        "compute kernels while an NCCL kernel is resident on the GPU (case 0: a receive waiting for its peer, 1: a "
        "large all-reduce transferring): GEMM t = alone g_c ceil(T/(S-H_c))/ceil(T/S), attention t = alone a_c, "
        "memory-bound t = alone b_c";
    s.inputs = {{"case", true, "0: pending receive (spinning), 1: all-reduce transferring"},
                {"kernel", true, "0: GEMM, 1: attention, 2: memory-bound kernel"},
                {"tiles", true, "128 x 128 output tiles of a GEMM (0 for other kernels)"},
                {"alone_s", false, "the kernel's time with no NCCL kernel resident, seconds"}};
    s.params = {{"cases", true, true, "measured cases, increasing"},
                {"held_sms", true, true, "H_c: SMs the NCCL kernel holds (wave model of the GEMMs), per case"},
                {"gemm_factor", false, true, "g_c: GEMM slowdown besides the waves, per case"},
                {"attention_factor", false, true, "a_c: attention slowdown, per case"},
                {"memory_factor", false, true, "b_c: memory-bound kernel slowdown, per case"}};
    specs.push_back(s);
  }
  {
    FamilySpec s;
    s.name = std::string(kNcclMemoryFamily);
    s.model = "nccl_memory_v1";
    s.kind = ModelKind::nccl_memory;
    s.description =
        "NCCL device memory (cudaMemGetInfo) by stage: communicator init, first collectives, first send/recv with a "
        "peer; parameters are the stages' median bytes (points' times: the stages' host seconds, for reference)";
    s.inputs = {{"stage", true, "0: communicator init, 1: first collectives, 2: first send/recv with a peer"},
                {"group_size", true, "ranks in the communicator"},
                {"bytes", true, "device bytes the stage allocated on the measured GPU"}};
    s.params = {{"communicator_bytes", false, false, "per communicator of more than one rank"},
                {"collective_bytes", false, false, "per communicator that runs collectives"},
                {"p2p_peer_bytes", false, false, "per peer this rank sends to or receives from"}};
    specs.push_back(s);
  }
  return specs;
}

}  // namespace

const std::vector<FamilySpec>& family_specs() {
  static const std::vector<FamilySpec> specs = build_specs();
  return specs;
}

const FamilySpec* find_family_spec(std::string_view name) {
  for (const auto& s : family_specs()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Measurement Measurement::from_samples(std::vector<double> samples_s) {
  if (samples_s.empty()) throw std::invalid_argument("Measurement::from_samples: no samples");
  Measurement m;
  m.median_s = fit::median(samples_s);
  m.p10_s = fit::quantile(samples_s, 0.10);
  m.p90_s = fit::quantile(samples_s, 0.90);
  m.count = static_cast<std::int64_t>(samples_s.size());
  m.samples_s = std::move(samples_s);
  return m;
}

Measurement Measurement::single(double seconds) {
  Measurement m;
  m.median_s = m.p10_s = m.p90_s = seconds;
  m.count = 1;
  return m;
}

const FamilySpec& Family::spec() const {
  const auto* s = find_family_spec(name);
  if (!s) throw std::logic_error("unknown calibration family '" + name + "'");
  return *s;
}

namespace {
std::size_t param_index(const Family& f, std::string_view key) {
  const auto& spec = f.spec();
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    if (spec.params[i].key == key) {
      if (i >= f.params.size()) break;
      return i;
    }
  }
  throw std::logic_error("calibration family '" + f.name + "' has no parameter '" + std::string(key) + "'");
}
}  // namespace

double Family::param(std::string_view key) const {
  const auto& v = params[param_index(*this, key)];
  if (v.size() != 1) throw std::logic_error("parameter '" + std::string(key) + "' of '" + name + "' is not a scalar");
  return v[0];
}

const std::vector<double>& Family::param_array(std::string_view key) const { return params[param_index(*this, key)]; }

double Hardware::peak_flop_per_s(Dtype dt) const {
  switch (dt) {
    case Dtype::bf16:
      return peak_bf16_flop_per_s;
    case Dtype::fp8:
      return peak_fp8_flop_per_s;
    case Dtype::fp32:
      return peak_fp32_flop_per_s;
  }
  return 0.0;
}

}  // namespace threewalls::calibration
