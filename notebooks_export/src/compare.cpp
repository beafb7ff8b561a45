#include "threewalls/notebooks_export/compare.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "text.hpp"
#include "threewalls/core/error.hpp"

namespace threewalls::notebooks_export {

using profiler::kAbsent;
using profiler::PhaseRecord;
using profiler::RunData;

std::optional<double> signed_error_pct(double a, double b) {
  if (!(a != 0.0) || !std::isfinite(a) || !std::isfinite(b)) return std::nullopt;
  return 100.0 * (b - a) / a;
}

std::string UnmatchedKey::str() const {
  std::string s = "step " + std::to_string(step) + " rank " + std::to_string(rank) + " " + phase;
  if (layer != kAbsent) s += " layer " + std::to_string(layer);
  if (microbatch != kAbsent) s += " mb " + std::to_string(microbatch);
  if (expert != kAbsent) s += " expert " + std::to_string(expert);
  return s;
}

bool CompareResult::failed() const {
  return std::any_of(checks.begin(), checks.end(), [](const Check& c) { return c.failed; });
}

namespace {

// A record's key (step, rank, phase, layer, microbatch, expert), the phase as an id shared by both
// runs, packed into two integers so that sorting a million keys compares two words:
//   hi = step << 32 | rank,  lo = phase << 48 | (layer + 1) << 32 | (microbatch + 1) << 16 | (expert + 1)
// (each field below 2^16 after the +1; compare_runs checks that and reports a run it cannot pack).
struct Key {
  std::uint64_t hi;
  std::uint64_t lo;
  std::uint32_t index;  // into the run's phases
  std::uint32_t phase;
};

bool key_less(const Key& x, const Key& y) { return x.hi != y.hi ? x.hi < y.hi : x.lo < y.lo; }
bool key_equal(const Key& x, const Key& y) { return x.hi == y.hi && x.lo == y.lo; }

constexpr std::int64_t kPackLimit = 0xffff;

std::vector<Key> sorted_keys(const RunData& run, const std::vector<std::uint32_t>& phase_map) {
  std::vector<Key> keys;
  keys.reserve(run.phases.size());
  for (std::uint32_t i = 0; i < run.phases.size(); ++i) {
    const PhaseRecord& p = run.phases[i];
    const std::uint32_t ph = phase_map[p.phase];
    if (ph >= kPackLimit || p.layer >= kPackLimit - 1 || p.microbatch >= kPackLimit - 1 || p.expert >= kPackLimit - 1 ||
        p.step < 0 || p.rank < 0) {
      throw InputError(run.dir.string() + ": record key out of the range compare handles (phases, layers, micro-batches "
                                          "and experts below 65534)");
    }
    const std::uint64_t hi = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(p.step)) << 32U) |
                             static_cast<std::uint32_t>(p.rank);
    const std::uint64_t lo = (static_cast<std::uint64_t>(ph) << 48U) |
                             (static_cast<std::uint64_t>(p.layer + 1) << 32U) |
                             (static_cast<std::uint64_t>(p.microbatch + 1) << 16U) |
                             static_cast<std::uint64_t>(p.expert + 1);
    keys.push_back({hi, lo, i, ph});
  }
  // Runs are mostly written in key order already per step and rank; sort what is not.
  if (!std::is_sorted(keys.begin(), keys.end(), key_less)) std::sort(keys.begin(), keys.end(), key_less);
  for (std::size_t i = 1; i < keys.size(); ++i) {
    if (key_equal(keys[i - 1], keys[i])) {
      const PhaseRecord& p = run.phases[keys[i].index];
      UnmatchedKey k{p.step, p.rank, run.names.phases.name(p.phase), p.layer, p.microbatch, p.expert};
      throw InputError(run.dir.string() + ": duplicate record key (" + k.str() +
                       "): a key (step, rank, phase, layer, microbatch, expert) must be unique in a run");
    }
  }
  return keys;
}

struct Group {
  std::string phase;
  std::optional<int> layer;
  std::optional<int> microbatch;
  profiler::Wall wall = profiler::Wall::compute;
  std::vector<double> a;
  std::vector<double> b;
};

// Quantile q with linear interpolation (as profiler::percentile_sorted) by selection, O(n).
double quantile(std::vector<double>& v, double q) {
  const double h = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(lo), v.end());
  const double x = v[lo];
  if (lo + 1 >= v.size() || h == static_cast<double>(lo)) return x;
  const double y = *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(lo) + 1, v.end());
  return x + (h - static_cast<double>(lo)) * (y - x);
}

SideStats stats(std::vector<double>& v) {
  SideStats s;
  s.count = v.size();
  if (v.empty()) return s;
  for (double x : v) s.total_us += x;
  s.median_us = quantile(v, 0.5);
  s.p95_us = quantile(v, 0.95);
  return s;
}

std::vector<CompareRow> finish(std::vector<Group>& groups, double total_a) {
  std::vector<CompareRow> rows;
  rows.reserve(groups.size());
  for (auto& g : groups) {
    CompareRow r;
    r.phase = g.phase;
    r.layer = g.layer;
    r.microbatch = g.microbatch;
    r.wall = g.wall;
    r.a = stats(g.a);
    r.b = stats(g.b);
    r.median_error_pct = signed_error_pct(r.a.median_us, r.b.median_us);
    r.p95_error_pct = signed_error_pct(r.a.p95_us, r.b.p95_us);
    r.share_of_a = total_a > 0 ? r.a.total_us / total_a : 0.0;
    rows.push_back(std::move(r));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const CompareRow& x, const CompareRow& y) {
    if (x.a.total_us != y.a.total_us) return x.a.total_us > y.a.total_us;
    return x.phase < y.phase;
  });
  return rows;
}

UnmatchedKey unmatched(const RunData& run, std::uint32_t index) {
  const PhaseRecord& p = run.phases[index];
  return UnmatchedKey{p.step, p.rank, run.names.phases.name(p.phase), p.layer, p.microbatch, p.expert};
}

// A peak from summary.json's memory: the largest rank's value under `measured_key` (real runs), kind
// `measured_kind`; or else the largest class's `peak_bytes` (class_field null) or breakdown_bytes
// entry `class_field` (the memory model), kind "model".
void memory_peak(const RunData& run, const char* measured_key, const char* measured_kind, const char* class_field,
                 std::optional<double>& out, std::string& kind) {
  if (!run.summary) return;
  auto mem = run.summary->find("memory");
  if (mem == run.summary->end() || !mem->is_object()) return;
  double peak = -1;
  if (auto m = mem->find(measured_key); m != mem->end() && m->is_object()) {
    for (const auto& [r, v] : m->items()) {
      if (v.is_number()) peak = std::max(peak, v.get<double>());
    }
    if (peak >= 0) kind = measured_kind;
  }
  if (peak < 0) {
    if (auto c = mem->find("classes"); c != mem->end() && c->is_array()) {
      for (const auto& cls : *c) {
        const auto* from = &cls;
        const char* field = "peak_bytes";
        if (class_field != nullptr) {
          const auto b = cls.find("breakdown_bytes");
          if (b == cls.end() || !b->is_object()) continue;
          from = &*b;
          field = class_field;
        }
        if (auto v = from->find(field); v != from->end() && v->is_number()) peak = std::max(peak, v->get<double>());
      }
      if (peak >= 0) kind = "model";
    }
  }
  if (peak >= 0) out = peak;
}

// Peak memory: the device-wide measured peak (real runs) or else the model's peak (simulator).
void peak_memory(const RunData& run, std::optional<double>& out, std::string& kind) {
  memory_peak(run, "measured_peak_bytes_by_rank", "measured", nullptr, out, kind);
}

// Peak of the saved activations: a real run's caching allocator (peak_allocated_bytes_by_rank) or
// else the memory model's activations.
void activation_memory(const RunData& run, std::optional<double>& out, std::string& kind) {
  memory_peak(run, "peak_allocated_bytes_by_rank", "allocated", "activations", out, kind);
}

// Megatron-LM's timers as spans of a fine-grained run's records on one rank and step:
//   forward-backward: every record but the optimizer's and the training metrics';
//   forward-compute / backward-compute: per micro-batch, the span of its forward (`_fwd`, the input
//     copy) / backward (`_bwd`, `_dgrad`, `_wgrad`) records, pipeline transfers excluded, summed;
//   all-grads-sync: the data-parallel gradient reduction (`dp_grad_*`);
//   params-all-gather: `dp_param_allgather`; optimizer: `optimizer_*` and `dp_param_allgather`.
struct Span {
  double start = 0.0;
  double end = 0.0;
  bool any = false;
  void add(const PhaseRecord& p) {
    start = any ? std::min(start, p.start_us) : p.start_us;
    end = any ? std::max(end, p.end_us()) : p.end_us();
    any = true;
  }
  [[nodiscard]] double dur() const { return any ? end - start : 0.0; }
};

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

struct TimerSpans {
  Span forward_backward, grads_sync, params_gather, optimizer;
  std::map<int, Span> fwd, bwd;  // by micro-batch
  void add(const std::string& name, const PhaseRecord& p) {
    const bool opt = starts_with(name, "optimizer") || name == "dp_param_allgather";
    if (opt) optimizer.add(p);
    if (name == "dp_param_allgather") params_gather.add(p);
    if (starts_with(name, "dp_grad_")) grads_sync.add(p);
    if (opt || starts_with(name, "training_metrics")) return;
    forward_backward.add(p);
    if (p.microbatch == kAbsent || starts_with(name, "pp_")) return;
    if (ends_with(name, "_fwd") || starts_with(name, "host_to_device")) fwd[p.microbatch].add(p);
    if (ends_with(name, "_bwd") || ends_with(name, "_dgrad") || ends_with(name, "_wgrad")) bwd[p.microbatch].add(p);
  }
  [[nodiscard]] std::vector<std::pair<std::string, double>> timers() const {
    std::vector<std::pair<std::string, double>> out;
    auto put = [&](const char* n, double d, bool any) {
      if (any) out.emplace_back(n, d);
    };
    double f = 0.0;
    double b = 0.0;
    for (const auto& [mb, sp] : fwd) f += sp.dur();
    for (const auto& [mb, sp] : bwd) b += sp.dur();
    put("forward-backward", forward_backward.dur(), forward_backward.any);
    put("forward-compute", f, !fwd.empty());
    put("backward-compute", b, !bwd.empty());
    put("all-grads-sync", grads_sync.dur(), grads_sync.any);
    put("params-all-gather", params_gather.dur(), params_gather.any);
    put("optimizer", optimizer.dur(), optimizer.any);
    return out;
  }
};

bool is_timer_run(const RunData& run) {
  const auto s = run.run_json.find("settings");
  if (s == run.run_json.end() || !s->is_object()) return false;
  const auto i = s->find("import");
  if (i == s->end() || !i->is_object()) return false;
  const auto f = i->find("format");
  return f != i->end() && f->is_string() && f->get<std::string>() == "megatron-log";
}

// The run as Megatron's timers on rank 0, each timer and the step time the largest over the ranks
// (what Megatron logs with --timing-log-option minmax or max). A run of timers keeps its records;
// any other run's records are rolled up into timers (TimerSpans).
RunData timer_view(const RunData& run, bool timers) {
  RunData v;
  v.dir = run.dir;
  v.header = run.header;
  v.run_json = run.run_json;
  v.summary = run.summary;
  v.schema_major = run.schema_major;
  v.schema_minor = run.schema_minor;
  const std::uint32_t host = v.names.streams.intern("host");
  std::map<int, double> step_dur;
  std::map<int, double> step_epoch;
  for (const auto& s : run.steps) {
    step_dur[s.step] = std::max(step_dur[s.step], s.dur_us);
    if (!step_epoch.count(s.step) || s.epoch_us < step_epoch[s.step]) step_epoch[s.step] = s.epoch_us;
  }
  std::map<std::pair<int, std::string>, double> value;  // (step, timer) -> largest over ranks
  if (timers) {
    for (const auto& p : run.phases) {
      double& x = value[{p.step, run.names.phases.name(p.phase)}];
      x = std::max(x, p.dur_us);
    }
  } else {
    std::map<std::pair<int, int>, TimerSpans> spans;
    for (const auto& p : run.phases) spans[{p.step, p.rank}].add(run.names.phases.name(p.phase), p);
    for (const auto& [key, sp] : spans) {
      for (const auto& [name, d] : sp.timers()) {
        double& x = value[{key.first, name}];
        x = std::max(x, d);
      }
    }
  }
  for (const auto& [step, dur] : step_dur) v.steps.push_back({step, 0, step_epoch[step], dur});
  for (const auto& [key, d] : value) {
    PhaseRecord p;
    p.step = key.first;
    p.rank = 0;
    p.phase = v.names.phases.intern(key.second);
    p.stream = host;
    p.dur_us = d;
    p.wall = profiler::Wall::host;
    v.phases.push_back(p);
  }
  v.header.ranks = {0};
  return v;
}

CompareResult compare_records(const RunData& a, const RunData& b, const CompareOptions& options);

}  // namespace

CompareResult compare_runs(const RunData& a, const RunData& b, const CompareOptions& options) {
  const bool ta = is_timer_run(a);
  const bool tb = is_timer_run(b);
  if (!ta && !tb) return compare_records(a, b, options);
  CompareResult r = compare_records(timer_view(a, ta), timer_view(b, tb), options);
  r.timer_view = true;
  r.walls_a.reset();  // timers overlap (forward-backward holds the others): no wall breakdown
  r.walls_b.reset();
  return r;
}

namespace {

CompareResult compare_records(const RunData& a, const RunData& b, const CompareOptions& options) {
  CompareResult r;
  r.label_a = a.label();
  r.label_b = b.label();
  const auto& scen_a = a.header.scenario;
  const auto& scen_b = b.header.scenario;
  if (scen_a.name != scen_b.name) {
    r.different_scenarios.push_back("scenario names differ: A \"" + scen_a.name + "\", B \"" + scen_b.name + "\"");
  }
  if (scen_a.hash != scen_b.hash) {
    r.different_scenarios.push_back("scenario files differ: A hash " + scen_a.hash + ", B hash " + scen_b.hash);
  }
  if (a.header.world_size != b.header.world_size) {
    r.different_scenarios.push_back("world sizes differ: A " + std::to_string(a.header.world_size) + " GPUs, B " +
                                    std::to_string(b.header.world_size));
  }
  for (const auto& [side, run] : {std::pair{"A", &a}, std::pair{"B", &b}}) {
    if (!run->summary) {
      r.missing_summary.push_back(std::string(side) + " (" + run->label() +
                                  ") has no summary.json: its peak memory and saved activations are n/a");
    }
  }
  r.fail_above_pct = options.fail_above_pct;

  // Shared phase ids: A's ids, then names only B has.
  std::vector<std::uint32_t> map_a(a.names.phases.size());
  for (std::uint32_t i = 0; i < map_a.size(); ++i) map_a[i] = i;
  std::vector<std::uint32_t> map_b(b.names.phases.size());
  std::vector<std::string> shared_names = a.names.phases.names();
  for (std::uint32_t i = 0; i < map_b.size(); ++i) {
    auto id = a.names.phases.find(b.names.phases.name(i));
    if (id) {
      map_b[i] = *id;
    } else {
      map_b[i] = static_cast<std::uint32_t>(shared_names.size());
      shared_names.push_back(b.names.phases.name(i));
    }
  }
  std::vector<Key> ka = sorted_keys(a, map_a);
  std::vector<Key> kb = sorted_keys(b, map_b);

  // Merge.
  std::vector<Group> by_phase(shared_names.size());
  std::vector<bool> phase_seen(shared_names.size(), false);
  // (phase, layer) and (phase, microbatch) -> group index, dense tables grown on demand.
  std::vector<std::vector<std::int32_t>> layer_index(shared_names.size());
  std::vector<std::vector<std::int32_t>> mb_index(shared_names.size());
  std::vector<Group> by_layer;
  std::vector<Group> by_mb;
  std::vector<int> matched_steps;
  double total_a = 0.0;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < ka.size() || j < kb.size()) {
    if (j >= kb.size() || (i < ka.size() && key_less(ka[i], kb[j]))) {
      r.only_in_a.push_back(unmatched(a, ka[i].index));
      ++i;
      continue;
    }
    if (i >= ka.size() || key_less(kb[j], ka[i])) {
      r.only_in_b.push_back(unmatched(b, kb[j].index));
      ++j;
      continue;
    }
    const PhaseRecord& pa = a.phases[ka[i].index];
    const PhaseRecord& pb = b.phases[kb[j].index];
    const std::uint32_t ph = ka[i].phase;
    ++r.matched;
    total_a += pa.dur_us;
    if (matched_steps.empty() || matched_steps.back() != pa.step) matched_steps.push_back(pa.step);
    Group& g = by_phase[ph];
    if (!phase_seen[ph]) {
      phase_seen[ph] = true;
      g.phase = shared_names[ph];
      g.wall = pa.wall;
    }
    g.a.push_back(pa.dur_us);
    g.b.push_back(pb.dur_us);
    auto add_to = [&](std::vector<std::vector<std::int32_t>>& index, std::vector<Group>& groups, int sub,
                      bool is_layer) {
      auto& row = index[ph];
      if (row.size() <= static_cast<std::size_t>(sub)) row.resize(static_cast<std::size_t>(sub) + 1, -1);
      auto& slot = row[static_cast<std::size_t>(sub)];
      if (slot < 0) {
        slot = static_cast<std::int32_t>(groups.size());
        Group ng;
        ng.phase = shared_names[ph];
        ng.wall = pa.wall;
        (is_layer ? ng.layer : ng.microbatch) = sub;
        groups.push_back(std::move(ng));
      }
      groups[static_cast<std::size_t>(slot)].a.push_back(pa.dur_us);
      groups[static_cast<std::size_t>(slot)].b.push_back(pb.dur_us);
    };
    if (pa.layer != kAbsent) add_to(layer_index, by_layer, pa.layer, true);
    if (pa.microbatch != kAbsent) add_to(mb_index, by_mb, pa.microbatch, false);
    ++i;
    ++j;
  }
  if (r.matched == 0 && !(a.phases.empty() && b.phases.empty())) {
    throw InputError("compare: " + r.label_a + " and " + r.label_b +
                     " share no record key (step, rank, phase, layer, microbatch, expert): not runs of the same "
                     "scenario, or recorded at different steps or ranks");
  }
  std::sort(matched_steps.begin(), matched_steps.end());
  matched_steps.erase(std::unique(matched_steps.begin(), matched_steps.end()), matched_steps.end());
  r.matched_steps = matched_steps;

  std::vector<Group> phases;
  for (std::size_t k = 0; k < by_phase.size(); ++k) {
    if (phase_seen[k]) phases.push_back(std::move(by_phase[k]));
  }
  r.by_phase = finish(phases, total_a);
  r.by_phase_layer = finish(by_layer, total_a);
  r.by_phase_microbatch = finish(by_mb, total_a);

  // Step time and walls over the steps both runs recorded (steps without phases count too).
  profiler::Summary sa = profiler::summarize(a.steps, a.phases, a.names, false);
  profiler::Summary sb = profiler::summarize(b.steps, b.phases, b.names, false);
  std::map<int, const profiler::StepSummary*> steps_b;
  for (const auto& s : sb.steps) steps_b[s.step] = &s;
  std::vector<double> ta;
  std::vector<double> tb;
  profiler::WallBreakdown wa;
  profiler::WallBreakdown wb;
  bool walls = true;
  for (const auto& s : sa.steps) {
    auto it = steps_b.find(s.step);
    if (it == steps_b.end()) continue;
    ta.push_back(s.step_time_us);
    tb.push_back(it->second->step_time_us);
    if (s.walls && it->second->walls) {
      wa += *s.walls;
      wb += *it->second->walls;
    } else {
      walls = false;
    }
  }
  r.step_time_a = profiler::aggregate(ta);
  r.step_time_b = profiler::aggregate(tb);
  r.step_time_error_pct = signed_error_pct(r.step_time_a.median, r.step_time_b.median);
  if (walls && !ta.empty()) {
    wa *= 1.0 / static_cast<double>(ta.size());
    wb *= 1.0 / static_cast<double>(tb.size());
    r.walls_a = wa;
    r.walls_b = wb;
  }
  peak_memory(a, r.peak_memory_a, r.peak_memory_kind_a);
  peak_memory(b, r.peak_memory_b, r.peak_memory_kind_b);
  activation_memory(a, r.activation_memory_a, r.activation_memory_kind_a);
  activation_memory(b, r.activation_memory_b, r.activation_memory_kind_b);

  // What --fail-above checks: the step-time median, the median of every major phase, peak memory.
  auto check = [&](std::string what, double x, double y) {
    Check c{std::move(what), x, y, signed_error_pct(x, y), false};
    if (options.fail_above_pct) {
      c.failed = c.error_pct ? std::fabs(*c.error_pct) > *options.fail_above_pct : x != y;
    }
    r.checks.push_back(std::move(c));
  };
  if (!ta.empty()) check("step time (median)", r.step_time_a.median, r.step_time_b.median);
  for (const auto& row : r.by_phase) {
    if (row.share_of_a >= options.major_phase_share) check("phase " + row.phase + " (median)", row.a.median_us, row.b.median_us);
  }
  if (r.peak_memory_a && r.peak_memory_b) check("peak memory", *r.peak_memory_a, *r.peak_memory_b);
  if (r.activation_memory_a && r.activation_memory_b) {
    check("saved activations (peak)", *r.activation_memory_a, *r.activation_memory_b);
  }
  return r;
}

std::vector<std::string> row_cells(const CompareRow& row) {
  std::string name = row.phase;
  if (row.layer) name += " L" + std::to_string(*row.layer);
  if (row.microbatch) name += " mb" + std::to_string(*row.microbatch);
  return {name,
          profiler::to_string(row.wall),
          std::to_string(row.a.count),
          detail::fixed(row.a.median_us, 1),
          detail::fixed(row.b.median_us, 1),
          detail::pct(row.median_error_pct),
          detail::fixed(row.a.p95_us, 1),
          detail::fixed(row.b.p95_us, 1),
          detail::pct(row.p95_error_pct),
          detail::fixed(100.0 * row.share_of_a, 1)};
}

const std::vector<std::string> kRowHeader = {"phase", "wall", "n", "A med us", "B med us", "err",
                                             "A p95 us", "B p95 us", "err", "A share %"};

std::vector<const CompareRow*> largest_errors(const std::vector<CompareRow>& rows, std::size_t top) {
  std::vector<const CompareRow*> v;
  for (const auto& r : rows) {
    if (r.median_error_pct) v.push_back(&r);
  }
  std::stable_sort(v.begin(), v.end(), [](const CompareRow* x, const CompareRow* y) {
    // Weight by time so a tiny kernel with a big relative error does not hide the ones that matter.
    return std::fabs(*x->median_error_pct) * x->share_of_a > std::fabs(*y->median_error_pct) * y->share_of_a;
  });
  if (v.size() > top) v.resize(top);
  return v;
}

}  // namespace

std::string format_compare_text(const CompareResult& r, std::size_t top) {
  using detail::duration_us;
  std::string out;
  if (!r.different_scenarios.empty()) {
    const std::string rule(72, '!');
    out += rule + "\nWARNING: A and B are NOT runs of the same scenario; the errors below compare unlike runs:\n";
    for (const auto& d : r.different_scenarios) out += "  - " + d + "\n";
    out += rule + "\n";
  }
  for (const auto& m : r.missing_summary) out += "warning: " + m + "\n";
  out += "A (reference): " + r.label_a + "\n";
  out += "B:             " + r.label_b + "\n";
  out += "matched records: " + std::to_string(r.matched) + " over " + std::to_string(r.matched_steps.size()) +
         " step(s); only in A: " + std::to_string(r.only_in_a.size()) + "; only in B: " + std::to_string(r.only_in_b.size()) +
         "\n";
  if (r.timer_view) {
    out +=
        "Megatron-LM timers: a run of imported timers on one side, so both runs are compared as timers on rank "
        "0 (each the largest over the ranks; a simulation's records rolled up into forward-backward, "
        "forward-compute, backward-compute, all-grads-sync, params-all-gather and optimizer)\n";
  }
  out += "error = (B - A) / A\n\n";
  out += "step time (critical rank)  A median " + duration_us(r.step_time_a.median) + " p95 " +
         duration_us(r.step_time_a.p95) + "   B median " + duration_us(r.step_time_b.median) + " p95 " +
         duration_us(r.step_time_b.p95) + "   error " + detail::pct(r.step_time_error_pct) + "\n";
  if (r.peak_memory_a || r.peak_memory_b) {
    out += "peak memory                A " + (r.peak_memory_a ? detail::gib(*r.peak_memory_a) + " (" + r.peak_memory_kind_a + ")" : "n/a") +
           "   B " + (r.peak_memory_b ? detail::gib(*r.peak_memory_b) + " (" + r.peak_memory_kind_b + ")" : "n/a");
    if (r.peak_memory_a && r.peak_memory_b) out += "   error " + detail::pct(signed_error_pct(*r.peak_memory_a, *r.peak_memory_b));
    out += "\n";
  }
  if (r.activation_memory_a || r.activation_memory_b) {
    auto side = [](const std::optional<double>& v, const std::string& kind) {
      return v ? detail::gib(*v) + " (" + kind + ")" : std::string("n/a");
    };
    out += "saved activations (peak)   A " + side(r.activation_memory_a, r.activation_memory_kind_a) + "   B " +
           side(r.activation_memory_b, r.activation_memory_kind_b);
    if (r.activation_memory_a && r.activation_memory_b) {
      out += "   error " + detail::pct(signed_error_pct(*r.activation_memory_a, *r.activation_memory_b));
    }
    out += "\n";
  }
  if (r.host_probe) {
    const HostProbeLine& h = *r.host_probe;
    auto list = [](const std::vector<double>& v) {
      std::string s;
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " / " : "") + detail::fixed(v[i], 2);
      return s;
    };
    const char sim_side = h.real_side == 'A' ? 'B' : 'A';
    out += std::string("host probe                 ") + h.real_side + " " + list(h.probe.probe_us) +
           " us (op launch, GEMM calls; its own process, before step 0)   " + sim_side + "'s profile " +
           list(h.probe.charged_us) + " us   " + h.real_side + "'s host at " + detail::fixed(h.probe.scale, 2) + "x\n";
    out += std::string("                           a launch-bound step moves with it; threewalls sim --host-scale ") +
           detail::fixed(h.probe.scale * h.sim_host_scale, 2) + " simulates at " + h.real_side + "'s host speed\n";
  }
  if (r.walls_a && r.walls_b) {
    out += "\nwalls (mean per step, critical rank)\n";
    detail::TextTable t({"wall", "A us", "A %", "B us", "B %", "error"});
    double sa = r.walls_a->total_us();
    double sb = r.walls_b->total_us();
    for (int w = 0; w < 5; ++w) {
      double x = profiler::wall_value(*r.walls_a, w);
      double y = profiler::wall_value(*r.walls_b, w);
      t.add({profiler::kWallNames[w], detail::fixed(x, 1), detail::fixed(sa > 0 ? 100 * x / sa : 0, 1), detail::fixed(y, 1),
             detail::fixed(sb > 0 ? 100 * y / sb : 0, 1), detail::pct(signed_error_pct(x, y))});
    }
    t.add({"exposed comm", detail::fixed(r.walls_a->exposed_comm_us, 1), "", detail::fixed(r.walls_b->exposed_comm_us, 1), "",
           detail::pct(signed_error_pct(r.walls_a->exposed_comm_us, r.walls_b->exposed_comm_us))});
    t.add({"overlapped comm", detail::fixed(r.walls_a->overlapped_comm_us, 1), "",
           detail::fixed(r.walls_b->overlapped_comm_us, 1), "",
           detail::pct(signed_error_pct(r.walls_a->overlapped_comm_us, r.walls_b->overlapped_comm_us))});
    out += t.str();
  } else {
    out += r.timer_view ? "\nwalls: not available (Megatron timers overlap)\n"
                        : "\nwalls: not available (a run holds only the coarse view)\n";
  }
  out += "\nper phase (matched records; sorted by A's time)\n";
  detail::TextTable t(kRowHeader);
  for (const auto& row : r.by_phase) t.add(row_cells(row));
  out += t.str();
  auto largest = [&](const std::vector<CompareRow>& rows, const char* title) {
    if (rows.empty()) return;
    out += "\n" + std::string(title) + " (largest time-weighted errors, " + std::to_string(std::min(top, rows.size())) +
           " of " + std::to_string(rows.size()) + "; all in --json)\n";
    detail::TextTable tt(kRowHeader);
    for (const auto* row : largest_errors(rows, top)) tt.add(row_cells(*row));
    out += tt.str();
  };
  largest(r.by_phase_layer, "per phase and layer");
  largest(r.by_phase_microbatch, "per phase and micro-batch");
  auto one_sided = [&](const std::vector<UnmatchedKey>& keys, const char* side) {
    if (keys.empty()) return;
    out += "\nonly in " + std::string(side) + ": " + std::to_string(keys.size()) + " record(s)";
    out += keys.size() > top ? " (first " + std::to_string(top) + "; all in --json)\n" : "\n";
    for (std::size_t k = 0; k < keys.size() && k < top; ++k) out += "  " + keys[k].str() + "\n";
  };
  one_sided(r.only_in_a, "A");
  one_sided(r.only_in_b, "B");
  if (r.fail_above_pct) {
    out += "\n--fail-above " + detail::fixed(*r.fail_above_pct, 1) + "%: ";
    std::vector<std::string> failed;
    for (const auto& c : r.checks) {
      if (c.failed) failed.push_back(c.what + " " + detail::pct(c.error_pct));
    }
    if (failed.empty()) {
      out += "pass (" + std::to_string(r.checks.size()) + " checks)\n";
    } else {
      out += "FAIL: ";
      for (std::size_t k = 0; k < failed.size(); ++k) out += (k ? "; " : "") + failed[k];
      out += "\n";
    }
  }
  return out;
}

namespace {

OrderedJson opt_num(std::optional<double> v) { return v ? OrderedJson(*v) : OrderedJson(nullptr); }

OrderedJson row_json(const CompareRow& r) {
  OrderedJson j = OrderedJson::object();
  j["phase"] = r.phase;
  if (r.layer) j["layer"] = *r.layer;
  if (r.microbatch) j["microbatch"] = *r.microbatch;
  j["wall"] = profiler::to_string(r.wall);
  j["count"] = r.a.count;
  j["a"] = OrderedJson{{"median_us", r.a.median_us}, {"p95_us", r.a.p95_us}, {"total_us", r.a.total_us}};
  j["b"] = OrderedJson{{"median_us", r.b.median_us}, {"p95_us", r.b.p95_us}, {"total_us", r.b.total_us}};
  j["median_error_pct"] = opt_num(r.median_error_pct);
  j["median_abs_error_pct"] = r.median_error_pct ? OrderedJson(std::fabs(*r.median_error_pct)) : OrderedJson(nullptr);
  j["p95_error_pct"] = opt_num(r.p95_error_pct);
  j["p95_abs_error_pct"] = r.p95_error_pct ? OrderedJson(std::fabs(*r.p95_error_pct)) : OrderedJson(nullptr);
  j["share_of_a"] = r.share_of_a;
  return j;
}

OrderedJson key_json(const UnmatchedKey& k) {
  auto opt = [](int v) { return v == kAbsent ? OrderedJson(nullptr) : OrderedJson(v); };
  return OrderedJson{{"step", k.step},       {"rank", k.rank},
                     {"phase", k.phase},     {"layer", opt(k.layer)},
                     {"microbatch", opt(k.microbatch)}, {"expert", opt(k.expert)}};
}

OrderedJson agg_json(const profiler::Aggregate& a) {
  return OrderedJson{{"count", a.count}, {"median", a.median}, {"p95", a.p95}, {"mean", a.mean}, {"min", a.min}, {"max", a.max}};
}

}  // namespace

OrderedJson compare_json(const CompareResult& r) {
  OrderedJson j = OrderedJson::object();
  j["a"] = r.label_a;
  j["b"] = r.label_b;
  j["different_scenarios"] = r.different_scenarios;
  j["missing_summary"] = r.missing_summary;
  j["megatron_timers"] = r.timer_view;
  j["error_definition"] = "100 * (B - A) / A";
  j["matched_records"] = r.matched;
  j["matched_steps"] = r.matched_steps;
  j["step_time_us"] = OrderedJson{{"a", agg_json(r.step_time_a)},
                                  {"b", agg_json(r.step_time_b)},
                                  {"median_error_pct", opt_num(r.step_time_error_pct)},
                                  {"median_abs_error_pct", r.step_time_error_pct ? OrderedJson(std::fabs(*r.step_time_error_pct))
                                                                                 : OrderedJson(nullptr)}};
  if (r.walls_a && r.walls_b) {
    OrderedJson w = OrderedJson::object();
    w["a"] = profiler::walls_json(*r.walls_a);
    w["b"] = profiler::walls_json(*r.walls_b);
    OrderedJson e = OrderedJson::object();
    for (int k = 0; k < 5; ++k) {
      e[profiler::kWallNames[k]] = opt_num(signed_error_pct(profiler::wall_value(*r.walls_a, k), profiler::wall_value(*r.walls_b, k)));
    }
    w["error_pct"] = std::move(e);
    w["communication_us"] = OrderedJson{
        {"a", {{"exposed", r.walls_a->exposed_comm_us}, {"overlapped", r.walls_a->overlapped_comm_us}}},
        {"b", {{"exposed", r.walls_b->exposed_comm_us}, {"overlapped", r.walls_b->overlapped_comm_us}}}};
    j["walls_us"] = std::move(w);
  } else {
    j["walls_us"] = nullptr;
  }
  // A memory figure of both sides: values, kinds and the error of B against A.
  auto memory_pair = [](const std::optional<double>& a, const std::string& a_kind, const std::optional<double>& b,
                        const std::string& b_kind) {
    return OrderedJson{{"a", opt_num(a)},
                       {"a_kind", a_kind},
                       {"b", opt_num(b)},
                       {"b_kind", b_kind},
                       {"error_pct", a && b ? opt_num(signed_error_pct(*a, *b)) : OrderedJson(nullptr)}};
  };
  j["peak_memory_bytes"] = memory_pair(r.peak_memory_a, r.peak_memory_kind_a, r.peak_memory_b, r.peak_memory_kind_b);
  j["activation_memory_bytes"] =
      memory_pair(r.activation_memory_a, r.activation_memory_kind_a, r.activation_memory_b, r.activation_memory_kind_b);
  if (r.host_probe) {
    const HostProbeLine& h = *r.host_probe;
    j["host_probe"] = OrderedJson{{"real_side", std::string(1, static_cast<char>(h.real_side + ('a' - 'A')))},
                                  {"keys", h.probe.keys},
                                  {"probe_us", h.probe.probe_us},
                                  {"charged_us", h.probe.charged_us},
                                  {"scale", h.probe.scale},
                                  {"sim_host_scale", h.sim_host_scale},
                                  {"host_scale_for_the_run", h.probe.scale * h.sim_host_scale},
                                  {"profile", h.profile}};
  } else {
    j["host_probe"] = nullptr;
  }
  auto rows = [](const std::vector<CompareRow>& v) {
    OrderedJson a = OrderedJson::array();
    for (const auto& row : v) a.push_back(row_json(row));
    return a;
  };
  j["phases"] = rows(r.by_phase);
  j["phase_layers"] = rows(r.by_phase_layer);
  j["phase_microbatches"] = rows(r.by_phase_microbatch);
  auto keys = [](const std::vector<UnmatchedKey>& v) {
    OrderedJson a = OrderedJson::array();
    for (const auto& k : v) a.push_back(key_json(k));
    return a;
  };
  j["only_in_a"] = keys(r.only_in_a);
  j["only_in_b"] = keys(r.only_in_b);
  OrderedJson checks = OrderedJson::array();
  for (const auto& c : r.checks) {
    checks.push_back(OrderedJson{{"what", c.what}, {"a", c.a}, {"b", c.b}, {"error_pct", opt_num(c.error_pct)}, {"failed", c.failed}});
  }
  j["fail_above_pct"] = opt_num(r.fail_above_pct);
  j["checks"] = std::move(checks);
  j["failed"] = r.failed();
  return j;
}

std::optional<HostProbePair> find_host_probe_pair(const profiler::RunData& a, const profiler::RunData& b) {
  for (const bool real_is_a : {true, false}) {
    const profiler::RunHeader& real = real_is_a ? a.header : b.header;
    const profiler::RunHeader& sim = real_is_a ? b.header : a.header;
    if (real.source != "real" || sim.source != "sim" || !sim.calibration_profile) continue;
    const auto& settings = real.settings;
    if (!settings.contains("executor") || !settings["executor"].contains("device") ||
        !settings["executor"]["device"].contains("host_probe")) {
      continue;
    }
    const std::filesystem::path path = sim.calibration_profile->path;
    std::error_code ec;
    if (path.empty() || !std::filesystem::is_regular_file(path, ec)) continue;
    HostProbePair pair;
    pair.real_side = real_is_a ? 'A' : 'B';
    pair.probe = settings["executor"]["device"]["host_probe"];
    pair.profile = path.string();
    if (sim.settings.contains("simulator") && sim.settings["simulator"].contains("host_scale") &&
        sim.settings["simulator"]["host_scale"].is_number()) {
      pair.sim_host_scale = sim.settings["simulator"]["host_scale"].get<double>();
    }
    return pair;
  }
  return std::nullopt;
}

}  // namespace threewalls::notebooks_export
