// The GPU PointRunner: one setup per section (op group), one measure per point, a correctness check
// per point. Every op runs the backend function that OpRunner runs for the matching StepGraph op
// (docs/backend.md, "OpRunner: op kind by op kind"), so the profile describes the kernels
// `threewalls run` launches.
#include "threewalls/calibration/bench/gpu_runner.hpp"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "bench_kernels.cuh"
#include "default_profiles.hpp"
#include "gpu_internal.hpp"
#include "gpu_kernels.hpp"
#include "threewalls/backend/attention.hpp"
#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/copies.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/backend/recording_path.hpp"
#include "threewalls/calibration/bench/hardware_info.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::calibration::bench {

namespace be = threewalls::backend;
using detail::CheckLog;
using detail::download_bf16;
using detail::Timer;

// ---- machine identity ------------------------------------------------------------------------------

MachineIdentity detect_machine(int gpus_wanted, const std::string& gpu_kind) {
  std::string reason;
  const int visible = be::device_count(&reason);
  if (visible == 0) throw SystemError("no CUDA device: " + reason);
  if (gpus_wanted < 0 || gpus_wanted > visible) {
    throw InputError("--gpus " + std::to_string(gpus_wanted) + ": " + std::to_string(visible) +
                     " GPU(s) visible; allowed: 1 to " + std::to_string(visible) + " (0 = all)");
  }
  MachineIdentity id;
  id.gpus_available = visible;
  const int gpus = gpus_wanted == 0 ? visible : gpus_wanted;
  be::set_device(0);
  cudaDeviceProp prop{};
  TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  Hardware& hw = id.hardware;
  hw.gpu_name = prop.name;
  hw.gpu_kind = gpu_kind.empty() ? gpu_kind_of(hw.gpu_name) : gpu_kind;
  const auto& kinds = known_gpu_kinds();
  if (std::find(kinds.begin(), kinds.end(), hw.gpu_kind) == kinds.end()) {
    throw InputError("GPU '" + hw.gpu_name + "' is not a known kind" +
                     (gpu_kind.empty() ? "" : " ('" + gpu_kind + "' given)") +
                     "; pass --gpu-kind with one of: h100, h200 (the kinds profiles are shipped for)");
  }
  hw.sm_count = prop.multiProcessorCount;
  hw.memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) == cudaSuccess) hw.sm_clock_mhz = khz / 1000.0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess) hw.memory_clock_mhz = khz / 1000.0;
  static_cast<void>(cudaGetLastError());
  bool ok = false;
  const SmiQuery q = parse_smi_query(run_command(
      "nvidia-smi --id=0 --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader,nounits", ok));
  hw.driver_version = ok && !q.driver_version.empty() ? q.driver_version : "unknown (nvidia-smi not available)";
  if (q.max_sm_clock_mhz > 0) hw.sm_clock_mhz = q.max_sm_clock_mhz;
  if (q.max_memory_clock_mhz > 0) hw.memory_clock_mhz = q.max_memory_clock_mhz;
  if (!(hw.sm_clock_mhz > 0)) hw.sm_clock_mhz = 1.0;  // the format needs > 0; "unknown" is said in machine
  if (!(hw.memory_clock_mhz > 0)) hw.memory_clock_mhz = 1.0;
  int runtime = 0, driver_api = 0;
  TW_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  TW_CUDA_CHECK(cudaDriverGetVersion(&driver_api));
  hw.cuda_version = "runtime " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
                    ", driver API " + std::to_string(driver_api / 1000) + "." + std::to_string(driver_api % 1000 / 10);
  hw.nccl_version = be::nccl_version();
  hw.gpus_seen = visible;
  id.topology_text = run_command("nvidia-smi topo -m", ok);
  if (!ok) id.topology_text = "nvidia-smi topo -m could not be run";
  hw.links_seen = links_from_topology(id.topology_text, gpus);
  if (hw.links_seen.empty()) {
    hw.links_seen.push_back(gpus < 2 ? "none: one GPU used" : "unknown: no GPU matrix in `nvidia-smi topo -m`");
  }
  hw.machine = describe_machine() + "; " + std::to_string(gpus) + " of " + std::to_string(visible) + " GPUs used";
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  hw.date = date;
  // Datasheet peaks of the kind (the same numbers the default profile uses).
  const Hardware sheet = defaults::make_default_profile(hw.gpu_kind).hardware();
  hw.peak_bf16_flop_per_s = sheet.peak_bf16_flop_per_s;
  hw.peak_fp8_flop_per_s = sheet.peak_fp8_flop_per_s;
  hw.peak_fp32_flop_per_s = sheet.peak_fp32_flop_per_s;
  hw.hbm_bandwidth_datasheet_bytes_per_s = sheet.hbm_bandwidth_datasheet_bytes_per_s;
  return id;
}

namespace {

std::size_t sz(double v) { return static_cast<std::size_t>(std::max(0.0, v)); }
std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(std::max<std::int64_t>(0, v)); }

be::DeviceBuffer random_bf16(std::size_t elements, std::uint64_t seed, cudaStream_t s) {
  be::DeviceBuffer b(std::max<std::size_t>(elements, 1) * 2);
  be::fill_random(b.as<be::bf16>(), static_cast<std::int64_t>(elements), seed, 1.0F, s);
  return b;
}

be::GemmLayout layout_of(int code) {
  return code == kLayoutDgrad   ? be::GemmLayout::dgrad
         : code == kLayoutWgrad ? be::GemmLayout::wgrad
                                : be::GemmLayout::forward;
}

// Checks C = op(A) op(B) at a few elements against a double-precision dot product of the stored
// (bf16 or e4m3) inputs. Bound per element: 2% of the L2 norm of the products plus 1% of the value
// (bf16 output rounding); a wrong layout or garbage misses by about the norm itself.
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
    const auto av = fp8 ? detail::download_fp8(a, a_first, k, a_stride) : download_bf16(a, a_first, k, a_stride);
    const auto bv = fp8 ? detail::download_fp8(b, b_first, k, b_stride) : download_bf16(b, b_first, k, b_stride);
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

// Attention reference for query row `row` of (batch 0, head 0): o = softmax(q K^T / sqrt(d)) V over
// the visible keys, in double from the stored bf16 inputs.
struct AttnRef {
  std::vector<double> p;  // probabilities over keys (0 where masked)
  std::vector<double> o;
};
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

// Copies of an operand inside a larger buffer, used in turn by consecutive runs so that a small
// GEMM does not find its operands in the L2 cache (50 MB on H100/H200): in a training step the next
// GEMM reads other weights. As many copies as fit, up to what makes one round of runs touch
// kRotationBytes, at most `max_copies`.
constexpr std::size_t kRotationBytes = std::size_t{256} << 20;
constexpr std::size_t kMaxGemmCopies = 256;
constexpr std::size_t kMaxGroupedCopies = 16;

// CPU references of one row of the norms (eps 1e-5): forward y, or backward dx from dy.
std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& dy,
                                      const std::vector<double>& g, bool backward) {
  const double n = static_cast<double>(x.size());
  double ss = 0.0;
  for (const double v : x) ss += v * v;
  const double rs = 1.0 / std::sqrt(ss / n + 1e-5);
  std::vector<double> want(x.size());
  double dot = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) dot += dy[j] * g[j] * x[j];
  const double cc = dot * rs * rs * rs / n;
  for (std::size_t j = 0; j < x.size(); ++j) want[j] = backward ? rs * g[j] * dy[j] - x[j] * cc : x[j] * rs * g[j];
  return want;
}

// LayerNorm with beta = gamma (as OpRunner runs it); backward dx = rstd (g dy - mean(g dy) - xhat
// mean(g dy xhat)).
std::vector<double> layernorm_reference(const std::vector<double>& x, const std::vector<double>& dy,
                                        const std::vector<double>& g, bool backward) {
  const double n = static_cast<double>(x.size());
  double mu = 0.0;
  for (const double v : x) mu += v;
  mu /= n;
  double var = 0.0;
  for (const double v : x) var += (v - mu) * (v - mu);
  const double rs = 1.0 / std::sqrt(var / n + 1e-5);
  double m1 = 0.0, m2 = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    m1 += g[j] * dy[j] / n;
    m2 += g[j] * dy[j] * (x[j] - mu) * rs / n;
  }
  std::vector<double> want(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double xh = (x[j] - mu) * rs;
    want[j] = backward ? rs * (g[j] * dy[j] - m1 - xh * m2) : xh * g[j] + g[j];
  }
  return want;
}

class Rotation {
 public:
  Rotation(const be::DeviceBuffer& buf, std::size_t bytes, std::size_t run_bytes,
           std::size_t max_copies = kMaxGemmCopies)
      : base_(static_cast<char*>(buf.data())), stride_((std::max<std::size_t>(bytes, 1) + 255) / 256 * 256) {
    const std::size_t fit = bytes > buf.size() ? 0 : 1 + (buf.size() - bytes) / stride_;
    const std::size_t want =
        (kRotationBytes + std::max<std::size_t>(run_bytes, 1) - 1) / std::max<std::size_t>(run_bytes, 1);
    count_ = std::clamp<std::size_t>(std::min(fit, want), 1, max_copies);
    if (fit == 0) throw std::logic_error("calibration buffer smaller than one operand");
  }
  [[nodiscard]] void* at(std::size_t i) const { return base_ + (i % count_) * stride_; }
  [[nodiscard]] std::size_t count() const { return count_; }

 private:
  char* base_;
  std::size_t stride_;
  std::size_t count_ = 1;
};

std::string rotation_note(const Rotation& a, const Rotation& b, const Rotation& c) {
  return "; operands rotate through " + std::to_string(a.count()) + "/" + std::to_string(b.count()) + "/" +
         std::to_string(c.count()) + " copies (cold L2)";
}

class GpuRunner final : public PointRunner {
 public:
  explicit GpuRunner(const GpuRunnerOptions& o) : opt_(o), clock_(steady_clock()) {
    be::set_device(0);
    be::set_thread_rank(0);
    stream_ = std::make_unique<be::Stream>();
    timer_ = std::make_unique<Timer>(stream_->get());
    lt_ = std::make_unique<be::CublasLt>();
  }
  ~GpuRunner() override {
    if (!disk_path_.empty()) std::filesystem::remove(disk_path_);
  }

  void begin_section(const std::string& section, const std::vector<PointSpec>& points) override {
    be::set_device(0);
    section_ = section;
    if (section == "copy") begin_copy(points);
    if (section == "memory") begin_memory(points);
    if (section == "gemm") begin_gemm(points);
    if (section == "grouped") begin_grouped(points);
    if (section == "attention") begin_attention(points);
    if (section == "host") begin_host(points);
    if (section == "concurrency") begin_concurrency(points);
    if (section == "interference") begin_interference(points);
    if (section == "collective") {
      max_coll_bytes_ = 0.0;
      for (const auto& p : points) max_coll_bytes_ = std::max(max_coll_bytes_, p.bytes);
      collectives_ = std::make_unique<detail::CollectiveBench>(opt_.seed, clock_);
    }
    TW_CUDA_CHECK(cudaStreamSynchronize(*stream_));
  }

  void end_section(const std::string& section) override {
    be::set_device(0);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& b : buf_) b = be::DeviceBuffer();
    pinned_ = be::PinnedBuffer();
    pageable_.clear();
    pageable_.shrink_to_fit();
    attention_.reset();
    sections_.clear();
    side_streams_.clear();
    comm_.reset();
    collectives_.reset();
    interference_.reset();
    if (!disk_path_.empty()) {
      std::filesystem::remove(disk_path_);
      disk_path_.clear();
    }
    static_cast<void>(section);
  }

  void measure(const StopRule& rule, Record& r) override {
    be::set_device(0);
    const std::string& op = r.point.op;
    if (detail::is_kernel_op(op)) return detail::measure_kernel_point(rule, clock_, *timer_, s(), opt_.seed + 91, r);
    if (op.rfind("copy_", 0) == 0) return measure_copy(rule, r);
    if (op.rfind("elementwise_", 0) == 0 || op.rfind("norm_", 0) == 0) return measure_memory(rule, r);
    if (op == "gemm_bf16" || op == "gemm_fp8") return measure_gemm(rule, r);
    if (op == "grouped_gemm_bf16") return measure_grouped(rule, r);
    if (op == "attention_fwd" || op == "attention_bwd") return measure_attention(rule, r);
    if (op.rfind("host_", 0) == 0) return measure_host_op(rule, r);
    if (op == "concurrency_section") return measure_concurrency(rule, r);
    if (op == "nccl_memory") return measure_nccl_memory(r);
    if (op == "nccl_interference") return measure_interference(rule, r);
    if (collectives_) return collectives_->measure(rule, max_coll_bytes_, r);
    throw std::logic_error("GPU runner: no handler for op " + op);
  }

 private:
  using Work = detail::Work;
  cudaStream_t s() const { return stream_->get(); }
  void device(const Work& w, bool batch, const StopRule& rule, Record& r) {
    detail::measure_device(rule, clock_, *timer_, s(), w, batch, r);
  }
  void sync() { TW_CUDA_CHECK(cudaStreamSynchronize(s())); }

  // ---- copies ----
  void begin_copy(const std::vector<PointSpec>& points) {
    double dev = 0, pinned = 0, pageable = 0, disk = 0;
    for (const auto& p : points) {
      if (p.op == "copy_d2d" || p.op.find("pinned") != std::string::npos ||
          p.op.find("pageable") != std::string::npos) {
        dev = std::max(dev, p.bytes);
      }
      if (p.op.find("pinned") != std::string::npos) pinned = std::max(pinned, p.bytes);
      if (p.op.find("pageable") != std::string::npos) pageable = std::max(pageable, p.bytes);
      if (p.op == "copy_disk_read") disk = std::max(disk, p.bytes);
    }
    buf_[0] = random_bf16(sz(dev / 2), opt_.seed + 11, s());
    buf_[1] = be::DeviceBuffer(std::max<std::size_t>(sz(dev), 2));
    if (pinned > 0 || disk > 0) {
      pinned_ = be::PinnedBuffer(std::max(sz(pinned), be::round_up_direct(sz(disk))));
      std::memset(pinned_.data(), 0x5A, pinned_.size());  // differs from the random device data
    }
    pageable_.assign(sz(pageable), static_cast<char>(0x3C));
    if (disk > 0) {
      disk_path_ = opt_.scratch_dir + "/threewalls_calibrate_" + std::to_string(::getpid()) + ".bin";
      // As OpRunner's disk tier: slots of the largest read, each read from the next slot (copies.hpp).
      disk_slot_bytes_ = sz(disk);
      be::write_random_file(disk_path_, be::round_up_direct(sz(disk)) * be::disk_slots(sz(disk)), opt_.seed);
    }
  }

  // Compares three 64-byte windows (start, middle, end) of two buffers (device or host).
  static std::string compare_bytes(const void* got, bool got_dev, const void* want, bool want_dev, std::size_t bytes) {
    CheckLog log("copied bytes equal their source (start, middle, end)");
    for (const std::size_t at : {std::size_t{0}, bytes / 2, bytes > 64 ? bytes - 64 : 0}) {
      const std::size_t n = std::min<std::size_t>(64, bytes - at);
      std::vector<unsigned char> g(n), w(n);
      TW_CUDA_CHECK(cudaMemcpy(g.data(), static_cast<const char*>(got) + at, n,
                               got_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
      TW_CUDA_CHECK(cudaMemcpy(w.data(), static_cast<const char*>(want) + at, n,
                               want_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
      for (std::size_t i = 0; i < n; ++i) log.expect_near(g[i], w[i], 0.5, "byte " + std::to_string(at + i));
    }
    return log.passed();
  }

  void measure_copy(const StopRule& rule, Record& r) {
    const std::size_t bytes = sz(r.point.bytes);
    const std::string& op = r.point.op;
    void* dev_src = buf_[0].data();
    void* dev_dst = buf_[1].data();
    if (op == "copy_disk_read") {
      bool direct = false;
      // Every read from the next slot of the file (never the offset just read), as expert fetches are.
      auto next = [&] { return be::disk_slot_offset(disk_slot_bytes_, disk_reads_++); };
      detail::measure_host(rule, clock_, 1,
                           [&] { direct = be::read_file_into(disk_path_, next(), bytes, pinned_).direct; }, r, {});
      const auto res = be::read_file_into(disk_path_, next(), bytes, pinned_);
      if (res.bytes != bytes)
        throw std::runtime_error("correctness check failed: read " + std::to_string(res.bytes) + " bytes");
      r.check = std::string("passed: ") + std::to_string(bytes) + " bytes read" +
                (direct ? " (O_DIRECT)" : " (buffered: page cache)") + ", each read from the next of " +
                std::to_string(be::disk_slots(disk_slot_bytes_)) + " slots of the file";
      return;
    }
    Work w;
    const void* got = nullptr;
    const void* want = nullptr;
    bool got_dev = true, want_dev = true, batch = true;
    if (op == "copy_h2d_pinned") {
      w = [&](cudaStream_t st) { be::copy_h2d(dev_dst, pinned_.data(), bytes, st); };
      got = dev_dst, want = pinned_.data(), want_dev = false;
    } else if (op == "copy_d2h_pinned") {
      w = [&](cudaStream_t st) { be::copy_d2h(pinned_.data(), dev_src, bytes, st); };
      got = pinned_.data(), got_dev = false, want = dev_src;
    } else if (op == "copy_h2d_pageable") {
      w = [&](cudaStream_t st) { be::copy_h2d(dev_dst, pageable_.data(), bytes, st); };
      got = dev_dst, want = pageable_.data(), want_dev = false, batch = false;  // host-synchronous staging
    } else if (op == "copy_d2h_pageable") {
      w = [&](cudaStream_t st) { be::copy_d2h(pageable_.data(), dev_src, bytes, st); };
      got = pageable_.data(), got_dev = false, want = dev_src, batch = false;
    } else {
      w = [&](cudaStream_t st) { be::copy_d2d(dev_dst, dev_src, bytes, st); };
      got = dev_dst, want = dev_src;
    }
    device(w, batch, rule, r);
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    r.check = compare_bytes(got, got_dev, want, want_dev, bytes);
  }

  // ---- element-wise and norms ----
  void begin_memory(const std::vector<PointSpec>& points) {
    std::size_t need[3] = {1, 1, 1};
    std::int64_t max_rows = 1, max_hidden = 1;
    for (const auto& p : points) {
      if (p.op.rfind("norm_", 0) == 0) {
        const auto e = sz(p.iparam("rows") * p.iparam("hidden"));
        for (auto& n : need) n = std::max(n, e);
        max_rows = std::max(max_rows, p.iparam("rows"));
        max_hidden = std::max(max_hidden, p.iparam("hidden"));
      } else {
        const auto e = sz(p.iparam("elements"));
        // swiglu: x [2e] in slot 0 or 1; dx [2e] in slot 2 (slot sizes: OpRunner's elementwise need).
        need[0] = std::max(need[0], 2 * e);
        need[1] = std::max(need[1], 2 * e);
        need[2] = std::max(need[2], 2 * e);
      }
    }
    buf_[0] = random_bf16(need[0], opt_.seed + 21, s());
    buf_[1] = random_bf16(need[1], opt_.seed + 22, s());
    buf_[2] = be::DeviceBuffer(need[2] * 2);
    buf_[3] = random_bf16(sz(max_hidden), opt_.seed + 23, s());  // gamma
    buf_[4] = be::DeviceBuffer(sz(max_rows) * 4);                // rstd
    buf_[5] = be::DeviceBuffer(sz(max_hidden) * 2 * 4);          // dgamma, then dbeta (LayerNorm)
    buf_[6] = be::DeviceBuffer(sz(max_rows) * 4);                // mean (LayerNorm)
    TW_CUDA_CHECK(cudaMemsetAsync(buf_[5].data(), 0, buf_[5].size(), s()));
  }

  void measure_memory(const StopRule& rule, Record& r) {
    const std::string& op = r.point.op;
    auto* a = buf_[0].as<be::bf16>();
    auto* b = buf_[1].as<be::bf16>();
    auto* c = buf_[2].as<be::bf16>();
    const std::vector<std::int64_t> picks = [&] {
      const std::int64_t e = op.rfind("norm_", 0) == 0 ? r.point.iparam("rows") : r.point.iparam("elements");
      return std::vector<std::int64_t>{0, e / 3, e / 2, e - 1};
    }();
    if (op == "elementwise_add") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::add(a, b, c, e, st); }, true, rule, r);
      CheckLog log("out = a + b");
      for (const auto i : picks) {
        const double want = detail::bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
        log.expect_near(download_bf16(c, i, 1)[0], want, 0.01 * std::fabs(want) + 1e-6, "element " + std::to_string(i));
      }
      r.check = log.passed();
    } else if (op == "elementwise_copy") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::copy_d2d(c, a, sz(e) * 2, st); }, true, rule, r);
      CheckLog log("copy equals its source");
      for (const auto i : picks)
        log.expect_near(download_bf16(c, i, 1)[0], download_bf16(a, i, 1)[0], 1e-30, "element " + std::to_string(i));
      r.check = log.passed();
    } else if (op == "elementwise_swiglu") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::swiglu_fwd(a, c, 1, e, st); }, true, rule, r);
      CheckLog log("y = silu(gate) up");
      for (const auto j : picks) {
        const double g = download_bf16(a, j, 1)[0], u = download_bf16(a, e + j, 1)[0];
        const double want = g / (1.0 + std::exp(-g)) * u;
        log.expect_near(download_bf16(c, j, 1)[0], want, 0.01 * std::fabs(want) + 1e-3, "element " + std::to_string(j));
      }
      r.check = log.passed();
    } else if (op == "elementwise_swiglu_bwd") {
      const std::int64_t e = r.point.iparam("elements");
      device([&](cudaStream_t st) { be::swiglu_bwd(b, a, c, 1, e, st); }, true, rule, r);
      CheckLog log("SwiGLU backward (d gate, d up)");
      for (const auto j : picks) {
        const double g = download_bf16(a, j, 1)[0], u = download_bf16(a, e + j, 1)[0], d = download_bf16(b, j, 1)[0];
        const double sig = 1.0 / (1.0 + std::exp(-g));
        const double dgate = d * u * sig * (1.0 + g * (1.0 - sig)), dup = d * g * sig;
        log.expect_near(download_bf16(c, j, 1)[0], dgate, 0.01 * std::fabs(dgate) + 1e-3,
                        "d gate " + std::to_string(j));
        log.expect_near(download_bf16(c, e + j, 1)[0], dup, 0.01 * std::fabs(dup) + 1e-3, "d up " + std::to_string(j));
      }
      r.check = log.passed();
    } else {
      // RMSNorm or LayerNorm as OpRunner runs them (LayerNorm: gamma and beta are one buffer).
      const bool ln = op.rfind("norm_layernorm", 0) == 0;
      const bool bwd = op == "norm_rmsnorm_bwd" || op == "norm_layernorm_bwd";
      const std::int64_t rows = r.point.iparam("rows"), h = r.point.iparam("hidden");
      auto* gamma = buf_[3].as<be::bf16>();
      auto* rstd = buf_[4].as<float>();
      auto* dgamma = buf_[5].as<float>();  // LayerNorm: dbeta follows at + h
      auto* mean = buf_[6].as<float>();
      auto forward = [&](cudaStream_t st) {
        if (ln) {
          be::layernorm_fwd(a, gamma, gamma, c, mean, rstd, rows, h, 1e-5F, st);
        } else {
          be::rmsnorm_fwd(a, gamma, c, rstd, rows, h, 1e-5F, st);
        }
      };
      forward(s());  // the statistics the backward reads
      if (bwd && ln) {
        device([&](cudaStream_t st) { be::layernorm_bwd(b, a, gamma, mean, rstd, c, dgamma, dgamma + h, rows, h, st); },
               true, rule, r);
      } else if (bwd) {
        device([&](cudaStream_t st) { be::rmsnorm_bwd(b, a, gamma, rstd, c, dgamma, rows, h, st); }, true, rule, r);
      } else {
        device(forward, true, rule, r);
      }
      TW_CUDA_CHECK(cudaStreamSynchronize(s()));
      CheckLog log(std::string(ln ? "LayerNorm" : "RMSNorm") + (bwd ? " backward dx" : " forward") +
                   " of a row (relative L2)");
      const auto g = download_bf16(gamma, 0, h);
      for (const std::int64_t row : {std::int64_t{0}, rows - 1}) {
        const auto x = download_bf16(a, row * h, h);
        const auto dy = download_bf16(b, row * h, h);
        const auto want = ln ? layernorm_reference(x, dy, g, bwd) : rmsnorm_reference(x, dy, g, bwd);
        log.expect_near(detail::rel_l2(download_bf16(c, row * h, h), want), 0.0, 0.02, "row " + std::to_string(row));
      }
      r.check = log.passed();
    }
  }

  // ---- dense GEMM ----
  void begin_gemm(const std::vector<PointSpec>& points) {
    double a = 1, b = 1, c = 1, a8 = 0, b8 = 0;
    for (const auto& p : points) {
      const double m = p.param("m"), n = p.param("n"), k = p.param("k");
      if (p.op == "gemm_fp8") {
        a8 = std::max(a8, m * k);
        b8 = std::max(b8, k * n);
      } else {
        a = std::max(a, m * k);
        b = std::max(b, k * n);
      }
      c = std::max(c, m * n);
    }
    // At least kRotationBytes per operand, so that small GEMMs rotate through many copies (cold L2).
    const double floor_elems = static_cast<double>(kRotationBytes) / 2.0;
    buf_[0] = random_bf16(sz(std::max(a, floor_elems)), opt_.seed + 31, s());
    buf_[1] = random_bf16(sz(std::max(b, floor_elems)), opt_.seed + 32, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(c, floor_elems)) * 2);
    if (a8 > 0) {
      buf_[3] = be::DeviceBuffer(sz(std::max(a8, 2 * floor_elems)));
      buf_[4] = be::DeviceBuffer(sz(std::max(b8, 2 * floor_elems)));
      be::fill_random(buf_[3].as<be::fp8>(), static_cast<std::int64_t>(buf_[3].size()), opt_.seed + 33, 1.0F, s());
      be::fill_random(buf_[4].as<be::fp8>(), static_cast<std::int64_t>(buf_[4].size()), opt_.seed + 34, 1.0F, s());
    }
  }

  void measure_gemm(const StopRule& rule, Record& r) {
    const bool fp8 = r.point.op == "gemm_fp8";
    const be::GemmShape g =
        be::linear_gemm(layout_of(static_cast<int>(r.point.iparam("layout"))), r.point.iparam("m"), r.point.iparam("n"),
                        r.point.iparam("k"), fp8 ? be::GemmType::e4m3 : be::GemmType::bfloat16);
    const std::size_t in = fp8 ? 1 : 2;
    const be::DeviceBuffer& abuf = fp8 ? buf_[3] : buf_[0];
    const be::DeviceBuffer& bbuf = fp8 ? buf_[4] : buf_[1];
    const std::size_t run_bytes = sz(g.m * g.k) * in + sz(g.k * g.n) * in + sz(g.m * g.n) * 2;
    const Rotation ra(abuf, sz(g.m * g.k) * in, run_bytes), rb(bbuf, sz(g.k * g.n) * in, run_bytes),
        rc(buf_[2], sz(g.m * g.n) * 2, run_bytes);
    std::size_t i = 0;
    device(
        [&](cudaStream_t st) {
          lt_->gemm(g, ra.at(i), rb.at(i), rc.at(i), st);
          ++i;
        },
        true, rule, r);
    // The check: one more run on the first copies, into a C poisoned with NaN.
    TW_CUDA_CHECK(cudaMemsetAsync(rc.at(0), 0xFF, sz(g.m * g.n) * 2, s()));
    lt_->gemm(g, ra.at(0), rb.at(0), rc.at(0), s());
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    r.check = check_gemm(g, ra.at(0), rb.at(0), rc.at(0), fp8) + rotation_note(ra, rb, rc);
  }

  // ---- grouped GEMM ----
  void begin_grouped(const std::vector<PointSpec>& points) {
    double x = 1, w = 1, y = 1;
    for (const auto& p : points) {
      x = std::max(x, p.param("total_rows") * p.param("k"));
      w = std::max(w, p.param("groups") * p.param("n") * p.param("k"));
      y = std::max(y, p.param("total_rows") * p.param("n"));
    }
    const double floor_elems = static_cast<double>(kRotationBytes) / 2.0;
    buf_[0] = random_bf16(sz(std::max(x, floor_elems)), opt_.seed + 41, s());
    buf_[1] = random_bf16(sz(std::max(w, floor_elems)), opt_.seed + 42, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(y, floor_elems)) * 2);
  }

  void measure_grouped(const StopRule& rule, Record& r) {
    const std::int64_t groups = r.point.iparam("groups"), total = r.point.iparam("total_rows");
    const std::int64_t max_rows = r.point.iparam("max_rows"), n = r.point.iparam("n"), k = r.point.iparam("k");
    const std::vector<std::int64_t> rows = be::expert_rows(total, groups, max_rows);
    const std::size_t run_bytes = sz(total * k + groups * n * k + total * n) * 2;
    const Rotation rx(buf_[0], sz(total * k) * 2, run_bytes, kMaxGroupedCopies),
        rw(buf_[1], sz(groups * n * k) * 2, run_bytes, kMaxGroupedCopies),
        ry(buf_[2], sz(total * n) * 2, run_bytes, kMaxGroupedCopies);
    // One prepared GroupedGemm per copy of the operands (pointer arrays are built at construction).
    std::vector<std::unique_ptr<be::GroupedGemm>> plans;
    const std::size_t copies = std::max({rx.count(), rw.count(), ry.count()});
    for (std::size_t c = 0; c < copies; ++c) {
      plans.push_back(std::make_unique<be::GroupedGemm>(
          *lt_, be::GemmLayout::forward, rows, n, k, static_cast<const be::bf16*>(rx.at(c)),
          static_cast<const be::bf16*>(rw.at(c)), static_cast<be::bf16*>(ry.at(c)), be::OpRunnerConfig{}.grouped_impl));
    }
    std::size_t turn = 0;
    device([&](cudaStream_t st) { plans[turn++ % plans.size()]->run(st); }, true, rule, r);
    const be::bf16* x = static_cast<const be::bf16*>(rx.at(0));
    const be::bf16* w = static_cast<const be::bf16*>(rw.at(0));
    be::bf16* y = static_cast<be::bf16*>(ry.at(0));
    TW_CUDA_CHECK(cudaMemsetAsync(y, 0xFF, sz(total * n) * 2, s()));
    plans[0]->run(s());
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    // Y_e = X_e W_e^T at the first and last row of the hot expert and of the last non-empty expert.
    CheckLog log(std::string("grouped Y_e = X_e W_e^T against a CPU dot product (") +
                 be::to_string(be::OpRunnerConfig{}.grouped_impl) + ")");
    std::int64_t off = 0, last_e = 0, last_off = 0;
    for (std::size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] > 0) {
        last_e = static_cast<std::int64_t>(e);
        last_off = off;
      }
      off += rows[e];
    }
    for (const auto& [e, row_off, nrows] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {0, 0, rows[0]}, {last_e, last_off, rows[sz(last_e)]}}) {
      if (nrows <= 0) continue;
      for (const auto& [i, j] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 0}, {nrows - 1, n - 1}}) {
        const auto xv = download_bf16(x, (row_off + i) * k, k);
        const auto wv = download_bf16(w, e * n * k + j * k, k);
        double ref = 0.0, norm = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          ref += xv[sz(l)] * wv[sz(l)];
          norm += (xv[sz(l)] * wv[sz(l)]) * (xv[sz(l)] * wv[sz(l)]);
        }
        log.expect_near(download_bf16(y, (row_off + i) * n + j, 1)[0], ref,
                        0.02 * std::sqrt(norm) + 0.01 * std::fabs(ref),
                        "expert " + std::to_string(e) + " row " + std::to_string(i) + " col " + std::to_string(j));
      }
    }
    r.check = log.passed() + rotation_note(rx, rw, ry);
  }

  // ---- attention ----
  void begin_attention(const std::vector<PointSpec>& points) {
    double q = 1, kv_qk = 1, kv_v = 1, o = 1, rows = 1;
    for (const auto& p : points) {
      const double bh = p.param("batch") * p.param("heads");
      q = std::max(q, bh * p.param("seq_q") * p.param("head_dim_qk"));
      kv_qk = std::max(kv_qk, bh * p.param("seq_kv") * p.param("head_dim_qk"));
      kv_v = std::max(kv_v, bh * p.param("seq_kv") * p.param("head_dim_v"));
      o = std::max(o, bh * p.param("seq_q") * p.param("head_dim_v"));
      rows = std::max(rows, bh * p.param("seq_q"));
    }
    buf_[0] = random_bf16(sz(q), opt_.seed + 51, s());
    buf_[1] = random_bf16(sz(kv_qk), opt_.seed + 52, s());
    buf_[2] = random_bf16(sz(kv_v), opt_.seed + 53, s());
    buf_[3] = be::DeviceBuffer(sz(o) * 2);
    buf_[4] = random_bf16(sz(o), opt_.seed + 54, s());  // dO
    buf_[5] = be::DeviceBuffer(sz(rows) * 4);           // lse
    buf_[6] = be::DeviceBuffer(sz(q) * 2);              // dQ
    buf_[7] = be::DeviceBuffer(sz(kv_qk) * 2);          // dK
    buf_[8] = be::DeviceBuffer(sz(kv_v) * 2);           // dV
    attention_ = std::make_unique<be::Attention>(*lt_, be::OpRunnerConfig{}.attention_workspace);
  }

  void measure_attention(const StopRule& rule, Record& r) {
    const auto& p = r.point;
    const be::AttentionShape sh{p.iparam("batch"),      p.iparam("seq_q"),       p.iparam("seq_kv"),
                                p.iparam("heads"),      p.iparam("head_dim_qk"), p.iparam("head_dim_v"),
                                p.iparam("causal") != 0};
    auto* q = buf_[0].as<be::bf16>();
    auto* k = buf_[1].as<be::bf16>();
    auto* v = buf_[2].as<be::bf16>();
    auto* o = buf_[3].as<be::bf16>();
    auto* d_o = buf_[4].as<be::bf16>();
    auto* lse = buf_[5].as<float>();
    attention_->reserve(sh);
    attention_->forward(sh, q, k, v, o, lse, s());  // backward consumes a real O and log-sum-exp
    const bool bwd = p.op == "attention_bwd";
    if (bwd) {
      device(
          [&](cudaStream_t st) {
            attention_->backward(sh, q, k, v, o, d_o, lse, buf_[6].as<be::bf16>(), buf_[7].as<be::bf16>(),
                                 buf_[8].as<be::bf16>(), st);
          },
          true, rule, r);
    } else {
      device([&](cudaStream_t st) { attention_->forward(sh, q, k, v, o, lse, st); }, true, rule, r);
    }
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    CheckLog log(bwd ? "attention backward dQ rows of (batch 0, head 0) against a CPU reference (relative L2)"
                     : "attention forward rows of (batch 0, head 0) against a CPU reference (relative L2)");
    const auto kv = download_bf16(k, 0, sh.seq_kv * sh.head_dim_qk);
    const auto vv = download_bf16(v, 0, sh.seq_kv * sh.head_dim_v);
    for (const std::int64_t row : {sh.seq_q - 1, sh.seq_q / 2}) {
      const AttnRef ref = attention_row(sh, q, k, v, row);
      if (!bwd) {
        log.expect_near(detail::rel_l2(download_bf16(o, row * sh.head_dim_v, sh.head_dim_v), ref.o), 0.0, 0.03,
                        "row " + std::to_string(row));
        continue;
      }
      // dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j, dP_ij = dO_i . V_j, D_i = dO_i . O_i (the GPU's O).
      const auto dov = download_bf16(d_o, row * sh.head_dim_v, sh.head_dim_v);
      const auto ov = download_bf16(o, row * sh.head_dim_v, sh.head_dim_v);
      double dd = 0.0;
      for (std::int64_t t = 0; t < sh.head_dim_v; ++t) dd += dov[sz(t)] * ov[sz(t)];
      std::vector<double> dq(sz(sh.head_dim_qk), 0.0);
      const double scale = 1.0 / std::sqrt(static_cast<double>(sh.head_dim_qk));
      for (std::int64_t j = 0; j < sh.seq_kv; ++j) {
        if (ref.p[sz(j)] == 0.0) continue;
        double dp = 0.0;
        for (std::int64_t t = 0; t < sh.head_dim_v; ++t) dp += dov[sz(t)] * vv[sz(j * sh.head_dim_v + t)];
        const double ds = ref.p[sz(j)] * (dp - dd);
        for (std::int64_t t = 0; t < sh.head_dim_qk; ++t) dq[sz(t)] += scale * ds * kv[sz(j * sh.head_dim_qk + t)];
      }
      log.expect_near(detail::rel_l2(download_bf16(buf_[6].data(), row * sh.head_dim_qk, sh.head_dim_qk), dq), 0.0, 0.1,
                      "dQ row " + std::to_string(row));
    }
    r.check = log.passed();
  }

  // ---- host overheads ----
  void begin_host(const std::vector<PointSpec>& points) {
    buf_[0] = be::DeviceBuffer(sizeof(int));
    TW_CUDA_CHECK(cudaMemsetAsync(buf_[0].data(), 0, sizeof(int), s()));
    buf_[1] = random_bf16(512, opt_.seed + 61, s());  // 1 KiB for the 1-rank all-reduce
    buf_[2] = be::DeviceBuffer(1024);
    // Operands of the library-call points: A/X/Q in 3, B/W/K in 4, C/Y/V in 5, attention's
    // O, dO, lse, dQ, dK, dV in 6-11. One copy each: these points time the host, not the device.
    double a = 1, b = 1, c = 1, attn = 1, rows = 1;
    for (const auto& p : points) {
      if (p.op == "host_gemm_launch") {
        a = std::max(a, p.param("m") * p.param("k"));
        b = std::max(b, p.param("k") * p.param("n"));
        c = std::max(c, p.param("m") * p.param("n"));
      } else if (p.op == "host_grouped_gemm_launch") {
        a = std::max(a, p.param("total_rows") * p.param("k"));
        b = std::max(b, p.param("groups") * p.param("n") * p.param("k"));
        c = std::max(c, p.param("total_rows") * p.param("n"));
      } else if (p.op == "host_attention_launch") {
        attn = std::max(attn, p.param("batch") * p.param("heads") * p.param("seq") * p.param("head_dim"));
        rows = std::max(rows, p.param("batch") * p.param("heads") * p.param("seq"));
      }
    }
    for (const auto& p : points) {
      if (p.op == "host_stream_cycle") a = std::max(a, 16.0 * 256), b = std::max(b, 256.0 * 512), c = std::max(c, 16.0 * 512);
    }
    if (a > 1) {
      buf_[3] = random_bf16(sz(a), opt_.seed + 62, s());
      buf_[4] = random_bf16(sz(b), opt_.seed + 63, s());
      buf_[5] = be::DeviceBuffer(sz(c) * 2);
    }
    if (attn > 1) {
      buf_[6] = random_bf16(sz(attn), opt_.seed + 64, s());  // Q
      buf_[7] = random_bf16(sz(attn), opt_.seed + 65, s());  // K
      buf_[8] = random_bf16(sz(attn), opt_.seed + 66, s());  // V
      buf_[9] = be::DeviceBuffer(sz(attn) * 2);               // O
      buf_[10] = random_bf16(sz(attn), opt_.seed + 67, s());  // dO
      buf_[11] = be::DeviceBuffer(sz(rows) * 4);              // lse
      buf_[12] = be::DeviceBuffer(sz(attn) * 2);              // dQ
      buf_[13] = be::DeviceBuffer(sz(attn) * 2);              // dK
      buf_[14] = be::DeviceBuffer(sz(attn) * 2);              // dV
      attention_ = std::make_unique<be::Attention>(*lt_, be::OpRunnerConfig{}.attention_workspace);
    }
  }

  // Host seconds per call of `fn` (which enqueues on s()) while a blocking kernel holds the stream:
  // every call only queues work, the device never drains the queue during the timing, so the sample
  // is the library call's host cost alone (the GEMM families time device work queued behind
  // the blocker and hide it; host.kernel_launch times an empty kernel). `calls` stays far below the
  // launch queue's depth (a full queue would block the host until the blocker's 2 s timeout, which
  // then fails the point).
  void measure_host_behind_blocker(const StopRule& rule, int calls, const std::function<void()>& fn, Record& r) {
    fn();  // warm-up: plans, heuristics, the first call's lazy loading
    sync();
    const Sampling smp = sample_until(rule, clock_, [&] {
      timer_->begin(true);
      double t = 0.0;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) fn();
        t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } catch (...) {
        timer_->release();
        static_cast<void>(cudaStreamSynchronize(s()));
        throw;
      }
      timer_->end();
      timer_->release();
      sync();
      static_cast<void>(timer_->elapsed_s());  // BlockerTimeout: the calls did not all queue behind it
      return t / calls;
    });
    r.samples_s = smp.samples, r.reps = calls, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
  }

  // Kernels one call of `work` launches (captured into a graph, not run): "N kernel(s)" or why unknown,
  // and the count of all its nodes (kernels, memsets) in `kernels_out` (0 when unknown).
  std::string kernels_per_call(const Work& work, int* kernels_out = nullptr) {
    if (kernels_out) *kernels_out = 0;
    try {
      be::CudaGraph::begin_capture(s());
      try {
        work(s());
      } catch (...) {
        cudaGraph_t g = nullptr;
        static_cast<void>(cudaStreamEndCapture(s(), &g));
        if (g) static_cast<void>(cudaGraphDestroy(g));
        static_cast<void>(cudaGetLastError());
        throw;
      }
      const be::CudaGraph g = be::CudaGraph::end_capture(s());
      std::size_t n = 0;
      TW_CUDA_CHECK(cudaGraphGetNodes(g.get(), nullptr, &n));
      std::vector<cudaGraphNode_t> nodes(n);
      TW_CUDA_CHECK(cudaGraphGetNodes(g.get(), nodes.data(), &n));
      int kernels = 0, other = 0;
      for (std::size_t i = 0; i < n; ++i) {
        cudaGraphNodeType type{};
        TW_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
        (type == cudaGraphNodeTypeKernel ? kernels : other) += 1;
      }
      if (kernels_out) *kernels_out = kernels + other;  // every node is a launch the host pays for
      return std::to_string(kernels) + " kernel(s)" + (other > 0 ? " and " + std::to_string(other) + " other node(s)" : "") +
             " per call (graph capture)";
    } catch (const std::exception& e) {
      return std::string("kernels per call unknown (graph capture failed: ") + e.what() + ")";
    }
  }

  // One library call as OpRunner makes it, host-timed behind the blocker; the check re-runs it into
  // a poisoned output and compares with the CPU.
  void measure_library_launch(const StopRule& rule, Record& r, const std::string& what) {
    const auto& p = r.point;
    if (what == "gemm_launch") {
      const be::GemmShape g = be::linear_gemm(be::GemmLayout::forward, p.iparam("m"), p.iparam("n"), p.iparam("k"));
      const void* a = buf_[3].data();
      const void* b = buf_[4].data();
      void* c = buf_[5].data();
      measure_host_behind_blocker(rule, 40, [&] { lt_->gemm(g, a, b, c, s()); }, r);
      int count = 0;
      const std::string kernels = kernels_per_call([&](cudaStream_t st) { lt_->gemm(g, a, b, c, st); }, &count);
      if (r.point.inputs.size() == 4) r.point.inputs[3] = count;  // host.gemm_call's input `nodes`
      TW_CUDA_CHECK(cudaMemsetAsync(c, 0xFF, sz(g.m * g.n) * 2, s()));
      lt_->gemm(g, a, b, c, s());
      sync();
      r.check = check_gemm(g, a, b, c, false) + "; " + kernels;
    } else if (what == "grouped_gemm_launch") {
      const std::int64_t groups = p.iparam("groups"), total = p.iparam("total_rows");
      const std::int64_t n = p.iparam("n"), k = p.iparam("k");
      const std::vector<std::int64_t> rows = be::expert_rows(total, groups, p.iparam("max_rows"));
      const auto* x = buf_[3].as<be::bf16>();
      const auto* w = buf_[4].as<be::bf16>();
      auto* y = buf_[5].as<be::bf16>();
      be::GroupedGemm plan(*lt_, be::GemmLayout::forward, rows, n, k, x, w, y, be::OpRunnerConfig{}.grouped_impl);
      measure_host_behind_blocker(rule, 20, [&] { plan.run(s()); }, r);
      const std::string kernels = kernels_per_call([&](cudaStream_t st) { plan.run(st); });
      TW_CUDA_CHECK(cudaMemsetAsync(y, 0xFF, sz(total * n) * 2, s()));
      plan.run(s());
      sync();
      // Y_0 = X_0 W_0^T (the hot expert) at its first row and column, against a CPU dot product.
      CheckLog log("grouped Y_0 = X_0 W_0^T against a CPU dot product");
      const auto xv = download_bf16(x, 0, k);
      const auto wv = download_bf16(w, 0, k);
      double ref = 0.0, norm = 0.0;
      for (std::int64_t l = 0; l < k; ++l) {
        ref += xv[sz(l)] * wv[sz(l)];
        norm += (xv[sz(l)] * wv[sz(l)]) * (xv[sz(l)] * wv[sz(l)]);
      }
      log.expect_near(download_bf16(y, 0, 1)[0], ref, 0.02 * std::sqrt(norm) + 0.01 * std::fabs(ref), "expert 0 row 0");
      r.check = log.passed() + "; " + kernels;
    } else {
      const std::int64_t hd = p.iparam("head_dim");
      const be::AttentionShape sh{p.iparam("batch"), p.iparam("seq"), p.iparam("seq"), p.iparam("heads"), hd, hd, true};
      auto* q = buf_[6].as<be::bf16>();
      auto* k = buf_[7].as<be::bf16>();
      auto* v = buf_[8].as<be::bf16>();
      auto* o = buf_[9].as<be::bf16>();
      auto* lse = buf_[11].as<float>();
      attention_->reserve(sh);
      attention_->forward(sh, q, k, v, o, lse, s());  // backward consumes a real O and log-sum-exp
      const bool bwd = p.iparam("backward") != 0;
      const Work call = [&](cudaStream_t st) {
        if (bwd) {
          attention_->backward(sh, q, k, v, o, buf_[10].as<be::bf16>(), lse, buf_[12].as<be::bf16>(),
                               buf_[13].as<be::bf16>(), buf_[14].as<be::bf16>(), st);
        } else {
          attention_->forward(sh, q, k, v, o, lse, st);
        }
      };
      measure_host_behind_blocker(rule, 20, [&] { call(s()); }, r);
      const std::string kernels = kernels_per_call(call);
      TW_CUDA_CHECK(cudaMemsetAsync(o, 0xFF, sz(sh.batch * sh.heads * sh.seq_q * hd) * 2, s()));
      attention_->forward(sh, q, k, v, o, lse, s());
      sync();
      CheckLog log("attention forward row of (batch 0, head 0) against a CPU reference (relative L2)");
      const std::int64_t row = sh.seq_q - 1;
      const AttnRef ref = attention_row(sh, q, k, v, row);
      log.expect_near(detail::rel_l2(download_bf16(o, row * hd, hd), ref.o), 0.0, 0.03, "row " + std::to_string(row));
      r.check = log.passed() + (bwd ? " (after the backward calls)" : "") + "; " + kernels;
    }
  }

  int counter() {
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    int v = 0;
    TW_CUDA_CHECK(cudaMemcpy(&v, buf_[0].data(), sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }

  std::string expect_count(int before, long long launched, const char* what) {
    const int got = counter() - before;
    if (got != launched) {
      throw std::runtime_error(std::string("correctness check failed: ") + what + ": " + std::to_string(got) + " of " +
                               std::to_string(launched) + " counting kernels ran");
    }
    return std::string("passed: all ") + std::to_string(launched) + " counting kernels ran (" + what + ")";
  }

  // Device time one timing marker costs its stream (host.timing_marker): threewalls run brackets each
  // op of a recorded step with two timing-event records on the op's stream (executor.cpp issue_op).
  // A sample times kMarkerKernels residual adds back to back, then the same adds each between two
  // timing events, both behind the blocker (the host enqueues the whole batch first, so the device
  // sets the pace, not the host's launch rate): (t_marked - t_plain) / (2 kMarkerKernels) per marker.
  // calibration/tools/timed_op_gap.cu measured the same with 3000 large kernels (H100 host 1.63 us).
  static constexpr std::size_t kMarkerKernelElems = std::size_t{1} << 20;  // 2 MiB per bf16 operand
  static constexpr int kMarkerKernels = 48;
  void measure_timing_marker(const StopRule& rule, Record& r) {
    // Its own operands (buf_ 6-14 hold the attention launch points' tensors in this section).
    const be::DeviceBuffer in_a = random_bf16(kMarkerKernelElems, opt_.seed + 68, s());
    const be::DeviceBuffer in_b = random_bf16(kMarkerKernelElems, opt_.seed + 69, s());
    be::DeviceBuffer sum(kMarkerKernelElems * 2);
    const auto* a = in_a.as<be::bf16>();
    const auto* b = in_b.as<be::bf16>();
    auto* out = sum.as<be::bf16>();
    const auto n = static_cast<std::int64_t>(kMarkerKernelElems);
    std::vector<be::Event> ev;
    ev.reserve(2 * kMarkerKernels);
    for (int i = 0; i < 2 * kMarkerKernels; ++i) ev.emplace_back(true);  // timing events, as CudaEventClock's
    auto plain = [&](cudaStream_t st) {
      for (int i = 0; i < kMarkerKernels; ++i) be::add(a, b, out, n, st);
    };
    auto marked = [&](cudaStream_t st) {
      for (int i = 0; i < kMarkerKernels; ++i) {
        ev[static_cast<std::size_t>(2 * i)].record(st);
        be::add(a, b, out, n, st);
        ev[static_cast<std::size_t>(2 * i + 1)].record(st);
      }
    };
    static_cast<void>(timer_->batch(plain, 1, true));  // warm-up
    static_cast<void>(timer_->batch(marked, 1, true));
    const Sampling smp = sample_until(rule, clock_, [&] {
      const double t_plain = timer_->batch(plain, 1, true);
      const double t_marked = timer_->batch(marked, 1, true);
      return std::max(1e-9, (t_marked - t_plain) / (2.0 * kMarkerKernels));
    });
    r.samples_s = smp.samples, r.reps = 1, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    CheckLog log("every marker completed and out = a + b");
    for (const auto& e : ev) {
      if (!e.done()) throw std::runtime_error("correctness check failed: a timing marker never completed");
    }
    for (const std::int64_t i : {std::int64_t{0}, n / 2, n - 1}) {
      const double want = detail::bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
      log.expect_near(download_bf16(out, i, 1)[0], want, 1e-2 * std::max(1.0, std::abs(want)),
                      "element " + std::to_string(i));
    }
    r.check = log.passed();
  }

  // Extra host seconds per launch when visits of five launches (count kernel, GEMM call, count kernel,
  // GEMM call, count kernel) rotate over N streams, each with its own cuBLASLt handle, as threewalls
  // run's OpRunners do (one per stream), over the same visits on one stream: host.stream_cycle. A
  // sample times one stream, N streams, one stream again, and takes N minus the mean of the two (a
  // drift of the host's speed during the sample cancels; samples a few seconds apart did not). The GEMM is tiny (16 x 512 x 256, one node), the
  // device keeps up with the host, so the sample is the host's launch rate. Fresh streams and
  // handles per point; the first rotation (plans, lazy loading) is not timed.
  void measure_stream_cycle(const StopRule& rule, Record& r) {
    const int n = static_cast<int>(r.point.iparam("streams"));
    constexpr int kVisits = 128;
    int* cnt = buf_[0].as<int>();
    const int before = counter();
    std::vector<be::Stream> streams;
    std::vector<std::unique_ptr<be::CublasLt>> lts;
    for (int i = 0; i < n; ++i) {
      streams.emplace_back();
      lts.push_back(std::make_unique<be::CublasLt>());
    }
    const be::GemmShape g = be::linear_gemm(be::GemmLayout::forward, 16, 512, 256);
    const void* a = buf_[3].data();
    const void* b = buf_[4].data();
    void* c = buf_[5].data();
    long long launched = 0;
    auto visit = [&](int v, int rotate) {
      const auto i = static_cast<std::size_t>(v % rotate);
      const cudaStream_t st = streams[i];
      kernels::launch_count(cnt, st);
      lts[i]->gemm(g, a, b, c, st);
      kernels::launch_count(cnt, st);
      lts[i]->gemm(g, a, b, c, st);
      kernels::launch_count(cnt, st);
      launched += 3;
    };
    auto drain = [&] {
      for (const auto& st : streams) TW_CUDA_CHECK(cudaStreamSynchronize(st));
    };
    for (int v = 0; v < n; ++v) visit(v, n);  // warm-up: every handle's plan
    drain();
    // Host seconds per launch of kVisits visits rotating over `rotate` streams.
    const auto pass = [&](int rotate) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int v = 0; v < kVisits; ++v) visit(v, rotate);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      drain();
      return t / (5.0 * kVisits);
    };
    const Sampling smp = sample_extra(rule, [&] { return pass(1); }, [&] { return pass(n); });
    r.samples_s = smp.samples, r.reps = 5 * kVisits, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    TW_CUDA_CHECK(cudaMemsetAsync(c, 0xFF, sz(g.m * g.n) * 2, s()));
    lts.back()->gemm(g, a, b, c, s());
    sync();
    r.check = expect_count(before, launched, (std::to_string(n) + " stream(s)").c_str()) + "; " + check_gemm(g, a, b, c, false);
  }

  // A differential sample of host time: `variant` minus the mean of `base` run just before and just
  // after it (a drift of the host's speed during the sample cancels; samples a few seconds apart did
  // not), floored at 1 ns. host.stream_cycle and host.stream_wait.
  Sampling sample_extra(const StopRule& rule, const std::function<double()>& base, const std::function<double()>& variant) {
    return sample_until(rule, clock_, [&] {
      const double before = base();
      const double with = variant();
      const double after = base();
      return std::max(1e-9, with - 0.5 * (before + after));
    });
  }

  // Host seconds of one cross-stream wait, as threewalls run makes one for each dependency on another
  // stream (wait_deps: cudaStreamWaitEvent on an event of its pool): kVisits visits of (a counting
  // kernel on the main stream, an event of a pool recorded behind it, a counting kernel on the next
  // of kStreams side streams), with and without the side stream waiting on that event first. A
  // sample times without, with, without and takes with minus the mean of the two (the host's drift
  // cancels, as in host.stream_cycle). The device keeps up with the host: the times are the host's.
  void measure_stream_wait(const StopRule& rule, Record& r) {
    constexpr int kStreams = 16;
    constexpr int kVisits = 128;
    int* cnt = buf_[0].as<int>();
    const int before = counter();
    std::vector<be::Stream> side(kStreams);
    std::vector<be::Event> events;
    for (int i = 0; i < kVisits; ++i) events.emplace_back(false);
    long long launched = 0;
    const auto pass = [&](bool wait) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int v = 0; v < kVisits; ++v) {
        const cudaStream_t st = side[static_cast<std::size_t>(v % kStreams)].get();
        be::Event& e = events[static_cast<std::size_t>(v)];
        kernels::launch_count(cnt, s());
        e.record(s());
        if (wait) TW_CUDA_CHECK(cudaStreamWaitEvent(st, e.get(), 0));
        kernels::launch_count(cnt, st);
      }
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      launched += 2 * kVisits;
      sync();
      for (const be::Stream& x : side) TW_CUDA_CHECK(cudaStreamSynchronize(x.get()));
      return t / kVisits;
    };
    static_cast<void>(pass(true));  // warm-up: the streams' first use
    const Sampling smp = sample_extra(rule, [&] { return pass(false); }, [&] { return pass(true); });
    r.samples_s = smp.samples, r.reps = kVisits, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    r.check = expect_count(before, launched, "kernels of the waiting and the plain visits");
  }

  // The executor's per-op host path, against the launch alone: `op_dispatch` is the extra
  // host time of OpRunner::run for a small elementwise add over a bare kernel launch (its buffer
  // checks and dispatch); `record_op` the extra host time of a *recorded* op over the same
  // OpRunner::run: the recording path of threewalls run's executor (backend::RecordedLaunches: the
  // previous end marker's query, a start marker unless shared, the launch, a host clock read, an end
  // marker, the StepRecorder record, and the step's harvest into records after the stream finished,
  // which the executor runs on the same thread between steps). Each sample times kExecutorOps calls
  // of each variant back to back and takes the difference per call; the tiny kernels keep the device ahead of the host,
  // so the times are the host's.
  static constexpr int kExecutorOps = 64;
  void measure_executor_path(const StopRule& rule, Record& r, bool recorded) {
    be::OpRunner runner(be::OpRunnerConfig{});
    scenarios::Op add;
    add.kind = scenarios::OpKind::elementwise;
    add.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::add);
    add.shape = {4096, 0, 0, 0, 0, 0};
    int* cnt = buf_[0].as<int>();
    const int before = counter();
    long long launched = 0;
    runner.run(add, s());  // buffers, first launch
    sync();
    be::RecordedLaunches rec(s(), 4 * kExecutorOps);
    const auto per_call = [&](const std::function<void()>& fn) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kExecutorOps;
    };
    const auto run_ops = [&] {
      for (int i = 0; i < kExecutorOps; ++i) runner.run(add, s());
    };
    const Sampling smp = sample_until(rule, clock_, [&] {
      double base = 0.0, with = 0.0;
      if (!recorded) {
        base = per_call([&] {
          for (int i = 0; i < kExecutorOps; ++i) kernels::launch_count(cnt, s());
        });
        launched += kExecutorOps;
        sync();
        with = per_call(run_ops);
      } else {
        base = per_call(run_ops);
        sync();
        with = per_call([&] { rec.step(kExecutorOps, [&] { runner.run(add, s()); }); });
        sync();
        // The step's conversion into records (two event-time reads per record), which the executor
        // does on the same host thread between steps: part of what a recorded op costs the host.
        with += per_call([&] { static_cast<void>(rec.harvest(nullptr)); });
      }
      sync();
      return std::max(1e-9, with - base);
    });
    r.samples_s = smp.samples, r.reps = kExecutorOps, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    if (recorded) {
      bool negative = false;
      const std::size_t phases = rec.harvest(&negative);
      const auto want = static_cast<std::size_t>(rec.steps()) * kExecutorOps;
      if (phases != want || negative) {
        throw std::runtime_error("correctness check failed: " + std::to_string(phases) + " records harvested of " +
                                 std::to_string(want) + (negative ? ", some with a negative time" : ""));
      }
      r.check = "passed: all " + std::to_string(phases) + " records of " + std::to_string(rec.steps()) +
                " recorded steps harvested, none negative";
    } else {
      r.check = expect_count(before, launched, "bare launches of the dispatch comparison");
    }
  }

  void measure_host_op(const StopRule& rule, Record& r) {
    const std::string what = r.point.op.substr(5);
    int* cnt = buf_[0].as<int>();
    const int before = counter();
    long long launched = 0;
    if (what == "kernel_launch") {
      // Host time per launch over 100 launches; the device drains the queue outside the timing.
      detail::measure_host(
          rule, clock_, 100,
          [&] {
            kernels::launch_count(cnt, s());
            ++launched;
          },
          r, [&] { sync(); });
      r.check = expect_count(before, launched, "host time of one kernel launch");
    } else if (what == "event_record") {
      be::Event e(true);
      detail::measure_host(
          rule, clock_, 100, [&] { e.record(s()); }, r, [&] { sync(); });
      TW_CUDA_CHECK(cudaStreamSynchronize(s()));
      if (!e.done()) throw std::runtime_error("correctness check failed: the recorded event never completed");
      r.check = "passed: the recorded event completed after the stream synchronised";
    } else if (what == "stream_sync") {
      // Host time of cudaStreamSynchronize right after launching a (counting, empty) kernel: the wait
      // for a trivial kernel plus the wake-up (the reference fact "stream sync after launch", docs/architecture.md).
      const Sampling smp = sample_until(rule, clock_, [&] {
        double t = 0.0;
        for (int i = 0; i < 20; ++i) {
          kernels::launch_count(cnt, s());
          ++launched;
          const auto t0 = std::chrono::steady_clock::now();
          TW_CUDA_CHECK(cudaStreamSynchronize(s()));
          t += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return t / 20.0;
      });
      r.samples_s = smp.samples, r.reps = 20, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
      r.check = expect_count(before, launched, "sync after each launch");
    } else if (what == "gpu_read") {
      // OpRunner::gpu_read (a 4-byte device-to-host read that blocks until the stream reaches it),
      // right after a kernel launch, as a routing-statistics read after the router kernel.
      be::OpRunner runner(be::OpRunnerConfig{});
      const Sampling smp = sample_until(rule, clock_, [&] {
        double t = 0.0;
        for (int i = 0; i < 20; ++i) {
          kernels::launch_count(cnt, s());
          ++launched;
          const auto t0 = std::chrono::steady_clock::now();
          runner.gpu_read(s());
          t += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (cudaStreamQuery(s()) != cudaSuccess) {
            throw std::runtime_error("correctness check failed: gpu_read returned before the stream drained");
          }
        }
        return t / 20.0;
      });
      r.samples_s = smp.samples, r.reps = 20, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
      r.check = expect_count(before, launched, "each read returned after the kernel before it");
    } else if (what == "graph_launch" || what == "graph_node") {
      auto capture = [&](int nodes) {
        be::CudaGraph::begin_capture(s());
        for (int i = 0; i < nodes; ++i) kernels::launch_count(cnt, s());
        be::CudaGraph g = be::CudaGraph::end_capture(s());
        return be::GraphExec(g);
      };
      if (what == "graph_launch") {
        const be::GraphExec ge = capture(16);
        detail::measure_host(
            rule, clock_, 10,
            [&] {
              ge.launch(s());
              launched += 16;
            },
            r, [&] { sync(); });
        r.check = expect_count(before, launched, "host time of one launch of a 16-node graph");
      } else {
        // Device time per node: (t(257 nodes) - t(1 node)) / 256, both timed with events.
        const be::GraphExec big = capture(257), small = capture(1);
        const Sampling smp = sample_until(rule, clock_, [&] {
          const double tb = timer_->batch([&](cudaStream_t st) { big.launch(st); }, 1, false);
          const double ts = timer_->batch([&](cudaStream_t st) { small.launch(st); }, 1, false);
          launched += 258;
          return std::max(1e-9, (tb - ts) / 256.0);
        });
        r.samples_s = smp.samples, r.reps = 1, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
        r.check = expect_count(before, launched, "graphs of 257 and 1 counting nodes");
      }
    } else if (what == "collective_launch") {
      // Host time to enqueue one NCCL all-reduce (1 KiB, bf16) on a one-rank communicator.
      if (!comm_) {
        const scenarios::Layout layout(1, 1, 1, 1, 1, 1, 1, 1);
        const auto ids = be::UniqueIdTable::create(layout, {scenarios::Group::dp});
        comm_ = std::make_unique<be::CommTable>(
            be::CommTable::create(layout, 0, ids, {scenarios::Group::dp}, std::chrono::seconds(60)));
      }
      be::NcclComm& c = comm_->comm(scenarios::Group::dp);
      TW_CUDA_CHECK(cudaMemsetAsync(buf_[2].data(), 0xFF, 1024, s()));
      detail::measure_host(
          rule, clock_, 50, [&] { be::all_reduce(buf_[1].data(), buf_[2].data(), 512, c, s()); }, r,
          [&] { c.wait_stream(s(), "calibration collective_launch"); });
      c.wait_stream(s(), "calibration collective_launch");
      CheckLog log("one-rank all-reduce output equals its input");
      for (const std::int64_t i : {0, 255, 511}) {
        log.expect_near(download_bf16(buf_[2].data(), i, 1)[0], download_bf16(buf_[1].data(), i, 1)[0], 1e-30,
                        "element " + std::to_string(i));
      }
      r.check = log.passed();
    } else if (what == "timing_marker") {
      measure_timing_marker(rule, r);
    } else if (what == "stream_cycle") {
      measure_stream_cycle(rule, r);
    } else if (what == "stream_wait") {
      measure_stream_wait(rule, r);
    } else if (what == "op_dispatch" || what == "record_op") {
      measure_executor_path(rule, r, what == "record_op");
    } else if (what == "gemm_launch" || what == "grouped_gemm_launch" || what == "attention_launch" ||
               what == "attention_bwd_launch") {
      measure_library_launch(rule, r, what);
    } else {
      throw std::logic_error("unknown host op " + r.point.op);
    }
  }

  // ---- concurrency ----
  // Like device(), but always behind the blocking kernel, also when one run makes a sample: the runs
  // are enqueued before the device starts them, so a sample is the device's time, not the host's
  // launch rate (on a 4 x H200 host 64 GEMM launches took ~0.6 ms, longer than the GPU needs for
  // them, and device() takes one unblocked run per sample past 0.4 ms). Falls back to
  // device() if the blocker times out.
  void device_blocked(const Work& w, const StopRule& rule, Record& rec) {
    w(s());  // warm-up
    sync();
    try {
      const double t1 = timer_->batch(w, 1, true);
      const int reps = reps_per_sample(t1, 4e-4, 16);
      const Sampling smp = sample_until(rule, clock_, [&] { return timer_->batch(w, reps, true); });
      rec.samples_s = smp.samples, rec.reps = reps, rec.stop = to_string(smp.reason), rec.rel_ci = smp.rel_ci;
    } catch (const detail::BlockerTimeout&) {
      device(w, true, rule, rec);
    }
  }

  struct Section {
    std::vector<scenarios::Op> ops;
    std::unique_ptr<be::OpRunner> serial;  // all of the ops, for the one-stream time
  };

  void begin_concurrency(const std::vector<PointSpec>& points) {
    int streams = 1;
    for (const auto& p : points) streams = std::max(streams, static_cast<int>(p.iparam("streams")));
    for (int i = 0; i < streams; ++i) side_streams_.push_back(std::make_unique<be::Stream>());
    buf_[0] = be::DeviceBuffer(sizeof(int));  // the counting kernels' counter (the join check)
    TW_CUDA_CHECK(cudaMemsetAsync(buf_[0].data(), 0, sizeof(int), s()));
    sections_.clear();
  }

  Section& section_of(const PointSpec& p) {
    const auto key = std::make_tuple(p.iparam("rows"), p.iparam("hidden"), p.iparam("ffn"));
    auto it = sections_.find(key);
    if (it != sections_.end()) return it->second;
    Section sec;
    sec.ops = concurrency_section_ops(std::get<0>(key), std::get<1>(key), std::get<2>(key));
    sec.serial = std::make_unique<be::OpRunner>(be::OpRunnerConfig{});
    sec.serial->prepare(sec.ops);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    return sections_.emplace(key, std::move(sec)).first->second;
  }

  // Experts round-robin over n streams (expert e on stream e mod n, its five ops in order), issued
  // expert by expert as the executor issues a streams:N section, forked from the main stream by one
  // event and joined back by one event per stream. Each stream has its own OpRunner (own cuBLASLt
  // handle, workspace and buffers) prepared with its experts' ops, as threewalls run's CudaDevice
  // has one per stream; the serial time runs all the ops back to back on the main stream with one.
  // Both behind the blocker (the device's time, not the host's).
  void measure_concurrency(const StopRule& rule, Record& r) {
    const int n = static_cast<int>(r.point.iparam("streams"));
    Section& sec = section_of(r.point);
    Record serial;
    serial.point = r.point;
    device_blocked([&](cudaStream_t st) { for (const auto& op : sec.ops) sec.serial->run(op, st); }, rule, serial);
    std::vector<std::unique_ptr<be::OpRunner>> runners;
    for (int i = 0; i < n; ++i) {
      std::vector<scenarios::Op> mine;
      for (const auto& op : sec.ops) {
        if (op.expert % n == i) mine.push_back(op);
      }
      runners.push_back(std::make_unique<be::OpRunner>(be::OpRunnerConfig{}));
      runners.back()->prepare(mine);
    }
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    be::Event fork(false);
    std::vector<be::Event> join;
    for (int i = 0; i < n; ++i) join.emplace_back(false);
    const auto side = [&](int i) { return side_streams_[sz(static_cast<std::int64_t>(i))]->get(); };
    const auto concurrent = [&](cudaStream_t st, bool count) {
      fork.record(st);
      for (int i = 0; i < n; ++i) TW_CUDA_CHECK(cudaStreamWaitEvent(side(i), fork.get(), 0));
      for (const auto& op : sec.ops) runners[sz(static_cast<std::int64_t>(op.expert % n))]->run(op, side(op.expert % n));
      for (int i = 0; i < n; ++i) {
        if (count) kernels::launch_count(buf_[0].as<int>(), side(i));
        join[sz(static_cast<std::int64_t>(i))].record(side(i));
        TW_CUDA_CHECK(cudaStreamWaitEvent(st, join[sz(static_cast<std::int64_t>(i))].get(), 0));
      }
    };
    device_blocked([&](cudaStream_t st) { concurrent(st, false); }, rule, r);
    r.point.inputs = {static_cast<double>(n), mean_sm_fraction(sec.ops, opt_.sm_count), serial.median_s()};
    // Every stream reached its end before the join released the main stream: one counting kernel
    // per stream after its sections, read once the main stream drained.
    const int before = counter();
    concurrent(s(), true);
    // Streams past the hardware work queues share them: record the setting this ran under
    // (the backend does not set the variable; CUDA's default is 8 connections).
    const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    r.check = expect_count(before, n, "one per stream after its sections, before the join") + "; " +
              std::to_string(sec.ops.size()) + " ops, one OpRunner per stream; CUDA_DEVICE_MAX_CONNECTIONS=" +
              (conns ? std::string(conns) : std::string("unset (CUDA default 8)"));
    TW_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // ---- compute beside resident NCCL kernels; NCCL memory (gpu_interference.cpp) ----
  void begin_interference(const std::vector<PointSpec>& points) {
    // GEMM operands of at least kRotationBytes (cold L2, as in the gemm section); the residual add
    // uses the same buffers; attention has its own (the attention section's layout).
    double a = 1, b = 1, c = 1, attn = 1, rows = 1;
    for (const auto& p : points) {
      if (p.op != "nccl_interference") continue;
      const auto kind = p.iparam("kernel");
      if (kind == 0) {
        a = std::max(a, p.param("m") * p.param("k"));
        b = std::max(b, p.param("k") * p.param("n"));
        c = std::max(c, p.param("m") * p.param("n"));
      } else if (kind == 1) {
        attn = std::max(attn, p.param("batch") * p.param("heads") * p.param("seq") * p.param("head_dim"));
        rows = std::max(rows, p.param("batch") * p.param("heads") * p.param("seq"));
      } else {
        a = std::max(a, p.param("elements"));
        b = std::max(b, p.param("elements"));
        c = std::max(c, p.param("elements"));
      }
    }
    const double floor_elems = static_cast<double>(kRotationBytes) / 2.0;
    buf_[0] = random_bf16(sz(std::max(a, floor_elems)), opt_.seed + 81, s());
    buf_[1] = random_bf16(sz(std::max(b, floor_elems)), opt_.seed + 82, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(c, floor_elems)) * 2);
    buf_[3] = random_bf16(sz(attn), opt_.seed + 83, s());  // Q
    buf_[4] = random_bf16(sz(attn), opt_.seed + 84, s());  // K
    buf_[5] = random_bf16(sz(attn), opt_.seed + 85, s());  // V
    buf_[6] = be::DeviceBuffer(sz(attn) * 2 * 4);         // O, dQ, dK, dV
    buf_[7] = random_bf16(sz(attn), opt_.seed + 86, s());  // dO
    buf_[8] = be::DeviceBuffer(sz(rows) * 4);              // lse
    attention_ = std::make_unique<be::Attention>(*lt_, be::OpRunnerConfig{}.attention_workspace);
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    interference_ = std::make_unique<detail::InterferenceBench>(opt_.seed + 87, clock_);
  }

  void measure_nccl_memory(Record& r) {
    if (!interference_) throw std::logic_error("nccl_memory outside the interference section");
    const auto& st = interference_->stage(static_cast<int>(r.point.iparam("stage")));
    r.point.inputs[2] = std::max(0.0, st.bytes);  // cudaMemGetInfo deltas; a release reads as 0
    r.point.params.push_back({"peer_gpu_bytes", st.peer_bytes});
    r.samples_s = {std::max(st.seconds, 1e-9)};
    r.reps = 1;
    r.stop = "one observation: the stage happens once on a fresh communicator pair";
    r.rel_ci = 0.0;
    r.check = "passed: " + st.what + ": GPU 0 " + std::to_string(st.bytes / 1048576.0) + " MiB, GPU 1 " +
              std::to_string(st.peer_bytes / 1048576.0) + " MiB (cudaMemGetInfo); the send/recv stage checked the "
              "received data";
  }

  void measure_interference(const StopRule& rule, Record& r) {
    if (!interference_) throw std::logic_error("nccl_interference outside the interference section");
    const auto& p = r.point;
    const int kase = static_cast<int>(p.iparam("case"));
    const auto kind = p.iparam("kernel");
    Work w;
    std::function<std::string()> check;
    std::optional<Rotation> ra, rb, rc;
    be::GemmShape g{};
    std::size_t run = 0;
    if (kind == 0) {
      g = be::linear_gemm(be::GemmLayout::forward, p.iparam("m"), p.iparam("n"), p.iparam("k"));
      const std::size_t a_bytes = sz(g.m * g.k) * 2, b_bytes = sz(g.k * g.n) * 2, c_bytes = sz(g.m * g.n) * 2;
      const std::size_t run_bytes = a_bytes + b_bytes + c_bytes;
      ra.emplace(buf_[0], a_bytes, run_bytes);
      rb.emplace(buf_[1], b_bytes, run_bytes);
      rc.emplace(buf_[2], c_bytes, run_bytes);
      w = [&](cudaStream_t st) {
        lt_->gemm(g, ra->at(run), rb->at(run), rc->at(run), st);
        ++run;
      };
      check = [&] {
        const std::size_t last = run - 1;
        return check_gemm(g, ra->at(last), rb->at(last), rc->at(last), false) + rotation_note(*ra, *rb, *rc);
      };
    } else if (kind == 1) {
      const be::AttentionShape sh{p.iparam("batch"), p.iparam("seq"),      p.iparam("seq"),
                                  p.iparam("heads"), p.iparam("head_dim"), p.iparam("head_dim"),
                                  p.iparam("causal") != 0};
      const bool bwd = p.iparam("backward") != 0;
      auto* q = buf_[3].as<be::bf16>();
      auto* k = buf_[4].as<be::bf16>();
      auto* v = buf_[5].as<be::bf16>();
      auto* o = buf_[6].as<be::bf16>();
      const std::size_t n = buf_[3].size() / 2;
      auto* dq = o + n;
      auto* dk = dq + n;
      auto* dv = dk + n;
      auto* d_o = buf_[7].as<be::bf16>();
      auto* lse = buf_[8].as<float>();
      attention_->reserve(sh);
      attention_->forward(sh, q, k, v, o, lse, s());  // backward consumes a real O and log-sum-exp
      // The measured batches run on the interference bench's own stream and share the attention
      // workspace with this forward: let it finish first (a backward racing it corrupted O).
      TW_CUDA_CHECK(cudaStreamSynchronize(s()));
      if (bwd) {
        w = [=, this](cudaStream_t st) { attention_->backward(sh, q, k, v, o, d_o, lse, dq, dk, dv, st); };
      } else {
        w = [=, this](cudaStream_t st) { attention_->forward(sh, q, k, v, o, lse, st); };
      }
      check = [=] {
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        CheckLog log("attention forward rows of (batch 0, head 0) against a CPU reference (relative L2)" +
                     std::string(bwd ? "; the backward's dQ is checked in the attention section" : ""));
        const std::int64_t row = sh.seq_q - 1;
        const AttnRef ref = attention_row(sh, q, k, v, row);
        log.expect_near(detail::rel_l2(download_bf16(o, row * sh.head_dim_v, sh.head_dim_v), ref.o), 0.0, 0.03,
                        "row " + std::to_string(row));
        return log.passed();
      };
    } else {
      const std::int64_t e = p.iparam("elements");
      auto* a = buf_[0].as<be::bf16>();
      auto* b = buf_[1].as<be::bf16>();
      auto* c = buf_[2].as<be::bf16>();
      w = [=](cudaStream_t st) { be::add(a, b, c, e, st); };
      check = [=] {
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        CheckLog log("out = a + b");
        for (const std::int64_t i : {std::int64_t{0}, e / 2, e - 1}) {
          const double want = detail::bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
          log.expect_near(download_bf16(c, i, 1)[0], want, 0.01 * std::fabs(want) + 1e-6,
                          "element " + std::to_string(i));
        }
        return log.passed();
      };
    }
    const double alone_s = interference_->measure(rule, kase, w, r);
    r.point.inputs[3] = alone_s;
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    r.check += "; " + check();
  }

  GpuRunnerOptions opt_;
  Clock clock_;
  std::string section_;
  std::unique_ptr<be::Stream> stream_;
  std::unique_ptr<Timer> timer_;
  std::unique_ptr<be::CublasLt> lt_;
  be::DeviceBuffer buf_[16];
  be::PinnedBuffer pinned_;
  std::vector<char> pageable_;
  std::string disk_path_;
  std::size_t disk_slot_bytes_ = 0;  // the disk-read file's slot size (the largest read)
  std::uint64_t disk_reads_ = 0;     // reads so far: the next slot to read
  std::unique_ptr<be::Attention> attention_;
  std::vector<std::unique_ptr<be::Stream>> side_streams_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, Section> sections_;  // concurrency, by shape
  std::unique_ptr<be::CommTable> comm_;
  std::unique_ptr<detail::CollectiveBench> collectives_;
  std::unique_ptr<detail::InterferenceBench> interference_;
  double max_coll_bytes_ = 0.0;
};

}  // namespace

std::unique_ptr<PointRunner> make_gpu_runner(const GpuRunnerOptions& options) {
  return std::make_unique<GpuRunner>(options);
}

}  // namespace threewalls::calibration::bench
