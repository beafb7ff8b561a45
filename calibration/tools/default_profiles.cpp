// Synthetic default profiles from the reference facts of docs/architecture.md (measured on H100/H200 machines) and
// datasheet ceilings. Where the facts table has no number, an explicit assumption is made here and
// repeated in the family's note in the written profile. Nothing is measured on the build machine.
#include "default_profiles.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::calibration::defaults {

namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = 1024.0 * kKiB;
constexpr double kGiB = 1024.0 * kMiB;

// Per-GPU measured facts; the datasheet values are the core GPU spec table (core/vocabulary.hpp).
struct Facts {
  std::string kind;
  const GpuSpec* spec;
  double hbm_copy_rw;  // measured HBM copy bandwidth, read + write, bytes/s (docs/architecture.md)
  // Throughput of this GPU relative to the H200 on compute-bound kernels: 1 for the H200; for the
  // H100 the ratio of the middles of the large-shape GEMM ranges, (670+740)/2 / ((770+890)/2); for
  // Blackwell the ratio of the datasheet bf16 peaks (assumption: the H200's fraction of peak).
  double compute_ratio;
  // NVLink bus bandwidth relative to the H200's (the datasheets' per-direction ratio).
  double nvlink_ratio = 1.0;
  // Whether this GPU kind was ever measured: Blackwell's figures are the H200's facts scaled by
  // datasheet ratios, and every family's note says so.
  bool measured_kind = true;
};

Facts facts_for(std::string_view kind) {
  const std::optional<GpuKind> g = parse_gpu_kind(kind);
  if (!g)
    throw InputError("no default calibration profile for GPU kind '" + std::string(kind) +
                     "'; known: " + join(known_gpu_kinds(), ", ", true));
  const GpuSpec& h200 = gpu_spec(GpuKind::h200);
  switch (*g) {
    case GpuKind::h200: return {"h200", &gpu_spec(*g), 4.0e12, 1.0};
    case GpuKind::h100: return {"h100", &gpu_spec(*g), 3.0e12, 705.0 / 830.0};
    case GpuKind::b200:
    case GpuKind::gb200: {
      // The H200's measured HBM copy (4.0 of its 4.8 TB/s datasheet) at the same fraction of this
      // GPU's datasheet bandwidth.
      const GpuSpec& sp = gpu_spec(*g);
      return {std::string(to_string(*g)),
              &sp,
              4.0e12 * sp.hbm_bandwidth.value / h200.hbm_bandwidth.value,
              sp.peak_bf16.value / h200.peak_bf16.value,
              sp.nvlink_bandwidth.value / h200.nvlink_bandwidth.value,
              false};
    }
  }
  throw InputError("no default calibration profile for GPU kind '" + std::string(kind) + "'");
}

// The note every family of an unmeasured kind starts with.
std::string unmeasured(const Facts& f) {
  if (f.measured_kind) return "";
  return "NOT MEASURED (no " + f.kind +
         " was ever measured here): the H200 facts below scaled by datasheet ratios "
         "(compute x" +
         std::to_string(f.compute_ratio).substr(0, 5) + ", HBM x" +
         std::to_string(f.hbm_copy_rw / 4.0e12).substr(0, 5) + ", NVLink x" +
         std::to_string(f.nvlink_ratio).substr(0, 5) + "). ";
}

// fp8: no facts. Assumed: fp8 kernels reach 80% of the bf16 kernels' fraction of peak (on the
// doubled fp8 peak), with the same tile, K-loop and fixed overheads.
constexpr double kFp8EfficiencyFactor = 0.8;

Measurement one(double seconds) { return Measurement::single(seconds); }

double gemm_seconds(double m, double n, double k, double tflops) { return 2.0 * m * n * k / (tflops * 1e12); }

Hardware hardware_for(const Facts& f) {
  Hardware hw;
  hw.gpu_name = f.spec->product;
  hw.gpu_kind = f.kind;
  hw.sm_count = f.spec->sm_count;
  hw.sm_clock_mhz = f.spec->sm_clock_mhz;
  hw.memory_clock_mhz = f.spec->memory_clock_mhz;
  hw.memory_bytes = static_cast<std::int64_t>(f.spec->memory.value);
  hw.driver_version = "unknown";
  hw.cuda_version = "unknown";
  hw.nccl_version = "unknown";
  hw.gpus_seen = 0;
  hw.machine = f.measured_kind ? "none: synthetic profile, no machine was measured"
                               : "none: synthetic profile, NOT MEASURED: no " + f.kind +
                                     " was measured; datasheet ratios applied to H200 facts";
  hw.date = "2026-11";
  hw.peak_bf16_flop_per_s = f.spec->peak_bf16.value;
  hw.peak_fp8_flop_per_s = f.spec->peak_fp8.value;
  hw.peak_fp32_flop_per_s = f.spec->peak_fp32.value;
  hw.hbm_bandwidth_datasheet_bytes_per_s = f.spec->hbm_bandwidth.value;
  return hw;
}

std::vector<double> sizes(double from, double to, double factor) {
  std::vector<double> out;
  for (double s = from; s <= to * 1.0000001; s *= factor) out.push_back(s);
  return out;
}

// ---- memory-bound kernels and copies ------------------------------------------------------------

void add_linear_family(ProfileBuilder& b, const std::string& family, double alpha_s, double bandwidth,
                       const std::vector<double>& bytes, std::string note) {
  // (An unmeasured kind's families get their NOT MEASURED prefix in make_default_profile.)
  for (double s : bytes) b.add_point(family, {s}, one(alpha_s + s / bandwidth));
  b.set_note(family, std::move(note));
}

void add_copies(ProfileBuilder& b, const Facts& f) {
  const auto hbm_sizes = sizes(64 * kKiB, 4 * kGiB, 4);
  const auto pcie_sizes = sizes(4 * kKiB, 1 * kGiB, 4);
  add_linear_family(b, std::string(kElementwiseFamily), 2.5e-6, f.hbm_copy_rw, hbm_sizes,
                    "bandwidth: HBM copy read+write " + std::to_string(static_cast<int>(f.hbm_copy_rw / 1e9)) +
                        " GB/s (fact, docs/architecture.md); latency 2.5 us (assumption: shortest kernel duration)");
  add_linear_family(
      b, std::string(kNormFamily), 3.0e-6, 0.8 * f.hbm_copy_rw, hbm_sizes,
      "bandwidth: 80% of the HBM copy fact (assumption: norms reduce across the row); latency 3 us (assumption)");
  // Per-kernel fits (threewalls run's kernels): bandwidth relative to the add kernel, from the H100
  // facts of docs/backend.md "Memory-bound kernels (H100)" (add 3.03, RMSNorm 1.36 / 0.54, SwiGLU
  // 1.41 TB/s) and an H100 calibration (SwiGLU backward 1.84, copy kernel 2.9 TB/s;
  // docs/validation/calibration_h100_2026-11-22.md).
  const struct {
    const char* kernel;
    double fraction;
    const char* source;
  } kernels[] = {{"elementwise_add", 1.0, "the add kernel runs at the HBM copy fact"},
                 {"elementwise_copy", 0.96, "copy kernel 2.9 vs add 3.03 TB/s (H100 calibration)"},
                 {"elementwise_swiglu", 0.465, "SwiGLU forward 1.41 vs add 3.03 TB/s (docs/backend.md, H100)"},
                 {"elementwise_swiglu_bwd", 0.61, "SwiGLU backward 1.84 vs add 3.0 TB/s (H100 calibration)"},
                 {"norm_rmsnorm_fwd", 0.45, "RMSNorm forward 1.36 vs add 3.03 TB/s (docs/backend.md, H100)"},
                 {"norm_rmsnorm_bwd", 0.18, "RMSNorm backward 0.54 vs add 3.03 TB/s (docs/backend.md, H100)"},
                 {"norm_layernorm_fwd", 0.33,
                  "LayerNorm forward 1.01 vs add 3.04 TB/s at 302 MB and 1 GB (H100 calibration, 2026-11-26 23:39)"},
                 {"norm_layernorm_bwd", 0.17,
                  "LayerNorm backward 0.52 vs add 3.04 TB/s at 302 MB and 1 GB (H100 calibration, 2026-11-26 23:39)"}};
  for (const auto& k : kernels) {
    add_linear_family(b, k.kernel, 2.5e-6, k.fraction * f.hbm_copy_rw, hbm_sizes,
                      std::string("bandwidth: ") + std::to_string(k.fraction) + " x the HBM copy fact (" + k.source +
                          "); latency 2.5 us (assumption)");
  }
  add_linear_family(b, copy_family(CopyKind::d2d), 2.5e-6, f.hbm_copy_rw / 2.0, hbm_sizes,
                    "bytes copied at half the HBM copy read+write fact (a copy reads and writes each byte); latency "
                    "2.5 us (assumption)");
  const std::string pinned_note =
      "bandwidth: PCIe pinned 55 GB/s for >= 16 MiB (fact, docs/architecture.md); latency 3 us (assumption: DMA setup)";
  add_linear_family(b, copy_family(CopyKind::h2d_pinned), 3e-6, 55e9, pcie_sizes, pinned_note);
  add_linear_family(b, copy_family(CopyKind::d2h_pinned), 3e-6, 55e9, pcie_sizes, pinned_note);
  add_linear_family(
      b, copy_family(CopyKind::h2d_pageable), 10e-6, 16e9, pcie_sizes,
      "bandwidth: pageable H2D ~16 GB/s (fact on H200, docs/architecture.md); latency 10 us (assumption: staging)");
  add_linear_family(
      b, copy_family(CopyKind::d2h_pageable), 10e-6, 16e9, pcie_sizes,
      "no fact for D2H pageable: assumed equal to the H2D pageable fact (16 GB/s); latency 10 us (assumption)");
  add_linear_family(
      b, copy_family(CopyKind::disk_read), 80e-6, 6.5e9, sizes(64 * kKiB, 1 * kGiB, 4),
      "no fact: assumed a PCIe Gen4 NVMe SSD (datasheet ~7 GB/s sequential read; 6.5 GB/s effective, 80 us latency)");
}

// ---- GEMM ----------------------------------------------------------------------------------------

struct GemmFact {
  double m, n, k, tflops;
};

void add_gemm_bf16(ProfileBuilder& b, const Facts& f) {
  std::vector<GemmFact> pts;
  std::string note;
  const double loop_tflops = 2.0 * 768 * 1408 * 2048 / (1.85e-3 / 64) / 1e12;
  if (f.kind != "h100") {
    pts = {{1024, 1408, 2048, 208},
           {16384, 1408, 2048, 667},
           {768, 1408, 2048, loop_tflops},
           {4096, 4096, 4096, 770},
           {8192, 8192, 8192, 890}};
    for (auto& p : pts) p.tflops *= f.compute_ratio;
    note =
        "facts (H200, docs/architecture.md): 208 / 667 TFLOP/s at K=2048 N=1408 M=1024 / 16384; 768x1408x2048 "
        "from a loop of 64 GEMMs taking 1.85 ms; the large-shape range 770-890 TFLOP/s placed at 4096^3 (770) and "
        "8192^3 (890)";
  } else {
    pts = {{4096, 4096, 4096, 670}, {8192, 8192, 8192, 740}};
    for (const auto& p :
         std::vector<GemmFact>{{1024, 1408, 2048, 208}, {16384, 1408, 2048, 667}, {768, 1408, 2048, loop_tflops}}) {
      pts.push_back({p.m, p.n, p.k, p.tflops * f.compute_ratio});
    }
    note =
        "facts (H100, docs/architecture.md): large-shape range 670-740 TFLOP/s placed at 4096^3 (670) and 8192^3 "
        "(740); the three K=2048 N=1408 points are the H200 facts scaled by 705/830 (ratio of the large-shape range "
        "middles)";
  }
  for (const auto& p : pts) {
    b.add_gemm(DType::bf16, static_cast<std::int64_t>(p.m), static_cast<std::int64_t>(p.n),
               static_cast<std::int64_t>(p.k), 1, one(gemm_seconds(p.m, p.n, p.k, p.tflops)));
  }
  b.set_note(gemm_family(DType::bf16), note);
}

void add_grouped_bf16(ProfileBuilder& b, const Facts& f) {
  const double t = 0.49e-3 / f.compute_ratio;
  b.add_grouped_gemm(DType::bf16, 64, 64 * 768, 768, 1408, 2048, one(t));
  b.set_note(
      grouped_gemm_family(DType::bf16),
      f.kind != "h100"
          ? "fact (H200, docs/architecture.md): 64 experts x 768 tokens (torch._grouped_mm) 0.49 ms; taken as N=1408 "
            "K=2048 (the shape of the GEMM facts); one point, so only e_max is fitted and leave-one-out is not "
            "available"
          : "the H200 fact (64 experts x 768 tokens, N=1408 K=2048, 0.49 ms) scaled by 705/830; one point, so only "
            "e_max is fitted and leave-one-out is not available");
}

GemmModel fp8_truth(const Family& bf16, const Hardware& hw) {
  GemmModel m;
  m.tile_m = static_cast<int>(bf16.param("tile_m"));
  m.tile_n = static_cast<int>(bf16.param("tile_n"));
  m.efficiency_max = bf16.param("efficiency_max") * kFp8EfficiencyFactor;
  m.k_half = bf16.param("k_half");
  m.wave_tail = bf16.param("wave_tail");
  m.overhead_s = bf16.param("overhead_s");
  m.memory_bandwidth_bytes_per_s = bf16.param("memory_bandwidth_bytes_per_s");
  m.device = {hw.sm_count, hw.peak_fp8_flop_per_s};
  m.elements = element_bytes(DType::fp8);
  return m;
}

void add_gemm_fp8(ProfileBuilder& b, const Profile& stage1) {
  const GemmModel truth = fp8_truth(stage1.family(gemm_family(DType::bf16)), stage1.hardware());
  for (std::int64_t m : {1024, 4096, 16384}) {
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{1408, 2048}, {4096, 4096}, {8192, 8192}}) {
      b.add_gemm(DType::fp8, m, n, k, 1, one(truth.time_s(m, n, k, 1)));
    }
  }
  b.set_note(gemm_family(DType::fp8),
             "no fp8 facts: points generated from this profile's bf16 fit on the datasheet fp8 peak (" +
                 std::to_string(static_cast<int>(stage1.hardware().peak_fp8_flop_per_s / 1e12)) +
                 " TFLOP/s) with "
                 "e_max x 0.8 (assumption: fp8 kernels reach a lower fraction of their peak), fp8 inputs, same tile, "
                 "k_half, wave "
                 "tail, "
                 "t0");
}

void add_grouped_fp8(ProfileBuilder& b, const Profile& stage1) {
  const Family& g = stage1.family(grouped_gemm_family(DType::bf16));
  const Hardware& hw = stage1.hardware();
  GroupedGemmModel truth;
  truth.tile_m = static_cast<int>(g.param("tile_m"));
  truth.tile_n = static_cast<int>(g.param("tile_n"));
  truth.efficiency_max = g.param("efficiency_max") * kFp8EfficiencyFactor;
  truth.k_half = g.param("k_half");
  truth.overhead_s = g.param("overhead_s");
  truth.memory_bandwidth_bytes_per_s = g.param("memory_bandwidth_bytes_per_s");
  truth.device = {hw.sm_count, hw.peak_fp8_flop_per_s};
  truth.elements = element_bytes(DType::fp8);
  struct Shape {
    std::int64_t groups, rows, max_rows;
  };
  for (const Shape& s : std::vector<Shape>{{8, 8 * 768, 768},
                                           {8, 8 * 4096, 4096},
                                           {64, 64 * 128, 128},
                                           {64, 64 * 768, 768},
                                           {64, 64 * 4096, 4096},
                                           {64, 64 * 768, 3072}}) {
    b.add_grouped_gemm(DType::fp8, s.groups, s.rows, s.max_rows, 1408, 2048,
                       one(truth.time_s(s.groups, s.rows, s.max_rows, 1408, 2048)));
  }
  b.set_note(grouped_gemm_family(DType::fp8),
             "no fp8 facts: points generated from this profile's grouped bf16 fit on the fp8 peak with e_max x 0.8 "
             "(assumption, as for gemm.fp8)");
}

// ---- attention -----------------------------------------------------------------------------------

void add_attention(ProfileBuilder& b, const Facts& f, const Profile& stage1, bool backward) {
  // No facts. Assumed curve, loosely after published FlashAttention-3 bf16 H100 figures (forward
  // ~450-650 TFLOP/s from 512 to 16k tokens at head dim 128; backward lower).
  AttentionModel truth;
  truth.backward = backward;
  // The fraction of this GPU's own peak: the H100's lower throughput at the same peak as the H200
  // lowers it; Blackwell's higher peak carries its speed-up.
  truth.efficiency_max =
      (backward ? 0.60 : 0.75) * f.compute_ratio * gpu_spec(GpuKind::h200).peak_bf16.value / f.spec->peak_bf16.value;
  truth.s_half = backward ? 512.0 : 256.0;
  truth.d_half = 16.0;
  truth.overhead_s = backward ? 8e-6 : 5e-6;
  truth.memory_bandwidth_bytes_per_s =
      2.0 * stage1.family(copy_family(CopyKind::d2d)).param_array("bandwidths_bytes_per_s").back();
  truth.device = {stage1.hardware().sm_count, stage1.hardware().peak_bf16_flop_per_s};
  std::vector<AttentionShape> shapes;
  for (std::int64_t seq : {512, 1024, 2048, 4096, 8192, 16384}) {
    for (bool causal : {false, true}) {
      AttentionShape s;
      s.batch = std::max<std::int64_t>(1, 16384 / seq);
      s.seq_q = s.seq_kv = seq;
      s.heads = s.kv_heads = 16;
      s.head_dim_qk = s.head_dim_v = 128;
      s.causal = causal;
      shapes.push_back(s);
    }
  }
  for (std::int64_t seq : {2048, 8192}) {
    AttentionShape s;
    s.batch = 16384 / seq;
    s.seq_q = s.seq_kv = seq;
    s.heads = s.kv_heads = 32;
    s.head_dim_qk = s.head_dim_v = 64;
    s.causal = true;
    shapes.push_back(s);
  }
  {
    AttentionShape mla;  // MLA-style head dims
    mla.batch = 4;
    mla.seq_q = mla.seq_kv = 4096;
    mla.heads = mla.kv_heads = 16;
    mla.head_dim_qk = 192;
    mla.head_dim_v = 128;
    mla.causal = true;
    shapes.push_back(mla);
    AttentionShape gqa;
    gqa.batch = 4;
    gqa.seq_q = gqa.seq_kv = 4096;
    gqa.heads = 32;
    gqa.kv_heads = 8;
    gqa.head_dim_qk = gqa.head_dim_v = 128;
    gqa.causal = true;
    shapes.push_back(gqa);
  }
  if (!backward) {
    AttentionShape decode;  // one new token against a 4k cache: memory-bound
    decode.batch = 64;
    decode.seq_q = 1;
    decode.seq_kv = 4096;
    decode.heads = 32;
    decode.kv_heads = 8;
    decode.head_dim_qk = decode.head_dim_v = 128;
    decode.causal = true;
    shapes.push_back(decode);
  }
  for (const auto& s : shapes) b.add_attention(s, backward, one(truth.time_s(s)));
  b.set_note(attention_family(backward),
             std::string("no facts: points generated from an assumed curve (e_max ") + (backward ? "0.60" : "0.75") +
                 (f.compute_ratio < 1 ? " x 705/830" : "") + ", s_half " + (backward ? "512" : "256") +
                 ", d_half 16, t0 " + (backward ? "8" : "5") +
                 " us), loosely after published FlashAttention-3 bf16 H100 throughput; replace with measurements");
}

// ---- collectives ---------------------------------------------------------------------------------

// Points on t = alpha + f S / beta_eff(S), beta_eff = beta_max / (1 + sqrt(S_half / S)), with beta_max
// chosen so that beta_eff(1 GiB) equals the given bus bandwidth.
void add_collective_curve(ProfileBuilder& b, Collective kind, LinkScope scope, int n, double busbw_at_1gib,
                          double alpha_s, double s_half) {
  CollectiveGroupParams p;
  p.group_size = n;
  p.alpha_s = alpha_s;
  p.gamma = 0.5;
  p.s_half_bytes = s_half;
  p.beta_max_bytes_per_s = busbw_at_1gib * (1.0 + std::sqrt(s_half / kGiB));
  CollectiveModel m;
  m.kind = kind;
  m.groups = {p};
  for (double s : sizes(1 * kKiB, 1 * kGiB, 4)) b.add_collective(kind, scope, n, Bytes(s), one(m.time_s(s, n)));
}

void add_collectives(ProfileBuilder& b, const Facts& f) {
  // NVLink: facts at 1 GiB for 2 and 4 GPUs (H200 x2/x4, NVLink NV18, docs/architecture.md).
  const double ar[2] = {321e9 * f.nvlink_ratio, 355e9 * f.nvlink_ratio};
  const double a2a[2] = {320e9 * f.nvlink_ratio, 336e9 * f.nvlink_ratio};
  const int nv_n[2] = {2, 4};
  const std::string nv_shape =
      std::string(f.kind == "h100" ? " Used for the H100 too (the same NVLink4/NVSwitch fabric)." : "") +
      " Curve shape assumed: latency 6 us + 2 us log2 n, bandwidth ramp beta_max / (1 + sqrt(8 MiB / S)). Group sizes "
      "above 4 are extrapolated by the model (bus bandwidth held, latency growing with log2 n).";
  for (Collective k : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                       Collective::all_to_all, Collective::broadcast}) {
    for (int i = 0; i < 2; ++i) {
      const double busbw = k == Collective::all_to_all ? a2a[i] : ar[i];
      add_collective_curve(b, k, LinkScope::nvlink, nv_n[i], busbw, 6e-6 + 2e-6 * std::log2(nv_n[i]), 8 * kMiB);
    }
  }
  add_collective_curve(b, Collective::send_recv, LinkScope::nvlink, 2, a2a[0], 8e-6, 8 * kMiB);
  b.set_note(collective_family(Collective::all_reduce, LinkScope::nvlink),
             "bus bandwidth at 1 GiB: 321 GB/s (2 GPUs), 355 GB/s (4 GPUs) (facts, H200 NV18)." + nv_shape);
  b.set_note(collective_family(Collective::all_to_all, LinkScope::nvlink),
             "bus bandwidth at 1 GiB: 320 GB/s (2 GPUs), 336 GB/s (4 GPUs) (facts, H200 NV18)." + nv_shape);
  for (Collective k : {Collective::all_gather, Collective::reduce_scatter, Collective::broadcast}) {
    b.set_note(collective_family(k, LinkScope::nvlink),
               "no fact: bus bandwidth assumed equal to the all_reduce facts (321 / 355 GB/s at 1 GiB, 2 / 4 GPUs; the "
               "same ring "
               "algorithm)." +
                   nv_shape);
  }
  b.set_note(collective_family(Collective::send_recv, LinkScope::nvlink),
             "no fact: one pair at the all_to_all 2-GPU fact (320 GB/s at 1 GiB); latency 8 us and the ramp assumed");

  // Network: one 400 Gb/s NIC per GPU (rail-optimised DGX-style nodes), from published measurements.
  // Bandwidth: NCCL reaches 46-48 GB/s bus bandwidth per NDR 400 Gb/s NIC (NVIDIA's answer in
  // nccl-tests issue #290); 47 GB/s is beta_max. A collective over several GPUs of a node uses as many
  // NICs (flows.hpp, rails_bus_time), as NVIDIA's DGX-A100 figure shows (192 GB/s all-reduce bus
  // bandwidth over 8 x 200 Gb/s NICs, NCCL issue #812). Latency: NCCL's own tuning model
  // (src/graph/tuning.cc at commit b6475625: base and per-network-step latencies of the LL protocol it picks
  // for small messages), for n GPUs on n nodes.
  const std::string cite =
      "not measured here (a network collective needs more than one node); from publications: bus bandwidth: 47 GB/s "
      "per 400 Gb/s NIC at large sizes (NVIDIA, nccl-tests issue #290: 'for NDR @ "
      "400Gbps you should see 46-48GB/s per NIC'); a group with L GPUs per node uses L NICs (simulator, "
      "rails; NVIDIA, NCCL issue #812: 192 GB/s all-reduce bus bandwidth on 8 x 200 Gb/s NICs). Ramp beta_max / "
      "(1 + sqrt(2 MiB / S)) assumed (within -15%..+19% of the 2-32 MiB points of nccl-tests issue #232, "
      "2 x H100 over NDR). Latency from NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc at commit b6475625), "
      "n GPUs "
      "on n nodes: ";
  const double kNetBusBw = 47e9;
  const double s_half = 2 * kMiB;
  const double busbw_at_1gib = kNetBusBw / (1.0 + std::sqrt(s_half / kGiB));
  struct NetLatency {
    Collective kind;
    const char* rule;
  };
  const NetLatency rules[] = {
      {Collective::all_reduce, "6.8 us + 2 log2(n) x 5.0 us (tree, LL protocol)"},
      {Collective::all_gather, "6.6 us + (n - 1) x 2.7 us (ring, LL protocol)"},
      {Collective::reduce_scatter, "6.6 us + (n - 1) x 2.7 us (ring, LL protocol)"},
      {Collective::broadcast, "6.6 us + n x 2.7 us (ring broadcast, LL protocol)"},
      {Collective::all_to_all,
       "9.3 us + (n - 1) x 1.0 us, assumed: the model has no all-to-all; one network step of its ring LL "
       "(6.6 + 2.7 us) and its network post overhead (1 us) per peer"},
  };
  auto alpha_of = [&](Collective k, int n) {
    const double nn = n;
    switch (k) {
      case Collective::all_reduce: return 6.8e-6 + 2.0 * std::floor(std::log2(nn)) * 5.0e-6;
      case Collective::all_gather:
      case Collective::reduce_scatter: return 6.6e-6 + (nn - 1.0) * 2.7e-6;
      case Collective::broadcast: return 6.6e-6 + nn * 2.7e-6;
      case Collective::all_to_all: return 9.3e-6 + (nn - 1.0) * 1.0e-6;
      case Collective::send_recv: return 9.3e-6;
    }
    return 9.3e-6;
  };
  for (const NetLatency& r : rules) {
    for (int n : {2, 4, 8, 16})
      add_collective_curve(b, r.kind, LinkScope::network, n, busbw_at_1gib, alpha_of(r.kind, n), s_half);
    b.set_note(collective_family(r.kind, LinkScope::network), cite + r.rule);
  }
  add_collective_curve(b, Collective::send_recv, LinkScope::network, 2, busbw_at_1gib,
                       alpha_of(Collective::send_recv, 2), s_half);
  b.set_note(collective_family(Collective::send_recv, LinkScope::network),
             cite + "9.3 us for one pair, one network step of its ring LL (6.6 + 2.7 us)");
}

// Expert dispatch over RDMA (dispatch.flex.network): DeepEP's published normal-kernel bandwidths. One
// point per group size and direction at the bytes of the published setting's dispatch (4096 tokens of
// 7168 bf16 values); the model is a bandwidth, so the size only labels the point.
void add_expert_dispatch(ProfileBuilder& b) {
  struct Row {
    int ep;
    double dispatch_gbps, combine_gbps;
  };
  const Row rows[] = {{16, 43.0, 43.0}, {32, 58.0, 57.0}, {64, 51.0, 50.0}};
  const double bytes = 4096.0 * 7168.0 * 2.0;
  const std::string name(kExpertDispatchFamily);
  for (const Row& r : rows) {
    b.add_point(name, {static_cast<double>(r.ep), 0.0, bytes}, one(bytes / (r.dispatch_gbps * 1e9)));
    b.add_point(name, {static_cast<double>(r.ep), 1.0, bytes}, one(bytes / (r.combine_gbps * 1e9)));
  }
  b.set_note(name,
             "not measured here (needs RDMA between nodes); from DeepEP's published normal-kernel figures "
             "(deepseek-ai/DeepEP, V1 README, now docs/legacy.md): H800 with one ConnectX-7 InfiniBand 400 Gb/s NIC "
             "per GPU (~50 GB/s), DeepSeek-V3 pre-training setting (4096 tokens per batch, hidden 7168, top-4 groups, "
             "top-8 experts, fp8 dispatch, bf16 combine): RDMA bottleneck bandwidth dispatch 43 / 58 / 51 GB/s and "
             "combine 43 / 57 / 50 GB/s at EP 16 / 32 / 64. Taken for every flex backend (no published HybridEP "
             "figure) and every GPU kind with this NIC. DeepEP counts a token's bytes once per node it uses, its own "
             "node included (its tests' rdma_idx.ne(-1).sum()); the simulator divides by that count over the network "
             "bytes");
}

// ---- host ----------------------------------------------------------------------------------------

void add_host(ProfileBuilder& b) {
  struct HostCost {
    const char* what;
    double seconds;
    const char* note;
  };
  const HostCost costs[] = {
      {"kernel_launch", 3.7e-6, "fact: C++ runtime kernel launch 3.7 us (H100, docs/architecture.md)"},
      {"framework_op", 11.8e-6,
       "derived: PyTorch eager op launch 15.5 us (H200 fact) minus the 3.7 us C++ kernel launch"},
      {"event_record", 2.0e-6, "no fact: 2 us assumed"},
      {"stream_sync", 8.5e-6, "fact: stream sync after launch 8.5 us (H100); consistent with PyTorch sync 9 us (H200)"},
      {"gpu_read", 15.2e-6,
       "derived: launch of the copy 3.7 us + stream sync 8.5 us + 3 us PCIe copy latency (assumed)"},
      {"graph_launch", 3.7e-6, "no fact: assumed equal to one kernel launch (3.7 us)"},
      {"graph_node", 1.0e-6, "fact: ~1 us per graph node (H100, docs/architecture.md)"},
      {"collective_launch", 5.0e-6, "no fact: 5 us assumed (kernel launch plus NCCL enqueue bookkeeping)"},
      {"timing_marker", 1.6e-6,
       "fact: calibration/tools/timed_op_gap.cu, 1.63 us per marker on the H100 host of 2026-11-22 (2.83 us on "
       "the 2-GPU H200 host: the host's, not the GPU's)"},
  };
  for (const auto& c : costs) {
    b.add_host(c.what, one(c.seconds));
    b.set_note(host_family(c.what), c.note);
  }
}

void add_concurrency(ProfileBuilder& b) {
  // No facts: e(n) assumed 0.85, 0.75, 0.6 for 2, 4, 8 streams.
  const std::pair<int, double> eff[] = {{2, 0.85}, {4, 0.75}, {8, 0.6}};
  for (const auto& [n, e] : eff) {
    for (double f : {0.05, 0.125, 0.25, 0.5}) {
      const double serial = n * 20e-6;
      const double ideal = std::min(static_cast<double>(n), 1.0 / f);
      b.add_concurrency(n, f, Seconds(serial), one(serial / std::pow(ideal, e)));
    }
  }
  b.set_note(
      std::string(kConcurrencyFamily),
      "no facts: speed-up min(n, 1/f)^e(n) with e = 0.85, 0.75, 0.6 for 2, 4, 8 streams assumed (kernels of 20 us). "
      "The 20-68% slow-down of experts on separate streams (docs/architecture.md) is launch overhead and tiny GEMMs, "
      "which the simulator adds itself, not this factor");
}

ProfileInfo info_for(const Facts& f) {
  return ProfileInfo{"default_" + f.kind, std::string(kSyntheticSource), "calibration/tools/make_default_profiles.cpp"};
}

}  // namespace

Profile make_default_profile(std::string_view gpu_kind) {
  const Facts f = facts_for(gpu_kind);
  const Hardware hw = hardware_for(f);
  // Stage 1: the families with facts that the fp8 and attention points are derived from.
  ProfileBuilder first(info_for(f), hw);
  add_copies(first, f);
  add_gemm_bf16(first, f);
  add_grouped_bf16(first, f);
  const Profile stage1 = first.build();
  // Stage 2: everything, fitted from scratch.
  ProfileBuilder b(info_for(f), hw);
  add_copies(b, f);
  add_gemm_bf16(b, f);
  add_grouped_bf16(b, f);
  add_gemm_fp8(b, stage1);
  add_grouped_fp8(b, stage1);
  add_attention(b, f, stage1, false);
  add_attention(b, f, stage1, true);
  add_collectives(b, f);
  add_expert_dispatch(b);
  add_host(b);
  add_concurrency(b);
  if (!f.measured_kind) {
    const Profile p = b.build();
    for (const Family& fam : p.families()) b.set_note(fam.name, unmeasured(f) + fam.note);
  }
  return b.build();
}

}  // namespace threewalls::calibration::defaults
