#include "threewalls/scenarios/loader.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "threewalls/core/hash.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "validate.hpp"

namespace threewalls::scenarios {

ScenarioError::ScenarioError(std::vector<std::string> messages)
    : InputError(join(messages, "\n")), messages_(std::move(messages)) {}

void ErrorList::add(const SourceLocation& where, const std::string& message) {
  messages_.push_back({where.line, where.column, where.str() + ": " + message});
}

void ErrorList::throw_if_any() const {
  if (messages_.empty()) return;
  auto sorted = messages_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  std::vector<std::string> texts;
  texts.reserve(sorted.size());
  for (auto& e : sorted) texts.push_back(std::move(e.text));
  throw ScenarioError(std::move(texts));
}

namespace {

SourceLocation loc_of(const std::string& file, const toml::source_region& r) {
  return SourceLocation{file, static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
}

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

std::string table_label(const std::string& table) { return table.empty() ? "[top level]" : "[" + table + "]"; }

// Checks a choice value, including "name:N" patterns.
bool choice_ok(const std::string& v, const std::vector<std::string>& choices) {
  for (const auto& c : choices) {
    if (c == v) return true;
    auto colon = c.find(":N");
    if (colon != std::string::npos && colon + 2 == c.size() && v.size() > colon + 1 &&
        v.compare(0, colon + 1, c, 0, colon + 1) == 0) {
      auto digits = v.substr(colon + 1);
      if (!digits.empty() && digits.size() <= 4 &&
          std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
          std::stoi(digits) >= 1) {
        return true;
      }
    }
  }
  return false;
}

class Loader {
 public:
  Loader(std::string file, LoadedScenario& out) : file_(std::move(file)), out_(out) {}

  void load(std::string_view text) {
    if (std::all_of(text.begin(), text.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; })) {
      errors_.add({file_, 1, 1}, "the file is empty; a scenario needs at least schema_version = " +
                                      std::to_string(kScenarioSchemaVersion) + " and the [model], [parallel], "
                                      "[train] or [infer], and [cluster] tables");
      errors_.throw_if_any();
    }
    if (text.find('\0') != std::string_view::npos) {
      auto pos = text.find('\0');
      errors_.add(location_of_offset(text, pos), "not a TOML text file (contains a NUL byte)");
      errors_.throw_if_any();
    }
    toml::table root;
    try {
      root = toml::parse(text, file_);
    } catch (const toml::parse_error& e) {
      errors_.add(loc_of(file_, e.source()), "malformed TOML: " + std::string(e.description()));
      errors_.throw_if_any();
    }
    check_schema_version(root);
    walk_table(root, "", {file_, 1, 1}, 0);
    apply_missing("", {file_, 1, 1}, 0, false);
    // Missing tables.
    std::set<std::string> present_tables;
    for (const auto& [k, v] : out_.locations) present_tables.insert(k);
    // Absent optional tables that create nothing still get their defaults (e.g. no [run] table).
    for (const auto& t : Registry::instance().tables()) {
      if (t.is_array || t.on_present || present_tables.count(t.path)) continue;
      auto dot = t.path.rfind('.');
      std::string parent = dot == std::string::npos ? std::string() : t.path.substr(0, dot);
      const auto* pt = parent.empty() ? nullptr : Registry::instance().find_table(parent);
      if (pt && pt->on_present && !present_tables.count(parent)) continue;
      apply_defaults_only(t.path);
    }
    for (const auto& t : Registry::instance().tables()) {
      if (t.required && !present_tables.count(t.path)) {
        errors_.add({file_, 1, 1}, "missing required table [" + t.path + "] (" + t.description + ")");
      }
    }
    if (!present_tables.count("train") && !present_tables.count("infer")) {
      errors_.add({file_, 1, 1}, "missing table: a scenario needs exactly one of [train] or [infer]");
    }
    errors_.throw_if_any();
  }

 private:
  SourceLocation location_of_offset(std::string_view text, std::size_t pos) const {
    int line = 1;
    int col = 1;
    for (std::size_t i = 0; i < pos && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return {file_, line, col};
  }

  void check_schema_version(const toml::table& root) {
    const auto* node = root.get("schema_version");
    if (!node) {
      errors_.add({file_, 1, 1}, "[top level] missing required key 'schema_version' (this threewalls reads " +
                                     std::to_string(kScenarioSchemaVersion) + "; add 'schema_version = " +
                                     std::to_string(kScenarioSchemaVersion) + "' at the top)");
      errors_.throw_if_any();
    }
    if (const auto* i = node->as_integer(); i && i->get() != kScenarioSchemaVersion) {
      errors_.add(loc_of(file_, node->source()),
                  "[top level] unknown schema_version " + std::to_string(i->get()) + ": this threewalls (" +
                      std::string(tool_version()) + ") reads schema_version " +
                      std::to_string(kScenarioSchemaVersion) + (i->get() > kScenarioSchemaVersion ? " (the file is from a newer threewalls)" : ""));
      errors_.throw_if_any();
    }
  }

  // Walks one table (or one element of an array of tables).
  void walk_table(const toml::table& tbl, const std::string& path, const SourceLocation& where, std::size_t index) {
    const Registry& reg = Registry::instance();
    for (auto&& [k, node] : tbl) {
      std::string key(k.str());
      std::string full = path.empty() ? key : path + "." + key;
      SourceLocation kloc = loc_of(file_, k.source());
      if (kloc.line == 0) kloc = loc_of(file_, node.source());
      if (const auto* ts = reg.find_table(full)) {
        enter_table(*ts, node, kloc);
        continue;
      }
      const ParamSpec* ps = reg.find_param(full);
      if (!ps) {
        unknown_key(path, key, kloc, node);
        continue;
      }
      std::string loc_key = array_element_path(path, index) + (path.empty() ? "" : ".") + key;
      if (path.empty()) loc_key = key;
      out_.locations[loc_key] = kloc;
      Value v;
      if (parse_value(*ps, node, kloc, v)) {
        try {
          ps->set(out_.scenario, v, index);
        } catch (const std::exception& e) {
          errors_.add(kloc, table_label(path) + " '" + key + "': " + e.what());
        }
      }
    }
    (void)where;
  }

  std::string array_element_path(const std::string& path, std::size_t index) const {
    const auto* ts = Registry::instance().find_table(path);
    if (ts && ts->is_array) return path + "[" + std::to_string(index) + "]";
    return path;
  }

  void enter_table(const TableSpec& ts, const toml::node& node, const SourceLocation& kloc) {
    for (const auto& other : ts.exclusive_with) {
      if (out_.locations.count(other)) {
        errors_.add(kloc, "[" + ts.path + "] cannot be used together with [" + other + "] (written at " +
                              out_.locations[other].str() + "); a scenario is either training or inference");
        return;
      }
    }
    if (ts.is_array) {
      const auto* arr = node.as_array();
      if (!arr || !arr->is_array_of_tables()) {
        errors_.add(kloc, "'" + ts.path + "' must be an array of tables, written [[" + ts.path + "]], not " +
                              toml_type_name(node.type()));
        return;
      }
      out_.locations[ts.path] = kloc;
      std::size_t i = 0;
      for (const auto& elem : *arr) {
        if (ts.on_present) ts.on_present(out_.scenario);
        SourceLocation eloc = loc_of(file_, elem.source());
        out_.locations[ts.path + "[" + std::to_string(i) + "]"] = eloc;
        walk_table(*elem.as_table(), ts.path, eloc, i);
        apply_missing(ts.path, eloc, i, true);
        ++i;
      }
      return;
    }
    const auto* t = node.as_table();
    if (!t) {
      errors_.add(kloc, "'" + ts.path + "' must be a table ([" + ts.path + "]), not " + toml_type_name(node.type()));
      out_.locations[ts.path] = kloc;  // written, though wrongly: no second "missing required table" error
      return;
    }
    if (ts.on_present) ts.on_present(out_.scenario);
    SourceLocation tloc = loc_of(file_, t->source());
    if (tloc.line == 0) tloc = kloc;
    out_.locations[ts.path] = tloc;
    walk_table(*t, ts.path, tloc, 0);
    apply_missing(ts.path, tloc, 0, false);
  }

  void unknown_key(const std::string& path, const std::string& key, const SourceLocation& kloc,
                   const toml::node& node) {
    const Registry& reg = Registry::instance();
    auto allowed = reg.children(path);
    std::string msg = table_label(path) + " unknown " + (node.is_table() ? "table" : "key") + " '" + key + "'";
    // A key that exists verbatim in another table was most likely put in the wrong table; say so
    // before guessing a typo (short keys such as 'tp' are otherwise "near" unrelated ones like 'gpu').
    std::vector<std::string> elsewhere;
    for (const auto& p : reg.params()) {
      if (p.key() != key) continue;
      // Appended piece by piece: GCC 12's "literal" + string&& inlines a memcpy it then flags (-Wrestrict).
      std::string where = "the top level";
      if (!p.table().empty()) where.assign("[").append(p.table()).append("]");
      elsewhere.push_back(std::move(where));
    }
    if (!elsewhere.empty()) {
      msg += " ('" + key + "' belongs in " + join(elsewhere, " or ") + ")";
    } else if (auto near = nearest(key, allowed)) {
      msg += " (did you mean '" + *near + "'?)";
    }
    msg += "; allowed here: " + join(allowed);
    errors_.add(kloc, msg);
  }

  void apply_missing(const std::string& table, const SourceLocation& tloc, std::size_t index, bool in_array) {
    const Registry& reg = Registry::instance();
    std::string prefix = in_array ? table + "[" + std::to_string(index) + "]" : table;
    for (const auto* p : reg.params_in(table)) {
      std::string loc_key = prefix.empty() ? p->key() : prefix + "." + p->key();
      if (out_.locations.count(loc_key)) continue;
      if (p->required) {
        // schema_version is checked earlier with its own message.
        if (p->path == "schema_version") continue;
        errors_.add(tloc, table_label(table) + " missing required key '" + p->key() + "' (" + p->unit_hint() +
                              "): " + p->description);
        continue;
      }
      if (p->default_toml.empty()) continue;  // derived in validation
      Value v;
      if (!parse_default(*p, v)) {
        errors_.add(tloc, "internal error: bad registry default for " + p->path);
        continue;
      }
      p->set(out_.scenario, v, index);
    }
  }

  void apply_defaults_only(const std::string& table) {
    for (const auto* p : Registry::instance().params_in(table)) {
      if (p->required || p->default_toml.empty()) continue;
      Value v;
      if (parse_default(*p, v)) p->set(out_.scenario, v, 0);
    }
  }

  bool parse_default(const ParamSpec& p, Value& v) {
    try {
      v = parse_literal(p, p.default_toml, {"<registry>", 1, 1});
      return true;
    } catch (const ScenarioError&) {
      return false;
    }
  }

 public:
  // One value of `p` written as a TOML literal; errors are recorded (file_ names the source).
  bool parse_literal_value(const ParamSpec& p, std::string_view literal, const SourceLocation& where, Value& out) {
    toml::table doc;
    try {
      doc = toml::parse("x = " + std::string(literal), file_);
    } catch (const toml::parse_error& e) {
      errors_.add(where, table_label(p.table()) + " '" + p.key() + "': malformed TOML value " + std::string(literal) +
                             ": " + std::string(e.description()));
      return false;
    }
    return parse_value(p, *doc.get("x"), where, out);
  }
  void throw_if_any() const { errors_.throw_if_any(); }

 private:
  // Parses `node` according to `p`; on error records it and returns false.
  bool parse_value(const ParamSpec& p, const toml::node& node, const SourceLocation& where, Value& out) {
    std::string label = table_label(p.table()) + " '" + p.key() + "'";
    auto type_error = [&](const std::string& expected) {
      errors_.add(where, label + " must be " + expected + ", not " + toml_type_name(node.type()) +
                             describe_literal(node));
      return false;
    };
    auto range_check = [&](double d) {
      if ((p.min && d < *p.min) || (p.max && d > *p.max)) {
        std::ostringstream os;
        os << label << " = " << p.format_value(d) << " is out of range; allowed: ";
        if (p.min && p.max)
          os << p.format_value(*p.min) << " to " << p.format_value(*p.max);
        else if (p.min)
          os << ">= " << p.format_value(*p.min);
        else
          os << "<= " << p.format_value(*p.max);
        errors_.add(where, os.str());
        return false;
      }
      return true;
    };
    switch (p.type) {
      case ParamType::integer: {
        const auto* i = node.as_integer();
        if (!i) return type_error("an integer");
        if (!range_check(static_cast<double>(i->get()))) return false;
        if (i->get() > 2147483647LL || i->get() < -2147483648LL) {
          if (p.path != "run.seed") {
            errors_.add(where, label + " = " + std::to_string(i->get()) + " is too large");
            return false;
          }
        }
        out = i->get();
        return true;
      }
      case ParamType::real: {
        double d = 0;
        if (const auto* f = node.as_floating_point()) d = f->get();
        else if (const auto* i = node.as_integer()) d = static_cast<double>(i->get());
        else return type_error("a number");
        if (!std::isfinite(d)) {
          errors_.add(where, label + " must be a finite number");
          return false;
        }
        if (!range_check(d)) return false;
        out = d;
        return true;
      }
      case ParamType::boolean: {
        const auto* b = node.as_boolean();
        if (!b) return type_error("true or false");
        out = b->get();
        return true;
      }
      case ParamType::string: {
        const auto* s = node.as_string();
        if (!s) return type_error("a string");
        out = s->get();
        return true;
      }
      case ParamType::choice: {
        const auto* s = node.as_string();
        if (!s) return type_error("a string, one of " + join(p.choices, ", ", true));
        if (!choice_ok(s->get(), p.choices)) {
          std::string msg = label + " = " + threewalls::quoted(s->get()) + " is not allowed; allowed: " + join(p.choices, ", ", true);
          if (auto n = nearest(s->get(), p.choices)) msg += " (did you mean " + threewalls::quoted(*n) + "?)";
          errors_.add(where, msg);
          return false;
        }
        out = s->get();
        return true;
      }
      case ParamType::choice_list: {
        const auto* a = node.as_array();
        if (!a) return type_error("an array of strings from " + join(p.choices, ", ", true));
        std::vector<std::string> items;
        bool ok = true;
        for (const auto& e : *a) {
          const auto* s = e.as_string();
          SourceLocation eloc = loc_of(file_, e.source());
          if (!s) {
            errors_.add(eloc, label + " elements must be strings from " + join(p.choices, ", ", true));
            ok = false;
            continue;
          }
          if (!choice_ok(s->get(), p.choices)) {
            std::string msg = label + " element " + threewalls::quoted(s->get()) + " is not allowed; allowed: " +
                              join(p.choices, ", ", true);
            if (auto n = nearest(s->get(), p.choices)) msg += " (did you mean " + threewalls::quoted(*n) + "?)";
            errors_.add(eloc, msg);
            ok = false;
            continue;
          }
          if (std::find(items.begin(), items.end(), s->get()) != items.end()) {
            errors_.add(eloc, label + " lists " + threewalls::quoted(s->get()) + " twice");
            ok = false;
            continue;
          }
          items.push_back(s->get());
        }
        if (ok) out = items;
        return ok;
      }
      case ParamType::int_list: {
        const auto* a = node.as_array();
        if (!a) return type_error("an array of integers");
        std::vector<std::int64_t> items;
        for (const auto& e : *a) {
          const auto* i = e.as_integer();
          if (!i || i->get() < 0 || i->get() > 1000000) {
            errors_.add(loc_of(file_, e.source()), label + " elements must be non-negative integers");
            return false;
          }
          items.push_back(i->get());
        }
        out = items;
        return true;
      }
      case ParamType::rank_list: {
        if (const auto* s = node.as_string()) {
          if (std::find(kRankListWords.begin(), kRankListWords.end(), s->get()) == kRankListWords.end()) {
            errors_.add(where, label + " = " + threewalls::quoted(s->get()) +
                                   " is not allowed; allowed: " + rank_list_allowed());
            return false;
          }
          out = s->get();
          return true;
        }
        const auto* a = node.as_array();
        if (!a) return type_error(rank_list_allowed());
        if (a->empty()) {
          errors_.add(where, label + " = [] names no rank; allowed: " + rank_list_allowed() +
                                 " (a non-empty one; to record nothing, set run.profiler.enabled = false)");
          return false;
        }
        std::vector<std::int64_t> items;
        for (const auto& e : *a) {
          const auto* i = e.as_integer();
          if (!i || i->get() < 0 || i->get() > 10000000) {
            errors_.add(loc_of(file_, e.source()), label + " elements must be ranks (non-negative integers)");
            return false;
          }
          if (std::find(items.begin(), items.end(), i->get()) != items.end()) {
            errors_.add(loc_of(file_, e.source()), label + " lists rank " + std::to_string(i->get()) + " twice");
            return false;
          }
          items.push_back(i->get());
        }
        out = items;
        return true;
      }
      case ParamType::bytes:
      case ParamType::bandwidth:
      case ParamType::duration:
      case ParamType::flop_rate: {
        const auto* s = node.as_string();
        if (!s) {
          if (node.is_number()) {
            errors_.add(where, label + " needs a unit: write it as a " + p.unit_hint() +
                                   " (a bare number is ambiguous)");
            return false;
          }
          return type_error("a " + p.unit_hint());
        }
        try {
          double d = 0;
          switch (p.type) {
            case ParamType::bytes: d = parse_bytes(s->get()).value; break;
            case ParamType::bandwidth: d = parse_bandwidth(s->get()).value; break;
            case ParamType::duration: d = parse_duration(s->get()).value; break;
            default: d = parse_flop_rate(s->get()).value; break;
          }
          // The unit's multiplier can take a finite number past the double range ("1e308PBps") or
          // below its normal range ("4e-320Bps"); neither is a value anything can be computed with.
          if (!std::isfinite(d)) {
            errors_.add(where, label + " = " + threewalls::quoted(s->get()) + " is too large to represent");
            return false;
          }
          if (d != 0 && !std::isnormal(d)) {
            errors_.add(where, label + " = " + threewalls::quoted(s->get()) +
                                   " is too small to represent (a subnormal number); write 0 or a larger value");
            return false;
          }
          if ((p.type == ParamType::bytes || p.type == ParamType::bandwidth) && d <= 0) {
            errors_.add(where, label + " must be greater than zero");
            return false;
          }
          if (!range_check(d)) return false;
          out = d;
          return true;
        } catch (const std::invalid_argument& e) {
          errors_.add(where, label + ": " + e.what());
          return false;
        }
      }
    }
    return false;
  }

  static std::string describe_literal(const toml::node& node) {
    std::ostringstream os;
    if (node.is_value()) {
      os << " (";
      node.visit([&](const auto& n) {
        // Strings quoted as everywhere else; other values as TOML writes them (true, 4.0, 2026-11-01).
        if constexpr (toml::is_string<decltype(n)>) os << threewalls::quoted(n.get());
        else if constexpr (toml::is_value<decltype(n)>) os << n;
      });
      os << ")";
      return os.str();
    }
    return "";
  }

  std::string file_;
  LoadedScenario& out_;
  ErrorList errors_;
};

}  // namespace

Value parse_literal(const ParamSpec& p, std::string_view literal, const SourceLocation& where) {
  LoadedScenario scratch;
  Loader loader(where.file, scratch);
  Value v;
  if (!loader.parse_literal_value(p, literal, where, v)) loader.throw_if_any();
  return v;
}

LoadedScenario load_scenario_text(std::string_view text, const std::string& file) {
  LoadedScenario out;
  Loader loader(file, out);
  loader.load(text);
  out.scenario.source_path = file;
  out.scenario.content_hash = hex64(fnv1a64(text));
  if (out.scenario.name.empty()) {
    out.scenario.name = std::filesystem::path(file).stem().string();
  }
  ErrorList errors;
  validate_and_derive(out.scenario, out.locations, file, errors);
  errors.throw_if_any();
  return out;
}

LoadedScenario load_scenario_file(const std::filesystem::path& path) {
  std::string text;
  try {
    text = read_input_file(path, "scenario file");
  } catch (const InputError& e) {
    throw ScenarioError({e.what()});
  }
  return load_scenario_text(text, path.string());
}

Scenario load_scenario(const std::filesystem::path& path) { return load_scenario_file(path).scenario; }

}  // namespace threewalls::scenarios
