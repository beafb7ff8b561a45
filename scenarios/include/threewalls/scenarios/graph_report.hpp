// What a scenario's step expands into, for people: op counts per phase and layer with FLOPs and bytes,
// as JSON, text or Graphviz dot (`threewalls graph`, docs/cli.md).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {

// Which ops a report covers. cls < 0: every rank class (dot draws class 0 then).
struct GraphSelection {
  int cls = -1;
  std::optional<int> layer;  // -1 selects the ops outside layers
  std::optional<int> microbatch;
  std::size_t max_ops = 2000;  // dot only: more selected ops than this is an InputError
};

// The report as JSON: scenario, step, streams, CUDA graph scopes and one entry per selected class with
// its phases (kind, wall, stream, count, FLOPs, bytes) and ops per layer. InputError when sel.cls names
// no class of the step.
OrderedJson graph_json(const Scenario& s, const StepGraph& g, const GraphSelection& sel, double expand_seconds);

// graph_json as aligned text.
std::string graph_text(const StepGraph& g, const OrderedJson& report);

// One class's selected ops as a Graphviz digraph: gray edges for same-stream order, black for explicit
// dependencies. InputError when more than sel.max_ops ops are selected.
std::string graph_dot(const std::string& title, const StepGraph& g, const GraphSelection& sel);

}  // namespace threewalls::scenarios
