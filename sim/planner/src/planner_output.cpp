// The planner's outputs (JSON, CSV, text), the scenario files of the top rows, and the flow-fidelity
// re-simulation of a row in a child process (docs/planner.md, "Output").
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "threewalls/core/error.hpp"
#include "threewalls/core/heap.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/writer.hpp"
#include "threewalls/sim/planner.hpp"
#include "threewalls/sim/simgrid_network.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::sim {

namespace {

constexpr const char* kPlanFormat = "threewalls.plan";
constexpr int kPlanMajor = 1;
constexpr int kPlanMinor = 0;

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::rule: return "rule";
    case Outcome::oom: return "oom";
    case Outcome::estimated: return "estimated";
  }
  return "estimated";
}

Outcome outcome_of(const std::string& s, const std::string& where) {
  if (s == "rule") return Outcome::rule;
  if (s == "oom") return Outcome::oom;
  if (s == "estimated") return Outcome::estimated;
  throw InputError(where + ": outcome '" + s + "' is not one of rule, oom, estimated");
}

OrderedJson walls_json(const PlanWalls& w) {
  OrderedJson j;
  j["compute_us"] = w.compute_us;
  j["exposed_comm_us"] = w.exposed_comm_us;
  j["bubble_us"] = w.bubble_us;
  j["host_us"] = w.host_us;
  return j;
}

PlanWalls walls_from(const Json& j) {
  PlanWalls w;
  w.compute_us = j.at("compute_us").get<double>();
  w.exposed_comm_us = j.at("exposed_comm_us").get<double>();
  w.bubble_us = j.at("bubble_us").get<double>();
  w.host_us = j.at("host_us").get<double>();
  return w;
}

OrderedJson row_json(const PlanRow& r) {
  const Candidate& c = r.cand;
  OrderedJson j;
  j["index"] = c.index;
  j["layout"] = {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"vpp", c.vpp}, {"dp", c.dp},
                 {"ep", c.ep}, {"etp", c.etp}, {"edp", c.edp}};
  j["mbs"] = c.mbs;
  j["recompute"] = scenarios::to_string(c.recompute);
  j["dispatcher"] = scenarios::to_string(c.dispatcher);
  j["cuda_graphs"] = c.cuda_graphs;
  j["precision"] = scenarios::to_string(c.precision);
  j["outcome"] = outcome_name(r.outcome);
  if (!r.rule.empty()) j["rule"] = r.rule;
  j["microbatches"] = r.microbatches;
  j["step_time_us"] = r.step_time_us;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_gpu"] = r.tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["peak_bytes"] = r.peak_bytes;
  j["capacity_bytes"] = r.capacity_bytes;
  j["walls"] = walls_json(r.walls);
  j["dominant"] = r.dominant;
  j["why"] = r.why;
  if (r.flow_step_time_us) {
    OrderedJson f;
    f["step_time_us"] = *r.flow_step_time_us;
    if (r.flow_walls) f["walls"] = walls_json(*r.flow_walls);
    if (r.flow_peak_bytes) f["peak_bytes"] = *r.flow_peak_bytes;
    if (r.flow_microbatches > 0) f["microbatches_simulated"] = r.flow_microbatches;
    if (r.flow_round > 0) f["steady_round"] = r.flow_round;
    j["flow"] = f;
  }
  if (!r.flow_error.empty()) j["flow_error"] = r.flow_error;
  return j;
}

// A scenario key's value in a plan file, read by the key's registry choices.
template <class E>
E choice_of(const Json& j, const char* field, const char* key, const std::string& where) {
  const std::string v = j.at(field).get<std::string>();
  if (const auto e = scenarios::choice_value<E>(key, v)) return *e;
  throw InputError(where + ": " + field + " '" + v + "' is not one of " + join(scenarios::choice_param(key).choices));
}

PlanRow row_from(const Json& j, const std::string& where) {
  PlanRow r;
  Candidate& c = r.cand;
  c.index = j.at("index").get<std::uint64_t>();
  const Json& l = j.at("layout");
  c.tp = l.at("tp").get<int>();
  c.cp = l.at("cp").get<int>();
  c.pp = l.at("pp").get<int>();
  c.vpp = l.at("vpp").get<int>();
  c.dp = l.at("dp").get<int>();
  c.ep = l.at("ep").get<int>();
  c.etp = l.at("etp").get<int>();
  c.edp = l.at("edp").get<int>();
  c.mbs = j.at("mbs").get<int>();
  c.recompute = choice_of<scenarios::RecomputeGranularity>(j, "recompute", "train.recompute_granularity", where);
  c.dispatcher = choice_of<scenarios::Dispatcher>(j, "dispatcher", "train.token_dispatcher", where);
  c.cuda_graphs = j.at("cuda_graphs").get<std::string>();
  c.precision = choice_of<scenarios::Precision>(j, "precision", "train.precision", where);
  r.outcome = outcome_of(j.at("outcome").get<std::string>(), where);
  if (j.contains("rule")) r.rule = j.at("rule").get<std::string>();
  r.microbatches = j.at("microbatches").get<int>();
  r.step_time_us = j.at("step_time_us").get<double>();
  r.tokens_per_s = j.at("tokens_per_s").get<double>();
  r.tflops_per_gpu = j.at("tflops_per_gpu").get<double>();
  r.mfu = j.at("mfu").get<double>();
  r.peak_bytes = j.at("peak_bytes").get<double>();
  r.capacity_bytes = j.at("capacity_bytes").get<double>();
  r.walls = walls_from(j.at("walls"));
  // A row's figures are finite and non-negative, its step time positive: a corrupt row must not rank.
  const std::pair<const char*, double> figures[] = {{"tokens_per_s", r.tokens_per_s},
                                                    {"tflops_per_gpu", r.tflops_per_gpu},
                                                    {"mfu", r.mfu},
                                                    {"peak_bytes", r.peak_bytes},
                                                    {"capacity_bytes", r.capacity_bytes}};
  for (const auto& [key, v] : figures) {
    if (!(v >= 0.0) || !std::isfinite(v)) {
      throw InputError(where + ": row " + std::to_string(c.index) + ": '" + key + "' is " + j.at(key).dump() +
                       "; allowed: a finite number >= 0");
    }
  }
  if (r.outcome == Outcome::estimated && (!(r.step_time_us > 0.0) || !std::isfinite(r.step_time_us))) {
    throw InputError(where + ": row " + std::to_string(c.index) + ": 'step_time_us' is " + j.at("step_time_us").dump() +
                     "; allowed: a finite number > 0");
  }
  r.dominant = j.at("dominant").get<std::string>();
  r.why = j.value("why", "");
  if (j.contains("flow")) {
    const Json& f = j.at("flow");
    r.flow_step_time_us = f.at("step_time_us").get<double>();
    if (f.contains("walls")) r.flow_walls = walls_from(f.at("walls"));
    if (f.contains("peak_bytes")) r.flow_peak_bytes = f.at("peak_bytes").get<double>();
    // The simulated step's micro-batches and its steady round (micro-batches, 0: not extrapolated).
    auto count = [&](const char* key) {
      if (!f.contains(key)) return 0;
      const Json& v = f.at(key);
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 1'000'000'000) {
        throw InputError(where + ": row " + std::to_string(c.index) + ": 'flow." + key + "' is " + v.dump() +
                         "; allowed: an integer from 0 to 1000000000");
      }
      return static_cast<int>(v.get<std::int64_t>());
    };
    r.flow_microbatches = count("microbatches_simulated");
    r.flow_round = count("steady_round");
  }
  if (j.contains("flow_error")) r.flow_error = j.at("flow_error").get<std::string>();
  return r;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

OrderedJson plan_to_json(const PlanResult& r) {
  OrderedJson j;
  j["format"] = kPlanFormat;
  j["format_version"] = std::to_string(kPlanMajor) + "." + std::to_string(kPlanMinor);
  j["tool_version"] = std::string(tool_version());
  j["git_sha"] = std::string(git_sha());
  j["scenario"] = {{"path", r.scenario_path}, {"name", r.scenario_name}, {"hash", r.scenario_hash}};
  j["calibration"] = {{"id", r.profile_id}, {"path", r.profile_path}};
  j["gpus"] = r.gpus;
  j["search"] = r.search;
  j["shard"] = {{"index", r.shard_index}, {"count", r.shard_count}};
  j["top_k"] = r.top_k;
  j["losers_per_reason"] = r.losers_per_reason;
  const auto& c = r.counters;
  OrderedJson cj;
  cj["total"] = c.total;
  cj["enumerated"] = c.enumerated;
  cj["estimated"] = c.estimated;
  cj["oom"] = c.oom;
  cj["rule"] = OrderedJson::object();
  for (const auto& [k, v] : c.rule) cj["rule"][k] = v;
  cj["dominant"] = OrderedJson::object();
  for (const auto& [k, v] : c.dominant) cj["dominant"][k] = v;
  cj["reduced_simulations"] = c.reduced_simulations;
  cj["wall_s"] = c.wall_s;
  cj["configs_per_minute"] = c.wall_s > 0 ? 60.0 * static_cast<double>(c.enumerated) / c.wall_s : 0.0;
  j["counters"] = cj;
  j["top"] = OrderedJson::array();
  for (const auto& row : r.top) j["top"].push_back(row_json(row));
  j["losers"] = OrderedJson::array();
  for (const auto& row : r.losers) j["losers"].push_back(row_json(row));
  return j;
}

PlanResult plan_from_json(const Json& j, const std::string& source) {
  // A string field or "" (absent, null or another type): never a raw JSON type error.
  auto text = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!j.is_object() || text("format") != kPlanFormat) {
    throw InputError(source + ": not a threewalls plan (format \"" + std::string(kPlanFormat) + "\" expected)");
  }
  const std::string ver = text("format_version");
  if (ver.empty() || std::atoi(ver.c_str()) != kPlanMajor) {
    const auto given = j.find("format_version");
    throw InputError(source + ": plan format_version " + (given == j.end() ? std::string("missing") : given->dump()) +
                     " is not supported (this tool reads \"" + std::to_string(kPlanMajor) + ".x\")");
  }
  try {
    PlanResult r;
    r.scenario_path = j.at("scenario").at("path").get<std::string>();
    r.scenario_name = j.at("scenario").at("name").get<std::string>();
    r.scenario_hash = j.at("scenario").at("hash").get<std::string>();
    r.profile_id = j.at("calibration").at("id").get<std::string>();
    r.profile_path = j.at("calibration").at("path").get<std::string>();
    r.gpus = j.at("gpus").get<int>();
    r.search = j.at("search").get<std::string>();
    r.shard_index = j.at("shard").at("index").get<int>();
    r.shard_count = j.at("shard").at("count").get<int>();
    r.top_k = j.at("top_k").get<int>();
    r.losers_per_reason = j.at("losers_per_reason").get<int>();
    const Json& c = j.at("counters");
    r.counters.total = c.at("total").get<std::uint64_t>();
    r.counters.enumerated = c.at("enumerated").get<std::uint64_t>();
    r.counters.estimated = c.at("estimated").get<std::uint64_t>();
    r.counters.oom = c.at("oom").get<std::uint64_t>();
    for (const auto& [k, v] : c.at("rule").items()) r.counters.rule[k] = v.get<std::uint64_t>();
    for (const auto& [k, v] : c.at("dominant").items()) r.counters.dominant[k] = v.get<std::uint64_t>();
    r.counters.reduced_simulations = c.at("reduced_simulations").get<std::uint64_t>();
    r.counters.wall_s = c.at("wall_s").get<double>();
    for (const auto& row : j.at("top")) r.top.push_back(row_from(row, source));
    for (const auto& row : j.at("losers")) r.losers.push_back(row_from(row, source));
    return r;
  } catch (const Json::exception& e) {
    throw InputError(source + ": malformed plan: " + e.what());
  }
}

std::string plan_to_csv(const PlanResult& r) {
  std::ostringstream os;
  os << "rank,kind,tp,cp,pp,vpp,dp,ep,etp,edp,mbs,recompute,dispatcher,cuda_graphs,precision,microbatches,"
        "step_time_us,tokens_per_s,tflops_per_gpu,mfu,peak_bytes,capacity_bytes,compute_us,exposed_comm_us,"
        "bubble_us,host_us,dominant,flow_step_time_us,why\n";
  auto line = [&](const PlanRow& row, const std::string& rank, const char* kind) {
    const Candidate& c = row.cand;
    os << rank << ',' << kind << ',' << c.tp << ',' << c.cp << ',' << c.pp << ',' << c.vpp << ',' << c.dp << ','
       << c.ep << ',' << c.etp << ',' << c.edp << ',' << c.mbs << ',' << scenarios::to_string(c.recompute) << ','
       << scenarios::to_string(c.dispatcher) << ',' << csv_field(c.cuda_graphs) << ','
       << scenarios::to_string(c.precision) << ',' << row.microbatches << ',' << fixed(row.step_time_us, 1) << ','
       << fixed(row.tokens_per_s, 1) << ',' << fixed(row.tflops_per_gpu, 2) << ',' << fixed(row.mfu, 4) << ','
       << fixed(row.peak_bytes, 0) << ',' << fixed(row.capacity_bytes, 0) << ',' << fixed(row.walls.compute_us, 1)
       << ',' << fixed(row.walls.exposed_comm_us, 1) << ',' << fixed(row.walls.bubble_us, 1) << ','
       << fixed(row.walls.host_us, 1) << ',' << (row.outcome == Outcome::oom ? "oom" : row.dominant) << ','
       << (row.flow_step_time_us ? fixed(*row.flow_step_time_us, 1) : "") << ',' << csv_field(row.why) << '\n';
  };
  for (std::size_t i = 0; i < r.top.size(); ++i) line(r.top[i], std::to_string(i + 1), "top");
  for (const auto& row : r.losers) line(row, "", "loser");
  return os.str();
}

std::string plan_to_text(const PlanResult& r) {
  std::ostringstream os;
  const auto& c = r.counters;
  os << "plan " << r.scenario_name << " on " << r.gpus << " GPUs (calibration " << r.profile_id << ")\n";
  os << "search " << r.search << "\n";
  if (r.shard_count > 1) os << "shard " << r.shard_index << "/" << r.shard_count << "\n";
  os << "configurations " << c.enumerated << " of " << c.total << ": " << c.estimated << " estimated, " << c.oom
     << " out of memory, ";
  std::uint64_t rules = 0;
  for (const auto& [k, v] : c.rule) rules += v;
  os << rules << " pruned by layout rules";
  if (!c.rule.empty()) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : c.rule) parts.push_back(k + " " + std::to_string(v));
    os << " (" << join(parts, ", ") << ")";
  }
  os << "\n";
  if (!c.dominant.empty()) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : c.dominant) parts.push_back(k + " " + std::to_string(v));
    os << "dominant overhead of the estimated: " << join(parts, ", ") << "\n";
  }
  os << "swept in " << fixed(c.wall_s, 2) << " s ("
     << fixed(c.wall_s > 0 ? 60.0 * static_cast<double>(c.enumerated) / c.wall_s : 0.0, 0) << " configurations/min, "
     << c.reduced_simulations << " reduced simulations)\n\n";
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-4s %-40s %-52s %10s %10s %6s %15s %9s %9s %9s %9s %10s  %s\n", "#", "layout",
                "options", "step_s", "tokens/s", "MFU%", "mem GiB/cap", "compute", "exp.comm", "bubble", "host",
                "flow_s", "verdict");
  os << buf;
  auto line = [&](const PlanRow& row, const std::string& rank) {
    const double gib = 1073741824.0;
    const bool oom = row.outcome == Outcome::oom;
    std::snprintf(buf, sizeof buf, "%-4s %-40s %-52s %10s %10s %6s %7.1f/%-7.1f %9s %9s %9s %9s %10s  %s\n",
                  rank.c_str(), row.cand.layout().c_str(), row.cand.options().c_str(),
                  oom ? "-" : fixed(row.step_time_us * 1e-6, 3).c_str(), oom ? "-" : fixed(row.tokens_per_s, 0).c_str(),
                  oom ? "-" : fixed(100.0 * row.mfu, 1).c_str(), row.peak_bytes / gib, row.capacity_bytes / gib,
                  oom ? "-" : fixed(row.walls.compute_us * 1e-6, 3).c_str(),
                  oom ? "-" : fixed(row.walls.exposed_comm_us * 1e-6, 3).c_str(),
                  oom ? "-" : fixed(row.walls.bubble_us * 1e-6, 3).c_str(),
                  oom ? "-" : fixed(row.walls.host_us * 1e-6, 3).c_str(),
                  row.flow_step_time_us ? fixed(*row.flow_step_time_us * 1e-6, 3).c_str()
                                        : (row.flow_error.empty() ? "-" : "failed"),
                  row.why.c_str());
    os << buf;
  };
  for (std::size_t i = 0; i < r.top.size(); ++i) line(r.top[i], std::to_string(i + 1));
  if (!r.losers.empty()) {
    os << "\nlosers (best " << r.losers_per_reason << " per reason; walls in seconds per step)\n";
    for (const auto& row : r.losers) line(row, "-");
  }
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    if (!r.top[i].flow_error.empty()) os << "flow re-simulation of #" << i + 1 << " failed: " << r.top[i].flow_error << "\n";
  }
  std::vector<std::string> extrapolated;
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const PlanRow& row = r.top[i];
    if (row.flow_round > 0 && row.flow_error.empty()) {
      extrapolated.push_back("#" + std::to_string(i + 1) + " from " + std::to_string(row.flow_microbatches) + " of " +
                             std::to_string(row.microbatches) + " (period of " + std::to_string(row.flow_round) + ")");
    }
  }
  if (!extrapolated.empty()) {
    os << "flow_s extrapolated by the steady period of a shorter step (micro-batches; --resim-method full "
          "simulates every one): "
       << join(extrapolated, ", ") << "\n";
  }
  // The rows are ranked by their estimates; where the flow re-simulations of the top rows rank them
  // otherwise, say which is fastest by flow.
  std::size_t fastest = r.top.size();
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const auto& f = r.top[i].flow_step_time_us;
    if (f && (fastest == r.top.size() || *f < *r.top[fastest].flow_step_time_us)) fastest = i;
  }
  if (fastest > 0 && fastest < r.top.size() && r.top[0].flow_step_time_us) {
    const double best = *r.top[fastest].flow_step_time_us;
    const double first = *r.top[0].flow_step_time_us;
    os << "by flow fidelity #" << fastest + 1 << " is the fastest re-simulated row: " << fixed(best * 1e-6, 3)
       << " s against #1's " << fixed(first * 1e-6, 3) << " s (" << fixed(100.0 * (best - first) / first, 1)
       << "%); its estimate ranks it lower\n";
  }
  return os.str();
}

std::string candidate_toml(const scenarios::Scenario& base, const scenarios::Scenario& candidate,
                           const std::string& name, const std::string& comment) {
  scenarios::Scenario out = base;
  out.name = name;
  out.parallel = candidate.parallel;
  out.train = candidate.train;
  out.cluster.nodes = candidate.cluster.nodes;
  return scenarios::write_scenario(out, {comment});
}

const char* to_string(ResimMethod m) { return m == ResimMethod::full ? "full" : "steady"; }

std::optional<ResimMethod> resim_method_from(const std::string& s) {
  for (const ResimMethod m : {ResimMethod::steady_state, ResimMethod::full}) {
    if (s == to_string(m)) return m;
  }
  return std::nullopt;
}

ResimStep resim_step(const scenarios::Scenario& s, ResimMethod method) {
  if (!s.train) return {0, 0, 0};  // an inference step: its own
  const int m = s.train->num_microbatches;
  const int pp = std::max(1, s.parallel.pp);
  // The first stage's forwards are steady from micro-batch pp + 1 on without interleaving (its
  // warm-up runs micro-batches 0 to pp - 2; pp - 1 and pp still follow it): three rounds of one
  // micro-batch are measured, as one alone varies by up to 1% with the flows' sharing (DeepSeek-V3
  // pp 16 on 2,048 GPUs: within 0.13% of the whole step with three, 1% with one). With interleaving
  // (rounds of pp micro-batches, a warm-up of about 2 pp) the third round is steady.
  const ResimStep st = s.parallel.vpp > 1 ? ResimStep{3 * pp, pp, 1} : ResimStep{pp + 5, 1, 3};
  if (method == ResimMethod::steady_state && m > st.microbatches) return st;
  return {m, 0, 0};
}

namespace {

// What one simulated step gives a row.
struct ResimPoint {
  double step_time_us = 0.0;
  std::optional<PlanWalls> walls;
  double peak_bytes = 0.0;
  std::optional<double> period_us;  // its steady period, when asked for (SteadyRound)
  std::optional<PlanWalls> period_walls;
};

// The planner's walls of a simulated step's (or period's) walls.
PlanWalls plan_walls(const profiler::WallBreakdown& w) {
  return PlanWalls{w.compute_us + w.memory_us, w.communication_us, w.bubble_us, w.host_us};
}

// A re-simulated step is a fresh process that allocates its StepGraph, the executor's state and the
// records (tens to hundreds of MiB) and exits: faulting them in page by page took about a fifth of its
// time (perf, DeepSeek-V3 on 1,024 GPUs). So its heap grows once, by `bytes` advised to the kernel as
// transparent huge pages (used where the THP mode is "madvise" or "always", ignored where "never"),
// and keeps them: blocks of every size come from it and freed memory is not given back (keep_freed_heap).
void heap_in_huge_pages(std::size_t bytes) {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  if (!keep_freed_heap()) return;
  void* p = std::malloc(bytes);
  if (p == nullptr) return;
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = (at + kHuge - 1) & ~(kHuge - 1);
  const std::uintptr_t end = (at + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  std::free(p);
}

// The child of one re-simulated step: one SimGrid engine, the result as JSON on `fd`, then _exit (no
// destructors of the parent's state). With st.round > 0 also its steady period (ResimStep).
[[noreturn]] void resimulate_child(const scenarios::Scenario& s, const OpCoster& coster, const ResimStep& st, int fd) {
  std::string msg;
  heap_in_huge_pages(std::size_t{512} << 20);
  try {
    scenarios::Scenario one = s;
    one.run.profiler.enabled = false;
    SimOptions opt;
    opt.fidelity = Fidelity::flow;
    opt.steps = 1;
    // The row reads the step time, the walls and the peak.
    opt.phase_stats = false;
    opt.substitution_warnings = false;
    opt.steady_round = st.round;
    opt.steady_rounds = st.rounds;
    const SimResult r = simulate(one, coster, ProfileInfoForHeader{"plan", "", "", "planner re-simulation", ""}, opt);
    OrderedJson j;
    j["step_time_us"] = r.summary.steps.empty() ? 0.0 : r.summary.steps.back().step_time_us;
    if (r.summary.walls_mean) j["walls"] = walls_json(plan_walls(*r.summary.walls_mean));
    if (r.steady_round) {
      j["period_us"] = r.steady_round->period_us;
      if (r.steady_round->walls) j["period_walls"] = walls_json(plan_walls(*r.steady_round->walls));
    }
    double peak = 0.0;
    for (const auto& c : r.memory.classes) peak = std::max(peak, c.peak().value);
    j["peak_bytes"] = peak;
    msg = j.dump();
  } catch (const std::exception& e) {
    msg = OrderedJson{{"error", e.what()}}.dump();
  }
  std::size_t off = 0;
  while (off < msg.size()) {
    const ssize_t n = write(fd, msg.data() + off, msg.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  close(fd);
  _exit(0);
}

// The step of a finished child, from its exit status and what it wrote; the error, or "".
std::string read_resimulation(const std::string& buf, int status, ResimPoint& p) {
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || buf.empty()) {
    return "the simulation process ended abnormally" +
           (WIFSIGNALED(status) ? " (signal " + std::to_string(WTERMSIG(status)) + ")" : std::string());
  }
  try {
    const Json j = Json::parse(buf);
    if (j.contains("error")) return j.at("error").get<std::string>();
    p.step_time_us = j.at("step_time_us").get<double>();
    if (j.contains("walls")) p.walls = walls_from(j.at("walls"));
    p.peak_bytes = j.at("peak_bytes").get<double>();
    if (j.contains("period_us")) p.period_us = j.at("period_us").get<double>();
    if (j.contains("period_walls")) p.period_walls = walls_from(j.at("period_walls"));
  } catch (const Json::exception& e) {
    return std::string("unreadable result: ") + e.what();
  }
  return "";
}

// The row of its simulated step: the step itself, or (st.round > 0) extrapolated to the row's m
// micro-batches by the step's steady period (resim_step); the error, or "".
std::string fill_row(PlanRow& row, const ResimStep& st, const ResimPoint& p, int m) {
  row.flow_microbatches = st.microbatches;
  row.flow_round = st.round;
  row.flow_peak_bytes = p.peak_bytes;
  if (st.round == 0) {
    row.flow_step_time_us = p.step_time_us;
    row.flow_walls = p.walls;
    return "";
  }
  if (!p.period_us) {
    return "the step of " + std::to_string(st.microbatches) +
           " micro-batches has no steady period on its first pipeline stage (--resim-method full simulates "
           "every micro-batch)";
  }
  const double k = static_cast<double>(m - st.microbatches) / static_cast<double>(st.round);
  row.flow_step_time_us = p.step_time_us + k * *p.period_us;
  if (p.walls && p.period_walls) {
    const PlanWalls &w = *p.walls, &d = *p.period_walls;
    row.flow_walls = PlanWalls{w.compute_us + k * d.compute_us, w.exposed_comm_us + k * d.exposed_comm_us,
                               w.bubble_us + k * d.bubble_us, w.host_us + k * d.host_us};
  }
  return "";
}

struct ResimChild {
  pid_t pid = -1;
  int fd = -1;
  std::size_t job = 0;
  std::string buf;
};

// The simulated step of a row.
struct ResimJob {
  std::size_t row = 0;
  scenarios::Scenario scenario;
  ResimStep step;
};

// The step of the row of `s` (row index `row`) by resim_step.
ResimJob resim_job(const scenarios::Scenario& s, std::size_t row, ResimMethod method) {
  const ResimStep st = resim_step(s, method);
  ResimJob job{row, s, st};
  if (st.round > 0) job.scenario.train->set_microbatches(st.microbatches, job.scenario.parallel.dp);
  return job;
}

// A step's simulation time grows with its micro-batches.
int step_length(const scenarios::Scenario& s) { return s.train ? s.train->num_microbatches : 1; }

// A forked child of one step: its pid and the read end of its pipe, or why it could not start.
struct Spawned {
  pid_t pid = -1;
  int fd = -1;
  std::string error;
};

// Forks resimulate_child for `s`; the child closes `others` (the parent's read ends of other children).
Spawned spawn_step(const scenarios::Scenario& s, const OpCoster& coster, const ResimStep& st,
                   const std::vector<int>& others) {
  Spawned out;
  int fds[2];
  if (pipe(fds) != 0) {
    out.error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    out.error = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return out;
  }
  if (pid == 0) {
    close(fds[0]);
    for (const int fd : others) close(fd);
    resimulate_child(s, coster, st, fds[1]);
  }
  close(fds[1]);
  out.pid = pid;
  out.fd = fds[0];
  return out;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Everything `fd` has until its end, then closed.
std::string read_all(int fd) {
  std::string buf;
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
  close(fd);
  return buf;
}

}  // namespace

struct ResimAhead::Step {
  std::uint64_t cand = 0;
  scenarios::Scenario scenario;
  ResimStep step;
};

ResimAhead::ResimAhead(const PlanEstimator& est, const OpCoster& coster, int rows, int jobs, ResimMethod method)
    : est_(est), coster_(coster), rows_(static_cast<std::size_t>(std::max(0, rows))),
      jobs_(static_cast<std::size_t>(std::max(0, jobs))), method_(method) {}

ResimAhead::~ResimAhead() { clear(); }

void ResimAhead::clear() {
  for (Child& c : children_) {
    if (!c.status) {
      kill(c.pid, SIGKILL);
      wait_child(c.pid);
    }
    close(c.fd);
  }
  children_.clear();
}

void ResimAhead::offer(const std::vector<PlanRow>& best) {
  if (jobs_ == 0 || rows_ == 0) return;
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 0; i < std::min(rows_, best.size()); ++i) ids.push_back(best[i].cand.index);
  if (ids != wanted_rows_) {
    wanted_rows_ = ids;
    steps_.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      try {
        ResimJob j = resim_job(est_.scenario_of(best[i].cand), i, method_);
        steps_.push_back(Step{ids[i], std::move(j.scenario), j.step});
      } catch (const std::exception&) {
        // resimulate_flow starts it, and records why it fails.
      }
    }
    // In the order resimulate_flow starts them.
    std::stable_sort(steps_.begin(), steps_.end(),
                     [](const Step& x, const Step& y) { return step_length(x.scenario) > step_length(y.scenario); });
    auto wanted = [this](const Child& c) {
      return std::any_of(steps_.begin(), steps_.end(), [&c](const Step& st) {
        return st.cand == c.cand && step_length(st.scenario) == c.microbatches;
      });
    };
    for (auto it = children_.begin(); it != children_.end();) {
      if (wanted(*it)) {
        ++it;
        continue;
      }
      if (!it->status) {
        kill(it->pid, SIGKILL);
        wait_child(it->pid);
      }
      close(it->fd);
      it = children_.erase(it);
    }
  }
  std::size_t running = 0;
  for (Child& c : children_) {
    if (c.status) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.status = status;
    } else {
      ++running;
    }
  }
  for (const Step& st : steps_) {
    if (running >= jobs_) break;
    const int m = step_length(st.scenario);
    if (std::any_of(children_.begin(), children_.end(),
                    [&](const Child& c) { return c.cand == st.cand && c.microbatches == m; })) {
      continue;
    }
    std::vector<int> others;
    for (const Child& c : children_) others.push_back(c.fd);
    const Spawned sp = spawn_step(st.scenario, coster_, st.step, others);
    if (sp.pid < 0) return;  // resimulate_flow starts it, and records why it fails
    children_.push_back(Child{st.cand, m, sp.pid, sp.fd, std::nullopt});
    ++running;
  }
}

std::optional<ResimAhead::Child> ResimAhead::take(std::uint64_t cand, int microbatches) {
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (it->cand == cand && it->microbatches == microbatches) {
      Child c = *it;
      children_.erase(it);
      return c;
    }
  }
  return std::nullopt;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

void resimulate_flow(const std::vector<scenarios::Scenario>& scenarios, const OpCoster& coster,
                     const std::vector<PlanRow*>& rows, int jobs, ResimMethod method,
                     const std::function<void(std::size_t)>& started, ResimAhead* ahead) {
  if (scenarios.size() != rows.size()) throw std::logic_error("resimulate_flow: one row per scenario");
  std::vector<ResimPoint> points(scenarios.size());
  std::vector<std::string> errors(scenarios.size());
  std::vector<ResimJob> todo;
  for (std::size_t i = 0; i < scenarios.size(); ++i) todo.push_back(resim_job(scenarios[i], i, method));
  // Longest first, so that the last ones to finish are short; the rows do not depend on the order.
  std::stable_sort(todo.begin(), todo.end(), [](const ResimJob& x, const ResimJob& y) {
    return step_length(x.scenario) > step_length(y.scenario);
  });
  std::vector<bool> reported(scenarios.size(), false);
  if (!todo.empty()) {
    try {
      preload_simgrid_module();
    } catch (const std::exception&) {
      // Each child then fails to load it too, and its row records why (flow_error).
    }
  }
  const std::size_t limit = static_cast<std::size_t>(std::max(1, jobs));
  // The steps started ahead: running ones join the others, finished ones are read now.
  std::vector<ResimChild> running;
  std::vector<bool> taken(todo.size(), false);
  if (ahead != nullptr) {
    for (std::size_t n = 0; n < todo.size(); ++n) {
      const ResimJob& job = todo[n];
      const auto c = ahead->take(rows[job.row]->cand.index, step_length(job.scenario));
      if (!c) continue;
      taken[n] = true;
      if (started && !reported[job.row]) started(job.row);
      reported[job.row] = true;
      if (!c->status) {
        running.push_back(ResimChild{c->pid, c->fd, n, {}});
        continue;
      }
      const std::string error = read_resimulation(read_all(c->fd), *c->status, points[job.row]);
      if (!error.empty() && errors[job.row].empty()) errors[job.row] = error;
    }
    ahead->clear();
  }
  std::size_t next = 0;
  auto start = [&](std::size_t n) {
    const ResimJob& job = todo[n];
    if (started && !reported[job.row]) started(job.row);
    reported[job.row] = true;
    std::vector<int> others;
    for (const auto& c : running) others.push_back(c.fd);
    const Spawned sp = spawn_step(job.scenario, coster, job.step, others);
    if (sp.pid < 0) {
      errors[job.row] = sp.error;
      return;
    }
    running.push_back(ResimChild{sp.pid, sp.fd, n, {}});
  };
  while (next < todo.size() || !running.empty()) {
    while (next < todo.size() && running.size() < limit) {
      if (!taken[next]) start(next);
      ++next;
    }
    if (running.empty()) continue;
    std::vector<pollfd> pfds;
    for (const auto& c : running) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw SystemError(std::string("plan: poll on the re-simulation processes: ") + std::strerror(errno));
    }
    // Back to front, so that erasing a finished child keeps the indices of the others.
    for (std::size_t k = pfds.size(); k-- > 0;) {
      if (pfds[k].revents == 0) continue;
      ResimChild& c = running[k];
      char chunk[4096];
      const ssize_t n = read(c.fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        c.buf.append(chunk, static_cast<std::size_t>(n));
        continue;
      }
      close(c.fd);
      const int status = wait_child(c.pid);
      const ResimJob& job = todo[c.job];
      const std::string error = read_resimulation(c.buf, status, points[job.row]);
      if (!error.empty() && errors[job.row].empty()) errors[job.row] = error;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    PlanRow& row = *rows[i];
    if (!errors[i].empty()) {
      row.flow_error = errors[i];
      continue;
    }
    const std::string error = fill_row(row, resim_step(scenarios[i], method), points[i],
                                       scenarios[i].train ? scenarios[i].train->num_microbatches : 0);
    if (!error.empty()) {
      row.flow_error = error;
      row.flow_step_time_us.reset();
      row.flow_walls.reset();
      row.flow_peak_bytes.reset();
    }
  }
}

}  // namespace threewalls::sim
