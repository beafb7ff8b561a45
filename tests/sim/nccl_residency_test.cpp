// Compute beside resident NCCL kernels (profile family nccl.interference) and NCCL's measured
// device memory (nccl.memory) in the simulator: the executor slows the kernels of a rank's GPU while
// one of its communication ops is resident (from its start on its stream to its completion), by the
// coster's factor and only then; a profile without the family changes nothing; the memory model
// counts the measured communicator and p2p bytes.
#include <gtest/gtest.h>

#include "sim_test_support.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/memory_model.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {
namespace {

using testing::GraphBuilder;

constexpr double kUs = 1e-6;

// Closed-form costs plus the two NCCL models.
class NcclFake final : public OpCoster {
 public:
  double pending = 0.0;   // slowdown while a comm op waits for its peer (0: no model)
  double transfer = 0.0;  // ... while it transfers
  std::optional<NcclMemoryParams> memory;

  [[nodiscard]] Seconds kernel_time(const scenarios::Op& op) const override { return Seconds(op.flops * 1e-6); }
  [[nodiscard]] Seconds copy_time(scenarios::CopyKind, Bytes b) const override { return Seconds(b.value / 50e9); }
  [[nodiscard]] CommParams comm_params(Collective, Bytes, int, LinkScope) const override {
    return {Seconds(0.0), BytesPerSecond(450e9)};
  }
  [[nodiscard]] HostCosts host_costs() const override { return {}; }
  [[nodiscard]] double stream_concurrency(int, double) const override { return 1.0; }
  [[nodiscard]] int sm_count() const override { return 132; }
  [[nodiscard]] double nccl_resident_slowdown(int c, int, double) const override {
    const double f = c == 0 ? pending : transfer;
    return f > 0.0 ? f : 1.0;
  }
  [[nodiscard]] bool models_nccl_residency() const override { return pending > 0.0 || transfer > 0.0; }
  [[nodiscard]] std::optional<NcclMemoryParams> nccl_memory() const override { return memory; }
};

// Two pipeline stages: stage 0 runs a `sender_us` kernel, then sends 1 MB to stage 1; stage 1 posts
// its receive at once (on its own stream) and runs a 100 us GEMM on the compute stream.
StepResult pipeline(const NcclFake& coster, double sender_us) {
  GraphBuilder b(1, 1, 1, 2, 1, 2);
  b.class_per_rank();
  const auto k = b.add(0, b.kernel(sender_us, "stage0_fwd"));
  b.add(0, b.p2p(true, +1, 0, 1e6, "pp_send", "pp_fwd_send"), {k});
  b.add(1, b.p2p(false, -1, 0, 1e6, "pp_recv", "pp_fwd_recv"));
  b.add(1, b.kernel(100, "attn_qkv_fwd"));
  const Platform p(testing::cluster(2, 1));
  ExecutorOptions o;
  o.fidelity = Fidelity::analytic;
  return Executor(coster, o).run_step(b.g, p, {}, 0.0, nullptr);
}

TEST(Executor, APostedEarlyRecvSlowsAConcurrentGemmByTheProfilesFactor) {
  NcclFake with;
  with.pending = 1.8;
  with.transfer = 1.3;
  // The sender posts at 300 us: the receive spins through the whole GEMM.
  const StepResult r = pipeline(with, 300);
  EXPECT_NEAR(r.classes[1].end[1], 180 * kUs, 1e-9);
  EXPECT_NEAR(r.classes[0].end[0], 300 * kUs, 1e-9);  // stage 0's kernel ran with no NCCL kernel resident
  const StepResult none = pipeline(NcclFake{}, 300);  // a profile without the family: as before
  EXPECT_NEAR(none.classes[1].end[1], 100 * kUs, 1e-9);
}

TEST(Executor, TheSlowdownLastsOnlyWhileTheNcclKernelIsResident) {
  NcclFake f;
  f.pending = 2.0;  // transfer: no slowdown (factor 1)
  // Receive pending for the first 50 us (the GEMM does 25 us of work in it), the transfer takes
  // 1e6 / 450e9 s, then the GEMM runs alone: it ends 25 us late.
  const StepResult r = pipeline(f, 50);
  const double transfer = 1e6 / 450e9;
  EXPECT_NEAR(r.classes[1].end[0], 50 * kUs + transfer, 1e-9);  // the receive
  EXPECT_NEAR(r.classes[1].end[1], 125 * kUs, 1e-9);
  f.transfer = 3.0;  // slowed 3x during the transfer too
  const StepResult t = pipeline(f, 50);
  EXPECT_NEAR(t.classes[1].end[1], 125 * kUs + transfer * (1.0 - 1.0 / 3.0), 1e-9);
}

// ---- the same through a profile: a scenario, the CostModel and the simulator ----

calibration::Profile with_families(const calibration::Profile& base, double gemm_pending) {
  using namespace calibration;
  ProfileBuilder b({"nccl_families", "synthetic: unit test", "tests/sim"}, base.hardware());
  for (int c = 0; c <= 1; ++c) {
    const double g = c == 0 ? gemm_pending : 1.0;
    for (const double tiles : {88.0, 500.0, 2000.0}) {
      b.add_point(kNcclInterferenceFamily, {static_cast<double>(c), 0, tiles, 1e-4}, Measurement::single(1e-4 * g));
    }
    b.add_point(kNcclInterferenceFamily, {static_cast<double>(c), 1, 0, 1e-4}, Measurement::single(1e-4 * g));
    b.add_point(kNcclInterferenceFamily, {static_cast<double>(c), 2, 0, 1e-4}, Measurement::single(1e-4));
  }
  b.add_point(kNcclMemoryFamily, {0, 2, 300e6}, Measurement::single(0.5));
  b.add_point(kNcclMemoryFamily, {1, 2, 200e6}, Measurement::single(0.1));
  b.add_point(kNcclMemoryFamily, {2, 2, 1000e6}, Measurement::single(0.1));
  std::vector<Family> fams = base.families();
  const Profile built = b.build();
  for (const auto& f : built.families()) fams.push_back(f);
  return Profile(base.info(), base.hardware(), std::move(fams));
}

double f10_step_us(const calibration::Profile& p, int cuda_device_max_connections = 8) {
  scenarios::Scenario s =
      scenarios::load_scenario(testing::source_dir() / "scenarios/validation/fidelity/f10_moe32_pp2_2gpu.toml");
  s.run.cuda_device_max_connections = cuda_device_max_connections;
  const calibration::CostModel cm(p);
  const CostModelCoster coster(cm);
  SimOptions o;
  o.fidelity = Fidelity::analytic;
  o.steps = 1;
  const SimResult r = simulate(s, coster, ProfileInfoForHeader{p.id(), "", "h200", "test", ""}, o);
  return r.summary.steps.at(0).step_time_us;
}

TEST(Simulator, PipelineStepIsSlowerWithTheNcclInterferenceFamilyAndUnchangedWithFactorOne) {
  const auto base = calibration::Profile::load(testing::source_dir() / "calibration/profiles/default_h200.toml");
  const double plain = f10_step_us(base);
  EXPECT_NEAR(f10_step_us(with_families(base, 1.0)), plain, 1e-6 * plain);  // factor 1: nothing changes
  const double slowed = f10_step_us(with_families(base, 1.7));
  EXPECT_GT(slowed, 1.02 * plain);  // the stages' GEMMs and attention run beside posted receives
  EXPECT_LT(slowed, 1.7 * plain);   // but not all the time
}

// With one hardware queue (run.cuda_device_max_connections = 1, as Megatron-LM runs tensor parallelism
// on Hopper) a stage's receive is dispatched in issue order, behind the compute issued before it, instead
// of being posted as soon as the host gets to it: its NCCL kernel is resident for less of the step, so
// the GEMMs beside it slow down less. Without the interference family the queues move nothing here.
TEST(Simulator, OneHardwareQueuePostsAPipelinesReceivesInIssueOrder) {
  const auto base = calibration::Profile::load(testing::source_dir() / "calibration/profiles/default_h200.toml");
  const calibration::Profile slowed = with_families(base, 1.7);
  const double eight = f10_step_us(slowed, 8);
  const double one = f10_step_us(slowed, 1);
  EXPECT_LT(one, 0.97 * eight);
  EXPECT_GT(one, f10_step_us(base, 1) * 0.999);  // still slowed while a receive is resident
  EXPECT_NEAR(f10_step_us(base, 1), f10_step_us(base, 8), 0.01 * f10_step_us(base, 8));
}

TEST(MemoryModel, MeasuredNcclMemoryCountsAPipelinesP2pCommunicatorsAndItsPeer) {
  const scenarios::Scenario s =
      scenarios::load_scenario(testing::source_dir() / "scenarios/validation/fidelity/f10_moe32_pp2_2gpu.toml");
  const scenarios::StepGraph g = scenarios::expand(s, 0);
  MemoryOptions plain;
  MemoryOptions measured;
  measured.nccl = NcclMemoryParams{Bytes(300e6), Bytes(200e6), Bytes(1000e6)};
  const MemoryReport a = memory_model(s, g, plain);
  const MemoryReport b = memory_model(s, g, measured);
  ASSERT_EQ(a.classes.size(), b.classes.size());
  for (std::size_t i = 0; i < a.classes.size(); ++i) {
    // Each stage sends to and receives from the other (forward activations, backward gradients):
    // threewalls run's two two-rank communicators (one per direction) and one p2p peer; plus the
    // communicator of the gradient-norm all-reduce over both stages (a collective: + collective
    // bytes). Before: one communicator of the pp group.
    const double want = 3 * 300e6 + 200e6 + 1000e6 - kNcclBytesPerCommunicator;
    EXPECT_NEAR(b.classes[i].breakdown.buffers.value - a.classes[i].breakdown.buffers.value, want, 1.0)
        << a.classes[i].label;
  }
}

}  // namespace
}  // namespace threewalls::sim
