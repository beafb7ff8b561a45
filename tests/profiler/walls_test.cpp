#include "threewalls/profiler/walls.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace threewalls::profiler;

namespace {

TimelineOp op(double s, double e, Wall w, bool pipeline = false) { return TimelineOp{s, e, w, pipeline}; }

}  // namespace

TEST(Walls, ComputeOverlappingCommunicationCountsAsCompute) {
  std::vector<TimelineOp> ops = {op(0, 100, Wall::compute), op(20, 80, Wall::communication)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 100);
  EXPECT_DOUBLE_EQ(w.communication_us, 0);
  EXPECT_DOUBLE_EQ(w.overlapped_comm_us, 60);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, 0);
}

TEST(Walls, ExposedCommunicationIsTheCommunicationWall) {
  std::vector<TimelineOp> ops = {op(0, 50, Wall::compute), op(40, 90, Wall::communication), op(90, 100, Wall::memory)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 50);
  EXPECT_DOUBLE_EQ(w.communication_us, 40);
  EXPECT_DOUBLE_EQ(w.memory_us, 10);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, 40);
  EXPECT_DOUBLE_EQ(w.overlapped_comm_us, 10);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, w.communication_us);
}

TEST(Walls, PrecedenceIsComputeMemoryCommunicationHost) {
  // Four layers stacked: each instant goes to the highest-precedence op running.
  std::vector<TimelineOp> ops = {op(0, 100, Wall::host), op(10, 100, Wall::communication), op(20, 100, Wall::memory),
                                 op(30, 100, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.host_us, 10);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
  EXPECT_DOUBLE_EQ(w.memory_us, 10);
  EXPECT_DOUBLE_EQ(w.compute_us, 70);
  EXPECT_DOUBLE_EQ(w.bubble_us, 0);
}

TEST(Walls, WaitingOnAPipelineRecvIsBubble) {
  // Forward of micro-batch 0, then the recv of the next activation waits 40 us, then compute again.
  std::vector<TimelineOp> ops = {op(0, 30, Wall::compute), op(30, 70, Wall::communication, true),
                                 op(70, 100, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
  EXPECT_DOUBLE_EQ(w.bubble_us, 40);
  EXPECT_DOUBLE_EQ(w.communication_us, 0);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, 0);  // pipeline p2p is not counted as communication
}

TEST(Walls, IdleGapEndedByAPipelineRecvIsBubbleOtherwiseHost) {
  std::vector<TimelineOp> ops = {op(0, 20, Wall::compute), op(50, 60, Wall::communication, true),
                                 op(80, 100, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  // [20,50) idle then a pipeline recv starts: bubble. [50,60) recv: bubble. [60,80) idle then a kernel: host.
  EXPECT_DOUBLE_EQ(w.bubble_us, 40);
  EXPECT_DOUBLE_EQ(w.host_us, 20);
  EXPECT_DOUBLE_EQ(w.compute_us, 40);
}

TEST(Walls, CommunicationOtherThanPipelineBeatsPipelineAndHost) {
  std::vector<TimelineOp> ops = {op(0, 100, Wall::communication, true), op(0, 50, Wall::communication),
                                 op(40, 60, Wall::host)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.communication_us, 50);
  EXPECT_DOUBLE_EQ(w.host_us, 10);
  EXPECT_DOUBLE_EQ(w.bubble_us, 40);
}

TEST(Walls, OpsAreClippedToTheStepAndEmptyOpsIgnored) {
  std::vector<TimelineOp> ops = {op(-10, 20, Wall::compute), op(90, 150, Wall::memory), op(50, 50, Wall::compute),
                                 op(60, 55, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 20);
  EXPECT_DOUBLE_EQ(w.memory_us, 10);
  EXPECT_DOUBLE_EQ(w.host_us, 70);
  EXPECT_DOUBLE_EQ(w.total_us(), 100);
  EXPECT_DOUBLE_EQ(sweep_walls({}, 0).total_us(), 0);
}

TEST(Walls, FiveWallsSumToTheStepTimeOnRandomTimelines) {
  std::mt19937_64 rng(20261101);  // fixed seed
  std::uniform_real_distribution<double> u(0.0, 1000.0);
  std::uniform_int_distribution<int> kind(0, 4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TimelineOp> ops;
    double step = 500.0 + u(rng);
    for (int i = 0; i < 50; ++i) {
      double a = u(rng);
      double b = a + u(rng) * 0.2;
      int k = kind(rng);
      ops.push_back(op(a, b, k == 4 ? Wall::communication : static_cast<Wall>(k), k == 4));
    }
    auto w = sweep_walls(ops, step);
    EXPECT_NEAR(w.total_us(), step, 1e-9 * step);
    EXPECT_NEAR(w.exposed_comm_us, w.communication_us, 1e-9 * step);
    for (int i = 0; i < 5; ++i) EXPECT_GE(wall_value(w, i), 0.0);
  }
}

TEST(Walls, TimelineOpMarksOnlyPipelineGroupCommunication) {
  PhaseRecord r;
  r.wall = Wall::communication;
  r.group = 3;
  r.start_us = 5;
  r.dur_us = 2;
  EXPECT_TRUE(timeline_op(r, 3).pipeline);
  EXPECT_FALSE(timeline_op(r, 4).pipeline);
  EXPECT_FALSE(timeline_op(r, kNoName).pipeline);
  EXPECT_DOUBLE_EQ(timeline_op(r, 3).end_us, 7);
  r.wall = Wall::compute;
  EXPECT_FALSE(timeline_op(r, 3).pipeline);
}

namespace {

TimelineOp waiting(double s, double e, double wait_us, bool pipeline = false) {
  return TimelineOp{s, e, Wall::communication, pipeline, wait_us};
}

}  // namespace

TEST(Walls, WaitForTheLastMemberOfACollectiveIsBubbleTheRestCommunication) {
  // Compute until 60, then an all-reduce that waits 30 us for a late member and transfers for 10.
  std::vector<TimelineOp> ops = {op(0, 60, Wall::compute), waiting(60, 100, 30)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, 10);  // the waiting part is neither exposed nor overlapped
  EXPECT_DOUBLE_EQ(w.overlapped_comm_us, 0);
  EXPECT_DOUBLE_EQ(w.total_us(), 100);
}

TEST(Walls, UnknownWaitKeepsACollectiveAsCommunication) {
  std::vector<TimelineOp> ops = {op(0, 60, Wall::compute), waiting(60, 100, -1)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.communication_us, 40);
  EXPECT_DOUBLE_EQ(w.bubble_us, 0);
}

TEST(Walls, PipelineRecvWithAKnownWaitIsBubbleThenCommunication) {
  // The recv waits 30 us for its sender, then the transfer takes 10 us: only the wait is bubble.
  std::vector<TimelineOp> ops = {op(0, 30, Wall::compute), waiting(30, 70, 30, true), op(70, 100, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
}

TEST(Walls, ComputeAndHostOverlappingAWaitKeepTheirWalls) {
  // A collective waiting [0, 80) while a kernel runs [10, 30) and a host op [50, 60): the wait is
  // bubble only where nothing of higher precedence runs.
  std::vector<TimelineOp> ops = {waiting(0, 100, 80), op(10, 30, Wall::compute), op(50, 60, Wall::host)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.compute_us, 20);
  EXPECT_DOUBLE_EQ(w.host_us, 10);
  EXPECT_DOUBLE_EQ(w.bubble_us, 50);
  EXPECT_DOUBLE_EQ(w.communication_us, 20);
}

TEST(Walls, IdleGapBeforeAPipelineOpWithAKnownWaitIsBubble) {
  std::vector<TimelineOp> ops = {op(0, 20, Wall::compute), waiting(50, 60, 0, true), op(60, 100, Wall::compute)};
  auto w = sweep_walls(ops, 100);
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);          // idle [20, 50), ended by the pipeline op
  EXPECT_DOUBLE_EQ(w.communication_us, 10);   // no wait: all transfer
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
}

TEST(Walls, TheLaunchWaitOfAComputeRecordIsHostUnlessSomethingElseRuns) {
  // A GEMM record of 30 us whose first 20 us the device waited for the launch; a memory op on
  // another stream covers 5 us of that wait.
  TimelineOp gemm = op(10, 40, Wall::compute);
  gemm.launch_wait_us = 20;
  std::vector<TimelineOp> ops = {gemm, op(12, 17, Wall::memory)};
  auto w = sweep_walls(ops, 50);
  EXPECT_DOUBLE_EQ(w.compute_us, 10);
  EXPECT_DOUBLE_EQ(w.memory_us, 5);
  EXPECT_DOUBLE_EQ(w.host_us, 35);  // 10 idle before, 15 of launch wait, 10 idle after
  EXPECT_NEAR(w.total_us(), 50, 1e-9);
  // From a record: communication records never carry one.
  PhaseRecord r;
  r.wall = Wall::memory;
  r.start_us = 0;
  r.dur_us = 10;
  r.launch_wait_us = 4.0F;
  EXPECT_DOUBLE_EQ(timeline_op(r, kNoName).launch_wait_us, 4);
  r.wall = Wall::communication;
  EXPECT_DOUBLE_EQ(timeline_op(r, kNoName).launch_wait_us, 0);
}

TEST(Walls, TheWallsUpToAMarkAreThoseOfTheStepCutThere) {
  // Random timelines of every kind of op (waits, launch waits, pipeline ops, idle gaps): the walls up
  // to each mark equal a sweep of the step cut at the mark, and the step's walls do not move.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> at(0.0, 100.0);
  std::uniform_int_distribution<int> kind(0, 3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TimelineOp> ops;
    for (int k = 0; k < 12; ++k) {
      const double a = at(rng), b = at(rng);
      TimelineOp o = op(std::min(a, b), std::max(a, b), static_cast<Wall>(kind(rng)), kind(rng) == 0);
      if (o.wall == Wall::communication && kind(rng) > 1) o.wait_us = (o.end_us - o.start_us) / 2;
      if (o.wall != Wall::communication && kind(rng) == 3) o.launch_wait_us = 1.5;
      ops.push_back(o);
    }
    const std::vector<double> marks = {at(rng), ops[0].start_us, ops[1].end_us, -5.0, 100.0, 150.0, at(rng)};
    std::vector<WallBreakdown> until;
    const WallBreakdown whole = sweep_walls(ops, 100, marks, &until);
    const WallBreakdown plain = sweep_walls(ops, 100);
    EXPECT_DOUBLE_EQ(whole.total_us(), plain.total_us());
    EXPECT_DOUBLE_EQ(whole.bubble_us, plain.bubble_us);
    EXPECT_DOUBLE_EQ(whole.exposed_comm_us, plain.exposed_comm_us);
    ASSERT_EQ(until.size(), marks.size());
    for (std::size_t k = 0; k < marks.size(); ++k) {
      const WallBreakdown cut = sweep_walls(ops, std::clamp(marks[k], 0.0, 100.0));
      for (int wall = 0; wall < 5; ++wall) {
        EXPECT_NEAR(wall_value(until[k], wall), wall_value(cut, wall), 1e-9) << trial << " mark " << marks[k];
      }
      EXPECT_NEAR(until[k].exposed_comm_us, cut.exposed_comm_us, 1e-9);
      EXPECT_NEAR(until[k].overlapped_comm_us, cut.overlapped_comm_us, 1e-9);
    }
  }
}
