#include "threewalls/profiler/walls.hpp"

#include <algorithm>
#include <array>

namespace threewalls::profiler {

WallBreakdown& WallBreakdown::operator+=(const WallBreakdown& o) {
  compute_us += o.compute_us;
  memory_us += o.memory_us;
  communication_us += o.communication_us;
  host_us += o.host_us;
  bubble_us += o.bubble_us;
  exposed_comm_us += o.exposed_comm_us;
  overlapped_comm_us += o.overlapped_comm_us;
  return *this;
}

WallBreakdown& WallBreakdown::operator-=(const WallBreakdown& o) {
  WallBreakdown minus = o;
  minus *= -1.0;
  return *this += minus;
}

WallBreakdown& WallBreakdown::operator*=(double k) {
  compute_us *= k;
  memory_us *= k;
  communication_us *= k;
  host_us *= k;
  bubble_us *= k;
  exposed_comm_us *= k;
  overlapped_comm_us *= k;
  return *this;
}

double wall_value(const WallBreakdown& w, int index) {
  switch (index) {
    case 0: return w.compute_us;
    case 1: return w.memory_us;
    case 2: return w.communication_us;
    case 3: return w.host_us;
    case 4: return w.bubble_us;
    default: return 0.0;
  }
}

namespace {

// Sweep categories, in precedence order. kWait: waiting for other ranks (bubble).
enum Cat : int { kCompute = 0, kMemory = 1, kComm = 2, kHost = 3, kWait = 4, kNumCats = 5 };

int category(Wall w) {
  switch (w) {
    case Wall::compute: return kCompute;
    case Wall::memory: return kMemory;
    case Wall::communication: return kComm;
    case Wall::host: return kHost;
  }
  return kHost;
}

struct Event {
  double t;
  int delta;      // +1 start, -1 end
  int cat;
  bool pipeline;  // the start of a pipeline send/recv (or of its waiting part)
};

}  // namespace

WallBreakdown sweep_walls(std::span<const TimelineOp> ops, double step_dur_us, std::span<const double> marks,
                          std::vector<WallBreakdown>* until) {
  WallBreakdown w;
  if (until != nullptr) until->assign(marks.size(), WallBreakdown{});
  if (!(step_dur_us > 0.0)) return w;
  std::vector<Event> ev;
  ev.reserve(ops.size() * 4 + 2);
  auto add = [&](double s, double e, int c, bool pipeline) {
    s = std::max(0.0, s);
    e = std::min(step_dur_us, e);
    if (!(e > s)) return;
    ev.push_back({s, +1, c, pipeline});
    ev.push_back({e, -1, c, false});
  };
  for (const auto& op : ops) {
    if (!(op.end_us > op.start_us)) continue;
    if (op.wall != Wall::communication) {
      const double split = std::min(op.end_us, op.start_us + std::max(0.0, op.launch_wait_us));
      add(op.start_us, split, kHost, false);  // the device waited for the host's launch
      add(split, op.end_us, category(op.wall), false);
    } else if (op.wait_us < 0.0) {
      // Unknown wait: a collective counts as communication, a pipeline send/recv as bubble.
      add(op.start_us, op.end_us, op.pipeline ? kWait : kComm, op.pipeline);
    } else {
      const double split = std::min(op.end_us, op.start_us + op.wait_us);
      add(op.start_us, split, kWait, op.pipeline);
      add(split, op.end_us, kComm, op.pipeline && !(split > op.start_us));
    }
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.t < b.t; });

  std::array<int, kNumCats> active{};
  double t = 0.0;
  std::size_t i = 0;
  // Classifies [t, t_next) into `into`: `starts_pipeline` tells whether a pipeline op starts at t_next.
  auto account_into = [&](WallBreakdown& into, double t_next, bool next_starts_pipeline) {
    double d = t_next - t;
    if (d <= 0.0) return;
    bool compute = active[kCompute] > 0;
    bool memory = active[kMemory] > 0;
    bool comm = active[kComm] > 0;
    if (comm) {
      if (compute || memory) {
        into.overlapped_comm_us += d;
      } else {
        into.exposed_comm_us += d;
      }
    }
    if (compute) {
      into.compute_us += d;
    } else if (memory) {
      into.memory_us += d;
    } else if (comm) {
      into.communication_us += d;
    } else if (active[kHost] > 0) {
      into.host_us += d;
    } else if (active[kWait] > 0) {
      into.bubble_us += d;
    } else if (next_starts_pipeline) {
      into.bubble_us += d;  // idle, and what ends the idleness is a pipeline send/recv
    } else {
      into.host_us += d;  // idle until the host launches the next op
    }
  };
  // The marks in order: the walls up to a mark are those before it plus [t, mark) as the last part of
  // a sweep clipped at the mark would count it (idle: host).
  std::vector<std::size_t> order(marks.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return marks[a] < marks[b]; });
  std::size_t next_mark = 0;
  auto account = [&](double t_next, bool next_starts_pipeline) {
    for (; until != nullptr && next_mark < order.size() && marks[order[next_mark]] <= t_next; ++next_mark) {
      const double m = std::clamp(marks[order[next_mark]], 0.0, step_dur_us);
      WallBreakdown& at = (*until)[order[next_mark]];
      at = w;
      if (m > t) account_into(at, m, false);
    }
    account_into(w, t_next, next_starts_pipeline);
  };
  while (i < ev.size()) {
    double t_next = ev[i].t;
    bool pipeline_starts = false;
    for (std::size_t k = i; k < ev.size() && ev[k].t == t_next; ++k) {
      if (ev[k].delta > 0 && ev[k].pipeline) pipeline_starts = true;
    }
    account(t_next, pipeline_starts);
    t = t_next;
    while (i < ev.size() && ev[i].t == t_next) {
      active[static_cast<std::size_t>(ev[i].cat)] += ev[i].delta;
      ++i;
    }
  }
  account(step_dur_us, false);
  for (; until != nullptr && next_mark < order.size(); ++next_mark) (*until)[order[next_mark]] = w;  // past the end
  return w;
}

}  // namespace threewalls::profiler
