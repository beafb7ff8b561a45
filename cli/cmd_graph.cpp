// threewalls graph: what a scenario's step expands into (op counts per phase and layer, FLOPs and
// bytes), as text, JSON or Graphviz dot. The report itself is scenarios/graph_report.hpp.
#include <chrono>
#include <iostream>

#include "command.hpp"
#include "threewalls/scenarios/graph_report.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::cli {

void register_graph(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("graph", "Expand a scenario into its StepGraph and print op counts per phase and "
                                          "layer with FLOPs and bytes (text, JSON or Graphviz dot).");
  static std::string scenario;
  static std::string format = "text";
  static int step = 0;
  static scenarios::GraphSelection sel;
  sub->add_option("scenario", scenario, "Scenario file")->required();
  sub->add_option("--format", format, "text, json or dot")->check(CLI::IsMember({"text", "json", "dot"}));
  sub->add_option("--step", step, "Step index (inference steps differ: prefill, decode)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--class", sel.cls, "Only this rank class (dot: default 0)");
  sub->add_option("--layer", sel.layer, "Only ops of this layer (-1: ops outside layers)");
  sub->add_option("--microbatch", sel.microbatch, "Only ops of this micro-batch");
  sub->add_option("--max-ops", sel.max_ops, "dot: refuse to draw more ops than this")->check(CLI::PositiveNumber);
  cmds.add(sub, [] {
    const scenarios::Scenario s = scenarios::load_scenario(scenario);
    const auto t0 = std::chrono::steady_clock::now();
    const scenarios::StepGraph g = scenarios::expand(s, step);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (format == "dot") {
      std::cout << scenarios::graph_dot(scenario, g, sel);
      return kExitOk;
    }
    const OrderedJson doc = scenarios::graph_json(s, g, sel, secs);
    if (format == "json") {
      std::cout << doc.dump(2) << "\n";
    } else {
      std::cout << scenarios::graph_text(g, doc);
    }
    return kExitOk;
  });
}

}  // namespace threewalls::cli
