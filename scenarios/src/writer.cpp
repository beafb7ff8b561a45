// Scenario values back to TOML through the registry (writer.hpp).
#include "threewalls/scenarios/writer.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "threewalls/core/toml_text.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::scenarios {
namespace {

[[noreturn]] void wrong_alternative(const ParamSpec& p) {
  throw std::logic_error("scenario writer: the value given for '" + p.path + "' is not a " + to_string(p.type));
}

std::string basic_string(const std::string& s) { return toml_basic_string(s); }

// The shortest decimal text that reads back to `d` (whole numbers below 10^15 without exponent).
std::string real_text(double d) {
  char buf[64];
  const auto fmt = (d == std::floor(d) && std::fabs(d) < 1e15) ? std::chars_format::fixed : std::chars_format::general;
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, fmt);
  if (ec != std::errc()) throw std::logic_error("scenario writer: cannot format a number");
  return std::string(buf, end);
}

struct UnitScale {
  const char* unit;
  double scale;  // SI value of one `unit`
};

// A unit string for `v` that `parse` reads back to exactly `v`: the shortest among the units (earlier
// ones win ties; the base unit, last, is always exact), or in `preferred` when that is exact and at
// most two characters longer ("400Gbps" rather than "50GBps", not "0.7000000000000001us").
template <class Parse>
std::string unit_text(double v, const std::vector<UnitScale>& units, const std::string& preferred, Parse parse) {
  std::string best;
  std::string in_preferred;
  for (const auto& u : units) {
    const std::string text = real_text(v / u.scale) + u.unit;
    try {
      if (parse(text).value != v) continue;
    } catch (const std::invalid_argument&) {
      continue;
    }
    if (u.unit == preferred) in_preferred = text;
    if (best.empty() || text.size() < best.size()) best = text;
  }
  return !in_preferred.empty() && in_preferred.size() <= best.size() + 2 ? in_preferred : best;
}

// The unit of a key's default ("400Gbps" -> "Gbps"): a value is written in the unit its key is
// documented in, when that is exact.
std::string default_unit(const ParamSpec& p) {
  const auto first = p.default_toml.find_first_not_of("\"0123456789.+-eE");
  if (first == std::string::npos) return "";
  std::string unit = p.default_toml.substr(first);
  if (!unit.empty() && unit.back() == '"') unit.pop_back();
  return unit;
}

std::string quantity_text(const ParamSpec& p, double v) {
  const ParamType t = p.type;
  const std::string preferred = default_unit(p);
  switch (t) {
    case ParamType::bytes: {
      static const std::vector<UnitScale> kUnits = {{"PiB", 1125899906842624.0},
                                                    {"TiB", 1099511627776.0},
                                                    {"GiB", 1073741824.0},
                                                    {"MiB", 1048576.0},
                                                    {"KiB", 1024.0},
                                                    {"PB", 1e15},
                                                    {"TB", 1e12},
                                                    {"GB", 1e9},
                                                    {"MB", 1e6},
                                                    {"kB", 1e3},
                                                    {"B", 1.0}};
      return unit_text(v, kUnits, preferred, [](const std::string& s) { return parse_bytes(s); });
    }
    case ParamType::bandwidth: {
      static const std::vector<UnitScale> kUnits = {
          {"TBps", 1e12},   {"GBps", 1e9},    {"MBps", 1e6},           {"kBps", 1e3},        {"Tbps", 1.25e11},
          {"Gbps", 1.25e8}, {"Mbps", 1.25e5}, {"GiBps", 1073741824.0}, {"MiBps", 1048576.0}, {"Bps", 1.0}};
      return unit_text(v, kUnits, preferred, [](const std::string& s) { return parse_bandwidth(s); });
    }
    case ParamType::duration: {
      static const std::vector<UnitScale> kUnits = {{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
      return unit_text(v, kUnits, preferred, [](const std::string& s) { return parse_duration(s); });
    }
    case ParamType::flop_rate: {
      static const std::vector<UnitScale> kUnits = {{"PFLOPS", 1e15}, {"TFLOPS", 1e12}, {"GFLOPS", 1e9},
                                                    {"MFLOPS", 1e6},  {"kFLOPS", 1e3},  {"FLOPS", 1.0}};
      return unit_text(v, kUnits, preferred, [](const std::string& s) { return parse_flop_rate(s); });
    }
    default: break;
  }
  throw std::logic_error("scenario writer: not a quantity type");
}

template <class T, class F>
std::string array_text(const std::vector<T>& items, F item_text) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + item_text(items[i]);
  return out + "]";
}

// `v` in the variant alternative the loader gives `p` (integers widened for number keys).
Value normalized(const ParamSpec& p, Value v) {
  const bool number = p.type == ParamType::real || p.type == ParamType::bytes || p.type == ParamType::bandwidth ||
                      p.type == ParamType::duration || p.type == ParamType::flop_rate;
  if (number && std::holds_alternative<std::int64_t>(v)) v = static_cast<double>(std::get<std::int64_t>(v));
  bool ok = false;
  switch (p.type) {
    case ParamType::integer: ok = std::holds_alternative<std::int64_t>(v); break;
    case ParamType::boolean: ok = std::holds_alternative<bool>(v); break;
    case ParamType::string:
    case ParamType::choice: ok = std::holds_alternative<std::string>(v); break;
    case ParamType::choice_list: ok = std::holds_alternative<std::vector<std::string>>(v); break;
    case ParamType::int_list: ok = std::holds_alternative<std::vector<std::int64_t>>(v); break;
    case ParamType::rank_list:
      ok = std::holds_alternative<std::string>(v) || std::holds_alternative<std::vector<std::int64_t>>(v);
      break;
    case ParamType::real:
    case ParamType::bytes:
    case ParamType::bandwidth:
    case ParamType::duration:
    case ParamType::flop_rate: ok = std::holds_alternative<double>(v); break;
  }
  if (!ok) wrong_alternative(p);
  return v;
}

const ParamSpec& param(const std::string& table, const std::string& key) {
  const std::string path = table.empty() ? key : table + "." + key;
  const ParamSpec* p = Registry::instance().find_param(path);
  if (p == nullptr) throw std::logic_error("scenario writer: '" + path + "' is not a registry key");
  return *p;
}

// The registry defaults as values (parsed once: the registry is immutable once built).
const std::map<const ParamSpec*, Value>& default_values() {
  static const std::map<const ParamSpec*, Value> kDefaults = [] {
    std::map<const ParamSpec*, Value> m;
    for (const auto& p : Registry::instance().params()) {
      if (!p.default_toml.empty()) m.emplace(&p, parse_literal(p, p.default_toml, {"<registry>", 1, 1}));
    }
    return m;
  }();
  return kDefaults;
}

}  // namespace

std::string toml_literal(const ParamSpec& p, const Value& value) {
  const Value v = normalized(p, value);
  switch (p.type) {
    case ParamType::integer: return std::to_string(std::get<std::int64_t>(v));
    case ParamType::real: return real_text(std::get<double>(v));
    case ParamType::boolean: return std::get<bool>(v) ? "true" : "false";
    case ParamType::string:
    case ParamType::choice: return basic_string(std::get<std::string>(v));
    case ParamType::choice_list: return array_text(std::get<std::vector<std::string>>(v), basic_string);
    case ParamType::int_list:
    case ParamType::rank_list:
      if (const auto* s = std::get_if<std::string>(&v)) return basic_string(*s);
      return array_text(std::get<std::vector<std::int64_t>>(v), [](std::int64_t i) { return std::to_string(i); });
    case ParamType::bytes:
    case ParamType::bandwidth:
    case ParamType::duration:
    case ParamType::flop_rate: return basic_string(quantity_text(p, std::get<double>(v)));
  }
  wrong_alternative(p);
}

ScenarioText::Section& ScenarioText::section(const std::string& table) {
  for (auto it = sections_.rbegin(); it != sections_.rend(); ++it) {
    if (it->table == table) return *it;
  }
  if (!table.empty() && Registry::instance().find_table(table) == nullptr) {
    throw std::logic_error("scenario writer: '" + table + "' is not a registry table");
  }
  sections_.push_back({table, false, {}});
  return sections_.back();
}

void ScenarioText::set(const std::string& table, const std::string& key, Value v) {
  const ParamSpec& p = param(table, key);
  v = normalized(p, std::move(v));
  Section& sec = section(table);
  for (auto& [spec, value] : sec.entries) {
    if (spec == &p) {
      value = std::move(v);
      return;
    }
  }
  sec.entries.emplace_back(&p, std::move(v));
}

void ScenarioText::add_element(const std::string& table) {
  const TableSpec* t = Registry::instance().find_table(table);
  if (t == nullptr || !t->is_array)
    throw std::logic_error("scenario writer: '" + table + "' is not an array of tables");
  sections_.push_back({table, true, {}});
}

void ScenarioText::add_table(const std::string& table) { static_cast<void>(section(table)); }

std::optional<Value> ScenarioText::get(const std::string& table, const std::string& key) const {
  const ParamSpec& p = param(table, key);
  for (const auto& sec : sections_) {
    if (sec.table != table) continue;
    for (const auto& [spec, value] : sec.entries) {
      if (spec == &p) return value;
    }
  }
  return std::nullopt;
}

void ScenarioText::erase(const std::string& table, const std::string& key) {
  const ParamSpec& p = param(table, key);
  for (auto& sec : sections_) {
    if (sec.table != table) continue;
    sec.entries.erase(
        std::remove_if(sec.entries.begin(), sec.entries.end(), [&](const auto& e) { return e.first == &p; }),
        sec.entries.end());
  }
}

bool ScenarioText::has_table(const std::string& table) const {
  return std::any_of(sections_.begin(), sections_.end(), [&](const Section& s) { return s.table == table; });
}

std::string ScenarioText::to_toml(const std::string& only_table) const {
  std::ostringstream os;
  auto keys = [&](const Section& sec) {
    for (const auto& [p, v] : sec.entries) os << p->key() << " = " << toml_literal(*p, v) << "\n";
  };
  bool first = true;
  if (only_table.empty()) {
    for (const auto& sec : sections_) {
      if (!sec.table.empty()) continue;
      keys(sec);
      first = sec.entries.empty();
    }
  }
  for (const auto& sec : sections_) {
    if (sec.table.empty() || (!only_table.empty() && sec.table != only_table)) continue;
    if (!first) os << "\n";
    first = false;
    os << (sec.array_element ? "[[" + sec.table + "]]" : "[" + sec.table + "]") << "\n";
    keys(sec);
  }
  return os.str();
}

ScenarioText scenario_text(const Scenario& s) {
  const Registry& reg = Registry::instance();
  const auto& defaults = default_values();
  ScenarioText out;
  auto write_keys = [&](const std::string& table, std::size_t index) {
    for (const ParamSpec* p : reg.params_in(table)) {
      std::optional<Value> v = p->get(s, index);
      if (!v) continue;
      const auto d = defaults.find(p);
      if (d != defaults.end() && d->second == normalized(*p, *v)) continue;
      out.set(table, p->key(), std::move(*v));
    }
  };
  write_keys("", 0);
  for (const auto& t : reg.tables()) {
    const std::size_t n = t.count ? t.count(s) : 1;
    for (std::size_t i = 0; i < n; ++i) {
      if (t.is_array)
        out.add_element(t.path);
      else if (t.on_present)
        out.add_table(t.path);
      write_keys(t.path, i);
    }
  }
  return out;
}

std::string write_scenario(const Scenario& s, const std::vector<std::string>& comments) {
  std::string out;
  for (const auto& c : comments) {
    std::string line = "# ";
    for (const char ch : c) line += ch == '\n' ? std::string("\n# ") : std::string(1, ch);
    out += line + "\n";
  }
  return out + scenario_text(s).to_toml();
}

}  // namespace threewalls::scenarios
