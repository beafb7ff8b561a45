// threewalls export RUN... --format perfetto|csv|notebook|html --out PATH (docs/compare_analyze_export.md).
#include <filesystem>
#include <iostream>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/summary_lines.hpp"

namespace threewalls::cli {

namespace {

// The report rows a run directory cannot give: its scenario's model and layout, from the scenario file
// run.json names (as the run's command line gave it: relative to the working directory), when that file
// is still there unchanged.
std::vector<std::pair<std::string, std::string>> scenario_facts(const profiler::RunData& run) {
  const std::string& path = run.header.scenario.path;
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) {
    return {{"model, layout", "not shown: the scenario file " + path + " is not found from here"}};
  }
  try {
    const scenarios::Scenario s = scenarios::load_scenario(path);
    if (!run.header.scenario.hash.empty() && s.content_hash != run.header.scenario.hash) {
      return {{"model, layout", "not shown: " + path + " has changed since the run"}};
    }
    return {{"model", scenarios::model_line(s)}, {"layout", scenarios::layout_line(s)}};
  } catch (const InputError& e) {
    return {{"model, layout", std::string("not shown: ") + e.what()}};
  }
}

}  // namespace

void register_export(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand(
      "export", "Export run directories as a Perfetto/Chrome trace, tidy CSV, a Jupyter notebook or a "
                "self-contained HTML report.");
  static std::vector<std::string> runs;
  static std::string format;
  static std::string out;
  static bool overwrite = false;
  static bool allow_incomplete = false;
  sub->add_option("RUN", runs, "Run directories (several: side by side; the first is the reference)")->required();
  sub->add_option("--format", format, "perfetto (trace JSON), csv (a directory of CSVs), notebook (.ipynb and its "
                                      "CSVs), html (one self-contained file)")
      ->required();
  sub->add_option("--out", out, "Output file (perfetto, notebook, html) or directory (csv)")->required();
  add_overwrite_flag(sub, overwrite, "Replace existing output files");
  sub->add_flag("--allow-incomplete", allow_incomplete,
                "Read runs that were cut short (no footer); what is dropped is reported");
  cmds.add(sub, [] {
    const auto fmt = notebooks_export::parse_export_format(format);  // before reading: fail fast
    profiler::ReadOptions ro;
    ro.allow_incomplete = allow_incomplete;
    std::vector<profiler::RunData> data;
    data.reserve(runs.size());
    for (const auto& r : runs) {
      data.push_back(profiler::RunDirReader::read(r, ro));
      for (const auto& w : data.back().warnings) std::cerr << "warning: " << w << "\n";
    }
    std::vector<const profiler::RunData*> ptrs;
    for (const auto& d : data) ptrs.push_back(&d);
    notebooks_export::ExportOptions o;
    o.force = overwrite;
    if (fmt == notebooks_export::ExportFormat::html) {
      for (const auto& d : data) o.scenario_facts.push_back(scenario_facts(d));
    }
    switch (fmt) {
      case notebooks_export::ExportFormat::perfetto: notebooks_export::write_perfetto(ptrs, out, o); break;
      case notebooks_export::ExportFormat::csv: notebooks_export::write_csv(ptrs, out, o); break;
      case notebooks_export::ExportFormat::notebook: notebooks_export::write_notebook(ptrs, out, o); break;
      case notebooks_export::ExportFormat::html: notebooks_export::write_html(ptrs, out, o); break;
    }
    std::cout << "wrote " << out << " (" << notebooks_export::to_string(fmt) << ", " << runs.size() << " run(s))\n";
    return kExitOk;
  });
}

}  // namespace threewalls::cli
