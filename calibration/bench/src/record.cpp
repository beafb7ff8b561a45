#include "threewalls/calibration/bench/record.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <utility>

#include "threewalls/calibration/fit.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::calibration::bench {

const char* to_string(Status s) {
  switch (s) {
    case Status::ok:
      return "ok";
    case Status::error:
      return "error";
    case Status::skipped:
      return "skipped";
  }
  return "?";
}

Measurement Record::measurement() const { return Measurement::from_samples(samples_s); }

double Record::median_s() const {
  return samples_s.empty() ? std::numeric_limits<double>::quiet_NaN() : fit::median(samples_s);
}

std::vector<Param> derived_metrics(const PointSpec& p, double median_s) {
  std::vector<Param> m;
  if (!(median_s > 0.0)) return m;
  const OpInfo* op = find_op(p.op);
  const std::string group = op ? op->group : "";
  if (group == "collective") {
    m.push_back({"algbw_gb_per_s", algorithm_bandwidth(p.bytes, median_s) / 1e9});
    m.push_back({"busbw_gb_per_s", bus_bandwidth(p.op, p.group_size, p.bytes, median_s) / 1e9});
    return m;
  }
  if (p.op == "nccl_interference" && p.inputs.size() == 4 && p.inputs[3] > 0.0) {
    m.push_back({"alone_us", p.inputs[3] * 1e6});
    m.push_back({"slowdown", median_s / p.inputs[3]});  // time with NCCL resident / time alone
  }
  if ((p.op == "nccl_memory" || p.op == "device_memory") && p.inputs.size() == 3) {
    m.push_back({"mib", p.inputs[2] / 1048576.0});
    return m;
  }
  if (p.flops > 0.0) m.push_back({"tflop_per_s", p.flops / median_s / 1e12});
  if (p.bytes > 0.0) m.push_back({"gb_per_s", p.bytes / median_s / 1e9});
  return m;
}

// ---- JSON ----------------------------------------------------------------------------------------

namespace {

OrderedJson number_or_null(double v) { return std::isfinite(v) ? OrderedJson(v) : OrderedJson(nullptr); }

}  // namespace

OrderedJson to_json(const Hardware& h) {
  OrderedJson j;
  j["gpu_name"] = h.gpu_name;
  j["gpu_kind"] = h.gpu_kind;
  j["sm_count"] = h.sm_count;
  j["sm_clock_mhz"] = h.sm_clock_mhz;
  j["memory_clock_mhz"] = h.memory_clock_mhz;
  j["memory_bytes"] = h.memory_bytes;
  j["driver_version"] = h.driver_version;
  j["cuda_version"] = h.cuda_version;
  j["nccl_version"] = h.nccl_version;
  j["gpus_seen"] = h.gpus_seen;
  j["links_seen"] = h.links_seen;
  j["machine"] = h.machine;
  j["date"] = h.date;
  j["peak_bf16_flop_per_s"] = h.peak_bf16_flop_per_s;
  j["peak_fp8_flop_per_s"] = h.peak_fp8_flop_per_s;
  j["peak_fp32_flop_per_s"] = h.peak_fp32_flop_per_s;
  j["hbm_bandwidth_datasheet_bytes_per_s"] = h.hbm_bandwidth_datasheet_bytes_per_s;
  return j;
}

OrderedJson to_json(const RawHeader& h) {
  OrderedJson j;
  j["format"] = kRawFormat;
  j["format_version"] = kRawFormatVersion;
  j["tool_version"] = h.tool_version;
  j["git_sha"] = h.git_sha;
  j["mode"] = h.mode;
  j["started"] = h.started;
  j["argv"] = h.argv;
  j["gpus_used"] = h.gpus_used;
  j["hardware"] = to_json(h.hardware);
  j["topology"] = h.topology;
  return j;
}

OrderedJson to_json(const Record& r) {
  OrderedJson j;
  j["op"] = r.point.op;
  j["family"] = r.point.family;
  OrderedJson params = OrderedJson::object();
  for (const auto& p : r.point.params) params[p.key] = p.value;
  j["params"] = params;
  j["inputs"] = r.point.inputs;
  j["held_out"] = r.point.held_out;
  j["group_size"] = r.point.group_size;
  j["flops"] = r.point.flops;
  j["bytes"] = r.point.bytes;
  j["status"] = to_string(r.status);
  if (!r.error.empty()) j["error"] = r.error;
  j["reps"] = r.reps;
  j["stop"] = r.stop;
  j["rel_ci"] = number_or_null(r.rel_ci);
  j["wall_s"] = r.wall_s;
  j["check"] = r.check;
  if (r.usable()) {
    const Measurement m = r.measurement();
    j["median_s"] = m.median_s;
    j["p10_s"] = m.p10_s;
    j["p90_s"] = m.p90_s;
  }
  j["samples_s"] = r.samples_s;
  OrderedJson metrics = OrderedJson::object();
  for (const auto& p : r.metrics) metrics[p.key] = number_or_null(p.value);
  j["metrics"] = metrics;
  return j;
}

// ---- reading -------------------------------------------------------------------------------------

namespace {

class LineReader {
 public:
  LineReader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(where_ + ": '" + key + "' " + why);
  }
  const Json& need(const std::string& key) const {
    if (!j_.is_object()) throw InputError(where_ + ": expected a JSON object");
    const auto it = j_.find(key);
    if (it == j_.end()) fail(key, "is missing");
    return *it;
  }
  std::string str(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_string()) fail(key, "must be a string");
    return v.get<std::string>();
  }
  std::string str_or(const std::string& key, const std::string& def) const { return j_.contains(key) ? str(key) : def; }
  double num(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_number()) fail(key, "must be a number");
    return v.get<double>();
  }
  double num_or_nan(const std::string& key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return std::numeric_limits<double>::quiet_NaN();
    return num(key);
  }
  std::int64_t integer(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    return v.get<std::int64_t>();
  }
  bool boolean(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }
  std::vector<double> numbers(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_array()) fail(key, "must be an array of numbers");
    std::vector<double> out;
    for (const auto& e : v) {
      if (!e.is_number()) fail(key, "must be an array of numbers");
      out.push_back(e.get<double>());
    }
    return out;
  }
  std::vector<std::string> strings(const std::string& key) const {
    const Json& v = need(key);
    if (!v.is_array()) fail(key, "must be an array of strings");
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) fail(key, "must be an array of strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  const Json& json() const { return j_; }
  const std::string& where() const { return where_; }

 private:
  const Json& j_;
  std::string where_;
};

Hardware hardware_from(const Json& j, const std::string& where) {
  const LineReader r(j, where + ": hardware");
  Hardware h;
  h.gpu_name = r.str("gpu_name");
  h.gpu_kind = r.str("gpu_kind");
  h.sm_count = static_cast<int>(r.integer("sm_count"));
  h.sm_clock_mhz = r.num("sm_clock_mhz");
  h.memory_clock_mhz = r.num("memory_clock_mhz");
  h.memory_bytes = r.integer("memory_bytes");
  h.driver_version = r.str("driver_version");
  h.cuda_version = r.str("cuda_version");
  h.nccl_version = r.str("nccl_version");
  h.gpus_seen = static_cast<int>(r.integer("gpus_seen"));
  h.links_seen = r.strings("links_seen");
  h.machine = r.str("machine");
  h.date = r.str("date");
  h.peak_bf16_flop_per_s = r.num("peak_bf16_flop_per_s");
  h.peak_fp8_flop_per_s = r.num("peak_fp8_flop_per_s");
  h.peak_fp32_flop_per_s = r.num("peak_fp32_flop_per_s");
  h.hbm_bandwidth_datasheet_bytes_per_s = r.num("hbm_bandwidth_datasheet_bytes_per_s");
  return h;
}

Status status_from(const LineReader& r) {
  const std::string s = r.str("status");
  if (s == "ok") return Status::ok;
  if (s == "error") return Status::error;
  if (s == "skipped") return Status::skipped;
  r.fail("status", "= \"" + s + "\" is not one of: ok, error, skipped");
}

}  // namespace

RawFile read_raw(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path))
    throw InputError(path.string() + ": no such file (expected a calibrate --raw-out points.jsonl)");
  RawFile out;
  bool have_header = false;
  read_jsonl(path, [&](Json&& j, std::size_t line) {
    const std::string where = path.string() + ":" + std::to_string(line);
    const LineReader r(j, where);
    if (!have_header) {
      const std::string format = r.str("format");
      if (format != kRawFormat) r.fail("format", "= \"" + format + "\"; expected \"" + kRawFormat + "\"");
      const std::string version = r.str("format_version");
      if (version.rfind("1.", 0) != 0) {
        r.fail("format_version", "= \"" + version + "\": this threewalls reads " + kRawFormat + " 1.x only");
      }
      out.header.tool_version = r.str("tool_version");
      out.header.git_sha = r.str("git_sha");
      out.header.mode = r.str("mode");
      out.header.started = r.str("started");
      out.header.argv = r.strings("argv");
      out.header.gpus_used = static_cast<int>(r.integer("gpus_used"));
      out.header.hardware = hardware_from(r.need("hardware"), where);
      out.header.topology = r.str_or("topology", "");
      have_header = true;
      return;
    }
    Record rec;
    rec.point.op = r.str("op");
    if (!find_op(rec.point.op)) {
      std::vector<std::string> names;
      for (const auto& o : op_table()) names.push_back(o.name);
      std::string msg = "= \"" + rec.point.op + "\" is not an op of this threewalls";
      if (auto near = nearest(rec.point.op, names)) msg += " (did you mean '" + *near + "'?)";
      r.fail("op", msg);
    }
    rec.point.family = r.str("family");
    const Json& params = r.need("params");
    if (!params.is_object()) r.fail("params", "must be an object of numbers");
    for (const auto& [k, v] : params.items()) {
      if (!v.is_number()) r.fail("params." + k, "must be a number");
      rec.point.params.push_back({k, v.get<double>()});
    }
    rec.point.inputs = r.numbers("inputs");
    rec.point.held_out = r.boolean("held_out");
    rec.point.group_size = static_cast<int>(r.integer("group_size"));
    rec.point.flops = r.num("flops");
    rec.point.bytes = r.num("bytes");
    rec.status = status_from(r);
    rec.error = r.str_or("error", "");
    rec.reps = static_cast<int>(r.integer("reps"));
    rec.stop = r.str("stop");
    rec.rel_ci = r.num_or_nan("rel_ci");
    rec.wall_s = r.num("wall_s");
    rec.check = r.str("check");
    rec.samples_s = r.numbers("samples_s");
    for (double s : rec.samples_s) {
      if (!(s > 0.0) || !std::isfinite(s)) r.fail("samples_s", "entries must be positive seconds");
    }
    if (rec.status == Status::ok && rec.samples_s.empty()) r.fail("samples_s", "is empty on an ok record");
    const Json& metrics = r.need("metrics");
    if (!metrics.is_object()) r.fail("metrics", "must be an object");
    for (const auto& [k, v] : metrics.items()) {
      rec.metrics.push_back({k, v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN()});
    }
    out.records.push_back(std::move(rec));
  });
  if (!have_header)
    throw InputError(path.string() + ": empty file (expected a header line, then one record per point)");
  return out;
}

namespace {
// The same point of the plan: op, held-out flag and parameters, in any order (a raw file read back
// lists the parameters by key, the plan in its own order).
bool same_point(const PointSpec& a, const PointSpec& b) {
  if (a.op != b.op || a.held_out != b.held_out || a.params.size() != b.params.size()) return false;
  auto sorted = [](const PointSpec& p) {
    std::vector<std::pair<std::string, double>> v;
    for (const auto& q : p.params) v.emplace_back(q.key, q.value);
    std::sort(v.begin(), v.end());
    return v;
  };
  return sorted(a) == sorted(b);
}
}  // namespace

bool is_host_point(const Record& r) {
  const OpInfo* info = find_op(r.point.op);
  return info != nullptr && info->group == "host" && r.usable();
}

std::size_t merge_host_processes(std::vector<Record>& main, const std::vector<std::vector<Record>>& others) {
  std::size_t merged = 0;
  for (Record& r : main) {
    if (!is_host_point(r)) continue;
    std::vector<const Record*> all{&r};
    for (const auto& proc : others) {
      for (const Record& o : proc) {
        if (o.usable() && same_point(o.point, r.point)) {
          all.push_back(&o);
          break;
        }
      }
    }
    if (all.size() < 2) continue;
    std::vector<std::pair<double, std::size_t>> by_median;
    for (std::size_t i = 0; i < all.size(); ++i) by_median.emplace_back(all[i]->median_s(), i);
    std::sort(by_median.begin(), by_median.end());
    std::string medians;
    for (std::size_t i = 0; i < all.size(); ++i) {
      char b[48];
      std::snprintf(b, sizeof b, "%s%.3g us", i == 0 ? "" : ", ", all[i]->median_s() * 1e6);
      medians += b;
    }
    const std::size_t chosen = by_median[by_median.size() / 2].second;
    Record pick = *all[chosen];
    pick.check += "; host group in " + std::to_string(all.size()) + " processes (this one first): medians " + medians +
                  "; kept process " + std::to_string(chosen) + " (the median)";
    r = std::move(pick);
    ++merged;
  }
  return merged;
}

std::vector<std::filesystem::path> host_process_dirs(const std::filesystem::path& raw_dir) {
  std::vector<std::filesystem::path> out;
  for (int i = 1;; ++i) {
    const std::filesystem::path d = raw_dir / ("host_process_" + std::to_string(i));
    if (!std::filesystem::exists(d / "points.jsonl")) break;
    out.push_back(d);
  }
  return out;
}

int merge_host_process_dirs(const std::filesystem::path& raw_dir, std::vector<Record>& records) {
  std::vector<std::vector<Record>> others;
  for (const auto& d : host_process_dirs(raw_dir)) others.push_back(read_raw(d / "points.jsonl").records);
  if (!others.empty()) merge_host_processes(records, others);
  return static_cast<int>(others.size()) + 1;
}

}  // namespace threewalls::calibration::bench
