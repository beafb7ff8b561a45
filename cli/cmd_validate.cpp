#include <iostream>

#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::cli {

void register_validate(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("validate", "Check scenario files; exit 0 only when every file is valid.");
  static std::vector<std::string> files;
  static bool quiet = false;
  sub->add_option("files", files, "Scenario files (TOML)")->required();
  sub->add_flag("-q,--quiet", quiet, "Print only errors");
  cmds.add(sub, [] {
    int bad = 0;
    for (const auto& f : files) {
      try {
        auto s = scenarios::load_scenario(f);
        if (!quiet) {
          std::cout << f << ": valid (" << s.name << ", " << s.world_size() << " GPUs, "
                    << (s.is_training() ? "training" : "inference") << ")\n";
        }
      } catch (const scenarios::ScenarioError& e) {
        ++bad;
        for (const auto& m : e.messages()) std::cerr << m << "\n";
      } catch (const InputError& e) {
        ++bad;
        std::cerr << e.what() << "\n";
      }
    }
    if (bad > 0) {
      std::cerr << bad << " of " << files.size() << " scenario file(s) invalid\n";
      return kExitInputError;
    }
    return kExitOk;
  });
}

}  // namespace threewalls::cli
