#include "threewalls/calibration/bench/driver.hpp"

#include <chrono>
#include <exception>
#include <map>

namespace threewalls::calibration::bench {

Clock steady_clock() {
  const auto t0 = std::chrono::steady_clock::now();
  return [t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
}

Sampling sample_until(const StopRule& rule, const Clock& clock, const std::function<double()>& one_sample) {
  Sampling s;
  const double t0 = clock();
  while (true) {
    s.samples.push_back(one_sample());
    s.reason = should_stop(rule, s.samples, clock() - t0);
    if (s.reason != StopReason::keep_going) break;
  }
  s.rel_ci = median_ci_rel_half_width(s.samples);
  return s;
}

std::vector<Budget::Section> sections_of(const std::vector<PointSpec>& plan) {
  // Shares: roughly the seconds each group needs at the H100/H200 rates for its grid.
  static const std::map<std::string, double> shares{{"copy", 20},       {"memory", 14},     {"gemm", 50},
                                                    {"grouped", 20},    {"attention", 35},  {"host", 5},
                                                    {"concurrency", 8}, {"collective", 118},
                                                    {"interference", 12}};
  std::vector<Budget::Section> out;
  for (const auto& p : plan) {
    const OpInfo* op = find_op(p.op);
    const std::string group = op ? op->group : p.op;
    if (out.empty() || out.back().name != group) {
      const auto it = shares.find(group);
      out.push_back({group, it == shares.end() ? 10.0 : it->second, 0});
    }
    ++out.back().points;
  }
  return out;
}

double default_budget_s(Mode mode) { return mode == Mode::quick ? 75.0 : 270.0; }

StopRule default_stop_rule(Mode mode) {
  StopRule r;
  if (mode == Mode::quick) {
    r.min_samples = 3;
    r.max_samples = 60;
    r.target_rel_ci = 0.02;
  } else {
    r.min_samples = 7;
    r.max_samples = 200;
    r.target_rel_ci = 0.005;
  }
  return r;
}

std::pair<double, double> point_bounds(Mode mode) {
  return mode == Mode::quick ? std::pair{0.02, 0.3} : std::pair{0.05, 1.0};
}

std::vector<Record> run_points(const std::vector<PointSpec>& plan, PointRunner& runner, Budget& budget,
                               const StopRule& rule, const Clock& clock, const Progress& progress) {
  std::vector<Record> out;
  out.reserve(plan.size());
  std::size_t i = 0;
  while (i < plan.size()) {
    const OpInfo* op = find_op(plan[i].op);
    const std::string section = op ? op->group : plan[i].op;
    std::size_t end = i;
    while (end < plan.size()) {
      const OpInfo* o = find_op(plan[end].op);
      if ((o ? o->group : plan[end].op) != section) break;
      ++end;
    }
    const std::vector<PointSpec> points(plan.begin() + static_cast<std::ptrdiff_t>(i),
                                        plan.begin() + static_cast<std::ptrdiff_t>(end));
    budget.begin(section);
    std::string section_error;
    double t0 = clock();
    try {
      runner.begin_section(section, points);
    } catch (const std::exception& e) {
      section_error = std::string("section '") + section + "' could not be set up: " + e.what();
    }
    budget.spend(clock() - t0, false);
    for (const auto& p : points) {
      Record r;
      r.point = p;
      t0 = clock();
      if (!section_error.empty()) {
        r.status = Status::error;
        r.error = section_error;
      } else if (const std::string why = budget.skip_reason(); !why.empty()) {
        r.status = Status::skipped;
        r.error = why;
      } else {
        StopRule pr = rule;
        pr.time_bound_s = budget.point_bound();
        try {
          runner.measure(pr, r);
          if (r.samples_s.empty()) throw std::runtime_error("the runner returned no samples");
          r.status = Status::ok;
          r.metrics = derived_metrics(r.point, r.median_s());
        } catch (const std::exception& e) {
          r.status = Status::error;
          r.error = e.what();
          r.samples_s.clear();
        }
      }
      r.wall_s = clock() - t0;
      budget.spend(r.wall_s, true);
      out.push_back(std::move(r));
      if (progress) progress(out.back(), out.size() - 1, plan.size());
    }
    t0 = clock();
    if (section_error.empty()) {
      try {
        runner.end_section(section);
      } catch (const std::exception&) {
        // Releasing buffers failed: the device is in trouble, which the next section will report.
      }
    }
    budget.spend(clock() - t0, false);
    i = end;
  }
  return out;
}

}  // namespace threewalls::calibration::bench
