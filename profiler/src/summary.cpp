#include "threewalls/profiler/summary.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
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

Summary summarize(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases, const Names& names,
                  bool phase_stats) {
  Summary out;
  // Critical rank of each step: the longest step, lowest rank on ties.
  std::map<int, StepRecord> critical;
  for (const auto& s : steps) {
    auto [it, inserted] = critical.emplace(s.step, s);
    if (!inserted && (s.dur_us > it->second.dur_us || (s.dur_us == it->second.dur_us && s.rank < it->second.rank))) {
      it->second = s;
    }
  }
  const std::uint32_t pp = names.groups.find("pp").value_or(kNoName);
  std::map<int, std::vector<TimelineOp>> timelines;
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
    auto it = critical.find(p.step);
    if (it != critical.end() && it->second.rank == p.rank) timelines[p.step].push_back(timeline_op(p, pp));
    if (!phase_stats) continue;
    if (durations[p.phase].empty()) {
      order.push_back(p.phase);
      phase_wall[p.phase] = p.wall;
    }
    durations[p.phase].push_back(p.dur_us);
  }

  std::vector<double> step_times;
  WallBreakdown sum;
  for (const auto& [step, rec] : critical) {
    StepSummary s;
    s.step = step;
    s.step_time_us = rec.dur_us;
    s.critical_rank = rec.rank;
    if (detailed) {
      const auto& tl = timelines[step];
      s.walls = sweep_walls(tl, rec.dur_us);
      sum += *s.walls;
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
  if (detailed && !out.steps.empty()) {
    sum *= 1.0 / static_cast<double>(out.steps.size());
    out.walls_mean = sum;
  }
  for (auto id : order) {
    PhaseSummary ps;
    ps.phase = names.phases.name(id);
    ps.wall = phase_wall[id];
    ps.dur_us = aggregate(durations[id]);
    out.phases.push_back(std::move(ps));
  }
  return out;
}

SummaryBuilder::SummaryBuilder(const RunHeader& header, SummaryInputs inputs)
    : header_(header), inputs_(std::move(inputs)) {}

Summary SummaryBuilder::build(std::span<const StepRecord> steps, std::span<const PhaseRecord> phases,
                              const Names& names) const {
  Summary s = summarize(steps, phases, names);
  const double world = std::max(1, header_.world_size);
  for (auto& st : s.steps) {
    if (!(st.step_time_us > 0.0)) continue;
    Seconds t = microseconds(st.step_time_us);
    st.tokens_per_s = inputs_.tokens_per_step / t.value;
    // tflops_per_gpu = model_flops_per_step / world_size / step_time; mfu = that / GPU dense bf16 peak.
    FlopsPerSecond per_gpu = (inputs_.model_flops_per_step / world) / t;
    st.tflops_per_gpu = per_gpu.value * 1e-12;
    st.mfu = inputs_.gpu_peak.value > 0.0 ? per_gpu / inputs_.gpu_peak : 0.0;
  }
  return s;
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
  j["memory"] = std::move(mem);
  return j;
}

}  // namespace threewalls::profiler
