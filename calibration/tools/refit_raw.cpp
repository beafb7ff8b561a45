// threewalls_refit_raw RAW_DIR_OR_POINTS.jsonl OUT.toml [NAME]
//
// Refits a calibration's raw output into a profile, exactly as `threewalls calibrate --from-raw`
// does (build_report with the default profile as filler), in builds without CUDA, where the
// calibrate command is not registered. Used to regenerate calibration/profiles/*.toml after a
// change of the fits (docs/validation/fidelity_model_changes.md).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "default_profiles.hpp"
#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/bench/report.hpp"
#include "threewalls/core/version.hpp"

int main(int argc, char** argv) {
  namespace cb = threewalls::calibration::bench;
  namespace fs = std::filesystem;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s RAW_DIR_OR_POINTS.jsonl OUT.toml [NAME]\n", argv[0]);
    return 2;
  }
  try {
    fs::path p = argv[1];
    if (fs::is_directory(p)) p /= "points.jsonl";
    cb::RawFile raw = cb::read_raw(p);
    cb::merge_host_process_dirs(p.parent_path(), raw.records);  // host_process_<i>/: calibrate --host-processes
    const cb::RawHeader& header = raw.header;
    cb::BuildOptions bo;
    bo.hardware = header.hardware;
    bo.mode = header.mode;
    bo.gpus_used = header.gpus_used;
    bo.info.name = argc == 4 ? std::string(argv[3]) : header.hardware.gpu_kind;
    bo.info.source = "measured";
    bo.info.generator = "threewalls " + std::string(threewalls::tool_version()) + " (" +
                        std::string(threewalls::git_sha()) + ") calibrate " + header.mode +
                        " (refit from raw output of threewalls " + header.tool_version + " " + header.git_sha + ")";
    bo.fill_from = {threewalls::calibration::defaults::make_default_profile(header.hardware.gpu_kind)};
    const cb::CalibrationReport rep = cb::build_report(raw.records, bo);
    rep.profile.save(argv[2]);
    std::printf("%s\nprofile written to %s\n", cb::summary_text(rep).c_str(), argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "threewalls_refit_raw: %s\n", e.what());
    return 1;
  }
  return 0;
}
