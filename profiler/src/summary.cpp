#include "threewalls/profiler/summary.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_map>

#include "threewalls/core/version.hpp"

namespace threewalls::profiler {

double percentile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0.0;
  double h = q * static_cast<double>(sorted.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(h));
  std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Aggregate aggregate(std::vector<double>& values) {
  Aggregate a;
  a.count = values.size();
  if (values.empty()) return a;
  std::sort(values.begin(), values.end());
  a.total = std::accumulate(values.begin(), values.end(), 0.0);
  a.mean = a.total / static_cast<double>(values.size());
  a.median = percentile_sorted(values, 0.5);
  a.p95 = percentile_sorted(values, 0.95);
  a.min = values.front();
  a.max = values.back();
  return a;
}

namespace {

struct CollKey {
  std::int32_t step, layer, microbatch, expert, group_id;
  std::uint32_t phase, group;
  bool operator==(const CollKey&) const = default;
};
struct P2pKey {
  std::int32_t step, rank, peer, microbatch;
  std::uint32_t phase;
  bool operator==(const P2pKey&) const = default;
};
inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}
struct CollKeyHash {
  std::size_t operator()(const CollKey& k) const {
    std::uint64_t h = 0;
    for (std::uint64_t v : {std::uint64_t(std::uint32_t(k.step)), std::uint64_t(std::uint32_t(k.layer)),
                            std::uint64_t(std::uint32_t(k.microbatch)), std::uint64_t(std::uint32_t(k.expert)),
                            std::uint64_t(std::uint32_t(k.group_id)), std::uint64_t(k.phase), std::uint64_t(k.group)}) {
      h = mix(h, v);
    }
    return static_cast<std::size_t>(h);
  }
};
struct P2pKeyHash {
  std::size_t operator()(const P2pKey& k) const {
    std::uint64_t h = 0;
    for (std::uint64_t v : {std::uint64_t(std::uint32_t(k.step)), std::uint64_t(std::uint32_t(k.rank)),
                            std::uint64_t(std::uint32_t(k.peer)), std::uint64_t(std::uint32_t(k.microbatch)),
                            std::uint64_t(k.phase)}) {
      h = mix(h, v);
    }
    return static_cast<std::size_t>(h);
  }
};

CollKey coll_key(const PhaseRecord& p) {
  return CollKey{p.step, p.layer, p.microbatch, p.expert, p.group_id, p.phase, p.group};
}

// A collective record: communication in a group other than "pp" (`pp` = its id), with no peer.
bool is_collective(const PhaseRecord& p, std::uint32_t pp) {
  return p.wall == Wall::communication && p.group != kNoName && p.group != pp && p.peer == kAbsent;
}
bool is_p2p(const PhaseRecord& p) { return p.wall == Wall::communication && p.peer != kAbsent; }

// The phase a point-to-point phase pairs with: its name with the first "send" or "recv" swapped.
std::vector<std::uint32_t> p2p_partners(const Names& names) {
  std::vector<std::uint32_t> out(names.phases.size(), kNoName);
  for (std::uint32_t id = 0; id < names.phases.size(); ++id) {
    const std::string& n = names.phases.name(id);
    const std::size_t a = n.find("send");
    const std::size_t b = n.find("recv");
    std::size_t at = std::min(a, b);
    if (at == std::string::npos) continue;
    std::string other = n;
    other.replace(at, 4, at == a ? "recv" : "send");
    out[id] = names.phases.find(other).value_or(kNoName);
  }
  return out;
}

struct Member {
  double arrival;
  double end;
  int rank;
  const PhaseRecord* rec;
};

// Measure of the union of intervals minus the union of `busy` intervals (both unsorted).
double uncovered(std::vector<std::pair<double, double>> want, std::vector<std::pair<double, double>> busy) {
  auto merge = [](std::vector<std::pair<double, double>>& v) {
    std::sort(v.begin(), v.end());
    std::vector<std::pair<double, double>> out;
    for (const auto& iv : v) {
      if (!(iv.second > iv.first)) continue;
      if (!out.empty() && iv.first <= out.back().second) {
        out.back().second = std::max(out.back().second, iv.second);
      } else {
        out.push_back(iv);
      }
    }
    v.swap(out);
  };
  merge(want);
  merge(busy);
  double total = 0.0;
  std::size_t j = 0;
  for (const auto& [a, b] : want) {
    double t = a;
    while (j < busy.size() && busy[j].second <= t) ++j;
    for (std::size_t k = j; k < busy.size() && busy[k].first < b && t < b; ++k) {
      if (busy[k].first > t) total += busy[k].first - t;
      t = std::max(t, busy[k].second);
    }
    if (t < b) total += b - t;
  }
  return total;
}

// Inference phase ids of a run (kNoName where absent).
struct InferencePhases {
  std::uint32_t router = kNoName, fetch_h2d = kNoName, fetch_disk = kNoName, sampled = kNoName;
  std::vector<bool> sync;  // by phase id
  [[nodiscard]] bool present() const { return sampled != kNoName || fetch_h2d != kNoName; }
};

InferencePhases inference_phases(const Names& names) {
  InferencePhases ip;
  ip.router = names.phases.find("router_topk_fwd").value_or(kNoName);
  ip.fetch_h2d = names.phases.find("expert_fetch_h2d").value_or(kNoName);
  ip.fetch_disk = names.phases.find("expert_fetch_disk").value_or(kNoName);
  ip.sampled = names.phases.find("sampled_token_read").value_or(kNoName);
  ip.sync.assign(names.phases.size(), false);
  for (const char* n : kSyncPhases) {
    if (auto id = names.phases.find(n)) ip.sync[*id] = true;
  }
  return ip;
}

// The record-derived inference metrics of one rank's step (summary.hpp, InferenceStep).
InferenceStep inference_step(const std::vector<const PhaseRecord*>& recs, const InferencePhases& ip, double step_us) {
  InferenceStep m;
  std::map<std::int32_t, double> router_end, fetch_end, fetch_start;
  std::vector<std::pair<double, double>> busy;
  for (const PhaseRecord* p : recs) {
    const bool fetch = p->phase == ip.fetch_h2d || p->phase == ip.fetch_disk;
    if (p->phase == ip.fetch_h2d) {
      m.bytes_fetched_h2d += p->bytes;
      ++m.experts_fetched;
      auto [it, fresh] = fetch_end.emplace(p->layer, p->end_us());
      if (!fresh) it->second = std::max(it->second, p->end_us());
    }
    if (fetch) {
      auto [it, fresh] = fetch_start.emplace(p->layer, p->start_us);
      if (!fresh) it->second = std::min(it->second, p->start_us);
    }
    if (p->phase == ip.fetch_disk) m.bytes_fetched_disk += p->bytes;
    if (p->phase == ip.router) {
      auto [it, fresh] = router_end.emplace(p->layer, p->end_us());
      if (!fresh) it->second = std::max(it->second, p->end_us());
    }
    if (p->wall == Wall::host) {
      if (p->phase < ip.sync.size() && ip.sync[p->phase]) m.sync_overhead_us += p->dur_us;
    } else if (!fetch) {
      busy.emplace_back(std::max(0.0, p->start_us), std::min(step_us, p->end_us()));
    }
  }
  std::vector<std::pair<double, double>> want;
  for (const auto& [layer, f] : fetch_end) {
    auto r = router_end.find(layer);
    const double from = r != router_end.end() ? r->second : fetch_start[layer];
    want.emplace_back(std::max(0.0, from), std::min(step_us, f));
  }
  m.expert_wait_us = uncovered(std::move(want), std::move(busy));
  if (step_us > 0.0) {
    m.bubble_ratio = m.expert_wait_us / step_us;
    m.sync_overhead_share = m.sync_overhead_us / step_us;
  }
  return m;
}

}  // namespace

std::optional<WallBreakdown> mean_walls(std::span<const StepSummary> steps, std::string_view kind) {
  WallBreakdown sum;
  std::size_t n = 0;
  for (const StepSummary& s : steps) {
    if (!kind.empty() && (!s.inference || s.inference->kind != kind)) continue;
    if (!s.walls) return std::nullopt;
    sum += *s.walls;
    ++n;
  }
  if (n == 0) return std::nullopt;
  sum *= 1.0 / static_cast<double>(n);
  return sum;
}

Summary summarize(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases, const Names& names,
                  bool phase_stats, std::span<const double> wall_marks_us) {
  Summary out;
  // Critical rank of each step: the longest step, lowest rank on ties.
  std::map<int, StepRecord> critical;
  std::unordered_map<std::uint64_t, double> epoch;  // (rank, step) -> epoch_us
  auto rank_step = [](std::int32_t rank, std::int32_t step) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32) | static_cast<std::uint32_t>(step);
  };
  for (const auto& s : steps) {
    epoch[rank_step(s.rank, s.step)] = s.epoch_us;
    auto [it, inserted] = critical.emplace(s.step, s);
    if (!inserted && (s.dur_us > it->second.dur_us || (s.dur_us == it->second.dur_us && s.rank < it->second.rank))) {
      it->second = s;
    }
  }
  auto is_critical = [&](const PhaseRecord& p) {
    auto it = critical.find(p.step);
    return it != critical.end() && it->second.rank == p.rank;
  };
  const std::uint32_t pp = names.groups.find("pp").value_or(kNoName);
  const std::vector<std::uint32_t> partner = p2p_partners(names);
  std::map<int, std::vector<const PhaseRecord*>> crit_records;
  // Members of the critical ranks' collectives and pipeline partners, filled in a second pass.
  std::unordered_map<CollKey, std::vector<Member>, CollKeyHash> coll;
  std::unordered_map<P2pKey, std::vector<Member>, P2pKeyHash> p2p_own, p2p_other;
  // Coarse view sums per step and rank.
  std::map<std::pair<int, int>, std::pair<double, double>> coarse;
  bool detailed = false;
  std::vector<std::vector<double>> durations(names.phases.size());
  std::vector<Wall> phase_wall(names.phases.size(), Wall::compute);
  std::vector<std::uint32_t> order;
  for (const auto& p : phases) {
    if (p.coarse == CoarseView::none) {
      detailed = true;
    } else {
      auto& c = coarse[{p.step, p.rank}];
      (p.coarse == CoarseView::host_to_device ? c.first : c.second) += p.dur_us;
    }
    if (is_critical(p)) {
      crit_records[p.step].push_back(&p);
      if (is_collective(p, pp)) {
        coll.try_emplace(coll_key(p));
      } else if (is_p2p(p) && p.phase < partner.size() && partner[p.phase] != kNoName) {
        p2p_other.try_emplace(P2pKey{p.step, p.peer, p.rank, p.microbatch, partner[p.phase]});
      }
    }
    if (!phase_stats) continue;
    if (durations[p.phase].empty()) {
      order.push_back(p.phase);
      phase_wall[p.phase] = p.wall;
    }
    durations[p.phase].push_back(p.dur_us);
  }
  // Second pass: arrivals of the members (the critical rank's own records included).
  if (!coll.empty() || !p2p_other.empty()) {
    for (const auto& p : phases) {
      if (p.wall != Wall::communication) continue;
      auto e = epoch.find(rank_step(p.rank, p.step));
      if (e == epoch.end()) continue;
      const Member m{e->second + p.start_us, e->second + p.end_us(), p.rank, &p};
      if (is_collective(p, pp)) {
        auto it = coll.find(coll_key(p));
        if (it != coll.end()) it->second.push_back(m);
      } else if (is_p2p(p)) {
        const P2pKey k{p.step, p.rank, p.peer, p.microbatch, p.phase};
        auto it = p2p_other.find(k);
        if (it != p2p_other.end()) it->second.push_back(m);
        if (is_critical(p)) p2p_own[k].push_back(m);
      }
    }
    for (auto* table : {&p2p_own, &p2p_other}) {
      for (auto& [k, v] : *table) {
        std::sort(v.begin(), v.end(), [](const Member& a, const Member& b) { return a.arrival < b.arrival; });
      }
    }
  }
  // The wait of one of the critical rank's communication records (< 0: unknown).
  auto wait_of = [&](const PhaseRecord& p) -> double {
    auto e = epoch.find(rank_step(p.rank, p.step));
    if (e == epoch.end()) return -1.0;
    const double own = e->second + p.start_us;
    if (is_collective(p, pp)) {
      auto it = coll.find(coll_key(p));
      if (it == coll.end()) return -1.0;
      const double own_end = e->second + p.end_us();
      const double tol = std::max(1.0, 0.02 * p.dur_us);
      double last = own;
      bool other = false;
      for (const Member& m : it->second) {
        if (m.rank == p.rank) continue;
        if (p.group_id == kAbsent && std::abs(m.end - own_end) > tol) continue;  // another instance
        other = true;
        last = std::max(last, m.arrival);
      }
      return other ? std::clamp(last - own, 0.0, p.dur_us) : -1.0;
    }
    if (is_p2p(p) && p.phase < partner.size() && partner[p.phase] != kNoName) {
      const P2pKey own_key{p.step, p.rank, p.peer, p.microbatch, p.phase};
      const auto mine = p2p_own.find(own_key);
      const auto theirs = p2p_other.find(P2pKey{p.step, p.peer, p.rank, p.microbatch, partner[p.phase]});
      if (mine == p2p_own.end() || theirs == p2p_other.end()) return -1.0;
      std::size_t k = 0;
      while (k < mine->second.size() && mine->second[k].rec != &p) ++k;
      if (k >= mine->second.size() || k >= theirs->second.size()) return -1.0;
      return std::clamp(theirs->second[k].arrival - own, 0.0, p.dur_us);
    }
    return -1.0;
  };
  const InferencePhases ip = inference_phases(names);

  std::vector<double> step_times;
  for (const auto& [step, rec] : critical) {
    StepSummary s;
    s.step = step;
    s.step_time_us = rec.dur_us;
    s.critical_rank = rec.rank;
    if (detailed) {
      std::vector<TimelineOp> tl;
      const auto& recs = crit_records[step];
      tl.reserve(recs.size());
      for (const PhaseRecord* p : recs) {
        tl.push_back(timeline_op(*p, pp, p->wall == Wall::communication ? wait_of(*p) : -1.0));
      }
      s.walls = sweep_walls(tl, rec.dur_us, wall_marks_us, &s.walls_until);
      if (ip.present()) s.inference = inference_step(recs, ip, rec.dur_us);
    }
    s.coarse.training_step_ms = rec.dur_us * 1e-3;
    for (auto it = coarse.lower_bound({step, -1}); it != coarse.end() && it->first.first == step; ++it) {
      s.coarse.host_to_device_ms = std::max(s.coarse.host_to_device_ms, it->second.first * 1e-3);
      s.coarse.training_metrics_ms = std::max(s.coarse.training_metrics_ms, it->second.second * 1e-3);
    }
    step_times.push_back(rec.dur_us);
    out.steps.push_back(s);
  }
  out.step_time_us = aggregate(step_times);
  if (detailed) out.walls_mean = mean_walls(out.steps);
  for (auto id : order) {
    PhaseSummary ps;
    ps.phase = names.phases.name(id);
    ps.wall = phase_wall[id];
    ps.dur_us = aggregate(durations[id]);
    out.phases.push_back(std::move(ps));
  }
  return out;
}

bool is_receive_phase(std::string_view phase) { return phase.find("recv") < phase.find("send"); }

std::vector<P2pPair> p2p_pairs(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                               const Names& names) {
  const std::vector<std::uint32_t> partner = p2p_partners(names);
  std::unordered_map<std::uint64_t, double> epoch;
  const auto rank_step = [](std::int32_t rank, std::int32_t step) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32U) | static_cast<std::uint32_t>(step);
  };
  for (const auto& s : steps) epoch[rank_step(s.rank, s.step)] = s.epoch_us;
  // Records of one key, by arrival; keys in order of first appearance (deterministic output).
  std::unordered_map<P2pKey, std::vector<std::pair<double, std::size_t>>, P2pKeyHash> by_key;
  std::vector<P2pKey> order;
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const PhaseRecord& p = phases[i];
    if (!is_p2p(p) || p.phase >= partner.size() || partner[p.phase] == kNoName) continue;
    const auto e = epoch.find(rank_step(p.rank, p.step));
    if (e == epoch.end()) continue;
    const P2pKey k{p.step, p.rank, p.peer, p.microbatch, p.phase};
    auto [it, fresh] = by_key.try_emplace(k);
    if (fresh) order.push_back(k);
    it->second.emplace_back(e->second + p.start_us, i);
  }
  for (auto& [k, v] : by_key)
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<P2pPair> out;
  for (const P2pKey& k : order) {
    if (is_receive_phase(names.phases.name(k.phase))) continue;  // paired from its send
    const auto theirs = by_key.find(P2pKey{k.step, k.peer, k.rank, k.microbatch, partner[k.phase]});
    if (theirs == by_key.end()) continue;
    const auto& mine = by_key.at(k);
    for (std::size_t j = 0; j < mine.size() && j < theirs->second.size(); ++j) {
      out.push_back(P2pPair{mine[j].second, theirs->second[j].second});
    }
  }
  return out;
}

SummaryBuilder::SummaryBuilder(const RunHeader& header, SummaryInputs inputs)
    : header_(header), inputs_(std::move(inputs)) {}

Summary SummaryBuilder::build(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                              const Names& names, bool phase_stats) const {
  Summary s = summarize(steps, phases, names, phase_stats, inputs_.wall_marks_us);
  const double world = std::max(1, header_.world_size);
  for (auto& st : s.steps) {
    const auto in = inputs_.inference_steps.find(st.step);
    const InferenceStepInput* step_in = in == inputs_.inference_steps.end() ? nullptr : &in->second;
    const double tokens = step_in != nullptr ? step_in->tokens : inputs_.tokens_per_step;
    const Flops flops = step_in != nullptr && step_in->model_flops >= 0.0 ? Flops(step_in->model_flops)
                                                                           : inputs_.model_flops_per_step;
    if (st.inference) {
      st.inference->tokens = tokens;
      if (step_in != nullptr) {
        st.inference->kind = step_in->kind;
        const auto r = step_in->by_rank.find(st.critical_rank);
        if (r != step_in->by_rank.end()) {
          st.inference->experts_activated = r->second.activated;
          st.inference->cache_hits = r->second.cache_hits;
          if (r->second.activated > 0) {
            st.inference->cache_hit_rate =
                static_cast<double>(r->second.cache_hits) / static_cast<double>(r->second.activated);
          }
        }
      }
    }
    if (!(st.step_time_us > 0.0)) continue;
    Seconds t = microseconds(st.step_time_us);
    st.tokens_per_s = tokens / t.value;
    // tflops_per_gpu = model_flops_per_step / world_size / step_time; mfu = that / GPU dense bf16 peak.
    FlopsPerSecond per_gpu = (flops / world) / t;
    st.tflops_per_gpu = per_gpu.value * 1e-12;
    st.mfu = inputs_.gpu_peak.value > 0.0 ? per_gpu / inputs_.gpu_peak : 0.0;
  }
  // Inference aggregates: all recorded steps, then each kind in order of first appearance.
  std::vector<std::string> kinds = {""};
  for (const auto& st : s.steps) {
    if (st.inference && !st.inference->kind.empty() &&
        std::find(kinds.begin(), kinds.end(), st.inference->kind) == kinds.end()) {
      kinds.push_back(st.inference->kind);
    }
  }
  for (const std::string& kind : kinds) {
    InferenceAggregate a;
    double time = 0.0, wait = 0.0, sync = 0.0, disk = 0.0, h2d = 0.0, fetched = 0.0, tokens = 0.0;
    std::int64_t activated = 0, hits = 0;
    bool with_hits = false;
    for (const auto& st : s.steps) {
      if (!st.inference || (!kind.empty() && st.inference->kind != kind)) continue;
      const InferenceStep& m = *st.inference;
      ++a.steps;
      time += st.step_time_us;
      wait += m.expert_wait_us;
      sync += m.sync_overhead_us;
      disk += m.bytes_fetched_disk;
      h2d += m.bytes_fetched_h2d;
      fetched += static_cast<double>(m.experts_fetched);
      tokens += m.tokens;
      if (m.experts_activated) {
        with_hits = true;
        activated += *m.experts_activated;
        hits += m.cache_hits.value_or(0);
      }
    }
    if (a.steps == 0) continue;
    const double n = static_cast<double>(a.steps);
    a.step_time_us_mean = time / n;
    a.expert_wait_us_mean = wait / n;
    a.bubble_ratio = time > 0.0 ? wait / time : 0.0;
    a.sync_overhead_share = time > 0.0 ? sync / time : 0.0;
    a.bytes_fetched_disk_mean = disk / n;
    a.bytes_fetched_h2d_mean = h2d / n;
    a.experts_fetched_mean = fetched / n;
    if (with_hits && activated > 0) a.cache_hit_rate = static_cast<double>(hits) / static_cast<double>(activated);
    a.tokens_per_s = time > 0.0 ? tokens / (time * 1e-6) : 0.0;
    s.inference.emplace_back(kind.empty() ? "all" : kind, a);
  }
  return s;
}

OrderedJson inference_step_json(const InferenceStep& m) {
  auto opt = [](const auto& v) { return v ? OrderedJson(*v) : OrderedJson(nullptr); };
  return OrderedJson{{"kind", m.kind.empty() ? OrderedJson(nullptr) : OrderedJson(m.kind)},
                     {"tokens", m.tokens},
                     {"expert_wait_us", m.expert_wait_us},
                     {"bubble_ratio", m.bubble_ratio},
                     {"sync_overhead_us", m.sync_overhead_us},
                     {"sync_overhead_share", m.sync_overhead_share},
                     {"bytes_fetched", {{"disk", m.bytes_fetched_disk}, {"h2d", m.bytes_fetched_h2d}}},
                     {"experts_fetched", m.experts_fetched},
                     {"experts_activated", opt(m.experts_activated)},
                     {"cache_hits", opt(m.cache_hits)},
                     {"cache_hit_rate", opt(m.cache_hit_rate)}};
}

OrderedJson inference_aggregate_json(const InferenceAggregate& a) {
  return OrderedJson{{"steps", a.steps},
                     {"step_time_us_mean", a.step_time_us_mean},
                     {"expert_wait_us_mean", a.expert_wait_us_mean},
                     {"bubble_ratio", a.bubble_ratio},
                     {"sync_overhead_share", a.sync_overhead_share},
                     {"bytes_fetched_per_step", {{"disk", a.bytes_fetched_disk_mean}, {"h2d", a.bytes_fetched_h2d_mean}}},
                     {"experts_fetched_per_step", a.experts_fetched_mean},
                     {"cache_hit_rate", a.cache_hit_rate ? OrderedJson(*a.cache_hit_rate) : OrderedJson(nullptr)},
                     {"tokens_per_s", a.tokens_per_s}};
}

OrderedJson walls_json(const WallBreakdown& w) {
  return OrderedJson{{"compute", w.compute_us},
                     {"memory", w.memory_us},
                     {"communication", w.communication_us},
                     {"host", w.host_us},
                     {"bubble", w.bubble_us}};
}

namespace {
OrderedJson comm_json(const WallBreakdown& w) {
  return OrderedJson{{"exposed", w.exposed_comm_us}, {"overlapped", w.overlapped_comm_us}};
}
}  // namespace

OrderedJson SummaryBuilder::to_json(const Summary& s) const {
  OrderedJson j = OrderedJson::object();
  j["schema"] = std::string(kRunDirSchemaName);
  j["schema_version"] = std::to_string(kRunDirSchemaMajor) + "." + std::to_string(kRunDirSchemaMinor);
  if (!header_.run_id.empty()) j["run_id"] = header_.run_id;
  j["source"] = header_.source;
  j["scenario"] = OrderedJson{{"name", header_.scenario.name}, {"path", header_.scenario.path}, {"hash", header_.scenario.hash}};
  j["world_size"] = header_.world_size;
  j["gpu"] = inputs_.gpu;
  j["gpu_peak_flops"] = inputs_.gpu_peak.value;
  j["model_flops_per_step"] = inputs_.model_flops_per_step.value;
  j["tokens_per_step"] = inputs_.tokens_per_step;
  OrderedJson steps = OrderedJson::array();
  for (const auto& st : s.steps) {
    OrderedJson e = OrderedJson::object();
    e["step"] = st.step;
    e["step_time_us"] = st.step_time_us;
    e["critical_rank"] = st.critical_rank;
    e["tokens_per_s"] = st.tokens_per_s;
    e["tflops_per_gpu"] = st.tflops_per_gpu;
    e["mfu"] = st.mfu;
    e["walls_us"] = st.walls ? walls_json(*st.walls) : OrderedJson(nullptr);
    e["communication_us"] = st.walls ? comm_json(*st.walls) : OrderedJson(nullptr);
    e["coarse"] = OrderedJson{{"host_to_device", {{"duration_ms", st.coarse.host_to_device_ms}}},
                              {"training_step", {{"duration_ms", st.coarse.training_step_ms}}},
                              {"training_metrics", {{"duration_ms", st.coarse.training_metrics_ms}}}};
    if (st.inference) e["inference"] = inference_step_json(*st.inference);
    steps.push_back(std::move(e));
  }
  j["steps"] = std::move(steps);
  j["step_time_us"] = OrderedJson{{"median", s.step_time_us.median}, {"p95", s.step_time_us.p95},
                                  {"mean", s.step_time_us.mean}, {"min", s.step_time_us.min},
                                  {"max", s.step_time_us.max}};
  j["walls_us"] = s.walls_mean ? walls_json(*s.walls_mean) : OrderedJson(nullptr);
  j["communication_us"] = s.walls_mean ? comm_json(*s.walls_mean) : OrderedJson(nullptr);
  OrderedJson phases = OrderedJson::array();
  for (const auto& p : s.phases) {
    phases.push_back(OrderedJson{{"phase", p.phase}, {"wall", to_string(p.wall)}, {"count", p.dur_us.count},
                                 {"total_us", p.dur_us.total}, {"median_us", p.dur_us.median},
                                 {"p95_us", p.dur_us.p95}});
  }
  j["phases"] = std::move(phases);
  if (!s.inference.empty()) {
    OrderedJson inf = OrderedJson::object();
    for (const auto& [kind, a] : s.inference) inf[kind] = inference_aggregate_json(a);
    j["inference"] = std::move(inf);
  }
  OrderedJson mem = OrderedJson::object();
  mem["gpu_memory_bytes"] = inputs_.gpu_memory ? OrderedJson(inputs_.gpu_memory->value) : OrderedJson(nullptr);
  OrderedJson classes = OrderedJson::array();
  for (const auto& c : inputs_.memory_classes) {
    OrderedJson b = OrderedJson::object();
    for (const auto& [k, v] : c.breakdown) b[k] = v.value;
    classes.push_back(OrderedJson{{"class", c.id}, {"label", c.label}, {"ranks", c.ranks}, {"peak_bytes", c.peak.value},
                                  {"breakdown_bytes", std::move(b)}});
  }
  mem["classes"] = std::move(classes);
  mem["oom"] = inputs_.oom;
  OrderedJson measured = OrderedJson::object();
  for (const auto& [r, b] : inputs_.measured_peak_by_rank) measured[std::to_string(r)] = b.value;
  mem["measured_peak_bytes_by_rank"] = std::move(measured);
  auto by_rank = [&](const char* key, const std::map<int, Bytes>& peaks) {
    if (peaks.empty()) return;
    OrderedJson o = OrderedJson::object();
    for (const auto& [r, b] : peaks) o[std::to_string(r)] = b.value;
    mem[key] = std::move(o);
  };
  by_rank("peak_allocated_bytes_by_rank", inputs_.peak_allocated_by_rank);
  by_rank("peak_reserved_bytes_by_rank", inputs_.peak_reserved_by_rank);
  j["memory"] = std::move(mem);
  return j;
}

}  // namespace threewalls::profiler
