// A training loop timed with threewalls' CUDA profiler (docs/profiler.md, "CUDA profiler"): no
// StepGraph, no executor, just the public header and the CMake target threewalls::profiler_cuda.
//
//   threewalls_cuda_loop_example OUT_DIR [steps] [record_every_n_steps]
//
// writes OUT_DIR/run.json, phases_rank_0.jsonl and summary.json (readable by `threewalls analyze`,
// `compare`, `export`). Phases: "forward" (compute-bound kernel), "optimizer" (memory-bound kernel)
// on the main stream, and "input_copy" (pinned host -> device) on a copy stream.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "threewalls/core/error.hpp"
#include "threewalls/profiler/cuda_profiler.hpp"

void example_compute(float* x, int n, int iters, cudaStream_t s);
void example_copy(const float* in, float* out, int n, cudaStream_t s);

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw threewalls::SystemError(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

int main(int argc, char** argv) {
  namespace tp = threewalls::profiler;
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " OUT_DIR [steps] [record_every_n_steps]\n";
    return 2;
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 30;
  try {
    constexpr int kN = 1 << 22;
    constexpr int kIters = 256;
    void* xp = nullptr;
    void* yp = nullptr;
    void* hp = nullptr;
    check(cudaMalloc(&xp, kN * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&yp, kN * sizeof(float)), "cudaMalloc");
    check(cudaMallocHost(&hp, kN * sizeof(float)), "cudaMallocHost");
    auto* x = static_cast<float*>(xp);
    auto* y = static_cast<float*>(yp);
    auto* host = static_cast<float*>(hp);
    check(cudaMemset(x, 0, kN * sizeof(float)), "cudaMemset");
    cudaStream_t main_stream = nullptr;
    cudaStream_t copy_stream = nullptr;
    check(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaEvent_t copied = nullptr;
    check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), "cudaEventCreate");

    // 1. The sampling knobs (docs/profiler.md).
    tp::cuda::ProfilerOptions o;
    o.out_dir = argv[1];
    o.sampling.record_every_n_steps = argc > 3 ? std::stoi(argv[3]) : 5;
    o.sampling.flush_every_n_steps = 10;
    o.run_name = "cuda_loop_example";
    o.argv.assign(argv, argv + argc);
    tp::cuda::Profiler prof(o);
    // 2. Phase names once.
    const auto fwd = prof.phase_id("forward");
    const auto opt = prof.phase_id("optimizer");
    const auto copy = prof.phase_id("input_copy");

    for (int step = 0; step < steps; ++step) {
      prof.begin_step(step, main_stream);
      {
        tp::cuda::PhaseInfo info;
        info.stream = "copy";
        info.wall = tp::Wall::memory;
        info.bytes = 4.0 * kN;
        info.coarse = tp::CoarseView::host_to_device;
        auto p = prof.phase(copy, copy_stream, info);
        check(cudaMemcpyAsync(y, host, kN * sizeof(float), cudaMemcpyHostToDevice, copy_stream), "cudaMemcpyAsync");
      }
      check(cudaEventRecord(copied, copy_stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(main_stream, copied, 0), "cudaStreamWaitEvent");
      {
        tp::cuda::PhaseInfo info;
        info.layer = 0;
        info.flops = 2.0 * kN * kIters;
        auto p = prof.phase(fwd, main_stream, info);
        example_compute(x, kN, kIters, main_stream);
      }
      {
        tp::cuda::PhaseInfo info;
        info.wall = tp::Wall::memory;
        info.bytes = 8.0 * kN;
        auto p = prof.phase(opt, main_stream, info);
        example_copy(y, x, kN, main_stream);
      }
      prof.end_step(main_stream);  // main_stream already waited for the copy stream
    }
    prof.finish();
    std::cout << "wrote " << prof.out_dir().string() << " (" << prof.events_created()
              << " CUDA events created for " << steps << " steps)\n";
    cudaEventDestroy(copied);
    cudaStreamDestroy(copy_stream);
    cudaStreamDestroy(main_stream);
    cudaFreeHost(host);
    cudaFree(y);
    cudaFree(x);
  } catch (const threewalls::InputError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const threewalls::Error& e) {
    std::cerr << e.what() << "\n";
    return 3;
  }
  return 0;
}
