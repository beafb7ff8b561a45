// Calibrate group "host" (families host.*, host.gemm_call, host.grouped_gemm_call,
// host.stream_cycle): host costs of launches, events, synchronisation, graphs, NCCL enqueues,
// library calls behind a blocking kernel, and the executor's own per-op path, each with a check that
// the work it timed ran (counting kernels, outputs against the CPU).
#include <chrono>
#include <functional>

#include "../bench_kernels.cuh"
#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/backend/recording_path.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

class HostBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
    buf_[1] = random_bf16(512, opt().seed + 61, s());  // 1 KiB for the 1-rank all-reduce
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
      if (p.op == "host_stream_cycle")
        a = std::max(a, 16.0 * 256), b = std::max(b, 256.0 * 512), c = std::max(c, 16.0 * 512);
    }
    if (a > 1) {
      buf_[3] = random_bf16(sz(a), opt().seed + 62, s());
      buf_[4] = random_bf16(sz(b), opt().seed + 63, s());
      buf_[5] = be::DeviceBuffer(sz(c) * 2);
    }
    if (attn > 1) {
      buf_[6] = random_bf16(sz(attn), opt().seed + 64, s());   // Q
      buf_[7] = random_bf16(sz(attn), opt().seed + 65, s());   // K
      buf_[8] = random_bf16(sz(attn), opt().seed + 66, s());   // V
      buf_[9] = be::DeviceBuffer(sz(attn) * 2);                // O
      buf_[10] = random_bf16(sz(attn), opt().seed + 67, s());  // dO
      buf_[11] = be::DeviceBuffer(sz(rows) * 4);               // lse
      buf_[12] = be::DeviceBuffer(sz(attn) * 2);               // dQ
      buf_[13] = be::DeviceBuffer(sz(attn) * 2);               // dK
      buf_[14] = be::DeviceBuffer(sz(attn) * 2);               // dV
      attention_ = std::make_unique<be::Attention>(*ctx_.lt, be::OpRunnerConfig{}.attention_workspace);
    }
  }

  void measure(const StopRule& rule, Record& r) override {
    const std::string what = r.point.op.substr(5);
    int* cnt = counter_.device();
    const int before = counter();
    long long launched = 0;
    // Host time of `call` right after launching a (counting, empty) kernel, the mean of 20 such pairs
    // per sample; `check` runs after each timed call, outside the timing.
    const auto time_after_launch = [&](const auto& call, const auto& check) {
      const Sampling smp = sample_until(rule, ctx_.clock, [&] {
        double t = 0.0;
        for (int i = 0; i < 20; ++i) {
          kernels::launch_count(cnt, s());
          ++launched;
          const auto t0 = std::chrono::steady_clock::now();
          call();
          t += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          check();
        }
        return t / 20.0;
      });
      r.samples_s = smp.samples, r.reps = 20, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    };
    if (what == "kernel_launch") {
      // Host time per launch over 100 launches; the device drains the queue outside the timing.
      measure_host(
          rule, ctx_.clock, 100,
          [&] {
            kernels::launch_count(cnt, s());
            ++launched;
          },
          r, [&] { sync(); });
      r.check = expect_count(before, launched, "host time of one kernel launch");
    } else if (what == "event_record") {
      be::Event e(true);
      measure_host(
          rule, ctx_.clock, 100, [&] { e.record(s()); }, r, [&] { sync(); });
      TW_CUDA_CHECK(cudaStreamSynchronize(s()));
      if (!e.done()) throw std::runtime_error("correctness check failed: the recorded event never completed");
      r.check = "passed: the recorded event completed after the stream synchronised";
    } else if (what == "stream_sync") {
      // Host time of cudaStreamSynchronize right after launching a (counting, empty) kernel: the wait
      // for a trivial kernel plus the wake-up (the reference fact "stream sync after launch", docs/architecture.md).
      time_after_launch([&] { TW_CUDA_CHECK(cudaStreamSynchronize(s())); }, [] {});
      r.check = expect_count(before, launched, "sync after each launch");
    } else if (what == "gpu_read") {
      // OpRunner::gpu_read (a 4-byte device-to-host read that blocks until the stream reaches it),
      // right after a kernel launch, as a routing-statistics read after the router kernel.
      be::OpRunner runner(be::OpRunnerConfig{});
      time_after_launch(
          [&] { runner.gpu_read(s()); },
          [&] {
            if (cudaStreamQuery(s()) != cudaSuccess) {
              throw std::runtime_error("correctness check failed: gpu_read returned before the stream drained");
            }
          });
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
        measure_host(
            rule, ctx_.clock, 10,
            [&] {
              ge.launch(s());
              launched += 16;
            },
            r, [&] { sync(); });
        r.check = expect_count(before, launched, "host time of one launch of a 16-node graph");
      } else {
        // Device time per node: (t(257 nodes) - t(1 node)) / 256, both timed with events.
        const be::GraphExec big = capture(257), small = capture(1);
        const Sampling smp = sample_until(rule, ctx_.clock, [&] {
          const double tb = ctx_.timer->batch([&](cudaStream_t st) { big.launch(st); }, 1, false);
          const double ts = ctx_.timer->batch([&](cudaStream_t st) { small.launch(st); }, 1, false);
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
      measure_host(
          rule, ctx_.clock, 50, [&] { be::all_reduce(buf_[1].data(), buf_[2].data(), 512, c, s()); }, r,
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

 private:
  // Host seconds per call of `fn` (which enqueues on s()) while a blocking kernel holds the stream:
  // every call only queues work, the device never drains the queue during the timing, so the sample
  // is the library call's host cost alone (the GEMM families time device work queued behind
  // the blocker and hide it; host.kernel_launch times an empty kernel). `calls` stays far below the
  // launch queue's depth (a full queue would block the host until the blocker's 2 s timeout, which
  // then fails the point).
  void measure_host_behind_blocker(const StopRule& rule, int calls, const std::function<void()>& fn, Record& r) {
    fn();  // warm-up: plans, heuristics, the first call's lazy loading
    sync();
    const Sampling smp = sample_until(rule, ctx_.clock, [&] {
      ctx_.timer->begin(true);
      double t = 0.0;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < calls; ++i) fn();
        t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } catch (...) {
        ctx_.timer->release();
        static_cast<void>(cudaStreamSynchronize(s()));
        throw;
      }
      ctx_.timer->end();
      ctx_.timer->release();
      sync();
      static_cast<void>(ctx_.timer->elapsed_s());  // BlockerTimeout: the calls did not all queue behind it
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
      return std::to_string(kernels) + " kernel(s)" +
             (other > 0 ? " and " + std::to_string(other) + " other node(s)" : "") + " per call (graph capture)";
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
      measure_host_behind_blocker(
          rule, 40, [&] { ctx_.lt->gemm(g, a, b, c, s()); }, r);
      int count = 0;
      const std::string kernels = kernels_per_call([&](cudaStream_t st) { ctx_.lt->gemm(g, a, b, c, st); }, &count);
      if (r.point.inputs.size() == 4) r.point.inputs[3] = count;  // host.gemm_call's input `nodes`
      TW_CUDA_CHECK(cudaMemsetAsync(c, 0xFF, sz(g.m * g.n) * 2, s()));
      ctx_.lt->gemm(g, a, b, c, s());
      sync();
      r.check = check_gemm(g, a, b, c, false) + "; " + kernels;
    } else if (what == "grouped_gemm_launch") {
      const std::int64_t groups = p.iparam("groups"), total = p.iparam("total_rows");
      const std::int64_t n = p.iparam("n"), k = p.iparam("k");
      const std::vector<std::int64_t> rows = be::expert_rows(total, groups, p.iparam("max_rows"));
      const auto* x = buf_[3].as<be::bf16>();
      const auto* w = buf_[4].as<be::bf16>();
      auto* y = buf_[5].as<be::bf16>();
      be::GroupedGemm plan(*ctx_.lt, be::GemmLayout::forward, rows, n, k, x, w, y, be::OpRunnerConfig{}.grouped_impl);
      measure_host_behind_blocker(
          rule, 20, [&] { plan.run(s()); }, r);
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
      measure_host_behind_blocker(
          rule, 20, [&] { call(s()); }, r);
      const std::string kernels = kernels_per_call(call);
      TW_CUDA_CHECK(cudaMemsetAsync(o, 0xFF, sz(sh.batch * sh.heads * sh.seq_q * hd) * 2, s()));
      attention_->forward(sh, q, k, v, o, lse, s());
      sync();
      CheckLog log("attention forward row of (batch 0, head 0) against a CPU reference (relative L2)");
      const std::int64_t row = sh.seq_q - 1;
      const AttnRef ref = attention_row(sh, q, k, v, row);
      log.expect_near(rel_l2(download_bf16(o, row * hd, hd), ref.o), 0.0, 0.03, "row " + std::to_string(row));
      r.check = log.passed() + (bwd ? " (after the backward calls)" : "") + "; " + kernels;
    }
  }

  int counter() const { return counter_.read(s()); }
  std::string expect_count(int before, long long launched, const char* what) const {
    return counter_.expect(s(), before, launched, what);
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
    const be::DeviceBuffer in_a = random_bf16(kMarkerKernelElems, opt().seed + 68, s());
    const be::DeviceBuffer in_b = random_bf16(kMarkerKernelElems, opt().seed + 69, s());
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
    static_cast<void>(ctx_.timer->batch(plain, 1, true));  // warm-up
    static_cast<void>(ctx_.timer->batch(marked, 1, true));
    const Sampling smp = sample_until(rule, ctx_.clock, [&] {
      const double t_plain = ctx_.timer->batch(plain, 1, true);
      const double t_marked = ctx_.timer->batch(marked, 1, true);
      return std::max(1e-9, (t_marked - t_plain) / (2.0 * kMarkerKernels));
    });
    r.samples_s = smp.samples, r.reps = 1, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    CheckLog log("every marker completed and out = a + b");
    for (const auto& e : ev) {
      if (!e.done()) throw std::runtime_error("correctness check failed: a timing marker never completed");
    }
    for (const std::int64_t i : {std::int64_t{0}, n / 2, n - 1}) {
      const double want = bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
      log.expect_near(download_bf16(out, i, 1)[0], want, 1e-2 * std::max(1.0, std::abs(want)),
                      "element " + std::to_string(i));
    }
    r.check = log.passed();
  }

  // Extra host seconds per launch when visits of five launches (count kernel, GEMM call, count kernel,
  // GEMM call, count kernel) rotate over N streams, each with its own cuBLASLt handle, as threewalls
  // run's OpRunners do (one per stream), over the same visits on one stream: host.stream_cycle. A
  // sample times one stream, N streams, one stream again, and takes N minus the mean of the two (a
  // drift of the host's speed during the sample cancels; samples a few seconds apart did not). The GEMM is tiny (16 x
  // 512 x 256, one node), the device keeps up with the host, so the sample is the host's launch rate. Fresh streams and
  // handles per point; the first rotation (plans, lazy loading) is not timed.
  void measure_stream_cycle(const StopRule& rule, Record& r) {
    const int n = static_cast<int>(r.point.iparam("streams"));
    constexpr int kVisits = 128;
    int* cnt = counter_.device();
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
    const Sampling smp = sample_extra(
        rule, [&] { return pass(1); }, [&] { return pass(n); });
    r.samples_s = smp.samples, r.reps = 5 * kVisits, r.stop = to_string(smp.reason), r.rel_ci = smp.rel_ci;
    TW_CUDA_CHECK(cudaMemsetAsync(c, 0xFF, sz(g.m * g.n) * 2, s()));
    lts.back()->gemm(g, a, b, c, s());
    sync();
    r.check = expect_count(before, launched, (std::to_string(n) + " stream(s)").c_str()) + "; " +
              check_gemm(g, a, b, c, false);
  }

  // A differential sample of host time: `variant` minus the mean of `base` run just before and just
  // after it (a drift of the host's speed during the sample cancels; samples a few seconds apart did
  // not), floored at 1 ns. host.stream_cycle and host.stream_wait.
  Sampling sample_extra(const StopRule& rule, const std::function<double()>& base,
                        const std::function<double()>& variant) {
    return sample_until(rule, ctx_.clock, [&] {
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
    int* cnt = counter_.device();
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
    const Sampling smp = sample_extra(
        rule, [&] { return pass(false); }, [&] { return pass(true); });
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
    int* cnt = counter_.device();
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
    const Sampling smp = sample_until(rule, ctx_.clock, [&] {
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

  // Released in reverse order: the buffers, the counter, attention, the communicator.
  std::unique_ptr<be::CommTable> comm_;
  std::unique_ptr<be::Attention> attention_;
  LaunchCounter counter_{s()};
  be::DeviceBuffer buf_[15];  // 1-2 all-reduce in/out; 3-5 GEMM operands; 6-14 attention tensors (0 unused)
};

}  // namespace

std::unique_ptr<GroupBench> make_host_bench(const BenchContext& ctx) { return std::make_unique<HostBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail
