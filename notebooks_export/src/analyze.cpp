#include "threewalls/notebooks_export/analyze.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "text.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

using profiler::kAbsent;
using profiler::kNoName;
using profiler::PhaseRecord;
using profiler::RunData;

namespace {

constexpr double kMadToZ = 0.6745;       // robust z = 0.6745 (x - median) / MAD (Iglewicz & Hoaglin)
constexpr double kArrivalTieUs = 0.5;    // arrivals closer than this are a tie: nobody arrived "last"

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return profiler::percentile_sorted(v, 0.5);
}

// Median and MAD of a sample.
std::pair<double, double> median_mad(const std::vector<double>& v) {
  double m = median_of(v);
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v) dev.push_back(std::fabs(x - m));
  return {m, median_of(dev)};
}

std::uint64_t rank_step(int rank, int step) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32U) | static_cast<std::uint32_t>(step);
}

struct Item {
  std::int32_t step;
  std::uint32_t phase;
  std::int32_t layer;
  std::int32_t microbatch;
  std::int32_t expert;
  std::uint32_t group;
  std::int32_t group_id;
  std::int32_t rank;
  double arrival;
  double end;
  double dur;
  std::size_t record;  // index into the run's phase records
};

bool same_key(const Item& x, const Item& y) {
  return x.step == y.step && x.phase == y.phase && x.layer == y.layer && x.microbatch == y.microbatch &&
         x.expert == y.expert && x.group == y.group && x.group_id == y.group_id;
}

struct Slowness {
  bool slow = false;
  double excess = 0.0;  // own / peers' median - 1
};

}  // namespace

Analysis analyze_run(const RunData& run, const AnalyzeOptions& options) {
  Analysis out;
  out.label = run.label();
  out.ranks_recorded = run.header.ranks.size();

  std::unordered_map<std::uint64_t, const profiler::StepRecord*> step_of;
  std::set<int> steps;
  std::set<int> ranks_with_steps;
  for (const auto& s : run.steps) {
    step_of[rank_step(s.rank, s.step)] = &s;
    steps.insert(s.step);
    ranks_with_steps.insert(s.rank);
  }
  out.steps.assign(steps.begin(), steps.end());

  std::map<int, int> stage_of;
  for (const auto& c : run.header.rank_classes) {
    for (int r : c.ranks) stage_of[r] = c.pp_stage;
  }
  auto stage = [&](int r) {
    auto it = stage_of.find(r);
    return it == stage_of.end() ? 0 : it->second;
  };

  // ---- collective waits ----
  const std::uint32_t pp = run.names.groups.find("pp").value_or(kNoName);
  std::vector<Item> items;
  bool with_id = false;
  bool without_id = false;
  for (const auto& p : run.phases) {
    if (p.wall != profiler::Wall::communication || p.group == kNoName || p.group == pp || p.peer != kAbsent) continue;
    auto it = step_of.find(rank_step(p.rank, p.step));
    if (it == step_of.end()) continue;
    double arrival = it->second->epoch_us + p.start_us;
    items.push_back({p.step, p.phase, p.layer, p.microbatch, p.expert, p.group, p.group_id, p.rank, arrival,
                     arrival + p.dur_us, p.dur_us, static_cast<std::size_t>(&p - run.phases.data())});
    (p.group_id != kAbsent ? with_id : without_id) = true;
  }
  out.collective_pairing = items.empty() ? "none" : with_id && without_id ? "group_id and end time"
                                                    : with_id                ? "group_id"
                                                                             : "end time";
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return std::tie(x.step, x.phase, x.layer, x.microbatch, x.expert, x.group, x.group_id, x.end) <
           std::tie(y.step, y.phase, y.layer, y.microbatch, y.expert, y.group, y.group_id, y.end);
  });
  // Per record, its wait (communication records paired with others; 0 elsewhere).
  std::vector<double> record_wait(run.phases.size(), 0.0);
  // (rank, step) -> the spans [arrival, arrival + wait) of its waits, on the run's shared clock.
  std::unordered_map<std::uint64_t, std::vector<std::pair<double, double>>> wait_spans;
  std::map<int, RankWait> rank_waits;
  std::map<std::uint32_t, GroupWait> group_waits;
  std::map<std::uint32_t, std::map<int, RankWait>> group_rank_waits;
  // One member's wait in a collective instance or a pipeline transfer (record: its index in
  // run.phases; group: kNoName for a transfer of no group).
  auto note_wait = [&](std::size_t record, const profiler::PhaseRecord& p, double arrival, double w,
                       std::uint32_t group, bool arrived_last) {
    record_wait[record] = w;
    if (w > 0.0) wait_spans[rank_step(p.rank, p.step)].emplace_back(arrival, arrival + w);
    RankWait* tables[2] = {&rank_waits[p.rank], group != kNoName ? &group_rank_waits[group][p.rank] : nullptr};
    for (RankWait* rw : tables) {
      if (rw == nullptr) continue;
      rw->rank = p.rank;
      ++rw->collectives;
      rw->total_wait_us += w;
      if (arrived_last) ++rw->last_arrivals;
    }
    if (group != kNoName) group_waits[group].total_wait_us += w;
  };
  auto settle = [&](std::size_t b, std::size_t e) {  // one collective instance: items[b, e)
    if (e - b < 2) return;  // one member recorded: nobody to wait for
    double last = -1e300;
    double second = -1e300;
    int last_rank = -1;
    for (std::size_t k = b; k < e; ++k) {
      if (items[k].arrival > last) {
        second = last;
        last = items[k].arrival;
        last_rank = items[k].rank;
      } else if (items[k].arrival > second) {
        second = items[k].arrival;
      }
    }
    const std::uint32_t g = items[b].group;
    ++group_waits[g].instances;
    for (std::size_t k = b; k < e; ++k) {
      const Item& it = items[k];
      note_wait(it.record, run.phases[it.record], it.arrival, std::clamp(last - it.arrival, 0.0, it.dur), g,
                it.rank == last_rank && last - second > kArrivalTieUs);
    }
  };
  for (std::size_t b = 0; b < items.size();) {
    std::size_t e = b + 1;
    while (e < items.size() && same_key(items[b], items[e])) ++e;
    if (items[b].group_id != kAbsent) {
      settle(b, e);
    } else {
      // Members of one instance finish together: split where consecutive end times jump.
      std::vector<double> durs;
      for (std::size_t k = b; k < e; ++k) durs.push_back(items[k].dur);
      const double tol = std::max(1.0, 0.02 * median_of(durs));
      std::size_t s = b;
      for (std::size_t k = b + 1; k <= e; ++k) {
        if (k == e || items[k].end - items[k - 1].end > tol) {
          settle(s, k);
          s = k;
        }
      }
    }
    b = e;
  }
  // ---- pipeline transfer waits ----
  // A send and the receive it delivers to (profiler::p2p_pairs, the summary's pairing) each wait from
  // their own arrival to the other's, clipped to their record, as the members of a collective do: a
  // stage behind a slow rank waits in its receives, and that wait is not its own time.
  for (const profiler::P2pPair& pair : profiler::p2p_pairs(run.steps, run.phases, run.names)) {
    const profiler::PhaseRecord* side[2] = {&run.phases[pair.send], &run.phases[pair.recv]};
    double arrival[2] = {0.0, 0.0};
    bool known = true;
    for (int k = 0; k < 2; ++k) {
      auto it = step_of.find(rank_step(side[k]->rank, side[k]->step));
      if (it == step_of.end()) {
        known = false;
        break;
      }
      arrival[k] = it->second->epoch_us + side[k]->start_us;
    }
    if (!known) continue;
    const double last = std::max(arrival[0], arrival[1]);
    const std::uint32_t g = side[0]->group;
    if (g != kNoName) ++group_waits[g].instances;
    for (int k = 0; k < 2; ++k) {
      note_wait(k == 0 ? pair.send : pair.recv, *side[k], arrival[k],
                std::clamp(last - arrival[k], 0.0, side[k]->dur_us), g, arrival[k] - arrival[1 - k] > kArrivalTieUs);
    }
  }
  // A rank's wait in a step: the time in its wait spans while it runs nothing else (no compute,
  // memory, copy or host record): a receive posted ahead of the compute it overlaps, or a collective
  // waiting beside the backward, takes no time of its own; overlapping waits count once.
  std::unordered_map<std::uint64_t, std::vector<std::pair<double, double>>> busy_spans;
  for (const auto& p : run.phases) {
    if (p.wall == profiler::Wall::communication) continue;
    const std::uint64_t key = rank_step(p.rank, p.step);
    if (!wait_spans.count(key)) continue;
    const double at = step_of.at(key)->epoch_us + p.start_us;
    busy_spans[key].emplace_back(at, at + p.dur_us);
  }
  std::unordered_map<std::uint64_t, double> wait_in_step;  // (rank, step) -> wait
  for (const auto& [key, spans] : wait_spans) {
    std::vector<std::pair<double, int>> ev;  // (time, +-1 wait / +-2 busy)
    for (const auto& [a, b] : spans) ev.insert(ev.end(), {{a, 1}, {b, -1}});
    if (auto it = busy_spans.find(key); it != busy_spans.end()) {
      for (const auto& [a, b] : it->second) ev.insert(ev.end(), {{a, 2}, {b, -2}});
    }
    std::sort(ev.begin(), ev.end());
    int waiting = 0;
    int busy = 0;
    double idle = 0.0;
    double t = ev.empty() ? 0.0 : ev.front().first;
    for (const auto& [time, d] : ev) {
      if (waiting > 0 && busy == 0) idle += time - t;
      t = time;
      (d == 1 || d == -1 ? waiting : busy) += d > 0 ? 1 : -1;
    }
    wait_in_step[key] = idle;
  }
  auto finish_waits = [](std::map<int, RankWait>& m) {
    std::vector<RankWait> v;
    for (auto& [r, w] : m) {
      w.mean_wait_us = w.collectives ? w.total_wait_us / static_cast<double>(w.collectives) : 0.0;
      v.push_back(w);
    }
    std::stable_sort(v.begin(), v.end(), [](const RankWait& x, const RankWait& y) { return x.total_wait_us > y.total_wait_us; });
    return v;
  };
  out.waits = finish_waits(rank_waits);
  for (auto& [g, gw] : group_waits) {
    gw.group = run.names.groups.name(g);
    gw.ranks = finish_waits(group_rank_waits[g]);
    std::size_t best = 0;
    for (const auto& rw : gw.ranks) {
      if (rw.last_arrivals > best) {
        best = rw.last_arrivals;
        gw.most_waited_for = rw.rank;
      }
    }
    out.groups.push_back(gw);
  }
  std::stable_sort(out.groups.begin(), out.groups.end(),
                   [](const GroupWait& x, const GroupWait& y) { return x.total_wait_us > y.total_wait_us; });

  // ---- own time per rank and step; peers by pipeline stage ----
  std::map<int, std::vector<int>> stage_ranks;
  for (int r : ranks_with_steps) stage_ranks[stage(r)].push_back(r);
  auto own = [&](int r, int s) -> std::optional<double> {
    auto it = step_of.find(rank_step(r, s));
    if (it == step_of.end()) return std::nullopt;
    auto w = wait_in_step.find(rank_step(r, s));
    return it->second->dur_us - (w == wait_in_step.end() ? 0.0 : w->second);
  };
  // Peers' median and MAD exclude the rank itself; above kLeaveOneOutMax peers the whole stage's
  // statistics are used instead (computed once per stage and step: O(ranks) instead of O(ranks^2)).
  constexpr std::size_t kLeaveOneOutMax = 16;
  std::map<std::pair<int, int>, std::pair<double, double>> stage_stats;
  auto slowness = [&](int r, int s) {
    Slowness sl;
    auto x = own(r, s);
    if (!x) return sl;
    const auto& members = stage_ranks[stage(r)];
    if (members.size() < 2) return sl;
    double m = 0.0;
    double mad = 0.0;
    if (members.size() > kLeaveOneOutMax) {
      auto key = std::make_pair(stage(r), s);
      auto it = stage_stats.find(key);
      if (it == stage_stats.end()) {
        std::vector<double> all;
        for (int q : members) {
          if (auto y = own(q, s)) all.push_back(*y);
        }
        it = stage_stats.emplace(key, median_mad(all)).first;
      }
      std::tie(m, mad) = it->second;
    } else {
      std::vector<double> peers;
      for (int q : members) {
        if (q == r) continue;
        if (auto y = own(q, s)) peers.push_back(*y);
      }
      if (peers.empty()) return sl;
      std::tie(m, mad) = median_mad(peers);
    }
    if (!(m > 0.0)) return sl;
    sl.excess = *x / m - 1.0;
    sl.slow = sl.excess > options.min_excess && (mad <= 0.0 || kMadToZ * (*x - m) / mad > options.outlier_z);
    return sl;
  };

  std::map<int, double> median_own;
  for (int r : ranks_with_steps) {
    RankStat rs;
    rs.rank = r;
    rs.stage = stage(r);
    std::vector<double> st;
    std::vector<double> ow;
    std::vector<double> wa;
    std::vector<double> excess_row(out.steps.size(), std::nan(""));
    for (std::size_t si = 0; si < out.steps.size(); ++si) {
      const int s = out.steps[si];
      auto it = step_of.find(rank_step(r, s));
      if (it == step_of.end()) continue;
      st.push_back(it->second->dur_us);
      double o = *own(r, s);
      ow.push_back(o);
      wa.push_back(it->second->dur_us - o);
      auto sl = slowness(r, s);
      if (sl.slow) ++rs.slow_steps;
      if (stage_ranks[stage(r)].size() >= 2) excess_row[si] = 100.0 * sl.excess;
    }
    out.own_excess_pct.push_back(std::move(excess_row));
    rs.steps = st.size();
    rs.median_step_us = median_of(st);
    rs.median_own_us = median_of(ow);
    rs.median_wait_us = median_of(wa);
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0.0 : s / static_cast<double>(v.size());
    };
    rs.mean_own_us = mean(ow);
    rs.mean_wait_us = mean(wa);
    median_own[r] = rs.median_own_us;
    out.ranks.push_back(rs);
  }
  // One recorded rank per stage (a simulation's class representatives): compare across stages.
  const bool across_stages =
      stage_ranks.size() >= 2 &&
      std::all_of(stage_ranks.begin(), stage_ranks.end(), [](const auto& kv) { return kv.second.size() == 1; });
  if (across_stages) out.peers = "other stages";
  for (auto& rs : out.ranks) {
    std::vector<double> peers;
    if (across_stages) {
      for (int q : ranks_with_steps) {
        if (q != rs.rank) peers.push_back(median_own[q]);
      }
    } else {
      for (int q : stage_ranks[rs.stage]) {
        if (q != rs.rank) peers.push_back(median_own[q]);
      }
    }
    if (peers.empty()) continue;
    auto [m, mad] = median_mad(peers);
    if (m > 0) rs.own_vs_peers_pct = 100.0 * (rs.median_own_us / m - 1.0);
    if (mad > 0) rs.robust_z = kMadToZ * (rs.median_own_us - m) / mad;
  }

  // ---- slow ranks: steps and phases ----
  // Per (rank, step, phase) time, for the phase attribution: a communication record's less its wait
  // (the transfer, not the time the rank waited for the others in it).
  std::unordered_map<std::uint64_t, std::unordered_map<std::uint32_t, double>> phase_time;
  std::vector<profiler::Wall> phase_wall(run.names.phases.size(), profiler::Wall::compute);
  std::vector<bool> wall_set(run.names.phases.size(), false);
  bool any_slow = std::any_of(out.ranks.begin(), out.ranks.end(), [](const RankStat& r) { return r.slow_steps > 0; });
  if (any_slow) {
    for (std::size_t i = 0; i < run.phases.size(); ++i) {
      const auto& p = run.phases[i];
      phase_time[rank_step(p.rank, p.step)][p.phase] += p.dur_us - record_wait[i];
      if (!wall_set[p.phase]) {
        wall_set[p.phase] = true;
        phase_wall[p.phase] = p.wall;
      }
    }
  }
  for (const auto& rs : out.ranks) {
    if (rs.slow_steps == 0) continue;
    SlowRank sr;
    sr.rank = rs.rank;
    sr.stage = rs.stage;
    sr.recorded_steps = rs.steps;
    std::vector<double> excess;
    for (int s : out.steps) {
      auto sl = slowness(rs.rank, s);
      if (sl.slow) {
        sr.slow_steps.push_back(s);
        excess.push_back(sl.excess);
      }
    }
    sr.first_slow_step = sr.slow_steps.front();
    sr.last_slow_step = sr.slow_steps.back();
    sr.persistent = static_cast<double>(sr.slow_steps.size()) >= options.persistent_share * static_cast<double>(rs.steps);
    sr.own_excess_pct = 100.0 * median_of(excess);
    auto time_in = [&](int r, int s, std::uint32_t ph) {
      auto it = phase_time.find(rank_step(r, s));
      if (it == phase_time.end()) return 0.0;
      auto jt = it->second.find(ph);
      return jt == it->second.end() ? 0.0 : jt->second;
    };
    for (std::uint32_t ph = 0; ph < run.names.phases.size(); ++ph) {
      std::vector<double> mine;
      for (int s : sr.slow_steps) mine.push_back(time_in(rs.rank, s, ph));
      std::vector<double> peer_medians;
      for (int q : stage_ranks[rs.stage]) {
        if (q == rs.rank) continue;
        std::vector<double> v;
        for (int s : sr.slow_steps) v.push_back(time_in(q, s, ph));
        peer_medians.push_back(median_of(v));
      }
      if (peer_medians.empty()) continue;
      PhaseExcess pe;
      pe.phase = run.names.phases.name(ph);
      pe.wall = phase_wall[ph];
      pe.rank_us = median_of(mine);
      pe.peers_us = median_of(peer_medians);
      pe.excess_us = pe.rank_us - pe.peers_us;
      pe.excess_pct = pe.peers_us > 0 ? std::optional<double>(100.0 * pe.excess_us / pe.peers_us) : std::nullopt;
      if (pe.excess_us > 0) sr.phases.push_back(pe);
    }
    std::stable_sort(sr.phases.begin(), sr.phases.end(),
                     [](const PhaseExcess& x, const PhaseExcess& y) { return x.excess_us > y.excess_us; });
    if (sr.phases.size() > options.top_phases) sr.phases.resize(options.top_phases);
    out.slow_ranks.push_back(std::move(sr));
  }
  std::stable_sort(out.slow_ranks.begin(), out.slow_ranks.end(), [](const SlowRank& x, const SlowRank& y) {
    if (x.slow_steps.size() != y.slow_steps.size()) return x.slow_steps.size() > y.slow_steps.size();
    return x.own_excess_pct > y.own_excess_pct;
  });

  // ---- what could not be analysed ----
  if (ranks_with_steps.size() <= 1) out.notes.push_back("one rank recorded: no peers to compare it with");
  if (across_stages) {
    out.notes.push_back(
        "each pipeline stage has one recorded rank (a simulation records one representative per rank class): "
        "'own vs peers' compares each stage with the other stages (pipeline balance); finding a slow rank needs two "
        "or more recorded ranks of one stage");
  }
  for (const auto& [st, rs] : stage_ranks) {
    if (!across_stages && rs.size() == 1 && ranks_with_steps.size() > 1) {
      out.notes.push_back("stage " + std::to_string(st) + " has one recorded rank (" + std::to_string(rs.front()) +
                          "): no peers to compare it with");
    }
  }
  // ---- inference metrics (summary.json's `inference` block) ----
  if (run.summary && run.summary->contains("inference") && run.summary->at("inference").is_object()) {
    auto num = [](const Json& o, const char* k) {
      auto it = o.find(k);
      return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
    };
    for (const auto& [kind, o] : run.summary->at("inference").items()) {
      if (!o.is_object()) continue;
      InferenceKind ik;
      ik.kind = kind;
      profiler::InferenceAggregate& m = ik.metrics;
      m.steps = static_cast<std::size_t>(num(o, "steps"));
      m.step_time_us_mean = num(o, "step_time_us_mean");
      m.expert_wait_us_mean = num(o, "expert_wait_us_mean");
      m.bubble_ratio = num(o, "bubble_ratio");
      m.sync_overhead_share = num(o, "sync_overhead_share");
      if (auto b = o.find("bytes_fetched_per_step"); b != o.end() && b->is_object()) {
        m.bytes_fetched_disk_mean = num(*b, "disk");
        m.bytes_fetched_h2d_mean = num(*b, "h2d");
      }
      m.experts_fetched_mean = num(o, "experts_fetched_per_step");
      if (auto h = o.find("cache_hit_rate"); h != o.end() && h->is_number()) m.cache_hit_rate = h->get<double>();
      m.tokens_per_s = num(o, "tokens_per_s");
      out.inference.push_back(std::move(ik));
    }
  }
  if (items.empty()) {
    out.notes.push_back("no collective records (granularity coarse, or no collectives): waits are zero, own time = step time");
  } else if (without_id) {
    out.notes.push_back("some collective records carry no group_id: their group instances were told apart by end times");
  }
  return out;
}

const SlowRank* find_slow_rank(const Analysis& a, int rank) {
  for (const auto& s : a.slow_ranks) {
    if (s.rank == rank) return &s;
  }
  return nullptr;
}

namespace {

std::string steps_text(const SlowRank& s) {
  std::string t = s.persistent ? "persistent: slow in " : "bounded to steps " + std::to_string(s.first_slow_step) + ".." +
                                                             std::to_string(s.last_slow_step) + ": slow in ";
  t += std::to_string(s.slow_steps.size()) + " of " + std::to_string(s.recorded_steps) + " recorded steps";
  return t;
}

}  // namespace

std::string format_analysis_text(const Analysis& a) {
  using detail::duration_us;
  std::string out = "run: " + a.label + "\n";
  out += "ranks recorded: " + std::to_string(a.ranks_recorded) + ", steps recorded: " + std::to_string(a.steps.size());
  if (!a.steps.empty()) out += " (" + std::to_string(a.steps.front()) + ".." + std::to_string(a.steps.back()) + ")";
  out += "\ncollectives paired by: " + a.collective_pairing + "\n";

  out += "\nslow ranks\n";
  if (a.slow_ranks.empty()) {
    out += "  none: no rank's own time stands out from its peers in any recorded step\n";
  }
  for (const auto& s : a.slow_ranks) {
    out += "  rank " + std::to_string(s.rank) + " (stage " + std::to_string(s.stage) + "): own time " +
           detail::pct(s.own_excess_pct) + " over its peers' median; " + steps_text(s) + "\n";
    for (const auto& p : s.phases) {
      out += "    in " + p.phase + " (" + profiler::to_string(p.wall) + "): " + duration_us(p.rank_us) + " vs peers " +
             duration_us(p.peers_us) + " (" + detail::pct(p.excess_pct) + ", +" + duration_us(p.excess_us) + " per step)\n";
    }
  }

  out +=
      "\nstep time per rank (median over recorded steps; own = step - wait in collectives and pipeline transfers; "
      "peers = " +
      std::string(a.peers == "other stages" ? "the other pipeline stages" : "the ranks of the same pipeline stage") +
      ")\n";
  detail::TextTable t({"rank", "stage", "steps", "step", "own", "wait", "own vs peers", "robust z", "slow steps"});
  for (const auto& r : a.ranks) {
    t.add({std::to_string(r.rank), std::to_string(r.stage), std::to_string(r.steps), duration_us(r.median_step_us),
           duration_us(r.median_own_us), duration_us(r.median_wait_us), detail::pct(r.own_vs_peers_pct),
           r.robust_z ? detail::fixed(*r.robust_z, 1) : "n/a", std::to_string(r.slow_steps)});
  }
  out += t.str();

  if (!a.waits.empty()) {
    out += "\nwho waits in collectives and pipeline transfers (wait = last member's arrival - own arrival)\n";
    detail::TextTable w({"rank", "instances", "total wait", "mean wait", "arrived last"});
    for (const auto& r : a.waits) {
      w.add({std::to_string(r.rank), std::to_string(r.collectives), duration_us(r.total_wait_us),
             duration_us(r.mean_wait_us), std::to_string(r.last_arrivals)});
    }
    out += w.str();
    out += "\nper group\n";
    detail::TextTable g({"group", "instances", "total wait", "most waiting rank", "most waited-for rank"});
    for (const auto& gw : a.groups) {
      g.add({gw.group, std::to_string(gw.instances), duration_us(gw.total_wait_us),
             gw.ranks.empty() || !(gw.ranks.front().total_wait_us > 0) ? "-" : std::to_string(gw.ranks.front().rank),
             gw.most_waited_for ? std::to_string(*gw.most_waited_for) : "-"});
    }
    out += g.str();
  }
  if (!a.inference.empty()) {
    out += "\ninference (summary.json, critical rank; expert wait = GPU idle from a layer's routing to its experts' "
           "arrival; bubble ratio = expert wait / step time; sync = host sync records / step time)\n";
    detail::TextTable it({"steps", "kind", "step", "expert wait", "bubble ratio", "sync share", "cache hit rate",
                          "fetched h2d", "fetched disk", "experts fetched", "tokens/s"});
    for (const auto& k : a.inference) {
      const profiler::InferenceAggregate& m = k.metrics;
      it.add({std::to_string(m.steps), k.kind, duration_us(m.step_time_us_mean), duration_us(m.expert_wait_us_mean),
              detail::fixed(m.bubble_ratio, 3), detail::fixed(m.sync_overhead_share, 3),
              m.cache_hit_rate ? detail::fixed(*m.cache_hit_rate, 3) : "n/a", detail::gib(m.bytes_fetched_h2d_mean),
              detail::gib(m.bytes_fetched_disk_mean), detail::fixed(m.experts_fetched_mean, 1),
              detail::fixed(m.tokens_per_s, 1)});
    }
    out += it.str();
  }
  for (const auto& n : a.notes) out += "note: " + n + "\n";
  return out;
}

namespace {
OrderedJson opt_num(std::optional<double> v) { return v ? OrderedJson(*v) : OrderedJson(nullptr); }
OrderedJson wait_json(const RankWait& w) {
  return OrderedJson{{"rank", w.rank},
                     {"collectives", w.collectives},
                     {"total_wait_us", w.total_wait_us},
                     {"mean_wait_us", w.mean_wait_us},
                     {"last_arrivals", w.last_arrivals}};
}
}  // namespace

OrderedJson analysis_json(const Analysis& a) {
  OrderedJson j = OrderedJson::object();
  j["run"] = a.label;
  j["ranks_recorded"] = a.ranks_recorded;
  j["steps"] = a.steps;
  j["collective_pairing"] = a.collective_pairing;
  j["peers"] = a.peers;
  OrderedJson slow = OrderedJson::array();
  for (const auto& s : a.slow_ranks) {
    OrderedJson phases = OrderedJson::array();
    for (const auto& p : s.phases) {
      phases.push_back(OrderedJson{{"phase", p.phase},
                                   {"wall", profiler::to_string(p.wall)},
                                   {"rank_us", p.rank_us},
                                   {"peers_us", p.peers_us},
                                   {"excess_us", p.excess_us},
                                   {"excess_pct", opt_num(p.excess_pct)}});
    }
    slow.push_back(OrderedJson{{"rank", s.rank},
                               {"stage", s.stage},
                               {"own_excess_pct", s.own_excess_pct},
                               {"slow_steps", s.slow_steps},
                               {"recorded_steps", s.recorded_steps},
                               {"first_slow_step", s.first_slow_step},
                               {"last_slow_step", s.last_slow_step},
                               {"persistent", s.persistent},
                               {"phases", std::move(phases)}});
  }
  j["slow_ranks"] = std::move(slow);
  OrderedJson ranks = OrderedJson::array();
  for (const auto& r : a.ranks) {
    ranks.push_back(OrderedJson{{"rank", r.rank},
                                {"stage", r.stage},
                                {"steps", r.steps},
                                {"median_step_us", r.median_step_us},
                                {"median_own_us", r.median_own_us},
                                {"median_wait_us", r.median_wait_us},
                                {"mean_own_us", r.mean_own_us},
                                {"mean_wait_us", r.mean_wait_us},
                                {"own_vs_peers_pct", opt_num(r.own_vs_peers_pct)},
                                {"robust_z", opt_num(r.robust_z)},
                                {"slow_steps", r.slow_steps}});
  }
  j["ranks"] = std::move(ranks);
  j["own_excess_pct"] = a.own_excess_pct;  // [rank index][step index]; NaN is written as null
  OrderedJson waits = OrderedJson::array();
  for (const auto& w : a.waits) waits.push_back(wait_json(w));
  j["waits"] = std::move(waits);
  OrderedJson groups = OrderedJson::array();
  for (const auto& g : a.groups) {
    OrderedJson gr = OrderedJson::array();
    for (const auto& w : g.ranks) gr.push_back(wait_json(w));
    groups.push_back(OrderedJson{{"group", g.group},
                                 {"instances", g.instances},
                                 {"total_wait_us", g.total_wait_us},
                                 {"most_waited_for", g.most_waited_for ? OrderedJson(*g.most_waited_for) : OrderedJson(nullptr)},
                                 {"ranks", std::move(gr)}});
  }
  j["groups"] = std::move(groups);
  OrderedJson inference = OrderedJson::object();
  for (const auto& k : a.inference) inference[k.kind] = profiler::inference_aggregate_json(k.metrics);
  j["inference"] = a.inference.empty() ? OrderedJson(nullptr) : std::move(inference);
  j["notes"] = a.notes;
  return j;
}

}  // namespace threewalls::notebooks_export
