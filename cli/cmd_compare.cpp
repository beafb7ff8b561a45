// threewalls compare A B: run B against run A (the reference), record for record (docs/compare_analyze_export.md).
#include <iostream>

#include "command.hpp"
#include "threewalls/calibration/host_probe_scale.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/compare.hpp"

namespace threewalls::cli {

namespace {

// The real run's host probe against the simulation's profile, when one side is each and the profile
// still loads; empty otherwise (a profile that broke since the simulation is a warning).
std::optional<notebooks_export::HostProbeLine> host_probe_line(const profiler::RunData& a, const profiler::RunData& b) {
  const auto pair = notebooks_export::find_host_probe_pair(a, b);
  if (!pair) return std::nullopt;
  std::optional<calibration::HostProbeScale> hs;
  try {
    hs = calibration::host_probe_scale_from_profile(pair->probe, pair->profile, pair->sim_host_scale);
  } catch (const Error& e) {
    std::cerr << "warning: host probe not compared with the simulation's profile: " << e.what() << "\n";
    return std::nullopt;
  }
  if (!hs) return std::nullopt;
  return notebooks_export::HostProbeLine{pair->real_side, *hs, pair->sim_host_scale, pair->profile};
}

}  // namespace

void register_compare(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand(
      "compare",
      "Compare run B against run A (the reference): per phase, layer and micro-batch median and p95, errors "
      "(B - A) / A, step time, walls, peak memory; records on one side only are listed. With a real run on one "
      "side and a simulation on the other, also the real run's host probe against the simulation's profile.");
  static std::string a;
  static std::string b;
  static std::string json_path;
  static double fail_above = -1;
  static bool allow_incomplete = false;
  static std::size_t top = 15;
  sub->add_option("A", a, "Reference run directory (e.g. the measured run)")->required();
  sub->add_option("B", b, "Run directory compared with A (e.g. the simulated run)")->required();
  sub->add_option("--json", json_path, "Also write every row and every one-sided key as JSON to this file");
  sub->add_option("--fail-above", fail_above,
                  "Exit 1 when |error| exceeds PCT percent for the step-time median, the median of any phase with "
                  ">= 5% of A's time, or peak memory")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--top", top, "Rows of the per-layer / per-micro-batch tables and one-sided keys shown in the text")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--allow-incomplete", allow_incomplete,
                "Read runs that were cut short (no footer); what is dropped is reported");
  cmds.add(sub, [] {
    profiler::ReadOptions ro;
    ro.allow_incomplete = allow_incomplete;
    profiler::RunData ra = profiler::RunDirReader::read(a, ro);
    profiler::RunData rb = profiler::RunDirReader::read(b, ro);
    for (const auto* r : {&ra, &rb}) {
      for (const auto& w : r->warnings) std::cerr << "warning: " << w << "\n";
    }
    notebooks_export::CompareOptions o;
    if (fail_above >= 0) o.fail_above_pct = fail_above;
    auto result = notebooks_export::compare_runs(ra, rb, o);
    for (const auto& d : result.different_scenarios)
      std::cerr << "warning: A and B are different scenarios: " << d << "\n";
    for (const auto& m : result.missing_summary) std::cerr << "warning: " << m << "\n";
    result.host_probe = host_probe_line(ra, rb);
    std::cout << notebooks_export::format_compare_text(result, top);
    if (!json_path.empty()) write_json_file(json_path, notebooks_export::compare_json(result));
    return result.failed() ? kExitFailure : kExitOk;
  });
}

}  // namespace threewalls::cli
