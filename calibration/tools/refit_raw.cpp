// threewalls_refit_raw RAW_DIR_OR_POINTS.jsonl OUT.toml [NAME]
//
// Refits a calibration's raw output into a profile, exactly as `threewalls calibrate --from-raw`
// does (calibration/bench/session.hpp: load_raw_for_refit, fit_and_write with the default profile as
// filler), in builds without CUDA, where the calibrate command is not registered. Used to regenerate
// calibration/profiles/*.toml after a change of the fits.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include "threewalls/calibration/bench/session.hpp"

int main(int argc, char** argv) {
  namespace cb = threewalls::calibration::bench;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s RAW_DIR_OR_POINTS.jsonl OUT.toml [NAME]\n", argv[0]);
    return 2;
  }
  try {
    const auto started = std::chrono::steady_clock::now();
    const cb::RawFile raw = cb::load_raw_for_refit(argv[1]);
    cb::CalibrateOptions o;
    o.out = argv[2];
    o.overwrite = true;
    if (argc == 4) o.name = argv[3];
    cb::fit_and_write(raw.records, raw.header, o, true, started);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "threewalls_refit_raw: %s\n", e.what());
    return 1;
  }
  return 0;
}
