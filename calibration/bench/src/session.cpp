// The host part of a calibration session (session.hpp): refit input and the fit-and-write step.
#include "threewalls/calibration/bench/session.hpp"

#include <cstdio>
#include <sstream>

#include "default_profiles.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/version.hpp"

namespace threewalls::calibration::bench {

namespace fs = std::filesystem;

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

RawFile load_raw_for_refit(const fs::path& raw_dir_or_points) {
  fs::path p = raw_dir_or_points;
  if (fs::is_directory(p)) p /= "points.jsonl";
  RawFile raw = read_raw(p);
  std::printf("refitting %zu records of %s (%s, %s, %s mode)\n", raw.records.size(), p.c_str(),
              raw.header.hardware.gpu_name.c_str(), raw.header.hardware.date.c_str(), raw.header.mode.c_str());
  if (const int n = merge_host_process_dirs(p.parent_path(), raw.records); n > 1) {
    std::printf("host points over %d processes (%s/host_process_*): the median process's kept\n", n,
                p.parent_path().c_str());
  }
  return raw;
}

CalibrationReport fit_and_write(const std::vector<Record>& records, const RawHeader& header, const CalibrateOptions& o,
                                bool refit, std::chrono::steady_clock::time_point started) {
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const auto t_fit = std::chrono::steady_clock::now();
  BuildOptions bo;
  bo.hardware = header.hardware;
  bo.mode = header.mode;
  bo.gpus_used = header.gpus_used;
  bo.info.name = o.name.empty() ? header.hardware.gpu_kind : o.name;
  bo.info.source = "measured";
  bo.info.generator =
      "threewalls " + std::string(tool_version()) + " (" + std::string(git_sha()) + ") calibrate " + header.mode +
      (refit ? " (refit from raw output of threewalls " + header.tool_version + " " + header.git_sha + ")" : "");
  if (!o.fill_from.empty()) {
    // An earlier calibration of the same GPU kind (typically a multi-GPU machine's: collectives, NCCL
    // interference) fills what this machine cannot measure, ahead of the kind's default profile.
    Profile given = Profile::load(o.fill_from);
    if (given.hardware().gpu_kind != header.hardware.gpu_kind) {
      throw InputError(o.fill_from + ": --fill-from profile is of GPU kind '" + given.hardware().gpu_kind +
                       "', this calibration measures '" + header.hardware.gpu_kind +
                       "'; allowed: a profile of the same kind");
    }
    if (given.info().source != "measured") {
      throw InputError(o.fill_from + ": --fill-from profile has source '" + given.info().source +
                       "'; allowed: a measured profile (the defaults fill the rest already)");
    }
    bo.fill_from.push_back(std::move(given));
  }
  if (!o.no_fill) bo.fill_from.push_back(defaults::make_default_profile(header.hardware.gpu_kind));
  CalibrationReport rep = build_report(records, bo);
  rep.profile.save(o.out);
  const std::string summary = summary_text(rep);
  std::printf("\n%s\nfitted in %.1f s; profile written to %s; total %.1f s\n", summary.c_str(), seconds_since(t_fit),
              o.out.c_str(), seconds_since(started));
  if (!o.raw_out.empty()) {
    const fs::path raw_dir = o.raw_out;
    OrderedJson j = summary_json(rep);
    j["total_s"] = seconds_since(started);
    write_json_file(raw_dir / "summary.json", j);
    if (std::FILE* f = std::fopen((raw_dir / "summary.txt").c_str(), "w")) {
      std::fputs(summary.c_str(), f);
      std::fclose(f);
    }
  }
  return rep;
}

}  // namespace threewalls::calibration::bench
