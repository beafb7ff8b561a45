// Waiting in collectives and pipeline send/recv is bubble, not communication (summary.hpp,
// docs/formats/run_dir.md): hand-built multi-rank timelines whose answer is known.
#include <gtest/gtest.h>

#include <algorithm>

#include "threewalls/profiler/summary.hpp"

using namespace threewalls;
using namespace threewalls::profiler;

namespace {

struct Timeline {
  Names names;
  std::vector<StepRecord> steps;
  std::vector<PhaseRecord> phases;

  PhaseRecord& add(int step, int rank, const char* phase, Wall wall, double start, double dur) {
    PhaseRecord p;
    p.step = step;
    p.rank = rank;
    p.phase = names.phases.intern(phase);
    p.stream = names.streams.intern(wall == Wall::communication ? "comm" : "compute");
    p.wall = wall;
    p.start_us = start;
    p.dur_us = dur;
    phases.push_back(p);
    return phases.back();
  }
  // A collective record of `group` instance `group_id` (kAbsent: an older writer without group_id).
  void coll(int step, int rank, const char* phase, double start, double end, const char* group, int group_id) {
    PhaseRecord& p = add(step, rank, phase, Wall::communication, start, end - start);
    p.group = names.groups.intern(group);
    p.group_id = group_id;
  }
  void p2p(int step, int rank, const char* phase, double start, double end, int peer, int mb) {
    PhaseRecord& p = add(step, rank, phase, Wall::communication, start, end - start);
    p.group = names.groups.intern("pp");
    p.peer = peer;
    p.microbatch = mb;
  }
};

}  // namespace

TEST(CollectiveWaits, WaitForALateMemberIsBubbleAndOnlyTheTransferCommunication) {
  // Rank 0 computes 60 us and arrives at the all-reduce; rank 1 computes 90 us; the transfer takes
  // 10 us after the last arrival. Both steps last 100 us; the critical rank is rank 0 (lowest on ties).
  Timeline t;
  t.steps = {{0, 0, 1000, 100}, {0, 1, 1000, 100}};
  t.add(0, 0, "fwd", Wall::compute, 0, 60);
  t.coll(0, 0, "grad_allreduce", 60, 100, "dp", 0);
  t.add(0, 1, "fwd", Wall::compute, 0, 90);
  t.coll(0, 1, "grad_allreduce", 90, 100, "dp", 0);
  const Summary s = summarize(t.steps, t.phases, t.names);
  ASSERT_EQ(s.steps.size(), 1U);
  EXPECT_EQ(s.steps[0].critical_rank, 0);
  const WallBreakdown& w = *s.steps[0].walls;
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
  EXPECT_DOUBLE_EQ(w.exposed_comm_us, 10);
  EXPECT_DOUBLE_EQ(w.total_us(), 100);
}

TEST(CollectiveWaits, ArrivalsAreComparedOnTheSharedClockThroughEachRanksEpoch) {
  // Rank 1's step started 25 us later: its arrival at 65 us into its step is 90 us on the shared
  // clock, the same instant as above.
  Timeline t;
  t.steps = {{0, 0, 1000, 100}, {0, 1, 1025, 75}};
  t.add(0, 0, "fwd", Wall::compute, 0, 60);
  t.coll(0, 0, "grad_allreduce", 60, 100, "dp", 0);
  t.add(0, 1, "fwd", Wall::compute, 0, 65);
  t.coll(0, 1, "grad_allreduce", 65, 75, "dp", 0);
  const WallBreakdown& w = *summarize(t.steps, t.phases, t.names).steps[0].walls;
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
}

TEST(CollectiveWaits, InstancesOfOneGroupAreToldApartByGroupId) {
  // Two TP groups run the same collective; rank 2 (another instance) arrives very late and must not
  // count as rank 0's member.
  Timeline t;
  t.steps = {{0, 0, 0, 100}, {0, 1, 0, 100}, {0, 2, 0, 100}, {0, 3, 0, 100}};
  for (int r : {0, 1}) {
    t.add(0, r, "fwd", Wall::compute, 0, r == 0 ? 50 : 80);
    t.coll(0, r, "tp_allreduce", r == 0 ? 50 : 80, 90, "tp", 0);
  }
  for (int r : {2, 3}) {
    t.add(0, r, "fwd", Wall::compute, 0, 95);
    t.coll(0, r, "tp_allreduce", 95, 100, "tp", 2);
  }
  const Summary s = summarize(t.steps, t.phases, t.names);
  EXPECT_EQ(s.steps[0].critical_rank, 0);
  const WallBreakdown& w = *s.steps[0].walls;
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);          // [50, 80): waiting for rank 1 only
  EXPECT_DOUBLE_EQ(w.communication_us, 10);   // [80, 90)
  EXPECT_DOUBLE_EQ(w.host_us, 10);            // [90, 100): idle, nothing follows
}

TEST(CollectiveWaits, WithoutGroupIdMembersAreThoseThatFinishTogether) {
  // An older writer: no group_id. Ranks 0 and 1 end together at 90; ranks 2 and 3 (another instance)
  // end at 100.
  Timeline t;
  t.steps = {{0, 0, 0, 100}, {0, 1, 0, 100}, {0, 2, 0, 100}, {0, 3, 0, 100}};
  t.coll(0, 0, "tp_allreduce", 50, 90, "tp", kAbsent);
  t.coll(0, 1, "tp_allreduce", 80, 90, "tp", kAbsent);
  t.coll(0, 2, "tp_allreduce", 95, 100, "tp", kAbsent);
  t.coll(0, 3, "tp_allreduce", 96, 100, "tp", kAbsent);
  t.add(0, 0, "fwd", Wall::compute, 0, 50);
  const WallBreakdown& w = *summarize(t.steps, t.phases, t.names).steps[0].walls;
  EXPECT_DOUBLE_EQ(w.bubble_us, 30);
  EXPECT_DOUBLE_EQ(w.communication_us, 10);
}

TEST(CollectiveWaits, WithoutTheOtherMembersRecordsTheCollectiveStaysCommunication) {
  // Only rank 0 recorded (sampled ranks): its wait is unknown, so the documented fallback keeps the
  // whole collective as communication.
  Timeline t;
  t.steps = {{0, 0, 0, 100}};
  t.add(0, 0, "fwd", Wall::compute, 0, 60);
  t.coll(0, 0, "grad_allreduce", 60, 100, "dp", 0);
  const WallBreakdown& w = *summarize(t.steps, t.phases, t.names).steps[0].walls;
  EXPECT_DOUBLE_EQ(w.communication_us, 40);
  EXPECT_DOUBLE_EQ(w.bubble_us, 0);
}

TEST(CollectiveWaits, TheLastToArriveDoesNotWait) {
  Timeline t;
  // Rank 1 is the straggler and the critical rank (longer step): it waits for nobody.
  t.steps = {{0, 0, 0, 100}, {0, 1, 0, 101}};
  t.add(0, 0, "fwd", Wall::compute, 0, 60);
  t.coll(0, 0, "grad_allreduce", 60, 100, "dp", 0);
  t.add(0, 1, "fwd", Wall::compute, 0, 90);
  t.coll(0, 1, "grad_allreduce", 90, 100, "dp", 0);
  t.add(0, 1, "tail", Wall::compute, 100, 1);
  const Summary s = summarize(t.steps, t.phases, t.names);
  EXPECT_EQ(s.steps[0].critical_rank, 1);
  EXPECT_DOUBLE_EQ(s.steps[0].walls->bubble_us, 0);
  EXPECT_DOUBLE_EQ(s.steps[0].walls->communication_us, 10);
}

TEST(PipelineWaits, ARecvWaitsForItsSendersArrivalThenTransfers) {
  // Stage 0 (rank 0) computes micro-batch 0 until 50 and sends; stage 1 (rank 1) posted its recv at
  // 10. The transfer ends at 60 on both; stage 1 then computes until 110 (the critical rank).
  Timeline t;
  t.steps = {{0, 0, 0, 60}, {0, 1, 0, 110}};
  t.add(0, 0, "fwd", Wall::compute, 0, 50);
  t.p2p(0, 0, "pp_send_fwd", 50, 60, 1, 0);
  t.add(0, 1, "setup", Wall::compute, 0, 10);
  t.p2p(0, 1, "pp_recv_fwd", 10, 60, 0, 0);
  t.add(0, 1, "fwd", Wall::compute, 60, 50);
  const Summary s = summarize(t.steps, t.phases, t.names);
  EXPECT_EQ(s.steps[0].critical_rank, 1);
  const WallBreakdown& w = *s.steps[0].walls;
  EXPECT_DOUBLE_EQ(w.bubble_us, 40);         // [10, 50): waiting for stage 0
  EXPECT_DOUBLE_EQ(w.communication_us, 10);  // [50, 60): the transfer
  EXPECT_DOUBLE_EQ(w.compute_us, 60);
}

TEST(PipelineWaits, SendsAndRecvsOfOneMicroBatchPairInOrderOfStart) {
  // Two activations of micro-batch 0 travel 0 -> 1 (two model chunks). The second recv (posted at
  // 70) pairs with the second send (arrival 100), not the first.
  Timeline t;
  t.steps = {{0, 0, 0, 110}, {0, 1, 0, 120}};
  t.p2p(0, 0, "pp_send_fwd", 20, 30, 1, 0);
  t.p2p(0, 0, "pp_send_fwd", 100, 110, 1, 0);
  t.p2p(0, 1, "pp_recv_fwd", 0, 30, 0, 0);
  t.p2p(0, 1, "pp_recv_fwd", 70, 110, 0, 0);
  t.add(0, 1, "fwd", Wall::compute, 30, 40);
  t.add(0, 1, "fwd2", Wall::compute, 110, 10);
  const WallBreakdown& w = *summarize(t.steps, t.phases, t.names).steps[0].walls;
  // Waits: [0, 20) and [70, 100) = 50; transfers [20, 30) and [100, 110) = 20.
  EXPECT_DOUBLE_EQ(w.bubble_us, 50);
  EXPECT_DOUBLE_EQ(w.communication_us, 20);
  EXPECT_DOUBLE_EQ(w.compute_us, 50);
}

TEST(PipelineWaits, WithoutThePeersRecordsASendRecvStaysBubble) {
  Timeline t;
  t.steps = {{0, 1, 0, 110}};
  t.p2p(0, 1, "pp_recv_fwd", 10, 60, 0, 0);
  t.add(0, 1, "fwd", Wall::compute, 60, 50);
  const WallBreakdown& w = *summarize(t.steps, t.phases, t.names).steps[0].walls;
  EXPECT_DOUBLE_EQ(w.bubble_us, 60);  // idle [0, 10) ended by the recv, and the whole recv
  EXPECT_DOUBLE_EQ(w.communication_us, 0);
}

TEST(PipelineWaits, OneFOneBWithAFinalAllReduceGivesTheIdealBubble) {
  // A pure 1F1B pipeline built by hand: p = 3 stages, m = 4 micro-batches, forward F = 10 us,
  // backward 2F, instant transfers, then a world all-reduce that every stage joins when done. Each
  // stage computes m (F + 2F) = 120 us of a (m + p - 1) 3F = 180 us step; the rest is waiting (recv
  // waits, and the wait in the final all-reduce for the stage that finishes last), so
  // bubble / step = (p - 1) / (m + p - 1) on every stage. Stage s is rank p - 1 - s, so the critical
  // rank (lowest on ties) is the last stage, which ends early and waits in the all-reduce.
  const int p = 3, m = 4;
  const double F = 10;
  auto rank_of = [&](int stage) { return p - 1 - stage; };
  Timeline t;
  std::vector<std::vector<double>> fwd_end(p, std::vector<double>(m, -1.0)), bwd_end(p, std::vector<double>(m, -1.0));
  std::vector<double> free_at(p, 0.0);
  // Per stage: p - s - 1 warm-up forwards, then one forward and one backward alternately, then the
  // remaining backwards (Megatron-Core's order).
  std::vector<std::vector<std::pair<bool, int>>> order(p);
  for (int s = 0; s < p; ++s) {
    int f = 0, b = 0;
    for (; f < std::min(m, p - s - 1); ++f) order[s].push_back({true, f});
    while (b < m) {
      if (f < m) order[s].push_back({true, f++});
      order[s].push_back({false, b++});
    }
  }
  std::vector<std::size_t> pos(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (pos[s] >= order[s].size()) continue;
      const auto [is_fwd, i] = order[s][pos[s]];
      const int from = is_fwd ? s - 1 : s + 1;  // the stage whose output this op needs
      double ready = 0.0;
      if (from >= 0 && from < p) {
        ready = is_fwd ? fwd_end[from][i] : bwd_end[from][i];
        if (ready < 0.0) continue;
      } else if (!is_fwd) {
        ready = fwd_end[s][i];
      }
      const double start = std::max(free_at[s], ready);
      if (from >= 0 && from < p) {
        // The recv is posted when the stage is free; the send when its data is ready; both end
        // when the later of the two arrived (instant transfer).
        t.p2p(0, rank_of(s), is_fwd ? "pp_recv_fwd" : "pp_recv_bwd", free_at[s], start, rank_of(from), i);
        t.p2p(0, rank_of(from), is_fwd ? "pp_send_fwd" : "pp_send_bwd", ready, start, rank_of(s), i);
      }
      const double dur = is_fwd ? F : 2 * F;
      t.add(0, rank_of(s), is_fwd ? "fwd" : "bwd", Wall::compute, start, dur);
      (is_fwd ? fwd_end : bwd_end)[s][i] = start + dur;
      free_at[s] = start + dur;
      ++pos[s];
      progress = true;
    }
  }
  const double end = (m + p - 1) * 3 * F;
  ASSERT_DOUBLE_EQ(*std::max_element(free_at.begin(), free_at.end()), end);
  for (int s = 0; s < p; ++s) {
    t.steps.push_back({0, rank_of(s), 0, end});
    t.coll(0, rank_of(s), "grad_norm_allreduce", free_at[s], end, "world", 0);
  }
  const Summary sum = summarize(t.steps, t.phases, t.names);
  EXPECT_EQ(sum.steps[0].critical_rank, 0);
  const WallBreakdown& w = *sum.steps[0].walls;
  EXPECT_DOUBLE_EQ(w.compute_us, m * 3 * F);
  EXPECT_NEAR(w.bubble_us / end, static_cast<double>(p - 1) / (m + p - 1), 1e-9);
  EXPECT_NEAR(w.communication_us, 0.0, 1e-9);
  EXPECT_NEAR(w.host_us, 0.0, 1e-9);
}
