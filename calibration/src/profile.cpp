// Reading and writing calibration profiles (docs/formats/calibration_profile.md).
//
// The writer owns the layout: to_toml() is canonical (fixed key order, family order of the registry,
// numbers in shortest round-trip form), so load -> save reproduces a saved file byte for byte and
// id() hashes content, not formatting. The reader is strict: every key is known, typed and checked,
// and every problem is reported with file:line:col and the allowed keys or values.
#include "threewalls/calibration/profile.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "families/module.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/hash.hpp"
#include "threewalls/core/input_file.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/core/toml_text.hpp"
#include "threewalls/core/version.hpp"

namespace threewalls::calibration {

namespace {

// Keys of a point besides the family's inputs, and of a fit table besides the parameters.
const std::vector<std::string> kPointTimeKeys = {"median_s", "p10_s", "p90_s", "count", "samples_s"};
const std::vector<std::string> kQualityKeys = {"rel_err_median", "rel_err_max", "loo_rel_err_median", "loo_rel_err_max",
                                               "loo_points"};
const std::vector<std::string> kFamilyKeys = {"model", "note", "points", "fit"};
const std::vector<std::string> kProfileKeys = {"format", "format_version", "name", "source", "generator"};
const std::vector<std::string> kHardwareKeys = {"gpu_name",
                                                "gpu_kind",
                                                "sm_count",
                                                "sm_clock_mhz",
                                                "memory_clock_mhz",
                                                "memory_bytes",
                                                "driver_version",
                                                "cuda_version",
                                                "nccl_version",
                                                "gpus_seen",
                                                "links_seen",
                                                "machine",
                                                "date",
                                                "peak_bf16_flop_per_s",
                                                "peak_fp8_flop_per_s",
                                                "peak_fp32_flop_per_s",
                                                "hbm_bandwidth_datasheet_bytes_per_s"};
constexpr std::string_view kSyntheticPrefix = "synthetic: ";

// ---------------------------------------------------------------------------------------- writer

// The largest magnitude a profile value may have: far past any real one (fitted saturation sizes reach
// 1e25), small enough that times and rates computed from it stay finite.
constexpr double kMaxProfileMagnitude = 1e100;

std::string fmt_real(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string fmt_int(std::int64_t v) { return std::to_string(v); }

std::string fmt_number(double v, bool integer) {
  return integer ? fmt_int(static_cast<std::int64_t>(std::llround(v))) : fmt_real(v);
}

std::string fmt_str(std::string_view s) { return toml_basic_string(s); }

std::string fmt_array(const std::vector<double>& v, bool integer) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += fmt_number(v[i], integer);
  }
  return out + "]";
}

// ---------------------------------------------------------------------------------------- reader

SourceLocation loc_of(const std::string& file, const toml::source_region& r) {
  return SourceLocation{file, static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  Profile read(std::string_view text) {
    if (text.find('\0') != std::string_view::npos) {
      throw InputError(SourceLocation{file_, 1, 1},
                       "not a calibration profile: the file contains a NUL byte (binary data)");
    }
    toml::table root;
    try {
      root = toml::parse(text, file_);
    } catch (const toml::parse_error& e) {
      throw InputError(loc_of(file_, e.source()), "malformed TOML: " + std::string(e.description()));
    }
    ProfileInfo info = read_profile_table(root);
    Hardware hw;
    std::vector<Family> families;
    bool have_hardware = false;
    for (auto&& [k, node] : root) {
      const std::string key(k.str());
      if (key == "profile") continue;
      if (key == "hardware") {
        have_hardware = true;
        if (const auto* t = node.as_table()) {
          hw = read_hardware(*t);
        } else {
          error(key_loc(k, node), "'hardware' must be a table ([hardware]), not " + std::string(type_name(node)));
        }
        continue;
      }
      walk_families(key, k, node, families);
    }
    if (!have_hardware) error({file_, 1, 1}, "missing table [hardware] (the GPU and machine the points describe)");
    if (families.empty() && errors_.empty()) {
      error({file_, 1, 1}, "the profile has no model family (expected tables such as [gemm.bf16] or [copy.d2d])");
    }
    throw_if_errors();
    return Profile(std::move(info), std::move(hw), std::move(families));
  }

 private:
  struct Entry {
    SourceLocation where;
    std::string text;
  };

  void error(const SourceLocation& where, std::string text) { errors_.push_back({where, std::move(text)}); }

  void throw_if_errors() {
    if (errors_.empty()) return;
    std::stable_sort(errors_.begin(), errors_.end(), [](const Entry& a, const Entry& b) {
      return a.where.line != b.where.line ? a.where.line < b.where.line : a.where.column < b.where.column;
    });
    if (errors_.size() == 1) throw InputError(errors_[0].where, errors_[0].text);
    std::string all;
    for (std::size_t i = 0; i < errors_.size(); ++i) {
      if (i) all += "\n";
      all += errors_[i].where.str() + ": " + errors_[i].text;
    }
    throw InputError(all);
  }

  SourceLocation key_loc(const toml::key& k, const toml::node& node) const {
    SourceLocation l = loc_of(file_, k.source());
    if (l.line == 0) l = loc_of(file_, node.source());
    if (l.line == 0) l = {file_, 1, 1};
    return l;
  }

  SourceLocation node_loc(const toml::node& node, const SourceLocation& fallback) const {
    SourceLocation l = loc_of(file_, node.source());
    return l.line == 0 ? fallback : l;
  }

  // Reports every key of `t` not in `allowed`, with the nearest allowed key.
  void check_keys(const toml::table& t, const std::vector<std::string>& allowed, const std::string& label) {
    for (auto&& [k, node] : t) {
      const std::string key(k.str());
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string msg = label + " unknown key '" + key + "'";
      if (auto near = nearest(key, allowed)) msg += " (did you mean '" + *near + "'?)";
      msg += "; allowed here: " + join(allowed);
      if (newer_minor_)
        msg += " (this file is format " + version_text_ + ", newer than this threewalls reads; update threewalls)";
      error(key_loc(k, node), msg);
    }
  }

  const toml::node* require(const toml::table& t, std::string_view key, const std::string& label,
                            const SourceLocation& tloc, std::string_view what) {
    const toml::node* n = t.get(key);
    if (!n) error(tloc, label + " missing key '" + std::string(key) + "' (" + std::string(what) + ")");
    return n;
  }

  std::optional<std::string> get_string(const toml::table& t, std::string_view key, const std::string& label,
                                        const SourceLocation& tloc, std::string_view what, bool required = true) {
    const toml::node* n = required ? require(t, key, label, tloc, what) : t.get(key);
    if (!n) return std::nullopt;
    if (const auto* s = n->as_string()) return s->get();
    error(node_loc(*n, tloc), label + " '" + std::string(key) + "' must be a string, not " + type_name(*n));
    return std::nullopt;
  }

  std::optional<std::int64_t> get_int(const toml::node* n, std::string_view key, const std::string& label,
                                      const SourceLocation& tloc, std::int64_t min_value,
                                      std::int64_t max_value = std::numeric_limits<std::int64_t>::max()) {
    if (!n) return std::nullopt;
    const auto* i = n->as_integer();
    if (!i) {
      error(node_loc(*n, tloc), label + " '" + std::string(key) + "' must be an integer, not " + type_name(*n));
      return std::nullopt;
    }
    if (i->get() < min_value || i->get() > max_value) {
      error(node_loc(*n, tloc),
            label + " '" + std::string(key) + "' = " + std::to_string(i->get()) +
                " is out of range; allowed: " + std::to_string(min_value) +
                (max_value == std::numeric_limits<std::int64_t>::max() ? " or more"
                                                                       : " to " + std::to_string(max_value)));
      return std::nullopt;
    }
    return i->get();
  }

  // A number (integer or float). NaN only where allowed; never infinite.
  std::optional<double> get_real(const toml::node* n, std::string_view key, const std::string& label,
                                 const SourceLocation& tloc, bool allow_nan = false) {
    if (!n) return std::nullopt;
    double d = 0;
    if (const auto* f = n->as_floating_point())
      d = f->get();
    else if (const auto* i = n->as_integer())
      d = static_cast<double>(i->get());
    else {
      error(node_loc(*n, tloc), label + " '" + std::string(key) + "' must be a number, not " + type_name(*n));
      return std::nullopt;
    }
    if (std::isinf(d) || (std::isnan(d) && !allow_nan)) {
      error(node_loc(*n, tloc), label + " '" + std::string(key) + "' must be a finite number" +
                                    (allow_nan ? " or nan (not available)" : ""));
      return std::nullopt;
    }
    // Times, rates and coefficients computed from a value past this bound (or a subnormal one) can
    // overflow to infinity or lose all precision.
    if (!std::isnan(d) && (std::fabs(d) > kMaxProfileMagnitude || (d != 0 && !std::isnormal(d)))) {
      error(node_loc(*n, tloc), label + " '" + std::string(key) + "' = " + fmt_real(d) +
                                    " is out of range; allowed: 0 or a normal number of magnitude up to 1e100");
      return std::nullopt;
    }
    return d;
  }

  std::optional<double> get_positive(const toml::node* n, std::string_view key, const std::string& label,
                                     const SourceLocation& tloc) {
    auto v = get_real(n, key, label, tloc);
    if (v && !(*v > 0)) {
      error(node_loc(*n, tloc), label + " '" + std::string(key) + "' must be > 0");
      return std::nullopt;
    }
    return v;
  }

  ProfileInfo read_profile_table(const toml::table& root) {
    const toml::node* pn = root.get("profile");
    if (!pn) {
      throw InputError(
          SourceLocation{file_, 1, 1},
          "missing table [profile]: not a threewalls calibration profile (it starts with [profile] format = " +
              threewalls::quoted(kProfileFormatName) + ", format_version = \"" + std::to_string(kProfileFormatMajor) +
              "." + std::to_string(kProfileFormatMinor) + "\")");
    }
    const auto* t = pn->as_table();
    const SourceLocation tloc = node_loc(*pn, {file_, 1, 1});
    if (!t) throw InputError(tloc, "'profile' must be a table ([profile]), not " + std::string(type_name(*pn)));
    // Format name and version first, alone: nothing else is worth reporting in a file of another format.
    const toml::node* fmt = t->get("format");
    if (!fmt || !fmt->as_string()) {
      throw InputError(fmt ? node_loc(*fmt, tloc) : tloc,
                       "[profile] needs format = " + threewalls::quoted(kProfileFormatName) + " (a string)");
    }
    if (fmt->as_string()->get() != kProfileFormatName) {
      throw InputError(node_loc(*fmt, tloc), "[profile] format " + threewalls::quoted(fmt->as_string()->get()) +
                                                 " is not a calibration profile; this threewalls reads " +
                                                 threewalls::quoted(kProfileFormatName));
    }
    const toml::node* ver = t->get("format_version");
    if (!ver || !ver->as_string()) {
      throw InputError(ver ? node_loc(*ver, tloc) : tloc,
                       "[profile] needs format_version = \"MAJOR.MINOR\" (a string; this threewalls reads " +
                           std::to_string(kProfileFormatMajor) + ".x)");
    }
    version_text_ = ver->as_string()->get();
    int major = 0;
    int minor = 0;
    {
      const std::string& v = version_text_;
      const auto dot = v.find('.');
      auto r1 = std::from_chars(v.data(), v.data() + (dot == std::string::npos ? v.size() : dot), major);
      bool ok = dot != std::string::npos && r1.ec == std::errc() && r1.ptr == v.data() + dot;
      if (ok) {
        auto r2 = std::from_chars(v.data() + dot + 1, v.data() + v.size(), minor);
        ok = r2.ec == std::errc() && r2.ptr == v.data() + v.size() && dot + 1 < v.size();
      }
      if (!ok || major < 0 || minor < 0) {
        throw InputError(node_loc(*ver, tloc), "[profile] format_version " + threewalls::quoted(v) +
                                                   " is not of the form \"MAJOR.MINOR\" (this threewalls reads " +
                                                   std::to_string(kProfileFormatMajor) + ".x)");
      }
    }
    if (major != kProfileFormatMajor) {
      throw InputError(node_loc(*ver, tloc),
                       "[profile] format_version " + threewalls::quoted(version_text_) + ": this threewalls (" +
                           std::string(tool_version()) + ") reads " + std::string(kProfileFormatName) + " " +
                           std::to_string(kProfileFormatMajor) + ".x only" +
                           (major > kProfileFormatMajor ? "; the file is from a newer threewalls"
                                                        : "; the file is from an older, unsupported format"));
    }
    newer_minor_ = minor > kProfileFormatMinor;
    check_keys(*t, kProfileKeys, "[profile]");
    ProfileInfo info;
    info.name = get_string(*t, "name", "[profile]", tloc, "the profile's name, e.g. \"h200\"").value_or("");
    if (t->get("name") && t->get("name")->as_string() && info.name.empty()) {
      error(node_loc(*t->get("name"), tloc), "[profile] 'name' must not be empty");
    }
    if (auto s = get_string(*t, "source", "[profile]", tloc,
                            "\"measured\" or \"synthetic: <where the numbers come from>\"")) {
      info.source = *s;
      const bool synthetic = s->rfind(kSyntheticPrefix, 0) == 0 && s->size() > kSyntheticPrefix.size();
      if (*s != "measured" && !synthetic) {
        error(node_loc(*t->get("source"), tloc),
              "[profile] source = " + threewalls::quoted(*s) +
                  " is not allowed; allowed: \"measured\" or \"synthetic: <where the numbers come from>\"");
      }
    }
    info.generator = get_string(*t, "generator", "[profile]", tloc, "what wrote the file").value_or("");
    return info;
  }

  Hardware read_hardware(const toml::table& t) {
    const std::string label = "[hardware]";
    const SourceLocation tloc = node_loc(t, {file_, 1, 1});
    check_keys(t, kHardwareKeys, label);
    Hardware hw;
    auto str = [&](std::string_view key, std::string_view what) {
      return get_string(t, key, label, tloc, what).value_or("");
    };
    auto integer = [&](std::string_view key, std::string_view what, std::int64_t min_value, std::int64_t max_value) {
      return get_int(require(t, key, label, tloc, what), key, label, tloc, min_value, max_value).value_or(0);
    };
    constexpr std::int64_t kMaxCount = 1 << 20;
    auto real = [&](std::string_view key, std::string_view what) {
      return get_positive(require(t, key, label, tloc, what), key, label, tloc).value_or(0.0);
    };
    hw.gpu_name = str("gpu_name", "the GPU's name as the driver reports it");
    hw.gpu_kind = str("gpu_kind", "one of " + join(known_gpu_kinds(), ", ", true));
    if (const toml::node* n = t.get("gpu_kind"); n && n->as_string()) {
      const auto& kinds = known_gpu_kinds();
      if (std::find(kinds.begin(), kinds.end(), hw.gpu_kind) == kinds.end()) {
        std::string msg = label + " gpu_kind = " + threewalls::quoted(hw.gpu_kind) +
                          " is not allowed; allowed: " + join(kinds, ", ", true);
        if (auto near = nearest(hw.gpu_kind, kinds)) msg += " (did you mean " + threewalls::quoted(*near) + "?)";
        error(node_loc(*n, tloc), msg);
      }
    }
    hw.sm_count = static_cast<int>(integer("sm_count", "streaming multiprocessors", 1, kMaxCount));
    hw.sm_clock_mhz = real("sm_clock_mhz", "maximum SM clock, MHz");
    hw.memory_clock_mhz = real("memory_clock_mhz", "maximum memory clock, MHz");
    hw.memory_bytes = integer("memory_bytes", "GPU memory, bytes", 1, std::numeric_limits<std::int64_t>::max());
    hw.driver_version = str("driver_version", "driver version, or \"unknown\"");
    hw.cuda_version = str("cuda_version", "CUDA runtime version, or \"unknown\"");
    hw.nccl_version = str("nccl_version", "NCCL version, or \"unknown\"");
    hw.gpus_seen = static_cast<int>(integer("gpus_seen", "GPUs visible on the machine", 0, kMaxCount));
    if (const toml::node* n = require(t, "links_seen", label, tloc, "array of strings, e.g. [\"NVLink NV18\"]")) {
      const auto* a = n->as_array();
      if (!a) {
        error(node_loc(*n, tloc), label + " 'links_seen' must be an array of strings, not " + type_name(*n));
      } else {
        for (const auto& e : *a) {
          if (const auto* s = e.as_string())
            hw.links_seen.push_back(s->get());
          else
            error(node_loc(e, tloc), label + " 'links_seen' elements must be strings, not " + type_name(e));
        }
      }
    }
    hw.machine = str("machine", "free text describing the machine");
    hw.date = str("date", "when the points were measured");
    hw.peak_bf16_flop_per_s = real("peak_bf16_flop_per_s", "datasheet dense bf16 peak, FLOP/s");
    hw.peak_fp8_flop_per_s = real("peak_fp8_flop_per_s", "datasheet dense fp8 peak, FLOP/s");
    hw.peak_fp32_flop_per_s = real("peak_fp32_flop_per_s", "datasheet fp32 peak, FLOP/s");
    hw.hbm_bandwidth_datasheet_bytes_per_s =
        real("hbm_bandwidth_datasheet_bytes_per_s", "datasheet HBM bandwidth, bytes/s");
    return hw;
  }

  // Children allowed under a family-group path ("" = root, "collective", "collective.all_reduce").
  static std::vector<std::string> children_of(const std::string& path) {
    std::vector<std::string> out;
    if (path.empty()) out = {"profile", "hardware"};
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& s : family_specs()) {
      if (s.name.rfind(prefix, 0) != 0) continue;
      std::string rest = s.name.substr(prefix.size());
      const auto dot = rest.find('.');
      if (dot != std::string::npos) rest = rest.substr(0, dot);
      if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
    }
    return out;
  }

  void walk_families(const std::string& path, const toml::key& k, const toml::node& node, std::vector<Family>& out) {
    const SourceLocation where = key_loc(k, node);
    if (const FamilySpec* spec = find_family_spec(path)) {
      if (const auto* t = node.as_table()) {
        // An older model of the family is read with its own registry entry.
        const FamilySpec* read_as = spec;
        if (const auto* m = t->get_as<std::string>("model")) {
          if (const FamilySpec* older = find_family_spec(path, m->get())) read_as = older;
        }
        if (auto f = read_family(*read_as, *t, where)) out.push_back(std::move(*f));
      } else {
        error(where, "'" + path + "' must be a table ([" + path + "]), not " + type_name(node));
      }
      return;
    }
    const auto dot = path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
    const std::string key(k.str());
    const auto below = children_of(path);
    if (below.empty()) {  // neither a family nor a group of families (such as "collective.all_reduce")
      const auto allowed = children_of(parent);
      std::string msg = (parent.empty() ? std::string("[top level]") : "[" + parent + "]") + " unknown " +
                        (node.is_table() ? "table" : "key") + " '" + key + "'";
      if (auto near = nearest(key, allowed)) msg += " (did you mean '" + *near + "'?)";
      msg += "; allowed here: " + join(allowed);
      if (newer_minor_)
        msg += " (this file is format " + version_text_ + ", newer than this threewalls reads; update threewalls)";
      error(where, msg);
      return;
    }
    const auto* t = node.as_table();
    if (!t) {
      error(where, "'" + path + "' must be a table of model families (" + join(below) + "), not " + type_name(node));
      return;
    }
    for (auto&& [ck, cn] : *t) walk_families(path + "." + std::string(ck.str()), ck, cn, out);
  }

  std::optional<Family> read_family(const FamilySpec& spec, const toml::table& t, const SourceLocation& where) {
    const std::string label = "[" + spec.name + "]";
    const SourceLocation tloc = node_loc(t, where);
    const std::size_t errors_before = errors_.size();
    check_keys(t, kFamilyKeys, label);
    Family f;
    f.name = spec.name;
    const FamilySpec* current = find_family_spec(spec.name);
    if (current != &spec) f.model = spec.model;
    if (auto m = get_string(t, "model", label, tloc, "the model id, " + threewalls::quoted(spec.model))) {
      if (*m != spec.model) {
        std::string also;
        for (const auto& o : older_family_specs()) {
          if (o.name == spec.name) also += ", " + threewalls::quoted(o.model);
        }
        error(node_loc(*t.get("model"), tloc),
              label + " model = " + threewalls::quoted(*m) + " is not known for this family; this threewalls fits " +
                  spec.name + " with " + threewalls::quoted(spec.model) +
                  (also.empty() ? std::string() : " and still reads" + also.substr(1)));
      }
    }
    f.note = get_string(t, "note", label, tloc, "free text", false).value_or("");
    if (const toml::node* pn = require(t, "points", label, tloc, "array of points, one inline table each")) {
      const auto* a = pn->as_array();
      if (!a) {
        error(node_loc(*pn, tloc), label + " 'points' must be an array of tables, not " + type_name(*pn));
      } else if (a->empty()) {
        error(node_loc(*pn, tloc), label + " 'points' is empty: a fitted model keeps the raw points it was fitted on");
      } else {
        std::size_t i = 0;
        for (const auto& e : *a) {
          const std::string plabel = label + " points[" + std::to_string(i++) + "]";
          if (const auto* pt = e.as_table()) {
            if (auto p = read_point(spec, *pt, plabel, node_loc(e, tloc))) f.points.push_back(std::move(*p));
          } else {
            error(node_loc(e, tloc), plabel + " must be a table ({ ... }), not " + type_name(e));
          }
        }
      }
    }
    if (const toml::node* fn = require(t, "fit", label, tloc, "table [" + spec.name + ".fit] of fitted parameters")) {
      if (const auto* ft = fn->as_table()) {
        read_fit(spec, *ft, f, node_loc(*fn, tloc));
      } else {
        error(node_loc(*fn, tloc), label + " 'fit' must be a table ([" + spec.name + ".fit]), not " + type_name(*fn));
      }
    }
    if (errors_.size() != errors_before) return std::nullopt;
    return f;
  }

  std::optional<Point> read_point(const FamilySpec& spec, const toml::table& t, const std::string& label,
                                  const SourceLocation& ploc) {
    std::vector<std::string> allowed;
    for (const auto& in : spec.inputs) allowed.push_back(in.key);
    allowed.insert(allowed.end(), kPointTimeKeys.begin(), kPointTimeKeys.end());
    const std::size_t errors_before = errors_.size();
    check_keys(t, allowed, label);
    Point p;
    for (const auto& in : spec.inputs) {
      const toml::node* n = require(t, in.key, label, ploc, in.description);
      if (in.integer) {
        // Integers up to 2^53 are exact as doubles.
        p.inputs.push_back(static_cast<double>(get_int(n, in.key, label, ploc, 0, std::int64_t{1} << 53).value_or(0)));
      } else {
        auto v = get_real(n, in.key, label, ploc);
        if (v && *v < 0) error(node_loc(*n, ploc), label + " '" + in.key + "' must be >= 0");
        p.inputs.push_back(v.value_or(0.0));
      }
    }
    auto med = get_positive(require(t, "median_s", label, ploc, "median time, seconds"), "median_s", label, ploc);
    auto p10 = get_positive(require(t, "p10_s", label, ploc, "10th percentile, seconds"), "p10_s", label, ploc);
    auto p90 = get_positive(require(t, "p90_s", label, ploc, "90th percentile, seconds"), "p90_s", label, ploc);
    auto cnt = get_int(require(t, "count", label, ploc, "number of timed runs"), "count", label, ploc, 1);
    if (med && p10 && p90 && !(*p10 <= *med && *med <= *p90)) {
      error(ploc, label + " needs p10_s <= median_s <= p90_s (got " + fmt_real(*p10) + ", " + fmt_real(*med) + ", " +
                      fmt_real(*p90) + ")");
    }
    p.time.median_s = med.value_or(0);
    p.time.p10_s = p10.value_or(0);
    p.time.p90_s = p90.value_or(0);
    p.time.count = cnt.value_or(0);
    if (const toml::node* sn = t.get("samples_s")) {
      const auto* a = sn->as_array();
      if (!a) {
        error(node_loc(*sn, ploc), label + " 'samples_s' must be an array of seconds, not " + type_name(*sn));
      } else {
        for (const auto& e : *a) {
          if (auto v = get_positive(&e, "samples_s", label, ploc)) p.time.samples_s.push_back(*v);
        }
        if (cnt && static_cast<std::int64_t>(a->size()) != *cnt) {
          error(node_loc(*sn, ploc), label + " has " + std::to_string(a->size()) +
                                         " samples_s but count = " + std::to_string(*cnt) + " (they must agree)");
        }
      }
    }
    if (errors_.size() != errors_before) return std::nullopt;
    return p;
  }

  void read_fit(const FamilySpec& spec, const toml::table& t, Family& f, const SourceLocation& floc) {
    const std::string label = "[" + spec.name + ".fit]";
    std::vector<std::string> allowed;
    for (const auto& ps : spec.params) allowed.push_back(ps.key);
    allowed.insert(allowed.end(), kQualityKeys.begin(), kQualityKeys.end());
    const std::size_t errors_before = errors_.size();
    check_keys(t, allowed, label);
    for (const auto& ps : spec.params) {
      if (ps.optional && !t.get(ps.key)) {
        f.params.emplace_back();  // absent optional array: empty (the model's form without it)
        continue;
      }
      const toml::node* n = require(t, ps.key, label, floc, ps.description);
      std::vector<double> values;
      if (n && ps.array) {
        if (const auto* a = n->as_array()) {
          for (const auto& e : *a) {
            if (ps.integer) {
              if (auto v = get_int(&e, ps.key, label, floc, 0)) values.push_back(static_cast<double>(*v));
            } else if (auto v = get_real(&e, ps.key, label, floc)) {
              values.push_back(*v);
            }
          }
        } else {
          error(node_loc(*n, floc), label + " '" + ps.key + "' must be an array of numbers, not " + type_name(*n));
        }
      } else if (n) {
        if (ps.integer) {
          if (auto v = get_int(n, ps.key, label, floc, 0)) values.push_back(static_cast<double>(*v));
        } else if (auto v = get_real(n, ps.key, label, floc)) {
          values.push_back(*v);
        }
      }
      f.params.push_back(std::move(values));
    }
    auto quality = [&](std::string_view key) {
      auto v = get_real(require(t, key, label, floc, "fit error statistic, a fraction (nan: not available)"), key,
                        label, floc, true);
      if (v && *v < 0) error(node_loc(*t.get(key), floc), label + " '" + std::string(key) + "' must be >= 0 or nan");
      return v.value_or(std::numeric_limits<double>::quiet_NaN());
    };
    f.quality.rel_err_median = quality("rel_err_median");
    f.quality.rel_err_max = quality("rel_err_max");
    f.quality.loo_rel_err_median = quality("loo_rel_err_median");
    f.quality.loo_rel_err_max = quality("loo_rel_err_max");
    f.quality.loo_points = get_int(require(t, "loo_points", label, floc, "points leave-one-out could predict"),
                                   "loo_points", label, floc, 0)
                               .value_or(0);
    if (errors_.size() != errors_before) return;
    if (auto problem = detail::check_params(spec, f.params)) error(floc, label + " " + *problem);
    if (!f.points.empty() && f.quality.loo_points > static_cast<std::int64_t>(f.points.size())) {
      error(floc, label + " 'loo_points' = " + std::to_string(f.quality.loo_points) + " exceeds the " +
                      std::to_string(f.points.size()) + " points");
    }
  }

  std::string file_;
  std::vector<Entry> errors_;
  std::string version_text_;
  bool newer_minor_ = false;
};

}  // namespace

Profile::Profile(ProfileInfo info, Hardware hardware, std::vector<Family> families)
    : info_(std::move(info)), hardware_(std::move(hardware)) {
  const auto& specs = family_specs();
  auto rank = [&](const std::string& name) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == name) return i;
    }
    throw std::logic_error("unknown calibration family '" + name + "'");
  };
  std::stable_sort(families.begin(), families.end(),
                   [&](const Family& a, const Family& b) { return rank(a.name) < rank(b.name); });
  for (std::size_t i = 1; i < families.size(); ++i) {
    if (families[i].name == families[i - 1].name)
      throw std::logic_error("duplicate calibration family '" + families[i].name + "'");
  }
  families_ = std::move(families);
}

Profile Profile::parse(std::string_view toml_text, const std::string& file) {
  Reader r(file);
  Profile p = r.read(toml_text);
  p.path_ = file;
  return p;
}

Profile Profile::load(const std::filesystem::path& path) {
  return parse(read_input_file(path, "calibration profile"), path.string());
}

std::string Profile::to_toml() const {
  std::string o;
  o += "# threewalls calibration profile; format: docs/formats/calibration_profile.md\n";
  o += "# Written by a program: regenerate it instead of editing it (its id hashes the content).\n\n";
  o += "[profile]\n";
  o += "format = " + fmt_str(kProfileFormatName) + "\n";
  o += "format_version = \"" + std::to_string(kProfileFormatMajor) + "." + std::to_string(kProfileFormatMinor) + "\"\n";
  o += "name = " + fmt_str(info_.name) + "\n";
  o += "source = " + fmt_str(info_.source) + "\n";
  o += "generator = " + fmt_str(info_.generator) + "\n\n";
  const Hardware& h = hardware_;
  o += "[hardware]\n";
  o += "gpu_name = " + fmt_str(h.gpu_name) + "\n";
  o += "gpu_kind = " + fmt_str(h.gpu_kind) + "\n";
  o += "sm_count = " + fmt_int(h.sm_count) + "\n";
  o += "sm_clock_mhz = " + fmt_real(h.sm_clock_mhz) + "\n";
  o += "memory_clock_mhz = " + fmt_real(h.memory_clock_mhz) + "\n";
  o += "memory_bytes = " + fmt_int(h.memory_bytes) + "\n";
  o += "driver_version = " + fmt_str(h.driver_version) + "\n";
  o += "cuda_version = " + fmt_str(h.cuda_version) + "\n";
  o += "nccl_version = " + fmt_str(h.nccl_version) + "\n";
  o += "gpus_seen = " + fmt_int(h.gpus_seen) + "\n";
  o += "links_seen = [";
  for (std::size_t i = 0; i < h.links_seen.size(); ++i) o += (i ? ", " : "") + fmt_str(h.links_seen[i]);
  o += "]\n";
  o += "machine = " + fmt_str(h.machine) + "\n";
  o += "date = " + fmt_str(h.date) + "\n";
  o += "peak_bf16_flop_per_s = " + fmt_real(h.peak_bf16_flop_per_s) + "\n";
  o += "peak_fp8_flop_per_s = " + fmt_real(h.peak_fp8_flop_per_s) + "\n";
  o += "peak_fp32_flop_per_s = " + fmt_real(h.peak_fp32_flop_per_s) + "\n";
  o += "hbm_bandwidth_datasheet_bytes_per_s = " + fmt_real(h.hbm_bandwidth_datasheet_bytes_per_s) + "\n";
  for (const auto& f : families_) {
    const FamilySpec& spec = f.spec();
    o += "\n# " + spec.description + "\n";
    o += "[" + spec.name + "]\n";
    o += "model = " + fmt_str(spec.model) + "\n";
    o += "note = " + fmt_str(f.note) + "\n";
    o += "points = [\n";
    for (const auto& p : f.points) {
      o += "  { ";
      for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
        o += spec.inputs[i].key + " = " + fmt_number(p.inputs.at(i), spec.inputs[i].integer) + ", ";
      }
      o += "median_s = " + fmt_real(p.time.median_s) + ", p10_s = " + fmt_real(p.time.p10_s) +
           ", p90_s = " + fmt_real(p.time.p90_s) + ", count = " + fmt_int(p.time.count);
      if (!p.time.samples_s.empty()) o += ", samples_s = " + fmt_array(p.time.samples_s, false);
      o += " },\n";
    }
    o += "]\n\n";
    o += "[" + spec.name + ".fit]\n";
    for (std::size_t i = 0; i < spec.params.size(); ++i) {
      const auto& ps = spec.params[i];
      if (ps.optional && f.params.at(i).empty()) continue;  // read back as empty
      o += ps.key + " = " +
           (ps.array ? fmt_array(f.params.at(i), ps.integer) : fmt_number(f.params.at(i).at(0), ps.integer)) + "\n";
    }
    o += "rel_err_median = " + fmt_real(f.quality.rel_err_median) + "\n";
    o += "rel_err_max = " + fmt_real(f.quality.rel_err_max) + "\n";
    o += "loo_rel_err_median = " + fmt_real(f.quality.loo_rel_err_median) + "\n";
    o += "loo_rel_err_max = " + fmt_real(f.quality.loo_rel_err_max) + "\n";
    o += "loo_points = " + fmt_int(f.quality.loo_points) + "\n";
  }
  return o;
}

void Profile::save(const std::filesystem::path& path) const {
  const std::string text = to_toml();
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw SystemError(path.string() + ": cannot write calibration profile (cannot create " + tmp.string() + ")");
    out << text;
    out.flush();
    if (!out) throw SystemError(path.string() + ": cannot write calibration profile (write failed)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw SystemError(path.string() + ": cannot write calibration profile (rename failed)");
  }
}

std::string Profile::id() const { return info_.name + "@" + hex64(fnv1a64(to_toml())); }

const Family* Profile::find(std::string_view family) const {
  for (const auto& f : families_) {
    if (f.name == family) return &f;
  }
  return nullptr;
}

std::string Profile::describe() const {
  return "calibration profile " + id() + (path_.empty() ? std::string() : " (" + path_ + ")");
}

const Family& Profile::family(std::string_view family) const {
  if (const Family* f = find(family)) return *f;
  std::vector<std::string> have;
  for (const auto& f : families_) have.push_back(f.name);
  std::string msg = describe() + " has no model '" + std::string(family) + "'";
  if (const FamilySpec* spec = find_family_spec(family); spec == nullptr)
    msg += " (not a family this threewalls knows)";
  msg += "; it has: " + (have.empty() ? std::string("nothing") : join(have));
  msg += ". Measure it with `threewalls calibrate` or use a profile that has it";
  throw InputError(path_.empty() ? SourceLocation{"<profile " + info_.name + ">", 0, 0} : SourceLocation{path_, 0, 0},
                   msg);
}

}  // namespace threewalls::calibration
