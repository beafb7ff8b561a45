// Per-process device memory (calibrate group "device"; family device.memory, models.hpp
// DeviceMemoryModel): what a process running threewalls run holds on its GPU besides its tensors.
//
// Why: the memory model's device-wide peak must count the CUDA context and the libraries' handles
// and workspaces; their size depends on the driver, the CUDA and library versions and the GPU, so
// it is measured, not assumed.
//
// How: on GPU 0, a fresh CUDA context of its own (cuCtxCreate through the runtime's driver entry
// points: no link to libcuda) is made current, and cudaMemGetInfo is read around each stage, in the
// order threewalls run meets them. Nothing else allocates on the GPU meanwhile (the driver runs one
// section at a time, on this thread), and the context's own memory is device-wide in
// cudaMemGetInfo whichever context reads it, so each difference is what the stage took:
//   0 the context (cuCtxCreate, then the runtime's first call in it);
//   1 the first launches of the backend's kernels a training step runs (fill, add, SwiGLU, RMSNorm,
//     softmax/top-k, Adam): with lazy module loading (the default) each kernel's code is loaded at
//     its first launch;
//   2 one CublasLt as every OpRunner holds one (cuBLASLt and cuBLAS handles, the 32 MiB workspace),
//     and its first GEMMs of the three layouts of a 4096^3 linear layer (their kernels' modules);
//   3 one FusedAttention (cuDNN handle, the forward and backward graphs of b2 s4096 h16 d128 causal,
//     the workspace they ask for);
//   4 a 1-byte cudaMalloc (the driver's allocation granularity).
// The operands of stages 1-3 are allocated between the stages (not counted), their data checked:
// the GEMM against a CPU dot product, the attention forward against a CPU reference row. The
// context is destroyed after each repeat, releasing everything; DeviceMemoryModel::kRepeats repeats.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/fused_attention.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/calibration/models.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

constexpr std::int64_t kGemmDim = 4096;
const be::AttentionShape kAttention{2, 4096, 4096, 16, 128, 128, true};

// Driver entry points through the runtime (cudaGetDriverEntryPointByVersion), so that the bench
// links no driver library.
struct Driver {
  PFN_cuCtxCreate_v3020 create = nullptr;
  PFN_cuCtxDestroy_v4000 destroy = nullptr;
  PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;

  Driver() {
    entry("cuCtxCreate", 3020, reinterpret_cast<void**>(&create));
    entry("cuCtxDestroy", 4000, reinterpret_cast<void**>(&destroy));
    entry("cuCtxGetCurrent", 4000, reinterpret_cast<void**>(&get_current));
    entry("cuCtxSetCurrent", 4000, reinterpret_cast<void**>(&set_current));
  }
  static void entry(const char* name, unsigned version, void** fn) {
    cudaDriverEntryPointQueryResult q{};
    TW_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || *fn == nullptr) {
      throw std::runtime_error(std::string("calibrate group device: the driver has no entry point ") + name);
    }
  }
  static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
      throw std::runtime_error(std::string("calibrate group device: ") + what + " failed (CUresult " +
                               std::to_string(static_cast<int>(r)) + ")");
    }
  }
};

double used_bytes() {
  std::size_t free_bytes = 0, total = 0;
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<double>(total - free_bytes);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Stage {
  double bytes = 0.0;
  double seconds = 0.0;
};

class DeviceBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& /*points*/) override {
    const Driver drv;
    int dev = 0;
    TW_CUDA_CHECK(cudaGetDevice(&dev));
    for (int r = 0; r < DeviceMemoryModel::kRepeats; ++r) repeats_.push_back(measure_repeat(drv, dev));
  }

  void measure(const StopRule& /*rule*/, Record& r) override {
    if (r.point.op != "device_memory") {
      throw std::logic_error("calibrate group device: no benchmark for op " + r.point.op);
    }
    const auto stage = static_cast<std::size_t>(r.point.iparam("stage"));
    const auto repeat = static_cast<std::size_t>(r.point.iparam("repeat"));
    if (stage >= DeviceMemoryModel::kStages || repeat >= repeats_.size()) {
      throw std::logic_error("device_memory: no stage " + std::to_string(stage) + " repeat " + std::to_string(repeat));
    }
    const Stage& st = repeats_[repeat].stages[stage];
    r.point.inputs[2] = std::max(0.0, st.bytes);  // cudaMemGetInfo deltas; a release reads as 0
    r.samples_s = {std::max(st.seconds, 1e-9)};
    r.reps = 1;
    r.stop = "one observation: the stage happens once in a fresh context";
    r.rel_ci = 0.0;
    r.check = repeats_[repeat].check + "; stage " + std::to_string(stage) + ": " +
              std::to_string(st.bytes / 1048576.0) + " MiB (cudaMemGetInfo)";
  }

 private:
  struct Repeat {
    Stage stages[DeviceMemoryModel::kStages];
    std::string check;
  };
  std::vector<Repeat> repeats_;

  // One repeat in a fresh context of its own; the context is destroyed (and the previous one made
  // current again) whatever happens.
  Repeat measure_repeat(const Driver& drv, int dev) {
    CUcontext previous = nullptr;
    Driver::check(drv.get_current(&previous), "cuCtxGetCurrent");
    Repeat out;
    double before = used_bytes();
    double t0 = now_s();
    CUcontext ctx = nullptr;
    Driver::check(drv.create(&ctx, 0, static_cast<CUdevice>(dev)), "cuCtxCreate");
    try {
      double after = used_bytes();
      out.stages[0] = {after - before, now_s() - t0};
      run_stages(out);
    } catch (...) {
      drv.destroy(ctx);
      drv.set_current(previous);
      throw;
    }
    Driver::check(drv.destroy(ctx), "cuCtxDestroy");
    Driver::check(drv.set_current(previous), "cuCtxSetCurrent");
    return out;
  }

  // Stages 1-5 in the current (fresh) context. Every handle stays alive until the end of the repeat,
  // as an OpRunner holds its handles for the run; all are released before returning.
  static void run_stages(Repeat& out) {
    const cudaStream_t st = nullptr;
    const std::int64_t n = kGemmDim;
    const auto& as = kAttention;
    const std::int64_t attn = as.batch * as.heads * as.seq_q * as.head_dim_qk;
    // Operands (between stages, not counted).
    be::DeviceBuffer a(sz(n * n) * 2), b(a.size()), c(a.size()), gamma(sz(n) * 2);
    be::DeviceBuffer rstd(sz(n) * 4), dgamma(sz(n) * 4), f32(sz(n * n) * 4 * 4);
    be::DeviceBuffer ids(sz(n) * 8 * 4), counts(64 * 4);
    be::DeviceBuffer q(sz(attn) * 2), k(q.size()), v(q.size()), o(q.size()), d_o(q.size()), dq(q.size()), dk(q.size()),
        dv(q.size()), lse(sz(as.batch * as.heads * as.seq_q) * 4);
    auto timed = [](Stage& s, const auto& fn) {
      const double before = used_bytes();
      const double t0 = now_s();
      fn();
      s = {used_bytes() - before, now_s() - t0};
    };
    // 1: the backend's kernels of a training step.
    timed(out.stages[1], [&] {
      be::fill_random(a.as<be::bf16>(), n * n, 101, 1.0F, st);
      be::fill_random(b.as<be::bf16>(), n * n, 102, 1.0F, st);
      be::fill_random(gamma.as<be::bf16>(), n, 103, 1.0F, st);
      be::fill_random(f32.as<float>(), n * n * 4, 104, 1.0F, st);
      be::add(a.as<be::bf16>(), b.as<be::bf16>(), c.as<be::bf16>(), n * n, st);
      be::swiglu_fwd(a.as<be::bf16>(), c.as<be::bf16>(), n, n / 2, st);
      be::swiglu_bwd(b.as<be::bf16>(), a.as<be::bf16>(), c.as<be::bf16>(), n, n / 2, st);
      be::rmsnorm_fwd(a.as<be::bf16>(), gamma.as<be::bf16>(), c.as<be::bf16>(), rstd.as<float>(), n, n, 1e-5F, st);
      TW_CUDA_CHECK(cudaMemsetAsync(dgamma.data(), 0, dgamma.size(), st));
      be::rmsnorm_bwd(b.as<be::bf16>(), a.as<be::bf16>(), gamma.as<be::bf16>(), rstd.as<float>(), c.as<be::bf16>(),
                      dgamma.as<float>(), n, n, st);
      be::softmax_topk(a.as<be::bf16>(), ids.as<std::int32_t>(), f32.as<float>(), counts.as<std::int32_t>(), n, 64, 8,
                       true, st);
      float* m = f32.as<float>();
      be::adam_step(m, m + n * n, m + 2 * n * n, m + 3 * n * n, nullptr, n * n, be::AdamParams{}, st);
    });
    // Fresh inputs for the checks (the launches above wrote into a and c).
    be::fill_random(a.as<be::bf16>(), n * n, 105, 1.0F, st);
    be::fill_random(q.as<be::bf16>(), attn, 106, 1.0F, st);
    be::fill_random(k.as<be::bf16>(), attn, 107, 1.0F, st);
    be::fill_random(v.as<be::bf16>(), attn, 108, 1.0F, st);
    be::fill_random(d_o.as<be::bf16>(), attn, 109, 1.0F, st);
    TW_CUDA_CHECK(cudaStreamSynchronize(st));
    // 2, 3: the first CublasLt with its first GEMMs (the three layouts of a 4096^3 linear layer),
    // then a second one with the same GEMMs (what every further OpRunner adds: its modules are loaded).
    auto gemms = [&](be::CublasLt& lt) {
      for (const auto layout : {be::GemmLayout::dgrad, be::GemmLayout::wgrad, be::GemmLayout::forward}) {
        lt.gemm(be::linear_gemm(layout, n, n, n), a.data(), b.data(), c.data(), st);
      }
    };
    std::optional<be::CublasLt> lt1, lt2;
    timed(out.stages[2], [&] { gemms(lt1.emplace()); });
    const std::string gemm_check =
        check_gemm(be::linear_gemm(be::GemmLayout::forward, n, n, n), a.data(), b.data(), c.data(), false);
    timed(out.stages[3], [&] { gemms(lt2.emplace()); });
    // 4: one FusedAttention, forward and backward of the typical shape.
    if (std::string why; !be::fused_attention_built(&why)) {
      throw std::runtime_error("calibrate group device: fused attention is not in this build (" + why + ")");
    }
    std::optional<be::FusedAttention> fa;
    timed(out.stages[4], [&] {
      fa.emplace();
      fa->forward(as, q.as<be::bf16>(), k.as<be::bf16>(), v.as<be::bf16>(), o.as<be::bf16>(), lse.as<float>(), st);
      fa->backward(as, q.as<be::bf16>(), k.as<be::bf16>(), v.as<be::bf16>(), o.as<be::bf16>(), d_o.as<be::bf16>(),
                   lse.as<float>(), dq.as<be::bf16>(), dk.as<be::bf16>(), dv.as<be::bf16>(), st);
    });
    CheckLog log("fused attention forward row of (batch 0, head 0) against a CPU reference (relative L2)");
    const std::int64_t row = as.seq_q - 1;
    const AttnRef ref = attention_row(as, q.data(), k.data(), v.data(), row);
    log.expect_near(rel_l2(download_bf16(o.data(), row * as.head_dim_v, as.head_dim_v), ref.o), 0.0, 0.03,
                    "row " + std::to_string(row));
    // 5: the allocation granularity.
    be::DeviceBuffer one;
    timed(out.stages[5], [&] { one = be::DeviceBuffer(1); });
    out.check = gemm_check + "; " + log.passed() + "; workspace of the fused attention " +
                std::to_string(fa->workspace_bytes() / 1048576.0) + " MiB";
  }
};

}  // namespace

std::unique_ptr<GroupBench> make_device_bench(const BenchContext& ctx) { return std::make_unique<DeviceBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
