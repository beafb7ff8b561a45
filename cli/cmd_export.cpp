// threewalls export RUN... --format perfetto|csv|notebook|html --out PATH (docs/compare_analyze_export.md).
#include <iostream>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"

namespace threewalls::cli {

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
