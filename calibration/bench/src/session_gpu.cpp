// The measuring part of a calibration session (session.hpp): this machine's GPUs through the backend,
// and the host group again in child processes.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>

#include "threewalls/backend/handles.hpp"
#include "threewalls/calibration/bench/driver.hpp"
#include "threewalls/calibration/bench/gpu_runner.hpp"
#include "threewalls/calibration/bench/session.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/version.hpp"

namespace threewalls::calibration::bench {
namespace {

namespace fs = std::filesystem;

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void print_record(const Record& r, std::size_t i, std::size_t total) {
  std::string rate;
  for (const auto& m : r.metrics) {
    char b[64];
    std::snprintf(b, sizeof b, " %s=%.4g", m.key.c_str(), m.value);
    rate += b;
  }
  if (r.status == Status::ok) {
    std::printf("[%4zu/%zu] %-70s %10.3f us%s  (n=%zu x%d, ci %.1f%%, %s)\n", i + 1, total, r.point.label().c_str(),
                r.median_s() * 1e6, rate.c_str(), r.samples_s.size(), r.reps, 100.0 * r.rel_ci, r.stop.c_str());
  } else {
    std::printf("[%4zu/%zu] %-70s %s: %s\n", i + 1, total, r.point.label().c_str(), to_string(r.status),
                r.error.c_str());
  }
  std::fflush(stdout);
}

// Runs this binary as `threewalls COMMAND ARGS` in a child process, stdout and stderr to `log`;
// SystemError naming the log unless it exits 0.
void run_child_calibration(const std::vector<std::string>& command, const std::vector<std::string>& args,
                           const fs::path& log) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw SystemError("calibrate --host-processes: cannot find this binary (/proc/self/exe): " + ec.message());
  std::vector<std::string> full{self.string()};
  full.insert(full.end(), command.begin(), command.end());
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
    throw SystemError(
        "calibrate --host-processes: the host calibration in a child process failed (" +
        (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status)) : std::string("killed by a signal")) +
        "); its output: " + log.string());
  }
}

// The host group measured again in `n - 1` child processes, merged into `records` (record.hpp,
// merge_host_processes). Raw folders RAW/host_process_<i> (a temporary folder without --raw-out).
void measure_host_processes(const CalibrateOptions& o, int n, const RawHeader& header, const fs::path& raw_dir,
                            std::vector<Record>& records) {
  const fs::path base = raw_dir.empty()
                            ? fs::temp_directory_path() / ("threewalls_host_processes_" + std::to_string(::getpid()))
                            : raw_dir;
  std::vector<std::vector<Record>> others;
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
      run_child_calibration(o.child_command, args, base / ("host_process_" + std::to_string(i) + ".log"));
      others.push_back(read_raw(dir / "points.jsonl").records);
    } catch (const std::exception& e) {
      // The main process's measurements stand; a failed child only narrows the median (and a refit
      // finds no folder for it: it stops at the first missing host_process_<i>, so the rest go too).
      std::printf("# warning: host process %d of %d failed, the host points use %zu process(es): %s\n", i + 1, n,
                  others.size() + 1, e.what());
      fs::remove_all(dir);
      break;
    }
  }
  const std::size_t merged = merge_host_processes(records, others);
  std::printf("# host points: %zu compared over %zu processes, the median process's kept\n", merged, others.size() + 1);
  if (raw_dir.empty()) fs::remove_all(base);
}

}  // namespace

int calibrate(const CalibrateOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (fs::exists(o.out) && !o.overwrite) {
    throw InputError("--out " + o.out +
                     ": the file exists; pass --overwrite to replace it (profiles are not overwritten silently)");
  }
  const Mode mode = o.quick ? Mode::quick : Mode::full;
  const std::set<std::string> only = parse_only(o.only);
  static_cast<void>(make_plan({mode, 1, only}));  // bad --only groups fail before the GPU is touched
  fs::path raw_dir = o.raw_out;
  if (!raw_dir.empty()) {
    if (fs::exists(raw_dir / "points.jsonl")) {
      throw InputError("--raw-out " + raw_dir.string() +
                       ": it already holds points.jsonl; raw results are never overwritten, choose a new folder");
    }
    fs::create_directories(raw_dir);
  }

  RawHeader header;
  std::vector<Record> records;
  if (!o.from_raw.empty()) {
    // Refit from a previous calibration's raw output: no GPU needed.
    RawFile raw = load_raw_for_refit(o.from_raw);
    header = raw.header;
    records = std::move(raw.records);
  } else {
    const MachineIdentity id = detect_machine(o.gpus, o.gpu_kind);
    const int gpus = o.gpus == 0 ? id.gpus_available : o.gpus;
    header.tool_version = std::string(tool_version());
    header.git_sha = std::string(git_sha());
    header.mode = to_string(mode);
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

    PlanOptions po;
    po.mode = mode;
    po.gpus = gpus;
    po.only = only;
    const std::vector<PointSpec> plan = make_plan(po);
    const auto [min_point, max_point] = point_bounds(mode);
    Budget budget(o.budget_s > 0.0 ? o.budget_s : default_budget_s(mode), sections_of(plan), min_point, max_point);
    std::printf("# %zu points, measurement budget %.0f s\n", plan.size(), budget.total());
    std::fflush(stdout);

    std::optional<JsonlWriter> raw;
    if (!raw_dir.empty()) {
      raw.emplace(raw_dir / "points.jsonl");
      raw->write(to_json(header));
      raw->flush();
    }
    GpuRunnerOptions ro;
    ro.mode = mode;
    ro.gpus = gpus;
    ro.sm_count = id.hardware.sm_count;
    ro.scratch_dir = o.scratch_dir;
    auto runner = make_gpu_runner(ro);
    records = run_points(plan, *runner, budget, default_stop_rule(mode), steady_clock(),
                         [&](const Record& r, std::size_t i, std::size_t total) {
                           print_record(r, i, total);
                           if (raw) {
                             raw->write(to_json(r));  // as it comes: a crash keeps what was measured
                             raw->flush();
                           }
                         });
    const int host_processes = o.host_processes >= 1 ? o.host_processes : (mode == Mode::full ? 5 : 1);
    if (host_processes > 1 && std::any_of(records.begin(), records.end(), is_host_point)) {
      // The children meet the GPU as a `threewalls run` process does, with no other context on it:
      // this process's go first (a live context in the parent is a condition no run has).
      runner.reset();
      backend::release_devices();
      measure_host_processes(o, host_processes, header, raw_dir, records);
    }
    std::printf("# measured in %.1f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  }

  fit_and_write(records, header, o, !o.from_raw.empty(), t_start);
  return 0;
}

}  // namespace threewalls::calibration::bench
