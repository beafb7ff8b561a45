#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <regex>
#include <set>
#include <thread>
#include <unordered_set>

#include "flat_json.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::profiler {

namespace fs = std::filesystem;

std::pair<int, int> check_schema(const Json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": expected a JSON object");
  auto it = j.find("schema");
  if (it == j.end() || !it->is_string()) {
    throw InputError(where + ": missing field 'schema' (expected \"" + std::string(kRunDirSchemaName) + "\")");
  }
  if (it->get<std::string>() != kRunDirSchemaName) {
    throw InputError(where + ": schema \"" + it->get<std::string>() + "\" is not a run directory (expected \"" +
                     std::string(kRunDirSchemaName) + "\")");
  }
  auto vit = j.find("schema_version");
  if (vit == j.end() || !vit->is_string()) {
    throw InputError(where + ": missing field 'schema_version' (a string \"MAJOR.MINOR\")");
  }
  const std::string v = vit->get<std::string>();
  int major = 0;
  int minor = 0;
  auto dot = v.find('.');
  bool ok = dot != std::string::npos && dot > 0 && dot + 1 < v.size();
  if (ok) {
    auto [p1, e1] = std::from_chars(v.data(), v.data() + dot, major);
    auto [p2, e2] = std::from_chars(v.data() + dot + 1, v.data() + v.size(), minor);
    ok = e1 == std::errc() && e2 == std::errc() && p1 == v.data() + dot && p2 == v.data() + v.size();
  }
  if (!ok) throw InputError(where + ": schema_version \"" + v + "\" is not \"MAJOR.MINOR\"");
  const std::string reads = std::to_string(kRunDirSchemaMajor) + ".x";
  if (major > kRunDirSchemaMajor) {
    throw InputError(where + ": schema " + std::string(kRunDirSchemaName) + " version " + v +
                     " is newer than this threewalls reads (" + reads + ")");
  }
  if (major < kRunDirSchemaMajor) {
    throw InputError(where + ": schema " + std::string(kRunDirSchemaName) + " version " + v +
                     " is older than this threewalls reads (" + reads + ")");
  }
  return {major, minor};
}

std::string RunData::label() const {
  std::string s = header.source + ":" + header.scenario.name;
  s += " (" + dir.string() + ")";
  return s;
}

namespace {

// Field bits of a flat record.
enum Field : std::uint32_t {
  kStep = 1U << 0, kRank = 1U << 1, kPhase = 1U << 2, kLayer = 1U << 3, kMicrobatch = 1U << 4,
  kStream = 1U << 5, kStartUs = 1U << 6, kDurUs = 1U << 7, kWall = 1U << 8, kBytes = 1U << 9,
  kFlops = 1U << 10, kExpert = 1U << 11, kPeer = 1U << 12, kGroup = 1U << 13, kTokens = 1U << 14,
  kCoarse = 1U << 15, kRecord = 1U << 16, kEpochUs = 1U << 17, kGroupId = 1U << 18, kLaunchWaitUs = 1U << 19,
};
constexpr std::uint32_t kPhaseRequired =
    kStep | kRank | kPhase | kLayer | kMicrobatch | kStream | kStartUs | kDurUs | kWall | kBytes | kFlops;
constexpr std::uint32_t kStepRequired = kRecord | kStep | kRank | kEpochUs | kDurUs;

const char* field_name(std::uint32_t bit) {
  switch (bit) {
    case kStep: return "step";
    case kRank: return "rank";
    case kPhase: return "phase";
    case kLayer: return "layer";
    case kMicrobatch: return "microbatch";
    case kStream: return "stream";
    case kStartUs: return "start_us";
    case kDurUs: return "dur_us";
    case kWall: return "wall";
    case kBytes: return "bytes";
    case kFlops: return "flops";
    case kExpert: return "expert";
    case kPeer: return "peer";
    case kGroup: return "group";
    case kTokens: return "tokens";
    case kCoarse: return "coarse";
    case kRecord: return "record";
    case kEpochUs: return "epoch_us";
    case kGroupId: return "group_id";
    case kLaunchWaitUs: return "launch_wait_us";
    default: return "?";
  }
}

// Keys in the order the writer emits them: the reader tries the expected key first.
constexpr std::uint32_t kWriterOrder[] = {kStep,  kRank,  kPhase,  kLayer, kMicrobatch, kStream,
                                          kStartUs, kDurUs, kWall, kBytes, kFlops, kExpert,
                                          kPeer, kGroup, kGroupId, kTokens, kLaunchWaitUs, kCoarse};
constexpr std::string_view kWriterOrderNames[] = {"step",  "rank",  "phase",  "layer", "microbatch", "stream",
                                                  "start_us", "dur_us", "wall", "bytes", "flops", "expert",
                                                  "peer", "group", "group_id", "tokens", "launch_wait_us", "coarse"};
constexpr std::size_t kWriterOrderSize = sizeof kWriterOrder / sizeof kWriterOrder[0];
static_assert(sizeof kWriterOrderNames / sizeof kWriterOrderNames[0] == kWriterOrderSize);

// key == kWriterOrderNames[i], with each comparison against a literal so that the compiler inlines it.
inline bool is_writer_key(std::string_view k, std::size_t i) {
  using namespace std::string_view_literals;
  switch (i) {
    case 0: return k == "step"sv;
    case 1: return k == "rank"sv;
    case 2: return k == "phase"sv;
    case 3: return k == "layer"sv;
    case 4: return k == "microbatch"sv;
    case 5: return k == "stream"sv;
    case 6: return k == "start_us"sv;
    case 7: return k == "dur_us"sv;
    case 8: return k == "wall"sv;
    case 9: return k == "bytes"sv;
    case 10: return k == "flops"sv;
    case 11: return k == "expert"sv;
    case 12: return k == "peer"sv;
    case 13: return k == "group"sv;
    case 14: return k == "group_id"sv;
    case 15: return k == "tokens"sv;
    case 16: return k == "launch_wait_us"sv;
    case 17: return k == "coarse"sv;
    default: return false;
  }
}

const char* field_name(std::uint32_t bit);

std::uint32_t field_bit(std::string_view k) {
  // Ordered by how often the key appears.
  if (k == "step") return kStep;
  if (k == "rank") return kRank;
  if (k == "phase") return kPhase;
  if (k == "layer") return kLayer;
  if (k == "microbatch") return kMicrobatch;
  if (k == "stream") return kStream;
  if (k == "start_us") return kStartUs;
  if (k == "dur_us") return kDurUs;
  if (k == "wall") return kWall;
  if (k == "bytes") return kBytes;
  if (k == "flops") return kFlops;
  if (k == "expert") return kExpert;
  if (k == "peer") return kPeer;
  if (k == "group") return kGroup;
  if (k == "tokens") return kTokens;
  if (k == "coarse") return kCoarse;
  if (k == "record") return kRecord;
  if (k == "epoch_us") return kEpochUs;
  if (k == "group_id") return kGroupId;
  if (k == "launch_wait_us") return kLaunchWaitUs;
  return 0;
}

// Why header `h` (a phases file's) cannot belong to the run of run.json `run`, or "" when it can:
// the run id (schema 1.2), the executor, the scenario's name and hash, the world size, the device.
std::string differs_from_run(const RunHeader& h, const RunHeader& run) {
  auto differ = [](const char* what, const std::string& a, const std::string& b) {
    return std::string(what) + " \"" + a + "\" differs from run.json's \"" + b + "\"";
  };
  if (h.run_id != run.run_id) return differ("run_id", h.run_id, run.run_id);
  if (h.source != run.source) return differ("source", h.source, run.source);
  if (h.scenario.name != run.scenario.name) return differ("scenario name", h.scenario.name, run.scenario.name);
  if (h.scenario.hash != run.scenario.hash) return differ("scenario hash", h.scenario.hash, run.scenario.hash);
  if (h.world_size != run.world_size) {
    return differ("world_size", std::to_string(h.world_size), std::to_string(run.world_size));
  }
  if (h.device != run.device) return differ("device", h.device, run.device);
  return "";
}

// summary.json against run.json and its own layout: the same run (run id, executor, scenario, world
// size), the fields every reader uses present, and every number finite and non-negative (times,
// counts, rates, ratios and ranks are).
void check_summary(const Json& s, const RunHeader& run, const std::string& where) {
  const char* required[] = {"source", "scenario", "world_size", "gpu", "steps", "step_time_us", "memory"};
  for (const char* key : required) {
    if (s.find(key) == s.end()) throw InputError(where + ": missing field '" + key + "'");
  }
  auto mixed = [&](const std::string& why) {
    throw InputError(where + ": belongs to another run than run.json: " + why +
                     " (files of different runs mixed in one directory)");
  };
  auto text = [](const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  const std::string id = s.contains("run_id") ? text(s["run_id"]) : std::string();
  if (id != run.run_id) mixed("run_id \"" + id + "\" differs from run.json's \"" + run.run_id + "\"");
  if (text(s["source"]) != run.source)
    mixed("source " + s["source"].dump() + " differs from run.json's \"" + run.source + "\"");
  const Json& sc = s["scenario"];
  if (!sc.is_object() || !sc.contains("name") || !sc.contains("hash")) {
    throw InputError(where + ": field 'scenario' must be an object with 'name' and 'hash'");
  }
  if (text(sc["name"]) != run.scenario.name) {
    mixed("scenario name " + sc["name"].dump() + " differs from run.json's \"" + run.scenario.name + "\"");
  }
  if (text(sc["hash"]) != run.scenario.hash) {
    mixed("scenario hash " + sc["hash"].dump() + " differs from run.json's \"" + run.scenario.hash + "\"");
  }
  if (!s["world_size"].is_number_integer() || s["world_size"].get<std::int64_t>() != run.world_size) {
    mixed("world_size " + s["world_size"].dump() + " differs from run.json's " + std::to_string(run.world_size));
  }
  if (!s["steps"].is_array()) throw InputError(where + ": field 'steps' must be an array");
  if (!s["step_time_us"].is_object()) throw InputError(where + ": field 'step_time_us' must be an object");
  if (!s["memory"].is_object()) throw InputError(where + ": field 'memory' must be an object");
  // Every number: finite (the writer never writes NaN or infinity; JSON has none) and >= 0.
  std::vector<std::pair<const Json*, std::string>> todo{{&s, ""}};
  while (!todo.empty()) {
    auto [v, path] = todo.back();
    todo.pop_back();
    if (v->is_object()) {
      for (const auto& [k, x] : v->items()) todo.emplace_back(&x, path.empty() ? k : path + "." + k);
    } else if (v->is_array()) {
      for (std::size_t i = 0; i < v->size(); ++i) todo.emplace_back(&(*v)[i], path + "[" + std::to_string(i) + "]");
    } else if (v->is_number() && !(v->get<double>() >= 0.0)) {
      throw InputError(where + ": field '" + path + "' is " + v->dump() + "; allowed: >= 0");
    }
  }
}

struct FileResult {
  int rank = 0;
  fs::path path;
  Json header;
  Names names;
  std::vector<StepRecord> steps;
  std::vector<PhaseRecord> phases;
  std::vector<std::string> warnings;
  std::vector<int> dropped_steps;  // cut short (allow_incomplete)
  bool cut_short = false;          // no footer (allow_incomplete)
  std::exception_ptr error;
};

std::string read_whole(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError(SourceLocation{path.string(), 0, 0}, std::string("cannot open for reading: ") + std::strerror(errno));
  std::string data;
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  if (!ec) data.reserve(static_cast<std::size_t>(size));
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) throw SystemError(path.string() + ": read failed");
  return data;
}

class FileParser {
 public:
  FileParser(FileResult& out, const RunHeader& run, const ReadOptions& options)
      : out_(out), run_(run), options_(options) {}

  void parse() {
    const std::string data = read_whole(out_.path);
    // Lines, with the index of the last non-empty one (a crash cuts the last write short).
    std::vector<std::pair<std::size_t, std::size_t>> lines;  // (offset, length)
    lines.reserve(data.size() / 160 + 4);
    std::size_t pos = 0;
    while (pos < data.size()) {
      auto nl = data.find('\n', pos);
      std::size_t end = nl == std::string::npos ? data.size() : nl;
      lines.emplace_back(pos, end - pos);
      pos = end + 1;
    }
    std::size_t last_nonempty = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (!blank(std::string_view(data).substr(lines[i].first, lines[i].second))) last_nonempty = i + 1;
    }
    if (last_nonempty == 0) throw InputError(SourceLocation{out_.path.string(), 0, 0}, "empty file: no header record");
    out_.phases.reserve(lines.size());
    for (std::size_t i = 0; i < lines.size(); ++i) {
      line_ = static_cast<int>(i + 1);
      std::string_view text = std::string_view(data).substr(lines[i].first, lines[i].second);
      if (blank(text)) continue;
      if (footer_seen_) fail(0, "record after the footer record");
      try {
        if (!header_seen_) {
          parse_header(text);
        } else {
          parse_record(text);
        }
      } catch (const InputError&) {
        bool is_last = i + 1 == last_nonempty;
        if (options_.allow_incomplete && is_last && header_seen_ && corrupt_) {
          out_.warnings.push_back(loc(0) + ": corrupt last line dropped (the write was cut short)");
          break;
        }
        throw;
      }
    }
    if (!footer_seen_) {
      std::string msg = "no footer record: the file was cut short (the run crashed or is still running)";
      if (!options_.allow_incomplete) {
        throw InputError(SourceLocation{out_.path.string(), 0, 0},
                         msg + "; read it anyway with --allow-incomplete");
      }
      out_.warnings.push_back(out_.path.string() + ": " + msg);
      out_.cut_short = true;
      drop_unfinished();
    }
    // Every step with phase records has a step record. In a file cut short, the step in progress
    // has none yet: its records are dropped with a warning (allow_incomplete only).
    for (int s : phase_steps_) {
      if (step_records_.count(s)) continue;
      if (!footer_seen_ && options_.allow_incomplete) {
        auto unfinished = [s](const PhaseRecord& p) { return p.step == s; };
        auto n = std::count_if(out_.phases.begin(), out_.phases.end(), unfinished);
        out_.phases.erase(std::remove_if(out_.phases.begin(), out_.phases.end(), unfinished), out_.phases.end());
        out_.warnings.push_back(out_.path.string() + ": step " + std::to_string(s) + " did not finish (no step record): " +
                                std::to_string(n) + " phase records dropped");
        continue;
      }
      throw InputError(SourceLocation{out_.path.string(), 0, 0},
                       "step " + std::to_string(s) + " has phase records but no step record");
    }
  }

 private:
  static bool blank(std::string_view t) {
    return std::all_of(t.begin(), t.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
  }
  [[nodiscard]] std::string loc(int col) const { return SourceLocation{out_.path.string(), line_, col}.str(); }
  [[noreturn]] void fail(int col, const std::string& what) const {
    throw InputError(SourceLocation{out_.path.string(), line_, col}, what);
  }

  Json full_parse(std::string_view text) {
    try {
      return parse_json(text, loc(0));
    } catch (const Json::parse_error& e) {
      corrupt_ = true;
      fail(static_cast<int>(e.byte), "corrupt or truncated JSON line: " + std::string(e.what()));
    }
  }

  void parse_header(std::string_view text) {
    Json j = full_parse(text);
    auto rec = j.find("record");
    if (!j.is_object() || rec == j.end() || *rec != "header") fail(0, "line 1 must be the header record (\"record\": \"header\")");
    auto [major, minor] = check_schema(j, loc(0));
    minor_ = minor;
    auto rank = j.find("rank");
    if (rank == j.end() || !rank->is_number_integer() || rank->get<std::int64_t>() != out_.rank) {
      fail(0, "header rank " + (rank == j.end() ? std::string("missing") : rank->dump()) + " does not match the file name (rank " +
                  std::to_string(out_.rank) + ")");
    }
    RunHeader h = header_from_json(j, loc(0));
    if (h.world_size != run_.world_size) {
      fail(0, "world_size " + std::to_string(h.world_size) + " differs from run.json's " + std::to_string(run_.world_size));
    }
    if (const std::string why = differs_from_run(h, run_); !why.empty()) {
      fail(0, "this file belongs to another run than run.json: " + why +
                  " (files of different runs mixed in one directory)");
    }
    run_id_ = h.run_id;
    out_.header = std::move(j);
    header_seen_ = true;
  }

  void parse_footer(const Json& j) {
    auto rec = j.find("record");
    if (rec == j.end() || !rec->is_string()) fail(0, "a record with nested values must be the footer record");
    if (*rec == "header") fail(0, "a second header record");
    if (*rec != "footer") fail(0, "unknown record kind " + rec->dump() + "; allowed: \"step\", \"footer\" (phase lines have no 'record')");
    for (const auto& [key, value] : j.items()) {
      if (key != "record" && key != "records" && key != "steps" && !(key == "run_id" && minor_ >= 2) &&
          minor_ <= kRunDirSchemaMinor) {
        fail(0, "footer: unknown field '" + key + "' in a version 1." + std::to_string(minor_) + " file");
      }
    }
    if (minor_ >= 2) {
      auto id = j.find("run_id");
      if (id == j.end() || !id->is_string()) fail(0, "footer: missing string field 'run_id'");
      if (*id != run_id_) {
        fail(0, "footer: run_id " + id->dump() + " differs from the header's \"" + run_id_ +
                    "\" (lines of different runs mixed in one file)");
      }
      for (const auto& [step, count] : phase_count_) {
        if (ended_.count(step) == 0) fail(0, "footer: step " + std::to_string(step) + " has no step_end record");
      }
      for (const auto& [step, unused] : step_records_) {
        if (ended_.count(step) == 0) fail(0, "footer: step " + std::to_string(step) + " has no step_end record");
      }
    }
    auto n = j.find("records");
    if (n == j.end() || !n->is_number_integer()) fail(0, "footer: missing integer field 'records'");
    auto steps = j.find("steps");
    if (steps == j.end() || !steps->is_array()) fail(0, "footer: missing array field 'steps'");
    if (n->get<std::int64_t>() != static_cast<std::int64_t>(out_.phases.size())) {
      fail(0, "footer says " + n->dump() + " phase records, the file holds " + std::to_string(out_.phases.size()));
    }
    std::set<int> covered(phase_steps_.begin(), phase_steps_.end());
    for (const auto& [s, unused] : step_records_) covered.insert(s);
    std::set<int> listed;
    for (const auto& s : *steps) {
      if (!s.is_number_integer()) fail(0, "footer: 'steps' must hold integers");
      listed.insert(s.get<int>());
    }
    if (listed != covered) fail(0, "footer lists steps that differ from the steps the file holds");
    footer_seen_ = true;
  }

  // A number that must be an integer in [lo, hi].
  std::int64_t integer(const detail::FlatValue& v, std::uint32_t bit, std::int64_t lo, std::int64_t hi) {
    if (v.kind != detail::FlatValue::Kind::number || v.number != std::floor(v.number)) {
      fail(0, std::string("field '") + field_name(bit) + "' must be an integer");
    }
    if (v.number < static_cast<double>(lo) || v.number > static_cast<double>(hi)) {
      fail(0, std::string("field '") + field_name(bit) + "' is " + std::to_string(v.number) + "; allowed: " +
                  std::to_string(lo) + ".." + std::to_string(hi));
    }
    return static_cast<std::int64_t>(v.number);
  }
  std::int32_t opt_index(const detail::FlatValue& v, std::uint32_t bit) {
    if (v.kind == detail::FlatValue::Kind::null) return kAbsent;
    return static_cast<std::int32_t>(integer(v, bit, 0, 0x7fffffff));
  }
  double number(const detail::FlatValue& v, std::uint32_t bit, bool non_negative) {
    if (v.kind != detail::FlatValue::Kind::number) fail(0, std::string("field '") + field_name(bit) + "' must be a number");
    if (non_negative && v.number < 0) {
      fail(0, std::string("field '") + field_name(bit) + "' is negative (" + std::to_string(v.number) + "); allowed: >= 0");
    }
    return v.number;
  }
  // Interning with a one-entry cache per table: consecutive records mostly repeat names.
  struct Cached {
    std::string last;
    std::uint32_t id = kNoName;
  };
  static std::uint32_t intern(StringTable& t, Cached& c, std::string_view s) {
    if (c.id != kNoName && s == c.last) return c.id;
    c.id = t.intern(s);
    c.last.assign(s);
    return c.id;
  }
  std::string_view string(const detail::FlatValue& v, std::uint32_t bit) {
    if (v.kind != detail::FlatValue::Kind::string) fail(0, std::string("field '") + field_name(bit) + "' must be a string");
    return v.text;
  }

  // A file cut short (read with allow_incomplete): only whole steps are kept. Schema 1.2: a step is
  // whole once its step_end line is read. Older files cannot tell: the step of the last record read
  // is dropped, as it may have been cut anywhere.
  void drop_unfinished() {
    std::set<int> cut;
    if (minor_ >= 2) {
      for (const auto& [step, count] : phase_count_) {
        if (ended_.count(step) == 0) cut.insert(step);
      }
      for (const auto& [step, unused] : step_records_) {
        if (ended_.count(step) == 0) cut.insert(step);
      }
    } else if (last_record_step_ >= 0) {
      cut.insert(last_record_step_);
    }
    for (int step : cut) {
      const auto n =
          std::count_if(out_.phases.begin(), out_.phases.end(), [&](const PhaseRecord& p) { return p.step == step; });
      out_.phases.erase(
          std::remove_if(out_.phases.begin(), out_.phases.end(), [&](const PhaseRecord& p) { return p.step == step; }),
          out_.phases.end());
      const bool had_step = step_records_.erase(step) > 0;
      out_.steps.erase(
          std::remove_if(out_.steps.begin(), out_.steps.end(), [&](const StepRecord& r) { return r.step == step; }),
          out_.steps.end());
      phase_steps_.erase(std::remove(phase_steps_.begin(), phase_steps_.end(), step), phase_steps_.end());
      out_.warnings.push_back(
          out_.path.string() + ": step " + std::to_string(step) +
          (minor_ >= 2
               ? " was cut short (no step_end record)"
               : " is the last of a schema 1." + std::to_string(minor_) + " file cut short and cannot be told whole") +
          ": its " + (had_step ? "step record and " : "") + std::to_string(n) + " phase records dropped");
      out_.dropped_steps.push_back(step);
    }
  }

  // A record of a step whose step_end line came already (schema 1.2).
  void not_ended(int step) {
    if (ended_.count(step) != 0) fail(0, "a record of step " + std::to_string(step) + " after its step_end record");
  }

  // {"record": "step_end", "step": S, "records": N} (schema 1.2): every record of step S in this file
  // precedes it, N of them phase records.
  void parse_step_end(const Json& j) {
    for (const auto& [key, value] : j.items()) {
      if (key != "record" && key != "step" && key != "records" && minor_ <= kRunDirSchemaMinor) {
        fail(0, "step_end: unknown field '" + key + "' in a version 1." + std::to_string(minor_) + " file");
      }
    }
    auto st = j.find("step");
    auto n = j.find("records");
    if (st == j.end() || !st->is_number_integer() || st->get<std::int64_t>() < 0 ||
        st->get<std::int64_t>() > 0x7fffffff) {
      fail(0, "step_end: missing or bad field 'step' (an integer 0..2147483647)");
    }
    if (n == j.end() || !n->is_number_integer() || n->get<std::int64_t>() < 0) {
      fail(0, "step_end: missing or bad field 'records' (an integer >= 0)");
    }
    const int step = st->get<int>();
    not_ended(step);
    if (step_records_.count(step) == 0)
      fail(0, "step_end of step " + std::to_string(step) + " without its step record");
    const auto it = phase_count_.find(step);
    const std::int64_t have = it == phase_count_.end() ? 0 : static_cast<std::int64_t>(it->second);
    if (n->get<std::int64_t>() != have) {
      fail(0, "step_end of step " + std::to_string(step) + " says " + n->dump() + " phase records, the file holds " +
                  std::to_string(have));
    }
    ended_.insert(step);
    last_phase_step_ = -1;
  }

  void parse_record(std::string_view text) {
    detail::FlatScanner sc(text);
    PhaseRecord p;
    double epoch_us = 0.0;
    std::string_view record_kind;
    std::uint32_t seen = 0;
    std::string_view key;
    detail::FlatValue v;
    if (sc.begin()) {
      std::size_t expect = 0;
      while (sc.next(key, v)) {
        std::uint32_t bit = 0;
        while (expect < kWriterOrderSize && (seen & kWriterOrder[expect])) ++expect;
        if (expect < kWriterOrderSize && is_writer_key(key, expect)) {
          bit = kWriterOrder[expect++];
        } else {
          bit = field_bit(key);
        }
        if (bit == 0) {
          if (minor_ > kRunDirSchemaMinor) continue;  // a field of a newer minor version
          fail(0, "unknown field '" + std::string(key) + "' in a version " + std::to_string(kRunDirSchemaMajor) + "." +
                      std::to_string(minor_) + " file");
        }
        if (seen & bit) fail(0, std::string("field '") + field_name(bit) + "' appears twice");
        seen |= bit;
        switch (bit) {
          case kStep: p.step = static_cast<std::int32_t>(integer(v, bit, 0, 0x7fffffff)); break;
          case kRank: {
            auto r = integer(v, bit, 0, 0x7fffffff);
            if (r != out_.rank) fail(0, "record of rank " + std::to_string(r) + " in the file of rank " + std::to_string(out_.rank));
            p.rank = static_cast<std::int32_t>(r);
            break;
          }
          case kPhase: p.phase = intern(out_.names.phases, phase_cache_, string(v, bit)); break;
          case kLayer: p.layer = opt_index(v, bit); break;
          case kMicrobatch: p.microbatch = opt_index(v, bit); break;
          case kStream: p.stream = intern(out_.names.streams, stream_cache_, string(v, bit)); break;
          case kStartUs: p.start_us = number(v, bit, false); break;
          case kDurUs: p.dur_us = number(v, bit, true); break;
          case kWall: {
            auto w = parse_wall(string(v, bit));
            if (!w) fail(0, "field 'wall' is \"" + std::string(v.text) + "\"; allowed: compute, memory, communication, host");
            p.wall = *w;
            break;
          }
          case kBytes: p.bytes = number(v, bit, true); break;
          case kFlops: p.flops = number(v, bit, true); break;
          case kExpert: p.expert = opt_index(v, bit); break;
          case kPeer: p.peer = opt_index(v, bit); break;
          case kGroup:
            if (v.kind != detail::FlatValue::Kind::null) p.group = intern(out_.names.groups, group_cache_, string(v, bit));
            break;
          case kGroupId: p.group_id = opt_index(v, bit); break;
          case kTokens:
            p.tokens = v.kind == detail::FlatValue::Kind::null ? kAbsent : integer(v, bit, 0, std::int64_t{1} << 53);
            break;
          case kLaunchWaitUs:
            if (minor_ < 1) fail(0, "field 'launch_wait_us' is new in schema 1.1; this file says 1." + std::to_string(minor_));
            p.launch_wait_us = static_cast<float>(number(v, bit, true));
            if (static_cast<double>(p.launch_wait_us) > p.dur_us + 0.001 && (seen & kDurUs)) fail(0, "launch_wait_us exceeds dur_us");
            break;
          case kCoarse: {
            if (v.kind == detail::FlatValue::Kind::null) break;
            auto c = parse_coarse_view(string(v, bit));
            if (!c) fail(0, "field 'coarse' is \"" + std::string(v.text) + "\"; allowed: host_to_device, training_metrics");
            p.coarse = *c;
            break;
          }
          case kRecord:
            record_kind = string(v, bit);
            if (record_kind == "step_end" && minor_ >= 2) {
              parse_step_end(full_parse(text));
              return;
            }
            if (record_kind != "step") {
              // Footer (nested values) or an unexpected kind: parse the whole line.
              Json j = full_parse(text);
              parse_footer(j);
              return;
            }
            break;
          case kEpochUs: epoch_us = number(v, bit, false); break;
          default: break;
        }
      }
    }
    if (!sc.error().empty()) {
      if (sc.nested_seen()) {
        Json j = full_parse(text);
        parse_footer(j);
        return;
      }
      corrupt_ = true;
      fail(sc.column(), "corrupt or truncated record: " + sc.error());
    }
    if (seen & kRecord) {
      if (record_kind == "step") {
        if ((seen & kStepRequired) != kStepRequired) missing(seen, kStepRequired, "step record");
        StepRecord s{p.step, p.rank, epoch_us, p.dur_us};
        if (!(s.dur_us > 0.0)) fail(0, "step record: field 'dur_us' is 0; allowed: > 0 (a step takes time)");
        not_ended(s.step);
        last_record_step_ = s.step;
        if (!step_records_.emplace(s.step, true).second) fail(0, "a second step record for step " + std::to_string(s.step));
        out_.steps.push_back(s);
        return;
      }
      if (record_kind == "footer") {
        Json j = full_parse(text);
        parse_footer(j);
        return;
      }
      if (record_kind == "header") fail(0, "a second header record");
      fail(0, "unknown record kind \"" + std::string(record_kind) + "\"; allowed: \"step\", \"footer\" (phase lines have no 'record')");
    }
    if ((seen & kPhaseRequired) != kPhaseRequired) missing(seen, kPhaseRequired, "phase record");
    if (seen & kEpochUs) fail(0, "field 'epoch_us' belongs to step records, not phase records");
    if (p.step != last_phase_step_) not_ended(p.step);
    last_record_step_ = p.step;
    last_phase_step_ = p.step;
    ++phase_count_[p.step];
    if (phase_steps_.empty() || phase_steps_.back() != p.step) {
      if (std::find(phase_steps_.begin(), phase_steps_.end(), p.step) == phase_steps_.end()) phase_steps_.push_back(p.step);
    }
    out_.phases.push_back(p);
  }

  [[noreturn]] void missing(std::uint32_t seen, std::uint32_t required, const char* what) {
    std::uint32_t lack = required & ~seen;
    std::string names;
    for (std::uint32_t bit = 1; bit != 0 && bit <= kGroupId; bit <<= 1U) {
      if (lack & bit) names += std::string(names.empty() ? "" : ", ") + "'" + field_name(bit) + "'";
    }
    fail(0, std::string(what) + " lacks field(s) " + names);
  }

  FileResult& out_;
  const RunHeader& run_;
  const ReadOptions& options_;
  int line_ = 0;
  int minor_ = 0;
  bool header_seen_ = false;
  bool footer_seen_ = false;
  bool corrupt_ = false;
  std::vector<int> phase_steps_;
  std::unordered_map<int, bool> step_records_;
  std::map<int, std::size_t> phase_count_;  // phase records per step
  std::set<int> ended_;                     // steps whose step_end line was read (1.2)
  int last_phase_step_ = -1;
  int last_record_step_ = -1;
  std::string run_id_;
  Cached phase_cache_;
  Cached stream_cache_;
  Cached group_cache_;
};

}  // namespace

RunData RunDirReader::read(const fs::path& dir, const ReadOptions& options) {
  RunData data;
  data.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": not a run directory (no such directory)");
  const fs::path run_path = dir / "run.json";
  if (!fs::exists(run_path, ec)) throw InputError(run_path.string() + ": missing; not a run directory");
  data.run_json = read_json_file(run_path);
  std::tie(data.schema_major, data.schema_minor) = check_schema(data.run_json, run_path.string());
  data.header = header_from_json(data.run_json, run_path.string());
  if (data.run_json.find("ranks") == data.run_json.end()) throw InputError(run_path.string() + ": missing field 'ranks'");

  // phases_rank_<r>.jsonl files against run.json's recording ranks.
  static const std::regex kPhases(R"(phases_rank_([0-9]+)\.jsonl)");
  std::vector<FileResult> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, kPhases)) continue;
    FileResult f;
    const std::string digits = m[1].str();
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), f.rank);
    if (err != std::errc() || end != digits.data() + digits.size()) {
      throw InputError(e.path().string() + ": rank " + digits + " in the file name is out of range (0..2147483647)");
    }
    f.path = e.path();
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const FileResult& a, const FileResult& b) { return a.rank < b.rank; });
  std::vector<int> present;
  for (const auto& f : files) present.push_back(f.rank);
  std::vector<int> listed = data.header.ranks;
  std::sort(listed.begin(), listed.end());
  for (int r : listed) {
    if (!std::binary_search(present.begin(), present.end(), r)) {
      throw InputError((dir / ("phases_rank_" + std::to_string(r) + ".jsonl")).string() +
                       ": missing; run.json lists rank " + std::to_string(r) + " as recording");
    }
  }
  for (const auto& f : files) {
    if (!std::binary_search(listed.begin(), listed.end(), f.rank)) {
      throw InputError(f.path.string() + ": rank " + std::to_string(f.rank) + " is not among run.json's recording ranks");
    }
  }

  // Parse files in parallel; errors are rethrown in rank order so the report is deterministic.
  unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads) : std::thread::hardware_concurrency();
  threads = std::max(1U, std::min<unsigned>(threads, static_cast<unsigned>(files.size())));
  std::atomic<std::size_t> next{0};
  auto work = [&]() {
    for (std::size_t i = next++; i < files.size(); i = next++) {
      try {
        FileParser(files[i], data.header, options).parse();
      } catch (...) {
        files[i].error = std::current_exception();
      }
    }
  };
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  for (auto& f : files) {
    if (f.error) std::rethrow_exception(f.error);
  }
  // Only whole steps are kept: a step cut short on one rank is dropped on every rank.
  std::string dropped_note;
  std::set<int> dropped;
  for (const auto& f : files) dropped.insert(f.dropped_steps.begin(), f.dropped_steps.end());
  if (std::any_of(files.begin(), files.end(), [](const FileResult& f) { return f.cut_short; })) {
    // Every recording rank records the same steps: a step that a file cut short does not hold (it
    // died before writing it) is not whole either.
    std::map<int, std::size_t> holders;
    for (const auto& f : files) {
      std::set<int> held;
      for (const auto& r : f.steps) held.insert(r.step);
      for (int step : held) ++holders[step];
    }
    for (const auto& [step, n] : holders) {
      if (n != files.size()) dropped.insert(step);
    }
  }
  if (!dropped.empty()) {
    std::set<int> kept;
    for (auto& f : files) {
      auto cut = [&](int step) { return dropped.count(step) != 0; };
      const auto phases =
          std::count_if(f.phases.begin(), f.phases.end(), [&](const PhaseRecord& p) { return cut(p.step); });
      const auto steps =
          std::count_if(f.steps.begin(), f.steps.end(), [&](const StepRecord& r) { return cut(r.step); });
      if (phases + steps > 0) {
        f.phases.erase(
            std::remove_if(f.phases.begin(), f.phases.end(), [&](const PhaseRecord& p) { return cut(p.step); }),
            f.phases.end());
        f.steps.erase(std::remove_if(f.steps.begin(), f.steps.end(), [&](const StepRecord& r) { return cut(r.step); }),
                      f.steps.end());
        f.warnings.push_back(f.path.string() + ": " + std::to_string(steps) + " step record(s) and " +
                             std::to_string(phases) + " phase records of steps cut short on another rank dropped");
      }
      for (const auto& r : f.steps) kept.insert(r.step);
    }
    data.dropped_steps.assign(dropped.begin(), dropped.end());
    std::string list;
    for (int step : dropped) list += (list.empty() ? "" : ", ") + std::to_string(step);
    dropped_note = dir.string() + ": kept " + std::to_string(kept.size()) + " whole step(s); dropped " +
                   std::to_string(dropped.size()) + " step(s) cut short (" + list + ")";
  }

  // Merge, remapping each file's name ids into the run's tables.
  std::size_t total_phases = 0;
  std::size_t total_steps = 0;
  for (const auto& f : files) {
    total_phases += f.phases.size();
    total_steps += f.steps.size();
  }
  data.phases.reserve(total_phases);
  data.steps.reserve(total_steps);
  for (auto& f : files) {
    auto remap = [](const StringTable& from, StringTable& to) {
      std::vector<std::uint32_t> m(from.size());
      for (std::uint32_t i = 0; i < from.size(); ++i) m[i] = to.intern(from.name(i));
      return m;
    };
    auto ph = remap(f.names.phases, data.names.phases);
    auto st = remap(f.names.streams, data.names.streams);
    auto gr = remap(f.names.groups, data.names.groups);
    for (auto p : f.phases) {
      p.phase = ph[p.phase];
      p.stream = st[p.stream];
      if (p.group != kNoName) p.group = gr[p.group];
      data.phases.push_back(p);
    }
    data.steps.insert(data.steps.end(), f.steps.begin(), f.steps.end());
    data.rank_headers.emplace(f.rank, std::move(f.header));
    for (auto& w : f.warnings) data.warnings.push_back(std::move(w));
    std::vector<PhaseRecord>().swap(f.phases);
  }
  if (!dropped_note.empty()) data.warnings.push_back(dropped_note);

  if (options.read_summary) {
    const fs::path sp = dir / "summary.json";
    if (fs::exists(sp, ec)) {
      Json s = read_json_file(sp);
      check_schema(s, sp.string());
      check_summary(s, data.header, sp.string());
      data.summary = std::move(s);
    }
  }
  return data;
}

}  // namespace threewalls::profiler
