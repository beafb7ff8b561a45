#pragma once
// StepRecorder: the device-timing half of the profiler (docs/profiler.md, "Device timing"), generic
// over where timestamps come from, so the same sampling, harvesting and alignment code runs on CUDA
// events (cuda_profiler.hpp, CudaEventClock) and on the executor's fake device in CI.
//
// Per step and rank:
//   begin_step(step, s)    asks the SamplingPolicy; when the step is recorded, an *epoch marker* is
//                          recorded on `s` (every phase of the step starts after it);
//   device_phase(r, a, b)  a phase between markers a and b (recorded around its work on its stream);
//                          with Owns::end (`a` is an earlier phase's end marker, shared) or
//                          Owns::none (both markers are another phase's: members of one NCCL group),
//                          the markers it does not own are released with their owner, once;
//                          `launched_host_us` (optional): host time at which the host's launch
//                          call for the phase's work returned, which gives the record's
//                          launch_wait_us = clamp(launched - start, 0, dur) on the host clock;
//   host_phase(r, t0, t1)  a phase timed on the host clock (host ops: syncs, reads, framework work);
//   end_step(z)            `z` marks the end of the step's device work.
// Nothing waits: harvest() (non-blocking, cheap) converts every *finished* step, oldest first, into
// records for the RecordSink and returns the markers to the clock's pool; a step whose end marker has
// not completed is picked up by a later harvest(). A step that is not recorded costs one branch.
//
// Times. Device phases: start_us = elapsed(epoch, a), dur_us = elapsed(a, b). Each step's epoch is
// placed on the host clock (the run's shared clock) through an *anchor*, a marker recorded while
// the device was idle at a known host time:
//   epoch_us(k) = anchor_host_us + elapsed(anchor, epoch_k),
// after which epoch_k becomes the anchor (so elapsed times stay short: float milliseconds from CUDA
// lose precision over hours). A host phase that waited for device work (host_phase_after) starts
// when the host had arrived and that work was done, whichever is later. Host phases: start_us = host_start - epoch_us(k). set_anchor() may
// re-align at any time (the executor does so every few seconds when the device is idle), which bounds
// the drift between the host and the device clocks. A host phase that began before the device
// reached the step's epoch (the host runs ahead of the device) is clipped to start at the epoch: the
// time before belongs to the previous step on the device. dur_us of the step = max(elapsed(epoch, z),
// the end of its last phase).
//
// Shared boundary markers. Two ops issued back to back on one stream, with nothing enqueued on that
// stream between them, can share a marker: start(B) = end(A). Under stream FIFO the stream reaches
// end(A) when A's work is done, and B's work is the next thing it runs, so a separate start marker
// for B would be taken at the same point of the stream (one marker's device time later: the very
// overhead this avoids). The caller decides when nothing was in between (the executor: no wait, event
// record, untimed launch or graph launch on the stream); the recorder only keeps ownership straight:
// every marker is released exactly once, by the phase that owns it, together with the step's other
// markers (a shared marker never outlives or predates its step: callers share only within a step).
//
// Clock requirements:
//   typename Clock::Stream, typename Clock::Marker (a copyable handle; Marker{} = none)
//   Marker mark(Stream s)                           records a timing marker at the current end of s
//   bool done(const Marker& m)                      non-blocking: has the device passed m?
//   double elapsed_us(const Marker& a, const Marker& b)   b - a in microseconds; both done
//   void release(const Marker& m)                   m may be reused (a no-op for pinned markers)
// Not thread-safe: one recorder per rank thread.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/record_sink.hpp"
#include "threewalls/profiler/sampling.hpp"

namespace threewalls::profiler {

template <class Clock>
class StepRecorder {
 public:
  using Stream = typename Clock::Stream;
  using Marker = typename Clock::Marker;

  // `sink` may be null (records are then kept in harvested() only: tests, or loops without files).
  StepRecorder(Clock& clock, SamplingPolicy policy, int rank, RecordSink* sink)
      : clock_(&clock), policy_(std::move(policy)), rank_(rank), sink_(sink),
        enabled_(policy_.enabled() && policy_.records_rank(rank)) {}
  ~StepRecorder() { release_all(); }
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // Whether this rank records anything at all (profiler enabled and the rank selected).
  [[nodiscard]] bool enabled() const { return enabled_; }
  [[nodiscard]] const SamplingPolicy& policy() const { return policy_; }
  [[nodiscard]] int rank() const { return rank_; }

  // Aligns device time with the host clock: `m` was recorded when the device was idle, at host
  // time `host_us` (on the clock epoch_us uses). Takes ownership of `m`.
  // Call it when no recorded step is pending (pending_steps() == 0), as the executor does.
  void set_anchor(Marker m, double host_us) {
    if (has_anchor_) clock_->release(anchor_);
    anchor_ = m;
    anchor_host_us_ = host_us;
    has_anchor_ = true;
  }
  [[nodiscard]] bool has_anchor() const { return has_anchor_; }

  // Starts step `step`; returns whether it is recorded (then the epoch marker is recorded on `s`).
  bool begin_step(int step, Stream s) {
    step_ = step;
    if (!enabled_ || !policy_.records(step)) {
      cur_ = nullptr;
      return false;
    }
    cur_ = &new_pending();
    cur_->step = step;
    cur_->epoch = clock_->mark(s);
    return true;
  }
  // Whether the current step is recorded, and whether it records ops of coarse-view membership `v`.
  [[nodiscard]] bool recording() const { return cur_ != nullptr; }
  [[nodiscard]] bool records_phase(CoarseView v) const { return cur_ != nullptr && policy_.records_phase(v); }

  [[nodiscard]] Marker mark(Stream s) { return clock_->mark(s); }
  // Which of a device phase's markers the phase owns (releases); a marker it does not own belongs to
  // an earlier device phase of the same step (see "Shared boundary markers" above).
  enum class Owns : std::uint8_t {
    both,  // a and b recorded for this phase
    end,   // a is an earlier phase's end marker (start(this) = end(previous) on the same stream)
    none,  // a and b both belong to an earlier phase (the members of one NCCL group)
  };
  // The start marker of a phase issued on `s` right behind an earlier phase of the step whose end
  // marker is `prev` (Marker{}: none, or nothing may be shared): `prev` itself while the device has
  // not passed it (start(this) = end(previous), Owns::end), else a marker of its own (Owns::both):
  // once the stream has passed `prev` it is idle waiting for the host, and sharing would put that
  // gap inside this phase (see "Shared boundary markers" above). One non-blocking query.
  struct Start {
    Marker marker;
    Owns owns;
  };
  Start start_after(Stream s, const Marker& prev) {
    if (!(prev == Marker{}) && !clock_->done(prev)) return {prev, Owns::end};
    return {clock_->mark(s), Owns::both};
  }
  // A phase of the current (recorded) step between markers `a` and `b`; `r` carries everything but
  // step, rank, start_us and dur_us.
  // `launched_host_us`: the host time (clock of set_anchor) at which the launch call of the phase's
  // work returned; kNotLaunched leaves launch_wait_us at 0.
  static constexpr double kNotLaunched = -std::numeric_limits<double>::infinity();
  void device_phase(const PhaseRecord& r, Marker a, Marker b, Owns owns = Owns::both,
                    double launched_host_us = kNotLaunched) {
    cur_->device.push_back(DevicePhase{r, a, b, owns, launched_host_us});
  }
  // A phase timed on the host clock (µs, the clock of set_anchor).
  void host_phase(const PhaseRecord& r, double host_start_us, double host_end_us) {
    PhaseRecord h = r;
    h.start_us = host_start_us;
    h.dur_us = host_end_us - host_start_us;
    cur_->host.push_back(h);
  }
  // A host phase that waited for device work: the host arrived at `host_arrive_us`, the work it
  // waited for ended at `after` (markers recorded behind it), and the host went on at `host_end_us`.
  // The phase starts when both the host had arrived and the device work was done, as the simulator's
  // host lane does (the wait before is a gap, not host time): start = max(arrive, max over `after`).
  void host_phase_after(const PhaseRecord& r, std::vector<Marker> after, double host_arrive_us, double host_end_us) {
    PhaseRecord h = r;
    h.start_us = host_arrive_us;
    h.dur_us = host_end_us - host_arrive_us;
    cur_->host_after.push_back(HostAfter{h, std::move(after)});
  }
  // Ends the current step. `end` marks the end of its device work (ignored and may be none when the
  // step is not recorded).
  void end_step(Marker end) {
    if (cur_ != nullptr) {
      cur_->end = end;
      cur_->ended = true;
      cur_ = nullptr;
    }
    last_ended_ = step_;
    notify_done();
  }

  // Non-blocking: converts every finished step, oldest first. Returns the number of steps harvested.
  std::size_t harvest() {
    std::size_t n = 0;
    while (!pending_.empty() && pending_.front().ended && ready(pending_.front())) {
      convert(pending_.front());
      recycle_front();
      ++n;
    }
    if (n > 0) notify_done();
    return n;
  }
  // Blocks until every ended step is harvested; `wait_a_bit()` runs between polls (it may sleep, or
  // throw to abort).
  template <class Wait>
  void drain(Wait&& wait_a_bit) {
    for (;;) {
      harvest();
      if (pending_.empty() || !pending_.front().ended) return;
      wait_a_bit();
    }
  }
  // Steps recorded but not yet harvested.
  [[nodiscard]] std::size_t pending_steps() const { return pending_.size(); }
  // Without a sink: the records harvested so far (tests and embedders read them here).
  [[nodiscard]] const std::vector<PhaseRecord>& kept_phases() const { return kept_phases_; }
  [[nodiscard]] const std::vector<StepRecord>& kept_steps() const { return kept_steps_; }

  // Returns every marker still held to the clock (an aborted run: nothing will be harvested).
  void release_all() {
    for (Pending& p : pending_) release_markers(p);
    pending_.clear();
    cur_ = nullptr;
    if (has_anchor_) clock_->release(anchor_);
    has_anchor_ = false;
  }

 private:
  struct DevicePhase {
    PhaseRecord r;
    Marker a;
    Marker b;
    Owns owns = Owns::both;
    double launched_host_us = kNotLaunched;
  };
  // Releases the markers a device phase owns (each marker of a step exactly once).
  void release_owned(const DevicePhase& d) {
    if (d.owns == Owns::both) clock_->release(d.a);
    if (d.owns != Owns::none) clock_->release(d.b);
  }
  struct HostAfter {
    PhaseRecord r;  // start_us/dur_us: host arrival and time until the host went on
    std::vector<Marker> after;
  };
  struct Pending {
    int step = 0;
    bool ended = false;
    Marker epoch{};
    Marker end{};
    std::vector<DevicePhase> device;
    std::vector<PhaseRecord> host;
    std::vector<HostAfter> host_after;
  };

  Pending& new_pending() {
    if (!spare_.empty()) {
      pending_.push_back(std::move(spare_.back()));
      spare_.pop_back();
    } else {
      pending_.emplace_back();
    }
    Pending& p = pending_.back();
    p.ended = false;
    p.device.clear();
    p.host.clear();
    p.host_after.clear();
    return p;
  }

  bool ready(const Pending& p) {
    // The end marker follows all of the step's device work (the caller joined every stream), so
    // once it is done every marker of the step is final, pinned graph markers included.
    return clock_->done(p.end) && clock_->done(p.epoch);
  }

  void convert(Pending& p) {
    const bool aligned = has_anchor_;  // device times can be put on the host clock
    double epoch_us = 0.0;
    if (has_anchor_) {
      epoch_us = anchor_host_us_ + clock_->elapsed_us(anchor_, p.epoch);
      clock_->release(anchor_);
    }
    // The epoch becomes the anchor for the next step (released then, not with the step's markers).
    anchor_ = p.epoch;
    anchor_host_us_ = epoch_us;
    has_anchor_ = true;
    StepRecord sr;
    sr.step = p.step;
    sr.rank = rank_;
    sr.epoch_us = epoch_us;
    double end_us = clock_->elapsed_us(p.epoch, p.end);
    std::vector<PhaseRecord> out;
    out.reserve(p.device.size() + p.host.size());
    for (const DevicePhase& d : p.device) {
      PhaseRecord r = d.r;
      r.step = p.step;
      r.rank = rank_;
      r.start_us = clock_->elapsed_us(p.epoch, d.a);
      r.dur_us = clock_->elapsed_us(d.a, d.b);
      // The device reached the start marker before the host's launch call returned: it waited for
      // the host (mapped onto the host clock through this step's epoch).
      if (aligned && r.wall != Wall::communication) {
        r.launch_wait_us = static_cast<float>(
            std::clamp(d.launched_host_us - epoch_us - r.start_us, 0.0, std::max(0.0, r.dur_us)));
      }
      end_us = std::max(end_us, r.start_us + r.dur_us);
      out.push_back(r);
    }
    for (const PhaseRecord& h : p.host) {
      PhaseRecord r = h;
      r.step = p.step;
      r.rank = rank_;
      r.start_us = h.start_us - epoch_us;
      if (r.start_us < 0.0) {  // began while the device was still in an earlier step: clip to the epoch
        r.dur_us = std::max(0.0, r.dur_us + r.start_us);
        r.start_us = 0.0;
      }
      end_us = std::max(end_us, r.start_us + r.dur_us);
      out.push_back(r);
    }
    for (const HostAfter& h : p.host_after) {
      PhaseRecord r = h.r;
      r.step = p.step;
      r.rank = rank_;
      const double arrive = h.r.start_us - epoch_us;
      const double leave = arrive + h.r.dur_us;
      double start = arrive;
      for (const Marker& m : h.after) start = std::max(start, clock_->elapsed_us(p.epoch, m));
      start = std::max(start, 0.0);
      r.start_us = std::min(start, std::max(leave, 0.0));
      r.dur_us = std::max(0.0, leave - r.start_us);
      end_us = std::max(end_us, r.start_us + r.dur_us);
      out.push_back(r);
    }
    sr.dur_us = end_us;
    if (sink_ != nullptr) {
      sink_->submit(sr, std::move(out));
    } else {
      kept_steps_.push_back(sr);
      kept_phases_.insert(kept_phases_.end(), out.begin(), out.end());
    }
  }

  void release_markers(Pending& p) {
    clock_->release(p.epoch);  // a pending step's epoch is never the anchor (only harvested ones are)
    if (p.ended) clock_->release(p.end);
    for (const DevicePhase& d : p.device) release_owned(d);
    for (const HostAfter& h : p.host_after) {
      for (const Marker& m : h.after) clock_->release(m);
    }
  }

  void recycle_front() {
    Pending& p = pending_.front();
    // The epoch stays alive as the anchor; the rest goes back to the clock.
    clock_->release(p.end);
    for (const DevicePhase& d : p.device) release_owned(d);
    for (const HostAfter& h : p.host_after) {
      for (const Marker& m : h.after) clock_->release(m);
    }
    p.device.clear();
    p.host.clear();
    p.host_after.clear();
    spare_.push_back(std::move(p));
    pending_.pop_front();
  }

  // Tells the sink which steps are finished on this rank: every step up to the oldest unharvested
  // recorded step (exclusive), or up to the last ended step when nothing is pending.
  void notify_done() {
    if (sink_ == nullptr) return;
    int through = last_ended_;
    if (!pending_.empty()) through = std::min(through, pending_.front().step - 1);
    while (done_through_ < through) sink_->step_done(rank_, ++done_through_);
  }

  Clock* clock_;
  SamplingPolicy policy_;
  int rank_;
  RecordSink* sink_;
  bool enabled_;
  std::deque<Pending> pending_;
  std::vector<Pending> spare_;
  Pending* cur_ = nullptr;
  int step_ = -1;
  int last_ended_ = -1;
  int done_through_ = -1;
  Marker anchor_{};
  double anchor_host_us_ = 0.0;
  bool has_anchor_ = false;
  std::vector<PhaseRecord> kept_phases_;
  std::vector<StepRecord> kept_steps_;
};

}  // namespace threewalls::profiler
