#pragma once
// One calibration from start to profile, as `threewalls calibrate` runs it (docs/calibration.md,
// "Running a calibration"): measure the plan's points on this machine's GPUs (measure(), GPU builds
// only), or read an earlier calibration's raw output (load_raw_for_refit), then fit the profile and
// write it with its report (fit_and_write). The CLI only turns flags into CalibrateOptions.
#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/bench/report.hpp"

namespace threewalls::calibration::bench {

struct CalibrateOptions {
  bool quick = false;
  std::string out;       // the profile to write (TOML)
  int gpus = 0;          // 0: every visible GPU
  std::string raw_out;   // folder for points.jsonl, summary.json, summary.txt; empty: none
  std::string only;      // comma-separated groups; empty: all
  std::string gpu_kind;  // when the device name does not say it
  std::string name;      // [profile] name; empty: the GPU kind
  std::string from_raw;  // refit this raw folder or points.jsonl instead of measuring
  std::string scratch_dir = "/tmp";
  double budget_s = 0.0;          // 0: the mode's default
  bool no_fill = false;           // do not fill unmeasured families from the kind's default profile
  std::string fill_from;          // a measured profile of the same kind, ahead of the default
  bool overwrite = false;         // replace an existing `out`
  int host_processes = -1;        // -1: the mode's default (full 5, quick 1)
  std::vector<std::string> argv;  // the command line that reproduces these settings (raw header)
  // How a child process re-runs the host group: this binary followed by these arguments (e.g.
  // {"calibrate"}) and then the child's own flags.
  std::vector<std::string> child_command{"calibrate"};
};

// "--only" groups as a set; InputError on an empty item.
std::set<std::string> parse_only(const std::string& list);

// An earlier calibration's raw output (a --raw-out folder or its points.jsonl) with the host points of
// its host_process_<i> folders merged (the median process's kept), as `--from-raw` refits it.
RawFile load_raw_for_refit(const std::filesystem::path& raw_dir_or_points);

// Fits the records into a profile (the default profile of the kind fills what was not measured unless
// o.no_fill; o.fill_from ahead of it), saves it to o.out, prints the summary, and with o.raw_out writes
// summary.json and summary.txt there. `refit`: the records come from an earlier calibration's raw output.
CalibrationReport fit_and_write(const std::vector<Record>& records, const RawHeader& header, const CalibrateOptions& o,
                                bool refit, std::chrono::steady_clock::time_point started);

// The whole calibration (GPU builds; the measuring part is in the GPU library): refuses an existing
// out without overwrite and a raw_out that already holds points, measures or refits, fits and writes.
// Returns 0.
int calibrate(const CalibrateOptions& o);

}  // namespace threewalls::calibration::bench
