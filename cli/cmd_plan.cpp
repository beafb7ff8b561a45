// threewalls plan SCENARIO --gpus N [--search SPEC] [--top K] [--format text|csv|json] [--out DIR]
//                 [--shard i/N] [--resim K] [--resim-method steady|full] [--calibration PROFILE] [--quiet]
// threewalls plan-merge SHARD.json... [--out DIR] [--format ...] [--resim K] [--resim-method ...]
//                 [--calibration PROFILE]
// The what-if planner (docs/planner.md): sweep layouts and options in analytic fidelity, rank them,
// re-simulate the best with flow fidelity, write the ranked table and ready scenario files.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/resolve.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/op_coster.hpp"
#include "threewalls/sim/planner.hpp"
#include "threewalls/sim/simgrid_network.hpp"

namespace threewalls::cli {

namespace {

struct PlanArgs {
  std::string scenario;
  int gpus = 0;
  std::string search;
  std::string calibration;
  std::string format = "text";
  std::string out;
  std::string shard = "0/1";
  int top = 10;
  int resim = -1;  // -1: every top row (unsharded); shards never re-simulate
  int losers = 5;
  int jobs = 0;  // 0: the CPUs available
  std::string resim_method = sim::to_string(sim::ResimMethod::steady_state);
  bool overwrite = false;
  ProgressArg progress;
};

struct MergeArgs {
  std::vector<std::string> files;
  std::string calibration;
  std::string format = "text";
  std::string out;
  int resim = 0;
  int jobs = 0;  // 0: the CPUs available
  std::string resim_method = sim::to_string(sim::ResimMethod::steady_state);
  bool overwrite = false;
  ProgressArg progress;
};

// The profile the planner costs with (as `threewalls sim` resolves it), kept alive with its model.
struct Costing {
  calibration::ResolvedProfile resolved;
  calibration::Profile profile;
  calibration::CostModel model;
  sim::CostModelCoster coster;
  Costing(calibration::ResolvedProfile r, calibration::Profile p, scenarios::Framework framework)
      : resolved(std::move(r)), profile(std::move(p)), model(profile), coster(model, 1.0, 1.0, framework) {}
};

std::unique_ptr<Costing> load_costing(const scenarios::Scenario& s, const std::string& calibration) {
  const std::string spec = calibration.empty() ? s.calibration_profile : calibration;
  const std::filesystem::path dir =
      s.source_path.empty() ? std::filesystem::path() : std::filesystem::path(s.source_path).parent_path();
  auto resolved = calibration::resolve_profile(spec, scenarios::to_string(s.cluster.gpu), dir);
  auto profile = calibration::Profile::load(resolved.path);
  return std::make_unique<Costing>(std::move(resolved), std::move(profile), s.run.framework);
}

void check_out_dir(const std::string& out, bool overwrite) {
  if (out.empty() || overwrite) return;
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !std::filesystem::is_empty(out, ec)) {
    throw InputError(out + ": output directory exists and is not empty; pass --overwrite to replace its plan files, "
                     "or --out to choose another");
  }
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) throw SystemError(p.string() + ": cannot write");
}

// Progress on stderr: done/total, rate and ETA, at most four times a second.
class Progress {
 public:
  explicit Progress(bool on) : on_(on), t0_(std::chrono::steady_clock::now()) {}
  void operator()(std::uint64_t done, std::uint64_t total) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    const double el = std::chrono::duration<double>(now - t0_).count();
    if (done < total && el - last_ < 0.25) return;
    last_ = el;
    const double rate = el > 0 ? static_cast<double>(done) / el : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0.0;
    std::fprintf(stderr, "\rplan: %llu/%llu (%.1f%%) %.0f configs/s, ETA %.0f s   ",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                 total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0, rate, eta);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  double last_ = -1.0;
};

// Re-simulates the first `resim` top rows with flow fidelity (`jobs` processes at once), then prints
// and writes the outputs.
int finish(sim::PlanResult& r, const scenarios::LoadedScenario& base, const Costing& cost, int resim, int jobs,
           const std::string& method, const std::string& format, const std::string& out, bool progress,
           sim::ResimAhead* ahead = nullptr) {
  sim::PlanEstimator est(base, cost.coster, r.gpus);
  const auto k = static_cast<std::size_t>(std::min<int>(resim, static_cast<int>(r.top.size())));
  std::vector<scenarios::Scenario> scenarios;
  std::vector<sim::PlanRow*> rows;
  for (std::size_t i = 0; i < k; ++i) {
    scenarios.push_back(est.scenario_of(r.top[i].cand));
    rows.push_back(&r.top[i]);
  }
  std::size_t started = 0;  // rows start longest first, not in rank order
  sim::resimulate_flow(
      scenarios, cost.coster, rows, jobs, *sim::resim_method_from(method),
      [&](std::size_t i) {
        if (progress) {
          std::fprintf(stderr, "plan: flow re-simulation %zu/%zu: #%zu (%s)\n", ++started, k, i + 1,
                       r.top[i].cand.layout().c_str());
        }
      },
      ahead);
  const std::string text = sim::plan_to_text(r);
  const OrderedJson json = sim::plan_to_json(r);
  const std::string csv = sim::plan_to_csv(r);
  if (format == "json") std::cout << json.dump(2) << "\n";
  else if (format == "csv") std::cout << csv;
  else std::cout << text;
  if (!out.empty()) {
    const std::filesystem::path dir(out);
    std::filesystem::create_directories(dir);
    write_text(dir / "plan.json", json.dump(2) + "\n");
    write_text(dir / "plan.csv", csv);
    write_text(dir / "plan.txt", text);
    if (r.shard_count == 1) {
      for (std::size_t i = 0; i < r.top.size(); ++i) {
        const auto& row = r.top[i];
        const std::string name = base.scenario.name + "_plan_" + std::to_string(i + 1);
        char comment[512];
        std::snprintf(comment, sizeof comment,
                      "threewalls plan #%zu of %s on %d GPUs: %s, %s; predicted step %.3f s (analytic), MFU %.1f%%",
                      i + 1, base.scenario.name.c_str(), r.gpus, row.cand.layout().c_str(),
                      row.cand.options().c_str(), row.step_time_us * 1e-6, 100.0 * row.mfu);
        const std::string toml = sim::candidate_toml(base.scenario, est.scenario_of(row.cand), name, comment);
        const std::filesystem::path p = dir / ("top_" + std::to_string(i + 1) + ".toml");
        // The file must load as written (same loader and rules as `threewalls validate`).
        scenarios::load_scenario_text(toml, p.string());
        write_text(p, toml);
      }
    }
  }
  return kExitOk;
}

// --jobs and --resim-method: how the flow re-simulations run.
void add_resim_options(CLI::App* sub, int& jobs, std::string& method) {
  sub->add_option("--jobs", jobs,
                  "Flow re-simulations run at once, each in a process of its own (default: the CPUs available); the "
                  "results do not depend on it")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--resim-method", method,
                  "steady (default): a long step is simulated with a short one (pp + 5 micro-batches; 3 x pp "
                  "with vpp > 1) and extrapolated to its micro-batches by that step's steady period "
                  "(docs/planner.md, \"Flow re-simulation\"); full: every micro-batch")
      ->check(CLI::IsMember({sim::to_string(sim::ResimMethod::steady_state), sim::to_string(sim::ResimMethod::full)}));
}

int jobs_or_cpus(int jobs) { return jobs > 0 ? jobs : sim::available_cpus(); }

std::pair<int, int> parse_shard(const std::string& s) {
  const auto slash = s.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument(s);
    std::size_t a = 0, b = 0;
    const int i = std::stoi(s.substr(0, slash), &a);
    const int n = std::stoi(s.substr(slash + 1), &b);
    if (a != slash || b != s.size() - slash - 1 || n < 1 || i < 0 || i >= n) throw std::invalid_argument(s);
    return {i, n};
  } catch (const std::exception&) {
    throw InputError("plan: --shard '" + s + "' is not i/N with 0 <= i < N (e.g. 3/16)");
  }
}

}  // namespace

void register_plan(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand(
      "plan", "What-if planner: sweep parallel layouts (tp, cp, pp, vpp, dp, ep, etp), micro-batch size, recompute, "
              "dispatcher, CUDA graphs and precision on N GPUs; prune by the layout rules and by memory; rank by "
              "step time (analytic), re-simulate the best with flow fidelity (docs/planner.md).");
  static PlanArgs a;
  sub->add_option("scenario", a.scenario, "Scenario file (TOML, training); its model, batch and cluster are kept")
      ->required();
  sub->add_option("--gpus", a.gpus, "GPUs to plan for (a multiple of the scenario's gpus_per_node)")
      ->required()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--search", a.search,
                  "Search space, e.g. \"tp=1,2,4;pp=1..16;ep=8..64;mbs=1,2;recompute=none,selective,full;"
                  "dispatcher=alltoall,flex;cuda_graphs=none,attn,attn+moe_router;precision=bf16,fp8\". Keys: tp, cp, "
                  "ep, etp, mbs, recompute, dispatcher, cuda_graphs, precision, pp, vpp; a..b is a range (powers of "
                  "two, every integer for pp and vpp); keys not given keep their defaults (docs/planner.md)");
  sub->add_option("--calibration", a.calibration,
                  "Calibration profile: a path, or \"auto\" (default: the scenario's [calibration] profile); " +
                      std::string(kProfilePathHelp));
  sub->add_option("--top", a.top, "Rows to rank and write as scenario files (default 10)")->check(CLI::Range(1, 1000));
  sub->add_option("--losers", a.losers, "Losers shown per reason (default 5)")->check(CLI::Range(0, 1000));
  sub->add_option("--format", a.format, "Output on stdout: text, csv or json")
      ->check(CLI::IsMember({"text", "csv", "json"}));
  sub->add_option("--out", a.out, "Directory for plan.json, plan.csv, plan.txt and top_<i>.toml");
  add_overwrite_flag(sub, a.overwrite, "Replace the plan files of an existing --out directory");
  sub->add_option("--shard", a.shard,
                  "Plan only shard i of N (i/N, 0-based; a deterministic split of the enumeration); join the shards' "
                  "plan.json with plan-merge");
  sub->add_option("--resim", a.resim,
                  "Top rows re-simulated with flow fidelity (default: all --top rows; 0: none; shards: none)")
      ->check(CLI::Range(0, 1000));
  add_resim_options(sub, a.jobs, a.resim_method);
  add_progress_option(sub, a.progress);
  cmds.add(sub, [] {
    const auto [si, sn] = parse_shard(a.shard);
    check_out_dir(a.out, a.overwrite);
    const scenarios::LoadedScenario base = scenarios::load_scenario_file(a.scenario);
    const auto cost = load_costing(base.scenario, profile_arg_from_cwd(a.calibration));
    sim::PlanOptions o;
    o.gpus = a.gpus;
    o.search = sim::default_search(base.scenario, a.gpus);
    if (!a.search.empty()) o.search = sim::parse_search(a.search, o.search);
    o.top_k = a.top;
    o.losers_per_reason = a.losers;
    o.shard_index = si;
    o.shard_count = sn;
    const bool show = a.progress.on();
    Progress progress(show);
    if (show) o.progress = [&progress](std::uint64_t d, std::uint64_t t) { progress(d, t); };
    if (cost->profile.hardware().gpus_seen == 0) {
      std::cerr << "warning: calibration profile " << cost->profile.id() << " is not a measurement ("
                << cost->profile.hardware().machine << "): the plan's step times are estimates from facts and "
                << "datasheets, not calibrated\n";
    }
    const int resim = sn > 1 ? 0 : (a.resim < 0 ? a.top : a.resim);
    // The flow re-simulations fork from a parent that has loaded the SimGrid module (resimulate_flow).
    // The sweep runs on one CPU: another loads the module meanwhile. Once it is loaded, the sweep joins
    // that thread (a fork happens only in a process of one thread: a child gets no lock another thread
    // held) and forks, at the points where it reports progress, children for the steps of its best rows
    // so far on the other CPUs (ResimAhead, `jobs` less the sweep's one), which resimulate_flow takes
    // over.
    const int jobs = jobs_or_cpus(a.jobs);
    std::optional<sim::PlanEstimator> ahead_est;
    std::optional<sim::ResimAhead> ahead;
    std::atomic<bool> preloaded{false};
    std::jthread preload;
    if (resim > 0 && sim::available_cpus() > 1) {
      preload = std::jthread([&preloaded] {
        try {
          sim::preload_simgrid_module();
          preloaded.store(true, std::memory_order_release);
        } catch (const std::exception&) {
          // resimulate_flow tries again, and each row records why it cannot (flow_error).
        }
      });
      if (jobs > 1) {
        ahead_est.emplace(base, cost->coster, a.gpus);
        ahead.emplace(*ahead_est, cost->coster, resim, jobs - 1, *sim::resim_method_from(a.resim_method));
        o.best_so_far = [&ahead, &preloaded, &preload](const std::vector<sim::PlanRow>& best) {
          if (!preloaded.load(std::memory_order_acquire)) return;
          if (preload.joinable()) preload.join();  // it has stored the flag: only its exit is left
          ahead->offer(best);
        };
      }
    }
    sim::PlanResult r = sim::run_plan(base, cost->coster, o);
    r.profile_id = cost->profile.id();
    r.profile_path = cost->resolved.path.string();
    if (preload.joinable()) preload.join();
    return finish(r, base, *cost, resim, jobs, a.resim_method, a.format, a.out, show, ahead ? &*ahead : nullptr);
  });

  auto* merge = app.add_subcommand(
      "plan-merge", "Join the plan.json files of the shards of one `threewalls plan --shard i/N` sweep into one ranked "
                    "plan (same outputs as an unsharded plan).");
  static MergeArgs m;
  merge->add_option("shards", m.files, "plan.json of every shard")->required();
  merge->add_option(
      "--calibration", m.calibration,
      "Calibration profile for --resim (default: the one the shards used); " + std::string(kProfilePathHelp));
  merge->add_option("--format", m.format, "Output on stdout: text, csv or json")
      ->check(CLI::IsMember({"text", "csv", "json"}));
  merge->add_option("--out", m.out, "Directory for plan.json, plan.csv, plan.txt and top_<i>.toml");
  add_overwrite_flag(merge, m.overwrite, "Replace the plan files of an existing --out directory");
  merge->add_option("--resim", m.resim, "Top rows re-simulated with flow fidelity (default 0)")->check(CLI::Range(0, 1000));
  add_resim_options(merge, m.jobs, m.resim_method);
  add_progress_option(merge, m.progress);
  cmds.add(merge, [] {
    check_out_dir(m.out, m.overwrite);
    std::vector<sim::PlanResult> shards;
    for (const auto& f : m.files) shards.push_back(sim::plan_from_json(read_json_file(f), f));
    sim::PlanResult r = sim::merge_plans(shards);
    // The scenario the shards planned, checked by content hash.
    const scenarios::LoadedScenario base = scenarios::load_scenario_file(r.scenario_path);
    if (base.scenario.content_hash != r.scenario_hash) {
      throw InputError(r.scenario_path + ": the scenario file changed since the shards were planned (hash " +
                       base.scenario.content_hash + ", shards " + r.scenario_hash + ")");
    }
    // The shards recorded the path their profile was read from (relative to their working directory).
    const auto cost =
        load_costing(base.scenario, profile_arg_from_cwd(m.calibration.empty() ? r.profile_path : m.calibration));
    return finish(r, base, *cost, m.resim, jobs_or_cpus(m.jobs), m.resim_method, m.format, m.out, m.progress.on());
  });
}

}  // namespace threewalls::cli
