#pragma once
// The result of one calibration point, and the raw output file that keeps every one of them
// (`<raw-out>/points.jsonl`, format: docs/formats/calibration_raw.md). A failed or skipped point is
// a record too (status "error" / "skipped" with the reason): a sweep never ends at a failed point,
// and nothing measured is lost.
#include <filesystem>
#include <string>
#include <vector>

#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/jsonl.hpp"

namespace threewalls::calibration::bench {

inline constexpr const char* kRawFormat = "threewalls.calibration_raw";
inline constexpr const char* kRawFormatVersion = "1.0";

enum class Status { ok, error, skipped };
const char* to_string(Status s);

struct Record {
  PointSpec point;
  Status status = Status::ok;
  std::string error;              // why, when status != ok
  std::vector<double> samples_s;  // seconds per run; each sample is the mean over `reps` runs
  int reps = 1;                   // back-to-back runs per sample
  std::string stop;               // StopReason of the stop rule
  double rel_ci = 0.0;            // CI half-width of the median, relative (stop_rule.hpp)
  double wall_s = 0.0;            // wall time spent on the point (warm-up, samples, check)
  std::string check;              // what the correctness check found ("passed: ...")
  std::vector<Param> metrics;     // derived rates: tflop_per_s, gb_per_s, algbw_gb_per_s, busbw_gb_per_s, ...

  // Median / p10 / p90 of the samples with the raw samples (Measurement::from_samples).
  [[nodiscard]] Measurement measurement() const;
  [[nodiscard]] double median_s() const;
  [[nodiscard]] bool usable() const { return status == Status::ok && !samples_s.empty(); }
};

// Rates of a measured point (TFLOP/s for compute, GB/s for bytes, nccl-tests algbw/busbw for
// collectives), from its definitions in plan.hpp.
std::vector<Param> derived_metrics(const PointSpec& p, double median_s);

// The raw file's header: what was run, where, when.
struct RawHeader {
  std::string tool_version;
  std::string git_sha;
  std::string mode;     // "quick" / "full"
  std::string started;  // ISO 8601 UTC
  std::vector<std::string> argv;
  Hardware hardware;
  std::string topology;  // raw `nvidia-smi topo -m` text (or why it is missing)
  int gpus_used = 1;
};

OrderedJson to_json(const Record& r);
OrderedJson to_json(const RawHeader& h);
OrderedJson to_json(const Hardware& h);

// Reads a points.jsonl. Throws InputError naming file:line and the key for a malformed line, an
// unknown format or a major version this reader does not know.
struct RawFile {
  RawHeader header;
  std::vector<Record> records;
};
RawFile read_raw(const std::filesystem::path& path);

// Host costs in several processes. On the H100 VMs a process's host is 0.94-1.55 times as
// fast as another's, steadily for the process's life (docs/validation/host_overhead.md), so one
// process's host points are one draw. `threewalls calibrate` measures the host group again in
// `others.size()` child processes (raw: RAW/host_process_<i>/points.jsonl); for every usable record
// of the host group in `main`, the record of the process whose median is the median over the
// processes that measured the point (the upper middle for an even count) takes its place, its check
// extended by every process's median. Records of other groups and points no other process measured
// stay as they are. Returns how many records were compared over more than one process.
std::size_t merge_host_processes(std::vector<Record>& main, const std::vector<std::vector<Record>>& others);
// A usable record of the host group: what merge_host_processes compares across processes.
[[nodiscard]] bool is_host_point(const Record& r);
// The raw folders of those child processes under `raw_dir`, in process order (empty: none).
std::vector<std::filesystem::path> host_process_dirs(const std::filesystem::path& raw_dir);
// A refit's side of it: reads the host_process_<i> folders under `raw_dir` and merges them into
// `records`. Returns the processes that measured the host group (1: no folders).
int merge_host_process_dirs(const std::filesystem::path& raw_dir, std::vector<Record>& records);

}  // namespace threewalls::calibration::bench
