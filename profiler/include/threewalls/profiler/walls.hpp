#pragma once
// The wall breakdown of one rank's step (docs/formats/run_dir.md, summary.json `walls_us`).
//
// A precedence sweep over the rank's timeline [0, step_dur_us): every instant goes to the first of
//   1. compute        a compute-wall op is running
//   2. memory         a memory-wall op is running
//   3. communication  a communication op is running past its wait (below); a pipeline send/recv
//                     counts here only when its wait is known
//   4. host           a host op is running; or a compute/memory op is in its launch wait (the
//                     first launch_wait_us of its record: its stream was idle and the device
//                     waited for the host's launch call); or nothing runs and the next op to start
//                     is not a pipeline send/recv (the GPU waits for the host to launch it)
//   5. bubble         a communication op is waiting for the last member of its collective (or the
//                     peer of its send/recv) to arrive; a pipeline send/recv whose wait is unknown;
//                     or nothing runs and the next op to start is a pipeline send/recv
// so compute + memory + communication + host + bubble = step_dur_us exactly. Ops are clipped to the
// step. A pipeline send/recv is a communication-wall record whose group is "pp".
//
// Waits: a communication op's first `wait_us` are spent waiting for the other members to arrive
// (arrival = epoch_us + start_us; summary.cpp pairs the members' records). That part is `bubble`
// (waiting for other ranks: pipeline fill and drain, imbalance), the rest `communication`. An op
// whose wait is unknown (wait_us < 0: no other member's record) keeps the fallback: a collective is
// all communication, a pipeline send/recv all bubble.
//
// Communication: `overlapped` = time the communication category (3) runs while a compute or memory op
// also runs; `exposed` = the rest of it (= the communication wall). Waiting parts count in neither.
// Both executors compute the breakdown with this one function (summary.cpp).
#include <span>
#include <vector>

#include "threewalls/profiler/record.hpp"

namespace threewalls::profiler {

// The five walls of one step, in microseconds.
struct WallBreakdown {
  double compute_us = 0.0;
  double memory_us = 0.0;
  double communication_us = 0.0;
  double host_us = 0.0;
  double bubble_us = 0.0;
  double exposed_comm_us = 0.0;
  double overlapped_comm_us = 0.0;

  [[nodiscard]] double total_us() const { return compute_us + memory_us + communication_us + host_us + bubble_us; }
  WallBreakdown& operator+=(const WallBreakdown& o);
  WallBreakdown& operator-=(const WallBreakdown& o);
  WallBreakdown& operator*=(double k);
};

// The wall names in precedence order, as written in summary.json.
inline constexpr const char* kWallNames[5] = {"compute", "memory", "communication", "host", "bubble"};
double wall_value(const WallBreakdown& w, int index);  // index into kWallNames

// One op on a rank's timeline, relative to its step start.
struct TimelineOp {
  double start_us = 0.0;
  double end_us = 0.0;
  Wall wall = Wall::compute;
  bool pipeline = false;  // a pipeline send/recv (communication in group "pp")
  // Communication only: microseconds from start_us spent waiting for the last member of the
  // collective (or the send/recv peer) to arrive, clipped to the op; < 0 = unknown.
  double wait_us = -1.0;
  // Compute/memory only: microseconds from start_us the device waited for the host to launch the op
  // (PhaseRecord::launch_wait_us); that part counts as host.
  double launch_wait_us = 0.0;
};

// The sweep above. `ops` in any order; ops with end <= start or outside [0, step_dur_us) add nothing.
// With `until`: (*until)[k] = the walls from 0 to marks[k] (clipped to [0, step_dur_us]), which a
// sweep with step_dur_us = marks[k] would give.
WallBreakdown sweep_walls(std::span<const TimelineOp> ops, double step_dur_us, std::span<const double> marks = {},
                          std::vector<WallBreakdown>* until = nullptr);

// The timeline form of a record (wait unknown); `pp_group` is Names::groups' id of "pp" (kNoName
// when absent).
inline TimelineOp timeline_op(const PhaseRecord& r, std::uint32_t pp_group, double wait_us = -1.0) {
  return TimelineOp{r.start_us, r.start_us + r.dur_us, r.wall,
                    r.wall == Wall::communication && pp_group != kNoName && r.group == pp_group, wait_us,
                    r.wall == Wall::communication ? 0.0 : static_cast<double>(r.launch_wait_us)};
}

}  // namespace threewalls::profiler
