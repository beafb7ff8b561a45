// Compute kernels beside a resident NCCL kernel, and NCCL's device memory (calibrate group
// "interference"; families nccl.interference and nccl.memory, models.hpp).
//
// Why: in pipeline-parallel steps a receive is posted on its own stream before its sender is ready,
// and its NCCL kernel (one CTA per channel) spins on the GPU until the data arrives. Kernels of the
// compute stream launched meanwhile get the SMs NCCL does not hold; a GEMM sized to one wave over
// all SMs then needs a second wave (f10 on H200: attn_qkv_fwd 44.7 us alone, 79.0 us beside a
// pending receive). This file measures that directly.
//
// Setup: GPU 0 is measured (driver thread), GPU 1 is the NCCL peer (a thread of its own), one
// non-blocking communicator pair as OpRunner uses. The memory stages are measured once, on the
// fresh pair, with cudaMemGetInfo on both GPUs (nothing else allocates on them between the
// readings): communicator init; the first collectives (all-reduce of 1 MiB, then of 1 GiB: NCCL
// connects ring/tree buffers at the first collective that uses them); the first send/recv in both
// directions (p2p connection buffers, also lazy).
//
// A sample of case 0 (pending): GPU 0 posts backend::recv from GPU 1 on the NCCL stream, then runs
// the timed batch of kernels on the compute stream (behind the Timer's blocking kernel, so they run
// back to back); only after the batch finished does GPU 1 post the matching backend::send. The
// receive must still be in flight when the batch ends (checked per sample). Case 1 (transfer): GPU 1
// posts 1 GiB all-reduces (about 3.4 ms each on 2 H200); GPU 0 posts its halves behind an event of
// the compute stream, so they start when the blocker releases the batch, and as many as outlast a
// batch slowed down twice (one for most kernels, two for the attention backward at 2 x 4096); the
// all-reduces must end after the batch (checked per sample: their completion event against the
// batch's). Every sample of the kernel with NCCL is paired with a sample of the same batch alone
// (no NCCL kernel on either GPU), taken right before it, so clocks and thermal state match.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/nccl.hpp"
#include "threewalls/backend/op_runner.hpp"
#include "threewalls/calibration/fit.hpp"

namespace threewalls::calibration::bench::detail {

namespace be = threewalls::backend;

// GPU 0 measured, GPU 1 the NCCL peer (a thread of its own). Construction measures the NCCL memory
// stages on a fresh communicator pair (cudaMemGetInfo on both GPUs) and keeps the pair.
class InterferenceBench {
 public:
  struct MemoryStage {
    std::string what;
    double bytes = 0.0;       // allocated on GPU 0 (the measured rank) by the stage
    double peer_bytes = 0.0;  // allocated on GPU 1
    double seconds = 0.0;     // host time of the stage
  };
  // Throws when fewer than 2 GPUs are visible or a stage fails.
  InterferenceBench(std::uint64_t seed, Clock clock);
  ~InterferenceBench();
  InterferenceBench(const InterferenceBench&) = delete;
  InterferenceBench& operator=(const InterferenceBench&) = delete;
  // Stage 0 communicator init, 1 first collectives, 2 first send/recv both directions.
  [[nodiscard]] const MemoryStage& stage(int i) const;
  // Samples of `work` (one run of the kernel on the given stream, GPU 0) while an NCCL kernel is
  // resident (kase 0: pending receive, 1: 1 GiB all-reduce transferring), each paired with a sample
  // alone. Fills r.samples_s (with NCCL), reps, stop, rel_ci and r.check; returns the alone median
  // (seconds per run).
  double measure(const StopRule& rule, int kase, const Work& work, Record& r);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace {

constexpr auto kCommTimeout = std::chrono::seconds(30);
constexpr auto kPeerTimeout = std::chrono::seconds(90);               // longer than a communicator's own timeout
constexpr std::size_t kBigElements = std::size_t{512} * 1024 * 1024;  // 1 GiB of bf16: the all-reduce
constexpr std::size_t kSmallElements = std::size_t{512} * 1024;       // 1 MiB of bf16
constexpr std::size_t kP2pElements = std::size_t{4} * 1024 * 1024;    // 8 MiB: a pipeline activation
constexpr double kTargetSampleS = 4e-4;
constexpr int kMaxReps = 64;

// Free device memory of the current device, bytes.
double free_bytes() {
  std::size_t free = 0, total = 0;
  TW_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<double>(free);
}

// A thread with GPU `device` current that runs one job at a time for the driver's thread.
class Peer {
 public:
  explicit Peer(int device) : thread_([this, device] { main(device); }) {}
  ~Peer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void post(std::function<void()> job) {
    if (!broken_.empty()) throw std::runtime_error("NCCL peer thread unusable: " + broken_);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_) throw std::logic_error("Peer::post while a job is pending");
    job_ = std::move(job);
    pending_ = true;
    error_ = nullptr;
    cv_.notify_all();
  }
  // Waits for the posted job; rethrows its exception.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kPeerTimeout, [&] { return !pending_; })) {
      broken_ = "a job on GPU 1 did not finish within 90 s";
      throw std::runtime_error(broken_);
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  void run(std::function<void()> job) {
    post(std::move(job));
    wait();
  }

 private:
  void main(int device) {
    bool bound = false;
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || (pending_ && job_); });
        if (quit_) return;
        job = std::move(job_);
        job_ = nullptr;
      }
      std::exception_ptr err;
      try {
        if (!bound) {
          be::set_device(device);
          be::set_thread_rank(device);
          bound = true;
        }
        job();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = err;
        pending_ = false;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool pending_ = false;
  bool quit_ = false;
  std::exception_ptr error_;
  std::string broken_;
  std::thread thread_;  // last: starts after the members it uses exist
};

// One rank's NCCL side: communicator, NCCL stream, buffers.
struct Side {
  be::CommTable table;
  std::unique_ptr<be::Stream> nccl_stream;
  be::DeviceBuffer big_in, big_out, p2p_send, p2p_recv;

  void allocate(std::uint64_t seed) {
    nccl_stream = std::make_unique<be::Stream>();
    big_in = be::DeviceBuffer(kBigElements * 2);
    big_out = be::DeviceBuffer(kBigElements * 2);
    p2p_send = be::DeviceBuffer(kP2pElements * 2);
    p2p_recv = be::DeviceBuffer(kP2pElements * 2);
    be::fill_random(big_in.as<be::bf16>(), static_cast<std::int64_t>(kBigElements), seed, 1.0F, *nccl_stream);
    be::fill_random(p2p_send.as<be::bf16>(), static_cast<std::int64_t>(kP2pElements), seed + 1, 1.0F, *nccl_stream);
    TW_CUDA_CHECK(cudaStreamSynchronize(*nccl_stream));
  }
  be::NcclComm& comm() { return table.comm(scenarios::Group::dp); }
  void wait(const char* what) { comm().wait_stream(*nccl_stream, what); }
  void all_reduce(std::size_t elems) { be::all_reduce(big_in.data(), big_out.data(), elems, comm(), *nccl_stream); }
};

}  // namespace

struct InterferenceBench::Impl {
  std::uint64_t seed;
  Clock clock;
  Peer peer{1};
  Side r0, r1;  // r0 used on this thread (GPU 0), r1 only inside peer jobs (GPU 1)
  std::unique_ptr<be::Stream> compute;
  std::unique_ptr<Timer> timer;
  be::Event batch_end{true}, nccl_start{true}, nccl_end{true};
  be::Event go{false};  // the compute stream's start, for case 1's all-reduce to wait on
  int all_reduces = 1;  // case 1: back-to-back 1 GiB all-reduces per batch, enough to outlast it

  // Seconds of one of the last case-1 batch's all-reduces (its NCCL stream has completed).
  [[nodiscard]] double all_reduce_s() const {
    return static_cast<double>(be::Event::elapsed_ms(nccl_start, nccl_end)) / 1e3 / all_reduces;
  }
  std::vector<MemoryStage> stages;
  bool blocker = true;

  Impl(std::uint64_t s, Clock c) : seed(s), clock(std::move(c)) {
    be::set_device(0);
    try {
      peer.run([this] { r1.allocate(seed + 2); });
      r0.allocate(seed + 1);
      compute = std::make_unique<be::Stream>();
      timer = std::make_unique<Timer>(compute->get());
      measure_memory();
    } catch (...) {
      release();
      throw;
    }
  }

  ~Impl() { release(); }

  // Nothing is in flight between calls; abort frees without waiting for the other rank. GPU 1's
  // side is released on its own thread (its device current).
  void release() noexcept {
    try {
      peer.run([this] {
        r1.table.abort_all();
        r1 = Side{};
      });
    } catch (...) {
    }
    r0.table.abort_all();
  }

  // One memory stage: `both` runs on GPU 0 (this thread) while `peer_job` runs on GPU 1.
  void stage(const std::string& what, const std::function<void()>& mine, const std::function<void()>& theirs) {
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    double peer_before = 0.0, peer_after = 0.0;
    peer.run([&] {
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      peer_before = free_bytes();
    });
    const double before = free_bytes();
    const double t0 = clock();
    peer.post(theirs);
    std::exception_ptr err;
    try {
      mine();
    } catch (...) {
      err = std::current_exception();
    }
    peer.wait();
    if (err) std::rethrow_exception(err);
    const double seconds = clock() - t0;
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    const double after = free_bytes();
    peer.run([&] {
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      peer_after = free_bytes();
    });
    stages.push_back({what, before - after, peer_before - peer_after, seconds});
  }

  void measure_memory() {
    const scenarios::Layout layout(1, 1, 2, 1, 1, 2, 1, 2);
    const auto ids = std::make_shared<be::UniqueIdTable>(be::UniqueIdTable::create(layout, {scenarios::Group::dp}));
    auto init = [&](Side& side, int rank) {
      side.table = be::CommTable::create(layout, rank, *ids, {scenarios::Group::dp}, kCommTimeout);
    };
    stage(
        "communicator init (ncclCommInitRank, non-blocking)", [&] { init(r0, 0); }, [&] { init(r1, 1); });
    auto collectives = [](Side& side) {
      side.all_reduce(kSmallElements);
      side.wait("calibration nccl_memory all_reduce 1 MiB");
      side.all_reduce(kBigElements);
      side.wait("calibration nccl_memory all_reduce 1 GiB");
    };
    stage(
        "first all-reduces (1 MiB, 1 GiB)", [&] { collectives(r0); }, [&] { collectives(r1); });
    // Both directions: GPU 0 sends then receives, GPU 1 receives then sends (one stream each).
    stage(
        "first send/recv with the peer, both directions",
        [&] {
          be::send(r0.p2p_send.data(), kP2pElements, 1, r0.comm(), *r0.nccl_stream);
          be::recv(r0.p2p_recv.data(), kP2pElements, 1, r0.comm(), *r0.nccl_stream);
          r0.wait("calibration nccl_memory send/recv");
        },
        [&] {
          be::recv(r1.p2p_recv.data(), kP2pElements, 0, r1.comm(), *r1.nccl_stream);
          be::send(r1.p2p_send.data(), kP2pElements, 0, r1.comm(), *r1.nccl_stream);
          r1.wait("calibration nccl_memory send/recv");
        });
    // The received message equals the peer's (seeded) data: the pair really exchanged it.
    const auto got = download_bf16(r0.p2p_recv.data(), 0, 1)[0];
    const auto want = bf16_round(static_cast<double>(be::random_value(seed + 2 + 1, 0, 1.0F)));
    if (got != want) {
      throw std::runtime_error("correctness check failed: GPU 0 received " + std::to_string(got) + ", GPU 1 sent " +
                               std::to_string(want));
    }
  }

  // One batch of `reps` runs of `work` on the compute stream; seconds per run. With `kase` >= 0 an
  // NCCL kernel is resident meanwhile (0 pending receive, 1 all-reduce transferring); `ok` tells
  // whether it stayed in flight for the whole batch.
  double batch(const Work& work, int reps, int kase, bool& ok) {
    ok = true;
    if (kase == 0) {
      be::recv(r0.p2p_recv.data(), kP2pElements, 1, r0.comm(), *r0.nccl_stream);
    } else if (kase == 1) {
      peer.run([this] {  // GPU 1's half waits in NCCL for GPU 0's
        for (int i = 0; i < all_reduces; ++i) r1.all_reduce(kBigElements);
      });
    }
    double t = 0.0;
    std::exception_ptr err;
    try {
      timer->begin(blocker);
      if (kase == 1) {
        // GPU 0's half starts when the blocker releases the compute stream, together with the
        // kernels. Enqueued before the batch, it ran while the host was still enqueuing a long one
        // (the attention backward is hundreds of launches) and ended before the kernels started.
        go.record(compute->get());
        TW_CUDA_CHECK(cudaStreamWaitEvent(*r0.nccl_stream, go.get(), 0));
        nccl_start.record(*r0.nccl_stream);
        for (int i = 0; i < all_reduces; ++i) r0.all_reduce(kBigElements);
        nccl_end.record(*r0.nccl_stream);
      }
      try {
        for (int i = 0; i < reps; ++i) work(compute->get());
      } catch (...) {
        timer->release();
        throw;
      }
      timer->end();
      batch_end.record(compute->get());
      timer->release();
      TW_CUDA_CHECK(cudaStreamSynchronize(compute->get()));
      if (kase == 0) {
        const cudaError_t q = cudaStreamQuery(*r0.nccl_stream);
        ok = q == cudaErrorNotReady;
        if (q != cudaSuccess && q != cudaErrorNotReady) TW_CUDA_CHECK(q);
      }
      t = timer->elapsed_s() / reps;
    } catch (...) {
      err = std::current_exception();
    }
    // Complete the NCCL side whatever happened, so that the pair stays usable.
    if (kase == 0) {
      peer.run([this] {
        be::send(r1.p2p_send.data(), kP2pElements, 0, r1.comm(), *r1.nccl_stream);
        r1.wait("calibration nccl_interference send");
      });
      r0.wait("calibration nccl_interference recv");
    } else if (kase == 1) {
      r0.wait("calibration nccl_interference all_reduce");
      peer.run([this] { r1.wait("calibration nccl_interference all_reduce"); });
      if (!err) ok = be::Event::elapsed_ms(batch_end, nccl_end) > 0.0F;
    }
    if (err) std::rethrow_exception(err);
    return t;
  }
};

InterferenceBench::InterferenceBench(std::uint64_t seed, Clock clock)
    : impl_(std::make_unique<Impl>(seed, std::move(clock))) {}

InterferenceBench::~InterferenceBench() = default;

const InterferenceBench::MemoryStage& InterferenceBench::stage(int i) const {
  return impl_->stages.at(static_cast<std::size_t>(i));
}

double InterferenceBench::measure(const StopRule& rule, int kase, const Work& work, Record& r) {
  if (kase != 0 && kase != 1) throw std::logic_error("nccl_interference: case must be 0 or 1");
  Impl& m = *impl_;
  be::set_device(0);
  bool ok = true;
  // Warm-up (plans, heuristics, the NCCL kernel of the case), then the batch size from the alone time.
  m.all_reduces = 1;
  // One run with nothing held first: a kernel's first launch may load its module, which waits for
  // the device, and behind the blocking kernel that wait ran into the blocker's 2 s timeout (quick
  // mode, whose GEMM grid had not launched the shape before).
  work(m.compute->get());
  TW_CUDA_CHECK(cudaStreamSynchronize(m.compute->get()));
  m.batch(work, 1, -1, ok);
  m.batch(work, 1, kase, ok);
  const double t1 = std::min(m.batch(work, 1, -1, ok), m.batch(work, 1, -1, ok));
  const int reps = reps_per_sample(t1, kTargetSampleS, kMaxReps);
  if (kase == 1) {
    // Enough all-reduces to outlast a batch slowed down twice (measured: at most 2.0x): one 1 GiB
    // all-reduce (3.3 ms on an NVLink pair) is shorter than one attention backward at 2 x 4096.
    m.all_reduces = std::max(1, static_cast<int>(std::ceil(2.0 * reps * t1 / m.all_reduce_s())));
  }
  try {
    m.batch(work, reps, -1, ok);
  } catch (const BlockerTimeout&) {
    m.blocker = false;  // batches without the blocking kernel
  }
  std::vector<double> alone;
  int held = 0, taken = 0;
  const Sampling s = sample_until(rule, m.clock, [&] {
    alone.push_back(m.batch(work, reps, -1, ok));
    const double with = m.batch(work, reps, kase, ok);
    ++taken;
    held += ok ? 1 : 0;
    return with;
  });
  if (2 * held < taken) {
    throw std::runtime_error(std::string("the NCCL kernel was not in flight for the whole batch in ") +
                             std::to_string(taken - held) + " of " + std::to_string(taken) + " samples (" +
                             (kase == 0 ? "the receive completed early" : "the all-reduce ended before the kernels") +
                             ")");
  }
  r.samples_s = s.samples;
  r.reps = reps;
  r.stop = std::string(to_string(s.reason)) + (reps > 1 && !m.blocker ? " (batches without the blocking kernel)" : "");
  r.rel_ci = s.rel_ci;
  const double alone_s = fit::median(alone);
  r.check = std::string("passed: the ") + (kase == 0 ? "receive was pending" : "all-reduce outlasted the kernels") +
            " in " + std::to_string(held) + " of " + std::to_string(taken) + " samples; alone median " +
            std::to_string(alone_s * 1e6) + " us";
  return alone_s;
}

namespace {

class InterferenceGroupBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;

  void begin(const std::vector<PointSpec>& points) override {
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
      } else if (kind == 3) {
        a = std::max(a, p.param("total_rows") * p.param("k"));
        b = std::max(b, p.param("groups") * p.param("n") * p.param("k"));
        c = std::max(c, p.param("total_rows") * p.param("n"));
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
    buf_[0] = random_bf16(sz(std::max(a, floor_elems)), opt().seed + 81, s());
    buf_[1] = random_bf16(sz(std::max(b, floor_elems)), opt().seed + 82, s());
    buf_[2] = be::DeviceBuffer(sz(std::max(c, floor_elems)) * 2);
    buf_[3] = random_bf16(sz(attn), opt().seed + 83, s());  // Q
    buf_[4] = random_bf16(sz(attn), opt().seed + 84, s());  // K
    buf_[5] = random_bf16(sz(attn), opt().seed + 85, s());  // V
    buf_[6] = be::DeviceBuffer(sz(attn) * 2 * 4);           // O, dQ, dK, dV
    buf_[7] = random_bf16(sz(attn), opt().seed + 86, s());  // dO
    buf_[8] = be::DeviceBuffer(sz(rows) * 4);               // lse
    attention_ = std::make_unique<be::Attention>(*ctx_.lt, be::OpRunnerConfig{}.attention_workspace);
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    interference_ = std::make_unique<InterferenceBench>(opt().seed + 87, ctx_.clock);
  }

  void measure(const StopRule& rule, Record& r) override {
    if (r.point.op == "nccl_memory") return measure_nccl_memory(r);
    if (r.point.op == "nccl_interference") return measure_interference(rule, r);
    throw std::logic_error("calibrate group interference: no benchmark for op " + r.point.op);
  }

 private:
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
              std::to_string(st.peer_bytes / 1048576.0) +
              " MiB (cudaMemGetInfo); the send/recv stage checked the "
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
    std::unique_ptr<be::GroupedGemm> grouped;
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
        ctx_.lt->gemm(g, ra->at(run), rb->at(run), rc->at(run), st);
        ++run;
      };
      check = [&] {
        const std::size_t last = run - 1;
        return check_gemm(g, ra->at(last), rb->at(last), rc->at(last), false) + rotation_note(*ra, *rb, *rc);
      };
    } else if (kind == 3) {
      // Balanced groups, one prepared GroupedGemm on fixed operands (the grouped section measures its
      // rotation; here only the ratio to the same kernel alone matters).
      const std::int64_t groups = p.iparam("groups"), total = p.iparam("total_rows");
      const std::int64_t n = p.iparam("n"), k = p.iparam("k");
      const std::vector<std::int64_t> rows = be::expert_rows(total, groups, p.iparam("max_rows"));
      auto* x = buf_[0].as<be::bf16>();
      auto* wt = buf_[1].as<be::bf16>();
      auto* y = buf_[2].as<be::bf16>();
      grouped = std::make_unique<be::GroupedGemm>(*ctx_.lt, be::GemmLayout::forward, rows, n, k, x, wt, y,
                                                  be::OpRunnerConfig{}.grouped_impl);
      w = [&](cudaStream_t st) { grouped->run(st); };
      check = [=] {
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        CheckLog log("grouped Y_e = X_e W_e^T of the last expert's last row against a CPU dot product");
        const std::int64_t row = total - 1, e = groups - 1, j = n - 1;
        const auto xv = download_bf16(x, row * k, k);
        const auto wv = download_bf16(wt, e * n * k + j * k, k);
        double ref = 0.0, norm = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          ref += xv[sz(l)] * wv[sz(l)];
          norm += (xv[sz(l)] * wv[sz(l)]) * (xv[sz(l)] * wv[sz(l)]);
        }
        log.expect_near(download_bf16(y, row * n + j, 1)[0], ref, 0.02 * std::sqrt(norm) + 0.01 * std::fabs(ref),
                        "expert " + std::to_string(e) + " row " + std::to_string(row));
        return log.passed();
      };
    } else if (kind == 1) {
      const be::AttentionShape sh{p.iparam("batch"),    p.iparam("seq"),      p.iparam("seq"),        p.iparam("heads"),
                                  p.iparam("head_dim"), p.iparam("head_dim"), p.iparam("causal") != 0};
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
        log.expect_near(rel_l2(download_bf16(o, row * sh.head_dim_v, sh.head_dim_v), ref.o), 0.0, 0.03,
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
          const double want = bf16_round(download_bf16(a, i, 1)[0] + download_bf16(b, i, 1)[0]);
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

  // Released in reverse order: the buffers, attention, the NCCL pair.
  std::unique_ptr<InterferenceBench> interference_;
  std::unique_ptr<be::Attention> attention_;
  be::DeviceBuffer buf_[9];  // GEMM / add operands 0-2; attention Q, K, V, O+dQ+dK+dV, dO, lse 3-8
};

}  // namespace

std::unique_ptr<GroupBench> make_interference_bench(const BenchContext& ctx) {
  return std::make_unique<InterferenceGroupBench>(ctx);
}

}  // namespace threewalls::calibration::bench::detail
