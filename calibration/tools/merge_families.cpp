// threewalls_merge_families INTO.toml FROM.toml OUT.toml FAMILY...
//
// Writes INTO with the named families taken from FROM, a calibration of the same GPU kind that
// measured them (e.g. `threewalls calibrate --only attention`), each refitted with INTO's hardware and
// the families its fit reads (calibration::merge_families, profile_builder.hpp). Used to add families
// to the shipped profiles (calibration/profiles/<kind>.toml) from a short GPU run instead of a new
// full calibration; OUT may be INTO. Prints each merged family's fit errors.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "threewalls/calibration/profile_builder.hpp"

int main(int argc, char** argv) {
  namespace cal = threewalls::calibration;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s INTO.toml FROM.toml OUT.toml FAMILY...\n", argv[0]);
    return 2;
  }
  try {
    const cal::Profile into = cal::Profile::load(argv[1]);
    const cal::Profile from = cal::Profile::load(argv[2]);
    const std::vector<std::string> names(argv + 4, argv + argc);
    const cal::Profile merged = cal::merge_families(into, from, names);
    merged.save(argv[3]);
    for (const auto& name : names) {
      const cal::Family& f = merged.family(name);
      std::printf("%-22s %3zu points  fit median %.2f%% max %.2f%%  leave-one-out median %.2f%% max %.2f%%\n",
                  name.c_str(), f.points.size(), 100.0 * f.quality.rel_err_median, 100.0 * f.quality.rel_err_max,
                  100.0 * f.quality.loo_rel_err_median, 100.0 * f.quality.loo_rel_err_max);
    }
    std::printf("written %s (%s)\n", argv[3], merged.id().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "threewalls_merge_families: %s\n", e.what());
    return 1;
  }
  return 0;
}
