#pragma once
// Writing and reading run directories (docs/formats/run_dir.md). Both executors write through
// RunDirWriter; compare, analyze, export and every test read through RunDirReader.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/sampling.hpp"

namespace threewalls::profiler {

// The directory name a scenario name gives when no output directory is chosen (`out/sim/<name>`): one
// path component of ASCII letters, digits, '.', '-' and '_' (every other byte becomes '_'), without
// leading dots (so never "." or ".."), at most 96 bytes; "run" when nothing is left. A scenario name
// therefore never places a run outside the directory it is put under.
std::string run_dir_name(std::string_view scenario_name);

// The lock file of a run directory: the writer that creates a run holds an exclusive flock on it
// from before it removes an old run until its destructor, and removes it then. A second writer into
// the same directory is refused while the first runs.
inline constexpr std::string_view kRunDirLockFile = ".threewalls.lock";

// Whether `dir` holds a run directory: a run.json whose "schema" is "threewalls.run_dir". Only such
// a directory is ever emptied by `overwrite`.
bool is_run_dir(const std::filesystem::path& dir);

// Checks that a new run may be written to `dir` (writer mode create), before any work: throws
// InputError naming the path when it cannot be used (a name the system refuses, e.g. too long; an
// existing file that is not a directory), when it exists and is not empty (unless `overwrite`), and
// when `overwrite` is asked for a non-empty directory that is not a run directory (is_run_dir).
// `remedy` ends the refusal of a non-empty directory (a command line names its own flags).
void check_run_dir_target(const std::filesystem::path& dir, bool overwrite,
                          std::string_view remedy = "choose another directory, or overwrite it explicitly");

struct WriterOptions {
  enum class Mode : std::uint8_t {
    create,  // create the directory; refuse an existing non-empty one unless `overwrite`
    join,    // the directory exists (another process of the run created it): only add phases files
  };
  Mode mode = Mode::create;
  // Replace an existing run directory: its run.json, summary.json and phases_rank_*.jsonl are removed
  // first (other files are left alone). Without it an existing non-empty directory is an InputError,
  // as nccl-tests never overwrites results; with it a non-empty directory that is not a run directory
  // (is_run_dir) is still one.
  bool overwrite = false;
  // Ranks whose phases files this writer owns; empty = every recording rank of the policy (one
  // process writing for all ranks, as the simulator does). A multi-process run gives its own rank.
  std::vector<int> local_ranks;
  // Write run.json (one process of a multi-process run does; `join` writers usually do not).
  bool write_run_json = true;
  // Keep every accepted record in memory (kept_steps(), kept_phases()) for SummaryBuilder.
  bool keep_records = true;
};

// Writes one run directory. Records are formatted by hand into a per-rank buffer as they arrive
// (about 0.2 us per record) and written to disk when the policy says flush_after(step), at close(),
// or when the buffers of all its ranks together exceed 8 MiB (a file's bytes do not depend on when
// they are written out; a simulation writing for every rank holds 8 MiB, not 8 MiB per rank).
//
// Not thread-safe: one thread adds records to one writer. With a disabled policy it creates nothing
// (no directory, no file) and every call returns at once.
//
// Crash semantics: the destructor writes out buffered records but no footer unless close() was
// called, so a run that dies by an exception leaves files that readers report as cut short.
class RunDirWriter {
 public:
  // Creates `dir` (mode create; check_run_dir_target, then the lock file) and run.json, and opens
  // phases_rank_<r>.jsonl with its header line for every local recording rank. Throws InputError for
  // what check_run_dir_target refuses, a directory another writer holds locked, or a missing one in
  // `join` mode; SystemError for I/O failures.
  RunDirWriter(std::filesystem::path dir, RunHeader header, SamplingPolicy policy, WriterOptions options = {});
  ~RunDirWriter();
  RunDirWriter(const RunDirWriter&) = delete;
  RunDirWriter& operator=(const RunDirWriter&) = delete;

  [[nodiscard]] bool enabled() const { return policy_.enabled(); }
  [[nodiscard]] const SamplingPolicy& policy() const { return policy_; }
  [[nodiscard]] const RunHeader& header() const { return header_; }
  [[nodiscard]] const std::filesystem::path& dir() const { return dir_; }

  // Intern names once (e.g. for every phase of a StepGraph) and put the ids into records.
  [[nodiscard]] Names& names() { return names_; }
  [[nodiscard]] const Names& names() const { return names_; }
  std::uint32_t phase_id(std::string_view name) { return names_.phases.intern(name); }
  std::uint32_t stream_id(std::string_view name) { return names_.streams.intern(name); }
  std::uint32_t group_id(std::string_view name) { return names_.groups.intern(name); }

  // Whether this writer records step `step` on rank `rank` (policy, and the rank is local).
  [[nodiscard]] bool records(int step, int rank) const {
    return policy_.records(step) && is_local(rank);
  }

  // Add a record. Records the policy does not select (step, rank, granularity) are not written and
  // the call returns false: that is sampling, by design. Records after close() throw SystemError.
  bool add(const StepRecord& r);
  bool add(const PhaseRecord& r);
  // add() of each of the phase records of one rank's step (every record's rank and step are the
  // first one's; a std::logic_error otherwise), in order. Returns how many were written.
  std::size_t add(std::span<const PhaseRecord> rs);

  // Call after every step (recorded or not), once every record of `step` is added: ends the step in
  // each file that holds records of it with a step_end line (the step's phase record count; a
  // reader keeps a step only with it), then writes buffered records out when the policy says so. A
  // record of a step that has ended is a SystemError.
  void end_step(int step);
  // Writes summary.json (nothing when disabled).
  void write_summary(const OrderedJson& summary);
  // Ends the steps still open (the run is whole), writes buffered records, a footer on every file,
  // and closes them. Idempotent.
  void close();

  [[nodiscard]] const std::vector<StepRecord>& kept_steps() const { return kept_steps_; }
  [[nodiscard]] const std::vector<PhaseRecord>& kept_phases() const { return kept_phases_; }
  [[nodiscard]] std::size_t phase_records_written() const;

 private:
  struct RankFile {
    int rank = 0;
    std::filesystem::path path;
    std::FILE* file = nullptr;
    std::string buffer;
    std::size_t phase_records = 0;
    std::vector<int> steps;  // steps covered, in arrival order (deduplicated at close)
    std::map<int, std::size_t> open_steps;  // steps with records but no step_end line yet: phase records
    std::vector<int> ended_steps;           // steps whose step_end line is written
  };
  [[nodiscard]] bool is_local(int rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < file_of_rank_.size() &&
           file_of_rank_[static_cast<std::size_t>(rank)] >= 0;
  }
  RankFile& file_of(int rank) { return files_[static_cast<std::size_t>(file_of_rank_[static_cast<std::size_t>(rank)])]; }
  // Writes f's buffer to its file. With more recorded ranks than the process may keep files open
  // (reopen_each_write_), the file is opened for the write (append) and closed after it.
  void write_out(RankFile& f);
  // f's buffer, ready for appending: an empty one takes the storage of a buffer written out before
  // (spare_), so that a world of many files does not allocate, grow and fault in fresh pages for each.
  std::string& buffer_of(RankFile& f);
  // `bytes` were appended to a buffer: writes every buffer out when they hold more than the bound.
  void appended(std::size_t bytes);
  void note_step(RankFile& f, int step);
  void end_step_lines(int step);
  void release_lock();

  std::filesystem::path dir_;
  bool reopen_each_write_ = false;
  RunHeader header_;
  SamplingPolicy policy_;
  WriterOptions options_;
  Names names_;
  std::vector<RankFile> files_;
  std::size_t buffered_ = 0;       // bytes in the buffers of files_, together
  std::vector<std::string> spare_;  // storage of written-out buffers (empty strings)
  std::size_t spare_capacity_ = 0;  // their capacities together, at most kMaxSpare
  std::vector<int> file_of_rank_;  // world-sized; -1 = not written here
  std::vector<StepRecord> kept_steps_;
  std::vector<PhaseRecord> kept_phases_;
  int lock_fd_ = -1;  // the lock file's descriptor while this writer holds it (mode create)
  bool closed_ = false;
};

// Appends one phase line (no newline) to `out`: the hot path of the writer, exposed for benchmarks.
void append_phase_line(std::string& out, const PhaseRecord& r, const Names& names);
void append_step_line(std::string& out, const StepRecord& r);

struct ReadOptions {
  // false (default): a phases file without footer is an InputError. true: it is read, a warning is
  // added to RunData::warnings, a corrupt *last* line of such a file (the write the crash cut short)
  // is dropped with a warning, and only whole steps are kept: a step without its step_end line (an
  // older file: the step of its last record) is dropped on every rank, and a warning says how many
  // steps were kept and dropped (RunData::dropped_steps). A corrupt line anywhere else is always an
  // error.
  bool allow_incomplete = false;
  // Read summary.json when present.
  bool read_summary = true;
  // Threads for parsing phases files (0 = hardware concurrency, at most 2 on CI).
  int threads = 0;
};

// Everything in a run directory.
struct RunData {
  std::filesystem::path dir;
  RunHeader header;              // from run.json
  Json run_json;                 // run.json as read (fields of newer minor versions included)
  std::map<int, Json> rank_headers;  // header line of each phases file, by rank
  int schema_major = 0;
  int schema_minor = 0;
  Names names;
  std::vector<StepRecord> steps;    // by rank, then file order
  std::vector<PhaseRecord> phases;  // by rank, then file order
  std::optional<Json> summary;      // summary.json, when present and asked for
  std::vector<std::string> warnings;  // "phases_rank_3.jsonl: no footer: ..." (allow_incomplete only)
  std::vector<int> dropped_steps;     // steps cut short on some rank, dropped on all (allow_incomplete only)

  [[nodiscard]] const std::vector<int>& ranks() const { return header.ranks; }
  [[nodiscard]] std::string label() const;  // "sim:mixtral_8x7b (out/run1)"
};

class RunDirReader {
 public:
  // Reads and checks a run directory. Throws InputError naming the file (and line for JSONL) for:
  // a missing run.json, a schema name that is not threewalls.run_dir, an unknown major version
  // ("... version 2.0 is newer than this threewalls reads (1.x)"), a corrupt or truncated line, a
  // phase record missing a field or with a bad value (naming the allowed values), a record of another
  // rank, a missing footer (unless allow_incomplete), a footer whose count disagrees with the file,
  // a phases file missing for a recording rank listed in run.json or present for one not listed.
  static RunData read(const std::filesystem::path& dir, const ReadOptions& options = {});
};

// Parses "MAJOR.MINOR" and checks it against this build (kRunDirSchemaMajor/Minor). Throws
// InputError naming `where`, the schema and the version when the major is unknown.
std::pair<int, int> check_schema(const Json& j, const std::string& where);

}  // namespace threewalls::profiler
