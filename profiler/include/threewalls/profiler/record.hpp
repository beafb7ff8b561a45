#pragma once
// Records of a run directory (docs/formats/run_dir.md): the header of a run, one step record per
// recorded step and rank, one phase record per recorded op. profiler/ depends only on core/, so these
// are its own small structs (no StepGraph types): any C++ training loop can fill them.
//
// Phase, stream and group names are interned: a record holds ids into the string tables of `Names`
// (owned by the writer or the reader), so millions of records cost 88 bytes each and no allocation.
// Times are microseconds in `double` fields suffixed `_us`, exactly as in the files; bytes and FLOPs
// are plain counts. Unit types (core/units.hpp) are used where values cross into models (summary.hpp).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/vocabulary.hpp"

namespace threewalls::profiler {

// What an op was bound by: the core vocabulary's Wall (its names are frozen in the file format).
using threewalls::kNumWalls;
using threewalls::parse_wall;
using threewalls::to_string;
using threewalls::Wall;

// Membership of an op in the coarse view (run_dir.md, `coarse` phase field): the input copies
// (`host_to_device`) and the loss reduction with its host read (`training_metrics`).
enum class CoarseView : std::uint8_t { none, host_to_device, training_metrics };

const char* to_string(CoarseView v);
std::optional<CoarseView> parse_coarse_view(std::string_view s);  // "host_to_device", "training_metrics"

// "absent" for the optional integer fields (written as null or left out).
inline constexpr std::int32_t kAbsent = -1;
// "no name" for the optional interned field `group`.
inline constexpr std::uint32_t kNoName = 0xffffffffU;

// An interning table: each distinct string gets a dense id, in order of first appearance.
class StringTable {
 public:
  std::uint32_t intern(std::string_view s);
  [[nodiscard]] std::optional<std::uint32_t> find(std::string_view s) const;
  [[nodiscard]] const std::string& name(std::uint32_t id) const { return names_[id]; }
  // The name as a JSON string literal, quotes included (what the writer appends).
  [[nodiscard]] const std::string& json(std::uint32_t id) const { return json_[id]; }
  [[nodiscard]] std::size_t size() const { return names_.size(); }
  [[nodiscard]] const std::vector<std::string>& names() const { return names_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> names_;
  std::vector<std::string> json_;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> index_;
};

// The string tables records refer to.
struct Names {
  StringTable phases;
  StringTable streams;
  StringTable groups;
};

// One op on one rank in one step (a "phase line" of phases_rank_<r>.jsonl).
struct PhaseRecord {
  std::int32_t step = 0;
  std::int32_t rank = 0;
  std::uint32_t phase = 0;           // Names::phases
  std::uint32_t stream = 0;          // Names::streams
  std::int32_t layer = kAbsent;      // global layer index; kAbsent = null
  std::int32_t microbatch = kAbsent; // kAbsent = null
  double start_us = 0.0;             // relative to the step's epoch_us on this rank
  double dur_us = 0.0;
  double bytes = 0.0;                // memory traffic, or payload (copies, communication: nccl-tests size)
  double flops = 0.0;
  std::int32_t expert = kAbsent;     // optional: local expert
  std::int32_t peer = kAbsent;       // optional: peer rank of point-to-point ops
  std::uint32_t group = kNoName;     // optional: Names::groups ("tp", "ep", "pp", ...)
  std::int32_t group_id = kAbsent;   // optional: which instance of `group`: its lowest global rank
  std::int64_t tokens = kAbsent;     // optional: tokens handled
  Wall wall = Wall::compute;
  CoarseView coarse = CoarseView::none;
  // Optional (written when > 0; schema 1.1): the first launch_wait_us of a compute- or memory-wall
  // record during which the device waited for the host to launch the op: the record's start marker
  // had run (the stream was idle) before the host's launch call returned. Both executors compute it
  // as clamp(launch returned - record start, 0, dur_us) (docs/formats/run_dir.md); the wall sweep
  // counts that part as host (walls.hpp).
  float launch_wait_us = 0.0F;  // (a float: it fits the padding after `coarse`; µs to 1e-7 relative)

  [[nodiscard]] double end_us() const { return start_us + dur_us; }
};

// One recorded step on one rank.
struct StepRecord {
  std::int32_t step = 0;
  std::int32_t rank = 0;
  double epoch_us = 0.0;  // step start on a clock shared by all ranks of the run
  double dur_us = 0.0;    // from epoch_us to the end of the rank's last op
};

struct ScenarioId {
  std::string name;
  std::string path;
  std::string hash;  // FNV-1a 64 of the scenario file, hex
};

struct ProfileId {
  std::string id;
  std::string path;
  std::string gpu;
};

struct RankClassInfo {
  int id = 0;
  std::string label;
  std::vector<int> ranks;
  int pp_stage = 0;
};

// Header of a run: run.json, and (with rank and rank_class) line 1 of every phases file.
struct RunHeader {
  std::string schema_version;                   // "MAJOR.MINOR"; the writer sets the current one
  std::string run_id;                           // 32 hex digits (1.2); empty in older files; sim: from its inputs
  std::string source;                           // "sim" or "real"
  std::string tool_version;                     // filled by make_header()
  std::string git_sha;
  ScenarioId scenario;
  std::optional<ProfileId> calibration_profile;  // null for real runs
  std::string device;                           // "NVIDIA H100 80GB HBM3" or "simulated h100"
  int world_size = 0;
  std::vector<std::string> argv;
  std::string start_time;                       // ISO 8601 UTC
  std::uint64_t seed = 0;
  OrderedJson settings = OrderedJson::object();  // effective settings; the writer adds "profiler"
  std::vector<RankClassInfo> rank_classes;      // may be empty for loops without a StepGraph
  std::vector<int> ranks;                       // recording ranks (the writer fills it from the policy)

  // The rank class of `rank`, or kAbsent when rank_classes does not list it.
  [[nodiscard]] int rank_class_of(int rank) const;
};

// A header with tool version, git sha, schema version, a run id and start time (now) filled in. The
// run id is new_run_id(), or content_run_id(*content_key) for a run that is a function of its inputs
// (a simulation: the key names all of them).
RunHeader make_header(std::string source, int world_size, std::optional<std::string_view> content_key = std::nullopt);
// A new run id: 128 random bits as 32 lowercase hex digits. Every file of a run directory carries it
// (run.json, each phases file's header and footer, summary.json), so readers tell files of one run
// from files of another.
std::string new_run_id();
// The run id of a run whose inputs `content_key` names: 128 bits of hash of the key as 32 lowercase
// hex digits. The same key gives the same id (byte-identical run directories for the same inputs),
// different keys different ids.
std::string content_run_id(std::string_view content_key);
// The current UTC time as "2026-11-03T14:05:09Z".
std::string iso8601_utc_now();

// JSON forms (run.json, and the per-rank header line) and back. from_json throws InputError naming
// `where` for missing or mistyped fields.
OrderedJson run_json(const RunHeader& h);
RunHeader header_from_json(const Json& j, const std::string& where);

// The header lines of one run's phases files (docs/run_dir.md), formatted once: the fields of
// run_json in its order with "record": "header" first and "rank", "rank_class" (null where no class
// holds the rank) after "world_size". line(rank) costs the same for any world size (a writer of
// 100,000 ranks formats 100,000 of them).
class HeaderLines {
 public:
  explicit HeaderLines(const RunHeader& h);
  [[nodiscard]] std::string line(int rank) const;

 private:
  std::string head_;                // `{"record":"header",...,"world_size":N` without the closing brace
  std::string tail_;                // `,"argv":...}`
  std::vector<int> class_of_rank_;  // rank -> rank class id, kAbsent where no class holds the rank
};

}  // namespace threewalls::profiler
