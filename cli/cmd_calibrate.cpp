// threewalls calibrate: measures the machine it runs on (GEMMs, grouped GEMMs, attention, memory-bound
// kernels, copies, collectives, host overheads, stream concurrency) with the backend's kernels,
// fits the cost models and writes a calibration profile (docs/calibration.md, "Running a
// calibration"). Registered only in CUDA builds.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "args.hpp"
#include "command.hpp"
#include "default_profiles.hpp"
#include "threewalls/backend/handles.hpp"
#include "threewalls/calibration/bench/driver.hpp"
#include "threewalls/calibration/bench/gpu_runner.hpp"
#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/bench/report.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/version.hpp"

namespace threewalls::cli {
namespace {

namespace cb = calibration::bench;
namespace fs = std::filesystem;

struct Options {
  bool quick = false;
  std::string out;
  int gpus = 0;
  std::string raw_out;
  std::string only;
  std::string gpu_kind;
  std::string name;
  std::string from_raw;
  std::string scratch_dir = "/tmp";
  double budget_s = 0.0;  // 0: the mode's default
  bool no_fill = false;
  std::string fill_from;
  bool overwrite = false;
  int host_processes = -1;  // -1: the mode's default (full 5, quick 1)
  std::vector<std::string> argv;
};

std::set<std::string> parse_only(const std::string& list) {
  std::set<std::string> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) throw InputError("--only: empty group name in '" + list + "'");
    out.insert(item);
  }
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void print_record(const cb::Record& r, std::size_t i, std::size_t total) {
  std::string rate;
  for (const auto& m : r.metrics) {
    char b[64];
    std::snprintf(b, sizeof b, " %s=%.4g", m.key.c_str(), m.value);
    rate += b;
  }
  if (r.status == cb::Status::ok) {
    std::printf("[%4zu/%zu] %-70s %10.3f us%s  (n=%zu x%d, ci %.1f%%, %s)\n", i + 1, total, r.point.label().c_str(),
                r.median_s() * 1e6, rate.c_str(), r.samples_s.size(), r.reps, 100.0 * r.rel_ci, r.stop.c_str());
  } else {
    std::printf("[%4zu/%zu] %-70s %s: %s\n", i + 1, total, r.point.label().c_str(), cb::to_string(r.status),
                r.error.c_str());
  }
  std::fflush(stdout);
}

// Runs this binary as `threewalls calibrate ARGS` in a child process, stdout and stderr to `log`;
// SystemError naming the log unless it exits 0.
void run_child_calibration(const std::vector<std::string>& args, const fs::path& log) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw SystemError("calibrate --host-processes: cannot find this binary (/proc/self/exe): " + ec.message());
  std::vector<std::string> full{self.string(), "calibrate"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) throw SystemError(std::string("calibrate --host-processes: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw SystemError("calibrate --host-processes: the host calibration in a child process failed (" +
                      (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                         : std::string("killed by a signal")) +
                      "); its output: " + log.string());
  }
}

// The host group measured again in `n - 1` child processes, merged into `records` (record.hpp,
// merge_host_processes). Raw folders RAW/host_process_<i> (a temporary folder without --raw-out).
void measure_host_processes(const Options& o, int n, const cb::RawHeader& header, const fs::path& raw_dir,
                            std::vector<cb::Record>& records) {
  const fs::path base = raw_dir.empty()
                            ? fs::temp_directory_path() / ("threewalls_host_processes_" + std::to_string(::getpid()))
                            : raw_dir;
  std::vector<std::vector<cb::Record>> others;
  std::printf("# host group again in %d more processes (their host costs differ from one process to the next)\n",
              n - 1);
  std::fflush(stdout);
  for (int i = 1; i < n; ++i) {
    const fs::path dir = base / ("host_process_" + std::to_string(i));
    fs::create_directories(dir.parent_path());
    std::vector<std::string> args{"--only",
                                  "host",
                                  "--gpus",
                                  "1",
                                  "--gpu-kind",
                                  header.hardware.gpu_kind,
                                  "--no-fill",
                                  "--overwrite",
                                  "--host-processes",
                                  "1",
                                  "--scratch-dir",
                                  o.scratch_dir,
                                  "--raw-out",
                                  dir.string(),
                                  "--out",
                                  (base / ("host_process_" + std::to_string(i) + ".toml")).string()};
    if (o.quick) args.push_back("--quick");
    try {
      run_child_calibration(args, base / ("host_process_" + std::to_string(i) + ".log"));
      others.push_back(cb::read_raw(dir / "points.jsonl").records);
    } catch (const std::exception& e) {
      // The main process's measurements stand; a failed child only narrows the median (and a refit
      // finds no folder for it: it stops at the first missing host_process_<i>, so the rest go too).
      std::printf("# warning: host process %d of %d failed, the host points use %zu process(es): %s\n", i + 1, n,
                  others.size() + 1, e.what());
      fs::remove_all(dir);
      break;
    }
  }
  const std::size_t merged = cb::merge_host_processes(records, others);
  std::printf("# host points: %zu compared over %zu processes, the median process's kept\n", merged, others.size() + 1);
  if (raw_dir.empty()) fs::remove_all(base);
}

int run(const Options& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (fs::exists(o.out) && !o.overwrite) {
    throw InputError("--out " + o.out +
                     ": the file exists; pass --overwrite to replace it (profiles are not overwritten silently)");
  }
  const cb::Mode mode = o.quick ? cb::Mode::quick : cb::Mode::full;
  const std::set<std::string> only = parse_only(o.only);
  static_cast<void>(cb::make_plan({mode, 1, only}));  // bad --only groups fail before the GPU is touched
  fs::path raw_dir = o.raw_out;
  if (!raw_dir.empty()) {
    if (fs::exists(raw_dir / "points.jsonl")) {
      throw InputError("--raw-out " + raw_dir.string() +
                       ": it already holds points.jsonl; raw results are never overwritten, choose a new folder");
    }
    fs::create_directories(raw_dir);
  }

  cb::RawHeader header;
  std::vector<cb::Record> records;
  if (!o.from_raw.empty()) {
    // Refit from a previous calibration's raw output: no GPU needed.
    fs::path p = o.from_raw;
    if (fs::is_directory(p)) p /= "points.jsonl";
    cb::RawFile raw = cb::read_raw(p);
    header = raw.header;
    records = std::move(raw.records);
    std::printf("refitting %zu records of %s (%s, %s, %s mode)\n", records.size(), p.c_str(),
                header.hardware.gpu_name.c_str(), header.hardware.date.c_str(), header.mode.c_str());
    if (const int n = cb::merge_host_process_dirs(p.parent_path(), records); n > 1) {
      std::printf("host points over %d processes (%s/host_process_*): the median process's kept\n", n,
                  p.parent_path().c_str());
    }
  } else {
    const cb::MachineIdentity id = cb::detect_machine(o.gpus, o.gpu_kind);
    const int gpus = o.gpus == 0 ? id.gpus_available : o.gpus;
    header.tool_version = std::string(tool_version());
    header.git_sha = std::string(git_sha());
    header.mode = cb::to_string(mode);
    header.started = utc_now();
    header.argv = o.argv;
    header.hardware = id.hardware;
    header.topology = id.topology_text;
    header.gpus_used = gpus;
    std::printf(
        "# threewalls calibrate (%s): %s x%d (%s), %d SMs, driver %s, CUDA %s, NCCL %s\n# links: ", header.mode.c_str(),
        id.hardware.gpu_name.c_str(), gpus, id.hardware.gpu_kind.c_str(), id.hardware.sm_count,
        id.hardware.driver_version.c_str(), id.hardware.cuda_version.c_str(), id.hardware.nccl_version.c_str());
    for (const auto& l : id.hardware.links_seen) std::printf("%s; ", l.c_str());
    std::printf("\n# machine: %s\n", id.hardware.machine.c_str());

    cb::PlanOptions po;
    po.mode = mode;
    po.gpus = gpus;
    po.only = only;
    const std::vector<cb::PointSpec> plan = cb::make_plan(po);
    const auto [min_point, max_point] = cb::point_bounds(mode);
    cb::Budget budget(o.budget_s > 0.0 ? o.budget_s : cb::default_budget_s(mode), cb::sections_of(plan), min_point,
                      max_point);
    std::printf("# %zu points, measurement budget %.0f s\n", plan.size(), budget.total());
    std::fflush(stdout);

    std::optional<JsonlWriter> raw;
    if (!raw_dir.empty()) {
      raw.emplace(raw_dir / "points.jsonl");
      raw->write(cb::to_json(header));
      raw->flush();
    }
    cb::GpuRunnerOptions ro;
    ro.mode = mode;
    ro.gpus = gpus;
    ro.sm_count = id.hardware.sm_count;
    ro.scratch_dir = o.scratch_dir;
    auto runner = cb::make_gpu_runner(ro);
    records = cb::run_points(plan, *runner, budget, cb::default_stop_rule(mode), cb::steady_clock(),
                             [&](const cb::Record& r, std::size_t i, std::size_t total) {
                               print_record(r, i, total);
                               if (raw) {
                                 raw->write(cb::to_json(r));  // as it comes: a crash keeps what was measured
                                 raw->flush();
                               }
                             });
    const int host_processes = o.host_processes >= 1 ? o.host_processes : (mode == cb::Mode::full ? 5 : 1);
    if (host_processes > 1 && std::any_of(records.begin(), records.end(), cb::is_host_point)) {
      // The children meet the GPU as a `threewalls run` process does, with no other context on it:
      // this process's go first (a live context in the parent is a condition no run has).
      runner.reset();
      backend::release_devices();
      measure_host_processes(o, host_processes, header, raw_dir, records);
    }
    std::printf("# measured in %.1f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  }

  const auto t_fit = std::chrono::steady_clock::now();
  cb::BuildOptions bo;
  bo.hardware = header.hardware;
  bo.mode = header.mode;
  bo.gpus_used = header.gpus_used;
  bo.info.name = o.name.empty() ? header.hardware.gpu_kind : o.name;
  bo.info.source = "measured";
  bo.info.generator =
      "threewalls " + std::string(tool_version()) + " (" + std::string(git_sha()) + ") calibrate " + header.mode +
      (o.from_raw.empty()
           ? ""
           : " (refit from raw output of threewalls " + header.tool_version + " " + header.git_sha + ")");
  if (!o.fill_from.empty()) {
    // An earlier calibration of the same GPU kind (typically a multi-GPU machine's: collectives, NCCL
    // interference) fills what this machine cannot measure, ahead of the kind's default profile.
    calibration::Profile given = calibration::Profile::load(o.fill_from);
    if (given.hardware().gpu_kind != header.hardware.gpu_kind) {
      throw InputError(o.fill_from + ": --fill-from profile is of GPU kind '" + given.hardware().gpu_kind +
                       "', this calibration measures '" + header.hardware.gpu_kind + "'; allowed: a profile of the same kind");
    }
    if (given.info().source != "measured") {
      throw InputError(o.fill_from + ": --fill-from profile has source '" + given.info().source +
                       "'; allowed: a measured profile (the defaults fill the rest already)");
    }
    bo.fill_from.push_back(std::move(given));
  }
  if (!o.no_fill) bo.fill_from.push_back(calibration::defaults::make_default_profile(header.hardware.gpu_kind));
  const cb::CalibrationReport rep = cb::build_report(records, bo);
  rep.profile.save(o.out);
  const std::string summary = cb::summary_text(rep);
  std::printf("\n%s\nfitted in %.1f s; profile written to %s; total %.1f s\n", summary.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fit).count(), o.out.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  if (!raw_dir.empty()) {
    OrderedJson j = cb::summary_json(rep);
    j["total_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    write_json_file(raw_dir / "summary.json", j);
    if (std::FILE* f = std::fopen((raw_dir / "summary.txt").c_str(), "w")) {
      std::fputs(summary.c_str(), f);
      std::fclose(f);
    }
  }
  return kExitOk;
}

}  // namespace

void register_calibrate(CLI::App& app, Commands& cmds) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Measure this machine's GPUs (GEMM, grouped GEMM, attention, memory-bound kernels, copies, NCCL collectives on "
      "every "
      "group size, host overheads, stream concurrency), fit the cost models and write a calibration profile.");
  sub->add_flag("--quick", o->quick, "Smaller grids and looser noise target (<= 90 s); default: full (<= 5 minutes)");
  sub->add_option("--out", o->out, "Profile to write (TOML); refused if it exists, unless --overwrite")->required();
  sub->add_option("--gpus", o->gpus, "GPUs to use (collectives on group sizes 2..N); 0 = all visible")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--raw-out", o->raw_out,
                  "Folder for the raw output: points.jsonl (every sample), summary.json, summary.txt");
  sub->add_option(
      "--only", o->only,
      "Comma-separated groups to measure: gemm, grouped, attention, memory, copy, collective, host, concurrency");
  sub->add_option("--gpu-kind", o->gpu_kind, "GPU kind when the device name does not say it: h100 or h200")
      ->check(CLI::IsMember({"h100", "h200"}));
  sub->add_option("--name", o->name, "Profile name ([profile] name); default: the GPU kind");
  sub->add_option("--from-raw", o->from_raw,
                  "Refit from a previous --raw-out folder (or its points.jsonl); no GPU is used")
      ->check(CLI::ExistingPath);
  sub->add_option("--scratch-dir", o->scratch_dir, "Where the disk-read benchmark writes its temporary file")
      ->check(CLI::ExistingDirectory);
  sub->add_flag("--no-fill", o->no_fill,
                "Do not copy the families this machine cannot measure (network collectives, framework op, fp8 grouped "
                "GEMM) from the default profile of the GPU kind");
  sub->add_option("--fill-from", o->fill_from,
                  "A measured profile of the same GPU kind (e.g. an earlier calibration of a multi-GPU machine) whose "
                  "families fill what this machine cannot measure, ahead of the default profile, and whose collective "
                  "points of group sizes larger than this machine's are fitted with its own; each note names its source")
      ->check(CLI::ExistingFile);
  add_overwrite_flag(sub, o->overwrite, "Replace an existing --out file");
  sub->add_option("--host-processes", o->host_processes,
                  "Measure the host group (launches, library calls, syncs) in this many processes in all and keep, "
                  "point by point, the median process's: a process's host speed differs from another's on some "
                  "machines (VMs). Default: 5 in full mode, 1 in quick mode")
      ->check(CLI::Range(1, 32));
  sub->add_option("--budget-seconds", o->budget_s,
                  "Measurement time budget in seconds (default: 270 full, 75 quick; see docs/calibration.md)")
      ->check(CLI::Range(1.0, 86400.0));
  cmds.add(sub, [o] {
    // The effective settings, as the command line that reproduces them (written into the raw header).
    o->argv = {"threewalls",    "calibrate",   "--out", o->out, "--gpus", std::to_string(o->gpus),
               "--scratch-dir", o->scratch_dir};
    if (o->quick) o->argv.push_back("--quick");
    for (const auto& [flag, value] : {std::pair{"--raw-out", o->raw_out}, std::pair{"--only", o->only},
                                      std::pair{"--gpu-kind", o->gpu_kind}, std::pair{"--name", o->name},
                                      std::pair{"--fill-from", o->fill_from}}) {
      if (!value.empty()) {
        o->argv.push_back(flag);
        o->argv.push_back(value);
      }
    }
    if (o->no_fill) o->argv.push_back("--no-fill");
    if (o->budget_s > 0.0) {
      o->argv.push_back("--budget-seconds");
      o->argv.push_back(std::to_string(o->budget_s));
    }
    if (o->overwrite) o->argv.push_back("--overwrite");
    if (o->host_processes >= 1) {
      o->argv.push_back("--host-processes");
      o->argv.push_back(std::to_string(o->host_processes));
    }
    if (!o->from_raw.empty() &&
        (o->quick || o->gpus != 0 || !o->only.empty() || !o->gpu_kind.empty() || o->budget_s > 0.0 ||
         o->host_processes >= 1)) {
      throw InputError(
          "--from-raw refits measured points: --quick, --gpus, --only, --gpu-kind, --budget-seconds and "
          "--host-processes do not apply to it (the host processes' raw folders next to points.jsonl are merged)");
    }
    return run(*o);
  });
}

}  // namespace threewalls::cli
