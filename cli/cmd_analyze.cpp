// threewalls analyze RUN: which rank is slow, in which phase, who waits in collectives, and whether the
// slowness persists (docs/compare_analyze_export.md).
#include <iostream>

#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/analyze.hpp"

namespace threewalls::cli {

void register_analyze(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand(
      "analyze", "Find slow ranks (robust z-score of their own time among their pipeline-stage peers), the phases "
                 "they are slow in, the steps it lasts, and who waits in collectives.");
  static std::string run;
  static std::string json_path;
  static bool allow_incomplete = false;
  static double z = 3.5;
  static double min_excess_pct = 5.0;
  sub->add_option("RUN", run, "Run directory")->required();
  sub->add_option("--json", json_path, "Also write the analysis as JSON to this file");
  sub->add_option("--z", z, "Robust z-score above which a rank's own time is an outlier among its peers")
      ->check(CLI::PositiveNumber);
  sub->add_option("--min-excess-pct", min_excess_pct, "... and at least this many percent above the peers' median")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--allow-incomplete", allow_incomplete,
                "Read a run that was cut short (no footer); what is dropped is reported");
  cmds.add(sub, [] {
    profiler::ReadOptions ro;
    ro.allow_incomplete = allow_incomplete;
    profiler::RunData data = profiler::RunDirReader::read(run, ro);
    for (const auto& w : data.warnings) std::cerr << "warning: " << w << "\n";
    notebooks_export::AnalyzeOptions o;
    o.outlier_z = z;
    o.min_excess = min_excess_pct / 100.0;
    auto a = notebooks_export::analyze_run(data, o);
    std::cout << notebooks_export::format_analysis_text(a);
    if (!json_path.empty()) write_json_file(json_path, notebooks_export::analysis_json(a));
    return kExitOk;
  });
}

}  // namespace threewalls::cli
