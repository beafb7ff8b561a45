// Writes a synthetic run directory with a known answer (notebooks_export/synthetic.hpp), for trying
// compare / analyze / export by hand and for the docs' screenshot (scripts/render_report.sh).
//   synthetic_run OUT [key=value ...]   keys: source scenario ranks stages steps layers microbatches noise
//                                             seed time_scale slow_rank slow_phase slow_factor slow_from
//                                             slow_to write_group_id
#include <iostream>
#include <string>

#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/synthetic.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " OUT [key=value ...]\n";
    return 2;
  }
  threewalls::notebooks_export::SyntheticSpec s;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      auto eq = a.find('=');
      if (eq == std::string::npos) throw threewalls::InputError("argument '" + a + "' is not key=value");
      std::string k = a.substr(0, eq);
      std::string v = a.substr(eq + 1);
      if (k == "source") s.source = v;
      else if (k == "scenario") s.scenario = v;
      else if (k == "ranks") s.ranks = std::stoi(v);
      else if (k == "stages") s.stages = std::stoi(v);
      else if (k == "steps") s.steps = std::stoi(v);
      else if (k == "layers") s.layers = std::stoi(v);
      else if (k == "microbatches") s.microbatches = std::stoi(v);
      else if (k == "noise") s.noise = std::stod(v);
      else if (k == "seed") s.seed = std::stoull(v);
      else if (k == "time_scale") s.time_scale = std::stod(v);
      else if (k == "slow_rank") s.slow_rank = std::stoi(v);
      else if (k == "slow_phase") s.slow_phase = v;
      else if (k == "slow_factor") s.slow_factor = std::stod(v);
      else if (k == "slow_from") s.slow_from = std::stoi(v);
      else if (k == "slow_to") s.slow_to = std::stoi(v);
      else if (k == "write_group_id") s.write_group_id = v == "true" || v == "1";
      else throw threewalls::InputError("unknown key '" + k + "'");
    }
    threewalls::notebooks_export::write_synthetic_run(argv[1], s);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
