#pragma once
// `threewalls export RUN... --format perfetto|csv|notebook|html --out PATH`: one or more run
// directories into a Perfetto/Chrome trace, tidy CSV, a Jupyter notebook or a self-contained HTML
// report. Formats: docs/compare_analyze_export.md.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::notebooks_export {

enum class ExportFormat : std::uint8_t { perfetto, csv, notebook, html };
const char* to_string(ExportFormat f);
// Throws InputError listing the allowed formats.
ExportFormat parse_export_format(const std::string& s);

struct ExportOptions {
  // Replace existing output files. Without it an existing output is an InputError (outputs, like
  // run directories, are never overwritten silently).
  bool force = false;
  // The HTML report: per run (in the order of the runs), rows of the run's table that need its scenario
  // (the model, the parallel layout), which the run directory does not hold; empty or shorter: none.
  std::vector<std::vector<std::pair<std::string, std::string>>> scenario_facts;
};

// Chrome Trace Event Format JSON (opens in https://ui.perfetto.dev and chrome://tracing):
//   pid = run_index * kPidStride + rank, process name "run <i> <source>:<scenario> rank <r>";
//   tid 0 = the rank's steps, tid 1 + k = stream k (thread_name = the stream's name);
//   one "X" event per phase record (ts = epoch_us + start_us, dur = dur_us, both microseconds; cat =
//   wall; args: step, layer, microbatch, expert, bytes, flops, peer, group, group_id, tokens) and one
//   per step record; "M" metadata events name and order processes and threads.
inline constexpr int kPidStride = 100000;
void write_perfetto(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& out,
                    const ExportOptions& options = {});

// Tidy CSV into directory `dir` (created): runs.csv, phases.csv (one row per phase record), steps.csv
// (one row per step record), walls.csv (one row per run and step: critical rank and the five walls).
// Every row starts with the run index; empty cells are absent values.
void write_csv(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& dir,
               const ExportOptions& options = {});

// A Jupyter notebook (`out`, .ipynb) plus its data (the CSVs above) in `<out stem>_data/` next to it.
// It loads the CSVs with pandas and draws with matplotlib: walls per step, phase breakdown, simulated
// vs measured per-record scatter (two or more runs), per-rank heatmap, timeline of one step.
void write_notebook(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& out,
                    const ExportOptions& options = {});

// A self-contained HTML report (inline SVG, no scripts, no external fonts): for each run its scenario's
// model and layout (ExportOptions::scenario_facts), step time and walls per step (one recorded step: that
// step's walls), the phase breakdown (posted receives, which mostly wait for their peer, reported as
// waits and not ranked), a per-rank view, peak memory per rank class or rank against the GPU's memory,
// analyze's findings; with two runs compare's headline and the signed error of the largest phases.
void write_html(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& out,
                const ExportOptions& options = {});

}  // namespace threewalls::notebooks_export
