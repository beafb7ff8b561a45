// threewalls calibrate: measures the machine it runs on (GEMMs, grouped GEMMs, attention, memory-bound
// kernels, copies, collectives, host overheads, stream concurrency) with the backend's kernels,
// fits the cost models and writes a calibration profile (docs/calibration.md, "Running a
// calibration"). Registered only in CUDA builds; the session itself is calibration/bench/session.hpp.
#include <memory>
#include <string>

#include "args.hpp"
#include "command.hpp"
#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/bench/session.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::cli {

void register_calibrate(CLI::App& app, Commands& cmds) {
  auto o = std::make_shared<calibration::bench::CalibrateOptions>();
  CLI::App* sub = app.add_subcommand("calibrate", kCalibrateSummary);
  sub->add_flag("--quick", o->quick, "Smaller grids and looser noise target (<= 90 s); default: full (<= 5 minutes)");
  sub->add_option("--out", o->out, "Profile to write (TOML); refused if it exists, unless --overwrite")->required();
  sub->add_option("--gpus", o->gpus, "GPUs to use (collectives on group sizes 2..N); 0 = all visible")
      ->check(CLI::Range(0, 1024));
  sub->add_option("--raw-out", o->raw_out,
                  "Folder for the raw output: points.jsonl (every sample), summary.json, summary.txt");
  sub->add_option("--only", o->only,
                  "Comma-separated groups to measure: " + join(calibration::bench::op_groups()) +
                      " (attention: the unfused, fused and decode attention families)");
  sub->add_option("--gpu-kind", o->gpu_kind,
                  "GPU kind when the device name does not say it: " + join(calibration::known_gpu_kinds()))
      ->check(CLI::IsMember(calibration::known_gpu_kinds()));
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
    return calibration::bench::calibrate(*o);
  });
}

}  // namespace threewalls::cli
