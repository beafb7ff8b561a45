// Writes (or checks) the shipped synthetic profiles calibration/profiles/default_<kind>.toml.
//   threewalls_make_default_profiles --out-dir calibration/profiles          write both
//   threewalls_make_default_profiles --out-dir calibration/profiles --check  exit 1 if they differ
// Not run by CI; tests/calibration checks that the committed files equal this program's output.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "default_profiles.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Generate the synthetic default calibration profiles from the reference facts of docs/architecture.md"};
  std::string out_dir;
  bool check = false;
  app.add_option("--out-dir", out_dir,
                 "folder to write default_<kind>.toml into, one per GPU kind (h100, h200, b200, gb200)")
      ->required();
  app.add_flag("--check", check, "compare with the files in --out-dir instead of writing; exit 1 when they differ");
  CLI11_PARSE(app, argc, argv);
  try {
    int differ = 0;
    for (const std::string& kind : threewalls::calibration::known_gpu_kinds()) {
      const auto profile = threewalls::calibration::defaults::make_default_profile(kind);
      const std::filesystem::path path = std::filesystem::path(out_dir) / ("default_" + kind + ".toml");
      if (check) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        if (!in || ss.str() != profile.to_toml()) {
          std::cerr << path.string() << ": differs from the generator's output (regenerate it)\n";
          ++differ;
        } else {
          std::cout << path.string() << ": up to date (" << profile.id() << ")\n";
        }
      } else {
        profile.save(path);
        std::cout << path.string() << ": written (" << profile.id() << ")\n";
      }
    }
    return differ ? threewalls::kExitFailure : threewalls::kExitOk;
  } catch (const threewalls::InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return threewalls::kExitInputError;
  } catch (const threewalls::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return threewalls::kExitSystemError;
  }
}
