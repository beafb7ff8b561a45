#include "threewalls/profiler/record.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <random>

#include "threewalls/core/error.hpp"
#include "threewalls/core/hash.hpp"
#include "threewalls/core/version.hpp"

namespace threewalls::profiler {

const char* to_string(CoarseView v) {
  switch (v) {
    case CoarseView::none: return "none";
    case CoarseView::host_to_device: return "host_to_device";
    case CoarseView::training_metrics: return "training_metrics";
  }
  return "?";
}

std::optional<CoarseView> parse_coarse_view(std::string_view s) {
  if (s == "host_to_device") return CoarseView::host_to_device;
  if (s == "training_metrics") return CoarseView::training_metrics;
  return std::nullopt;
}

std::uint32_t StringTable::intern(std::string_view s) {
  if (auto it = index_.find(s); it != index_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(names_.size());
  names_.emplace_back(s);
  std::string j;
  append_json_string(j, s);
  json_.push_back(std::move(j));
  index_.emplace(std::string(s), id);
  return id;
}

std::optional<std::uint32_t> StringTable::find(std::string_view s) const {
  if (auto it = index_.find(s); it != index_.end()) return it->second;
  return std::nullopt;
}

int RunHeader::rank_class_of(int rank) const {
  for (const auto& c : rank_classes) {
    if (std::find(c.ranks.begin(), c.ranks.end(), rank) != c.ranks.end()) {
      return c.id;
    }
  }
  return kAbsent;
}

std::string iso8601_utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string new_run_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

std::string content_run_id(std::string_view content_key) {
  return hex64(fnv1a64(content_key)) + hex64(fnv1a64(content_key, 0x9e3779b97f4a7c15ULL));
}

RunHeader make_header(std::string source, int world_size, std::optional<std::string_view> content_key) {
  RunHeader h;
  h.schema_version = std::to_string(kRunDirSchemaMajor) + "." + std::to_string(kRunDirSchemaMinor);
  h.run_id = content_key ? content_run_id(*content_key) : new_run_id();
  h.source = std::move(source);
  h.tool_version = std::string(tool_version());
  h.git_sha = std::string(git_sha());
  h.world_size = world_size;
  h.start_time = iso8601_utc_now();
  return h;
}

namespace {

void common_fields(OrderedJson& j, const RunHeader& h) {
  j["schema"] = std::string(kRunDirSchemaName);
  j["schema_version"] = h.schema_version.empty()
                            ? std::to_string(kRunDirSchemaMajor) + "." + std::to_string(kRunDirSchemaMinor)
                            : h.schema_version;
  if (!h.run_id.empty()) j["run_id"] = h.run_id;
  j["source"] = h.source;
  j["tool_version"] = h.tool_version;
  j["git_sha"] = h.git_sha;
  j["scenario"] = OrderedJson{{"name", h.scenario.name}, {"path", h.scenario.path}, {"hash", h.scenario.hash}};
  if (h.calibration_profile) {
    j["calibration_profile"] = OrderedJson{{"id", h.calibration_profile->id},
                                           {"path", h.calibration_profile->path},
                                           {"gpu", h.calibration_profile->gpu}};
  } else {
    j["calibration_profile"] = nullptr;
  }
  j["device"] = h.device;
  j["world_size"] = h.world_size;
}

void tail_fields(OrderedJson& j, const RunHeader& h) {
  j["argv"] = h.argv;
  j["start_time"] = h.start_time;
  j["seed"] = h.seed;
  j["settings"] = h.settings;
}

// Typed field access with errors naming the file and the field.
const Json& field(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) throw InputError(where + ": missing field '" + key + "'");
  return *it;
}

std::string str_field(const Json& j, const char* key, const std::string& where) {
  const Json& v = field(j, key, where);
  if (!v.is_string()) throw InputError(where + ": field '" + key + "' must be a string, not " + v.dump());
  return v.get<std::string>();
}

// An integer that fits an int (ranks, sizes, ids): a larger one is an error, never truncated.
int int32_value(const Json& v, const std::string& what, const std::string& where) {
  if (!v.is_number_integer()) throw InputError(where + ": field '" + what + "' must hold integers, not " + v.dump());
  const bool too_big = v.is_number_unsigned() ? v.get<std::uint64_t>() > 0x7fffffffU : false;
  const auto x = too_big ? std::int64_t{0} : v.get<std::int64_t>();
  if (too_big || x < -0x7fffffffLL - 1 || x > 0x7fffffffLL) {
    throw InputError(where + ": field '" + what + "' is " + v.dump() + "; allowed: -2147483648..2147483647");
  }
  return static_cast<int>(x);
}

int int32_field(const Json& j, const char* key, const std::string& where) {
  return int32_value(field(j, key, where), key, where);
}

std::vector<int> int_list(const Json& v, const std::string& what, const std::string& where) {
  if (!v.is_array()) throw InputError(where + ": field '" + what + "' must be an array of integers");
  std::vector<int> out;
  for (const auto& e : v) out.push_back(int32_value(e, what, where));
  return out;
}

// The fields a header (a phases file's line 1, or run.json) of this build's versions may hold.
constexpr std::array<std::string_view, 19> kHeaderFields = {
    "record",      "schema",   "schema_version",      "run_id", "source",     "tool_version",
    "git_sha",     "scenario", "calibration_profile", "device", "world_size", "rank",
    "rank_class",  "argv",     "start_time",          "seed",   "settings",   "ranks",
    "rank_classes"};

// The minor version of "MAJOR.MINOR" (check_schema has accepted it), or -1.
int minor_of(const std::string& version) {
  const auto dot = version.find('.');
  int minor = -1;
  if (dot == std::string::npos) return -1;
  std::from_chars(version.data() + dot + 1, version.data() + version.size(), minor);
  return minor;
}

}  // namespace

OrderedJson run_json(const RunHeader& h) {
  OrderedJson j = OrderedJson::object();
  common_fields(j, h);
  tail_fields(j, h);
  j["ranks"] = h.ranks;
  OrderedJson classes = OrderedJson::array();
  for (const auto& c : h.rank_classes) {
    classes.push_back(OrderedJson{{"id", c.id}, {"label", c.label}, {"ranks", c.ranks}, {"pp_stage", c.pp_stage}});
  }
  j["rank_classes"] = std::move(classes);
  return j;
}

HeaderLines::HeaderLines(const RunHeader& h) {
  OrderedJson head = OrderedJson::object();
  head["record"] = "header";
  common_fields(head, h);
  head_ = head.dump();
  head_.pop_back();  // the closing brace: rank and rank_class follow
  OrderedJson tail = OrderedJson::object();
  tail_fields(tail, h);
  tail_ = tail.dump();
  tail_[0] = ',';
  class_of_rank_.assign(static_cast<std::size_t>(std::max(h.world_size, 0)), kAbsent);
  for (const auto& c : h.rank_classes) {
    for (int r : c.ranks) {
      if (r < 0 || r >= h.world_size) continue;
      int& cls = class_of_rank_[static_cast<std::size_t>(r)];
      if (cls == kAbsent) cls = c.id;  // the first class that holds the rank, as rank_class_of
    }
  }
}

std::string HeaderLines::line(int rank) const {
  const int cls = rank >= 0 && static_cast<std::size_t>(rank) < class_of_rank_.size()
                      ? class_of_rank_[static_cast<std::size_t>(rank)]
                      : kAbsent;
  std::string out;
  out.reserve(head_.size() + tail_.size() + 40);
  out += head_;
  out += ",\"rank\":";
  out += std::to_string(rank);
  out += ",\"rank_class\":";
  out += cls == kAbsent ? std::string("null") : std::to_string(cls);
  out += tail_;
  return out;
}

RunHeader header_from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": the header must be a JSON object");
  RunHeader h;
  h.schema_version = str_field(j, "schema_version", where);
  const int minor = minor_of(h.schema_version);
  if (minor >= 0 && minor <= kRunDirSchemaMinor) {
    // A file of a version this build knows: an unknown field is a typo or a corruption, not data.
    for (const auto& [key, value] : j.items()) {
      if (std::find(kHeaderFields.begin(), kHeaderFields.end(), key) == kHeaderFields.end()) {
        throw InputError(where + ": unknown field '" + key + "' in a version " + h.schema_version + " header");
      }
    }
  }
  if (auto it = j.find("run_id"); it != j.end()) {
    if (minor >= 0 && minor < 2)
      throw InputError(where + ": field 'run_id' is new in schema 1.2; this file says " + h.schema_version);
    h.run_id = str_field(j, "run_id", where);
    if (h.run_id.empty()) throw InputError(where + ": field 'run_id' is empty");
  } else if (minor >= 2) {
    throw InputError(where + ": missing field 'run_id' (schema 1.2 and later name the run in every file)");
  }
  h.source = str_field(j, "source", where);
  if (h.source != "sim" && h.source != "real") {
    throw InputError(where + ": field 'source' is \"" + h.source + "\"; allowed: \"sim\", \"real\"");
  }
  h.tool_version = str_field(j, "tool_version", where);
  h.git_sha = str_field(j, "git_sha", where);
  const Json& sc = field(j, "scenario", where);
  if (!sc.is_object()) throw InputError(where + ": field 'scenario' must be an object");
  h.scenario.name = str_field(sc, "name", where + ": scenario");
  h.scenario.path = str_field(sc, "path", where + ": scenario");
  h.scenario.hash = str_field(sc, "hash", where + ": scenario");
  const Json& cp = field(j, "calibration_profile", where);
  if (cp.is_object()) {
    h.calibration_profile = ProfileId{str_field(cp, "id", where + ": calibration_profile"),
                                      str_field(cp, "path", where + ": calibration_profile"),
                                      str_field(cp, "gpu", where + ": calibration_profile")};
  } else if (!cp.is_null()) {
    throw InputError(where + ": field 'calibration_profile' must be an object or null");
  }
  h.device = str_field(j, "device", where);
  h.world_size = int32_field(j, "world_size", where);
  if (h.world_size <= 0) throw InputError(where + ": field 'world_size' must be positive, not " + std::to_string(h.world_size));
  const Json& argv = field(j, "argv", where);
  if (!argv.is_array()) throw InputError(where + ": field 'argv' must be an array of strings");
  for (const auto& a : argv) {
    if (!a.is_string()) throw InputError(where + ": field 'argv' must hold strings");
    h.argv.push_back(a.get<std::string>());
  }
  h.start_time = str_field(j, "start_time", where);
  const Json& seed = field(j, "seed", where);
  if (!seed.is_number_integer()) throw InputError(where + ": field 'seed' must be an integer");
  h.seed = seed.get<std::uint64_t>();
  const Json& settings = field(j, "settings", where);
  if (!settings.is_object()) throw InputError(where + ": field 'settings' must be an object");
  h.settings = OrderedJson::parse(settings.dump());
  if (auto it = j.find("ranks"); it != j.end()) {
    h.ranks = int_list(*it, "ranks", where);
    for (int r : h.ranks) {
      if (r < 0 || r >= h.world_size) {
        throw InputError(where + ": field 'ranks' holds rank " + std::to_string(r) + ", outside the world (0.." +
                         std::to_string(h.world_size - 1) + ")");
      }
    }
  }
  if (auto it = j.find("rank_classes"); it != j.end()) {
    if (!it->is_array()) throw InputError(where + ": field 'rank_classes' must be an array");
    for (const auto& c : *it) {
      RankClassInfo info;
      info.id = int32_field(c, "id", where + ": rank_classes");
      info.label = str_field(c, "label", where + ": rank_classes");
      info.ranks = int_list(field(c, "ranks", where + ": rank_classes"), "rank_classes[].ranks", where);
      info.pp_stage = int32_field(c, "pp_stage", where + ": rank_classes");
      h.rank_classes.push_back(std::move(info));
    }
  }
  return h;
}

}  // namespace threewalls::profiler

// Records stay small: a million of them is 88 MB in memory.
static_assert(sizeof(threewalls::profiler::PhaseRecord) <= 88, "PhaseRecord grew: keep it compact");
