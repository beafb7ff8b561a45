// The self-contained HTML report: inline CSS and SVG only (no scripts, no external fonts or images).
#include <algorithm>
#include <cmath>
#include <map>

#include "output.hpp"
#include "svg.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/notebooks_export/analyze.hpp"
#include "threewalls/notebooks_export/compare.hpp"
#include "threewalls/notebooks_export/export.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

namespace {

using detail::xml;

const char* wall_color(int i) {
  static const char* kColors[5] = {"#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"};
  return kColors[i];
}
const char* wall_color(profiler::Wall w) { return wall_color(static_cast<int>(w)); }

std::vector<std::pair<std::string, std::string>> wall_legend(int n) {
  std::vector<std::pair<std::string, std::string>> v;
  for (int i = 0; i < n; ++i) v.emplace_back(profiler::kWallNames[i], wall_color(i));
  return v;
}

constexpr const char* kStyle = R"CSS(
body { font-family: sans-serif; margin: 24px; color: #222; background: #fafafa; max-width: 1320px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 15px; }
.meta { color: #555; font-size: 13px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts svg { border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
th { background: #eee; }
pre { background: #fff; border: 1px solid #ddd; padding: 8px; font-size: 12px; overflow-x: auto; }
.finding { color: #a02020; font-weight: bold; }
)CSS";

std::string kv_table(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string out = "<table>\n";
  for (const auto& [k, v] : rows) out += "<tr><td>" + xml(k) + "</td><td>" + xml(v) + "</td></tr>\n";
  return out + "</table>\n";
}

// Peak memory from summary.json: per rank class (simulation: the memory model's breakdown) or per
// rank (real run: the allocator's peak), against the GPU's memory.
std::string memory_section(const profiler::RunData& run) {
  if (!run.summary || !run.summary->contains("memory") || !run.summary->at("memory").is_object()) return "";
  const Json& mem = run.summary->at("memory");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const bool has_cap = mem.contains("gpu_memory_bytes") && mem.at("gpu_memory_bytes").is_number();
  const double cap = has_cap ? mem.at("gpu_memory_bytes").get<double>() : 0.0;
  std::string out = "<h3>memory</h3>\n";
  if (has_cap) out += "<p>GPU memory " + detail::fixed(cap / gib, 1) + " GiB";
  if (mem.contains("oom") && mem.at("oom").is_boolean()) {
    out +=
        std::string(has_cap ? "; " : "<p>") + (mem.at("oom").get<bool>() ? "<b>out of memory</b>" : "fits in memory");
  }
  out += "</p>\n<table>\n";
  bool any = false;
  if (mem.contains("classes") && mem.at("classes").is_array() && !mem.at("classes").empty()) {
    std::vector<std::string> parts;
    for (const Json& c : mem.at("classes")) {
      if (!c.contains("breakdown_bytes") || !c.at("breakdown_bytes").is_object()) continue;
      for (const auto& [k, v] : c.at("breakdown_bytes").items()) {
        if (std::find(parts.begin(), parts.end(), k) == parts.end()) parts.push_back(k);
      }
    }
    out += "<tr><th>rank class</th><th>ranks</th><th>peak GiB</th><th>of GPU</th>";
    for (const auto& p : parts) out += "<th>" + xml(p) + " GiB</th>";
    out += "</tr>\n";
    for (const Json& c : mem.at("classes")) {
      const double peak =
          c.contains("peak_bytes") && c.at("peak_bytes").is_number() ? c.at("peak_bytes").get<double>() : 0.0;
      out += "<tr><td>" + xml(c.value("label", std::string("?"))) + "</td><td>" + std::to_string(c.value("ranks", 0)) +
             "</td><td>" + detail::fixed(peak / gib, 2) + "</td><td>" +
             (has_cap && cap > 0 ? detail::fixed(100.0 * peak / cap, 1) + " %" : "n/a") + "</td>";
      for (const auto& p : parts) {
        const Json* v = c.contains("breakdown_bytes") && c.at("breakdown_bytes").contains(p)
                            ? &c.at("breakdown_bytes").at(p)
                            : nullptr;
        out += "<td>" + (v && v->is_number() ? detail::fixed(v->get<double>() / gib, 2) : std::string("")) + "</td>";
      }
      out += "</tr>\n";
      any = true;
    }
  }
  if (mem.contains("measured_peak_bytes_by_rank") && mem.at("measured_peak_bytes_by_rank").is_object() &&
      !mem.at("measured_peak_bytes_by_rank").empty()) {
    out += "<tr><th>rank</th><th>measured peak GiB</th><th>of GPU</th></tr>\n";
    for (const auto& [rank, v] : mem.at("measured_peak_bytes_by_rank").items()) {
      if (!v.is_number()) continue;
      out += "<tr><td>rank " + xml(rank) + "</td><td>" + detail::fixed(v.get<double>() / gib, 2) + "</td><td>" +
             (has_cap && cap > 0 ? detail::fixed(100.0 * v.get<double>() / cap, 1) + " %" : "n/a") + "</td></tr>\n";
      any = true;
    }
  }
  out += "</table>\n";
  return any ? out : "";
}

std::string run_section(std::size_t index, const profiler::RunData& run,
                        const std::vector<std::pair<std::string, std::string>>& scenario_facts) {
  using detail::duration_us;
  const profiler::Summary s = profiler::summarize(run.steps, run.phases, run.names);
  const Analysis an = analyze_run(run);
  std::string out = "<h2>run " + std::to_string(index) + ": " + xml(run.header.source + ":" + run.header.scenario.name) + "</h2>\n";

  std::vector<std::pair<std::string, std::string>> facts = {
      {"run directory", run.dir.string()},
  };
  facts.insert(facts.end(), scenario_facts.begin(), scenario_facts.end());
  facts.insert(facts.end(), {
                                {"source", run.header.source},
                                {"device", run.header.device},
                                {"world size", std::to_string(run.header.world_size)},
                                {"ranks recorded", std::to_string(run.header.ranks.size())},
                                {"steps recorded", std::to_string(s.steps.size())},
                                {"phase records", std::to_string(run.phases.size())},
                                {"step time (critical rank) median / p95",
                                 duration_us(s.step_time_us.median) + " / " + duration_us(s.step_time_us.p95)},
                            });
  if (run.summary) {
    const auto& sm = *run.summary;
    if (sm.contains("steps") && sm["steps"].is_array() && !sm["steps"].empty()) {
      std::vector<double> mfu;
      std::vector<double> tps;
      for (const auto& st : sm["steps"]) {
        if (st.contains("mfu") && st["mfu"].is_number()) mfu.push_back(st["mfu"].get<double>());
        if (st.contains("tokens_per_s") && st["tokens_per_s"].is_number()) tps.push_back(st["tokens_per_s"].get<double>());
      }
      auto med = [](std::vector<double> v) { return profiler::aggregate(v).median; };
      if (!mfu.empty()) facts.emplace_back("MFU (median, summary.json)", detail::fixed(100 * med(mfu), 1) + " %");
      if (!tps.empty()) facts.emplace_back("tokens/s (median, summary.json)", detail::fixed(med(tps), 0));
    }
  }
  if (s.walls_mean) {
    const double total = s.walls_mean->total_us();
    std::string w;
    for (int k = 0; k < 5; ++k) {
      if (k) w += ", ";
      w += std::string(profiler::kWallNames[k]) + " " +
           detail::fixed(total > 0 ? 100 * profiler::wall_value(*s.walls_mean, k) / total : 0, 1) + "%";
    }
    facts.emplace_back("walls (mean step)", w);
  }
  out += kv_table(facts);

  out += "<div class=\"charts\">\n";
  // 1-2. Step time and walls per recorded step; with one recorded step, that step's walls as bars
  // (a line through one point and a single column show nothing).
  if (s.steps.size() == 1) {
    const auto& only = s.steps.front();
    if (only.walls) {
      std::vector<std::string> labels;
      std::vector<double> values;
      std::vector<std::string> colors;
      for (int k = 0; k < 5; ++k) {
        labels.emplace_back(profiler::kWallNames[k]);
        values.push_back(profiler::wall_value(*only.walls, k) * 1e-3);
        colors.emplace_back(wall_color(k));
      }
      out += detail::hbars("Walls of step " + std::to_string(only.step) + " (critical rank; step time " +
                               duration_us(only.step_time_us) + ")",
                           labels, values, colors, "ms", {});
    }
  } else {
    std::vector<std::string> cats;
    std::vector<double> st;
    for (const auto& x : s.steps) {
      cats.push_back(std::to_string(x.step));
      st.push_back(x.step_time_us * 1e-3);
    }
    out += detail::lines("Step time (critical rank)", cats, {{"step time", "#4C72B0", st}}, "ms", "step");
    if (s.walls_mean) {
      std::vector<detail::Series> series;
      for (int k = 0; k < 5; ++k) {
        detail::Series se{profiler::kWallNames[k], wall_color(k), {}};
        for (const auto& x : s.steps) se.values.push_back(x.walls ? profiler::wall_value(*x.walls, k) * 1e-3 : 0.0);
        series.push_back(std::move(se));
      }
      out += detail::stacked_columns("Walls per step (critical rank)", cats, series, "ms", "step");
    }
  }
  double receive_ms = 0.0;
  // 3. Phase breakdown: mean time per rank and step, 15 largest.
  {
    // Posted receives wait for their peer most of their duration: waits, not phase time.
    std::vector<const profiler::PhaseSummary*> ph;
    double receive_total_us = 0.0;
    for (const auto& p : s.phases) {
      if (p.wall == profiler::Wall::communication && profiler::is_receive_phase(p.phase)) {
        receive_total_us += p.dur_us.total;
      } else {
        ph.push_back(&p);
      }
    }
    std::stable_sort(ph.begin(), ph.end(), [](const auto* a, const auto* b) { return a->dur_us.total > b->dur_us.total; });
    if (ph.size() > 15) ph.resize(15);
    const double per = static_cast<double>(std::max<std::size_t>(1, s.steps.size())) *
                       static_cast<double>(std::max<std::size_t>(1, run.header.ranks.size()));
    std::vector<std::string> labels;
    std::vector<double> values;
    std::vector<std::string> colors;
    for (const auto* p : ph) {
      labels.push_back(p->phase);
      values.push_back(p->dur_us.total / per * 1e-3);
      colors.emplace_back(wall_color(p->wall));
    }
    out += detail::hbars("Phase breakdown (15 largest; posted receives are waits, not ranked)", labels, values, colors,
                         "ms per rank and step", wall_legend(4));
    receive_ms = receive_total_us / per * 1e-3;
  }
  // 4. Per-rank view: own time and wait per rank, slow ranks marked.
  {
    std::vector<std::string> ranks;
    detail::Series own{"own", "#4C72B0", {}};
    detail::Series wait{"wait in collectives and pipeline transfers", "#55A868", {}};
    std::vector<bool> mark;
    for (const auto& r : an.ranks) {
      ranks.push_back(std::to_string(r.rank));
      own.values.push_back(r.mean_own_us * 1e-3);
      wait.values.push_back(r.mean_wait_us * 1e-3);
      mark.push_back(find_slow_rank(an, r.rank) != nullptr);
    }
    out += detail::stacked_columns("Per rank: mean own time + wait (slow ranks marked)", ranks, {own, wait}, "ms",
                                   "rank", mark);
    std::vector<std::string> rows;
    for (const auto& r : an.ranks) rows.push_back("rank " + std::to_string(r.rank));
    std::vector<std::string> cols;
    for (int st_ : an.steps) cols.push_back(std::to_string(st_));
    double limit = 5.0;
    for (const auto& row : an.own_excess_pct) {
      for (double v : row) {
        if (std::isfinite(v)) limit = std::max(limit, std::fabs(v));
      }
    }
    limit = std::min(limit, 50.0);
    out += detail::heatmap("Per rank and step: own time vs peers' median", rows, cols, an.own_excess_pct, limit, "%", mark);
  }
  out += "</div>\n";
  if (receive_ms > 0.0) {
    out += "<p>Posted receives (pipeline <code>*recv*</code> phases): " + detail::fixed(receive_ms, 2) +
           " ms per rank and step, summed over every receive. They are posted before their data can arrive and "
           "run alongside the stage's compute, so that time is mostly a wait for the peer stage, not work: it is "
           "not ranked as phase time.</p>\n";
  }
  out += memory_section(run);

  out += "<h3>analyze</h3>\n";
  if (an.slow_ranks.empty()) {
    out += "<p>No rank's own time stands out from its peers in any recorded step.</p>\n";
  }
  for (const auto& sr : an.slow_ranks) {
    out += "<p class=\"finding\">rank " + std::to_string(sr.rank) + " is slow: own time " + detail::pct(sr.own_excess_pct) +
           " over its peers; " +
           (sr.persistent ? std::string("persistent (") : "steps " + std::to_string(sr.first_slow_step) + ".." +
                                                              std::to_string(sr.last_slow_step) + " (") +
           std::to_string(sr.slow_steps.size()) + " of " + std::to_string(sr.recorded_steps) + " recorded steps)";
    if (!sr.phases.empty()) {
      out += "; mostly in " + xml(sr.phases.front().phase) + " (" + detail::pct(sr.phases.front().excess_pct) + ")";
    }
    out += "</p>\n";
  }
  out += "<pre>" + xml(format_analysis_text(an)) + "</pre>\n";
  return out;
}

std::string compare_section(const profiler::RunData& a, const profiler::RunData& b) {
  std::string out = "<h2>run 1 against run 0</h2>\n";
  CompareResult r;
  try {
    r = compare_runs(a, b);
  } catch (const InputError& e) {
    return out + "<p>not comparable: " + xml(e.what()) + "</p>\n";
  }
  out += kv_table({{"matched records", std::to_string(r.matched)},
                   {"only in run 0 / run 1", std::to_string(r.only_in_a.size()) + " / " + std::to_string(r.only_in_b.size())},
                   {"step time median, run 0 / run 1", detail::duration_us(r.step_time_a.median) + " / " +
                                                           detail::duration_us(r.step_time_b.median)},
                   {"step time error (run 1 - run 0) / run 0", detail::pct(r.step_time_error_pct)}});
  out += "<div class=\"charts\">\n";
  if (r.walls_a && r.walls_b) {
    std::vector<detail::Series> series;
    for (int k = 0; k < 5; ++k) {
      series.push_back({profiler::kWallNames[k], wall_color(k),
                        {profiler::wall_value(*r.walls_a, k) * 1e-3, profiler::wall_value(*r.walls_b, k) * 1e-3}});
    }
    out += detail::stacked_columns("Walls, mean step: run 0 vs run 1", {"run 0", "run 1"}, series, "ms", "run");
  }
  std::vector<std::string> labels;
  std::vector<double> values;
  std::vector<std::string> colors;
  for (std::size_t i = 0; i < r.by_phase.size() && labels.size() < 15; ++i) {
    const auto& row = r.by_phase[i];
    if (!row.median_error_pct) continue;
    labels.push_back(row.phase);
    values.push_back(*row.median_error_pct);
    colors.emplace_back(wall_color(row.wall));
  }
  out += detail::hbars("Median error of the 15 largest phases (right: run 1 slower)", labels, values, colors,
                       "% error, (run 1 - run 0) / run 0", wall_legend(4));
  out += "</div>\n<pre>" + xml(format_compare_text(r, 10)) + "</pre>\n";
  return out;
}

}  // namespace

void write_html(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& path,
                const ExportOptions& options) {
  if (runs.empty()) throw InputError("export: no run directory given");
  const std::vector<std::pair<std::string, std::string>> no_facts;
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>threewalls report: " +
                     xml(runs.front()->header.scenario.name) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<h1>threewalls report: " + xml(runs.front()->header.scenario.name) + "</h1>\n";
  html += "<p class=\"meta\">Generated by threewalls " + xml(std::string(tool_version())) + " (" +
          xml(std::string(git_sha())) + ") from " + std::to_string(runs.size()) +
          " run director" + (runs.size() == 1 ? "y" : "ies") +
          ". Walls: the critical rank's step split by precedence compute &gt; memory &gt; communication &gt; host &gt; "
          "bubble (docs/formats/run_dir.md).</p>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    html += run_section(i, *runs[i], i < options.scenario_facts.size() ? options.scenario_facts[i] : no_facts);
  }
  if (runs.size() >= 2) html += compare_section(*runs[0], *runs[1]);
  html += "</body>\n</html>\n";
  detail::OutFile f(path, options.force);
  f.buf() = std::move(html);
  f.close();
}

}  // namespace threewalls::notebooks_export
