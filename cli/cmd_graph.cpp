// threewalls graph: what a scenario's step expands into (op counts per phase and layer, FLOPs and
// bytes), as text, JSON or Graphviz dot.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "command.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::cli {
namespace {

using namespace scenarios;

struct PhaseAgg {
  std::size_t count = 0;
  double flops = 0;
  double bytes = 0;
  std::string kind;
  std::string wall;
  std::string stream;
};

struct Options {
  std::string scenario;
  std::string format = "text";
  int step = 0;
  int cls = -1;
  std::optional<int> layer;
  std::optional<int> microbatch;
  std::size_t max_ops = 2000;
};

bool selected(const Options& o, const Op& op) {
  if (o.layer && op.layer != *o.layer) return false;
  if (o.microbatch && op.microbatch != *o.microbatch) return false;
  return true;
}

OrderedJson class_json(const StepGraph& g, const RankClass& rc, const Options& o) {
  std::map<std::string, PhaseAgg> phases;
  std::map<int, std::size_t> per_layer;
  double flops = 0;
  double model_flops = 0;
  double bytes = 0;
  std::size_t n = 0;
  for (const auto& op : rc.ops) {
    if (!selected(o, op)) continue;
    ++n;
    auto& a = phases[g.phase_name(op)];
    ++a.count;
    a.flops += op.flops;
    a.bytes += op.bytes;
    a.kind = to_string(op.kind);
    a.wall = to_string(op.wall);
    a.stream = g.stream_name(op);
    flops += op.flops;
    if (!(op.flags & kRecompute)) model_flops += op.flops;
    bytes += op.bytes;
    ++per_layer[op.layer];
  }
  OrderedJson j;
  j["class"] = rc.id;
  j["label"] = rc.label;
  j["pp_stage"] = rc.pp_stage;
  j["ranks"] = rc.ranks.size();
  j["representative"] = rc.representative();
  j["ops"] = n;
  j["flops"] = flops;
  j["model_flops"] = model_flops;
  j["bytes"] = bytes;
  j["dense_params"] = rc.dense_params;
  j["expert_params"] = rc.expert_params;
  j["cuda_graph_runs"] = rc.graph_runs.size();
  OrderedJson ph = OrderedJson::array();
  for (const auto& [name, a] : phases) {
    ph.push_back({{"phase", name}, {"kind", a.kind}, {"wall", a.wall}, {"stream", a.stream}, {"count", a.count},
                  {"flops", a.flops}, {"bytes", a.bytes}});
  }
  j["phases"] = ph;
  OrderedJson layers = OrderedJson::object();
  for (const auto& [l, c] : per_layer) layers[l < 0 ? std::string("none") : std::to_string(l)] = c;
  j["ops_per_layer"] = layers;
  return j;
}

void print_text(const StepGraph& g, const OrderedJson& doc) {
  std::printf("scenario %s, step %d (%s): %zu rank classes, %zu ops in all, expanded in %.3f s\n",
              doc["scenario"].get<std::string>().c_str(), g.step, g.step_kind.c_str(), g.classes.size(), g.total_ops(),
              doc["expand_seconds"].get<double>());
  std::printf("model FLOPs per step %.4e (Megatron formula %.4e), tokens per step %.0f\n",
              doc["graph_model_flops"].get<double>(), g.model_flops, g.tokens);
  for (const auto& c : doc["classes"]) {
    std::printf("\nclass %d  %s  (%zu ranks, representative %d)\n", c["class"].get<int>(),
                c["label"].get<std::string>().c_str(), c["ranks"].get<std::size_t>(), c["representative"].get<int>());
    std::printf("  ops %zu, FLOPs %.4e (model %.4e), bytes %.4e, params dense %.4e expert %.4e, graph runs %zu\n",
                c["ops"].get<std::size_t>(), c["flops"].get<double>(), c["model_flops"].get<double>(),
                c["bytes"].get<double>(), c["dense_params"].get<double>(), c["expert_params"].get<double>(),
                c["cuda_graph_runs"].get<std::size_t>());
    std::printf("  %-36s %-14s %-13s %-12s %8s %12s %12s\n", "phase", "kind", "wall", "stream", "count", "FLOPs", "bytes");
    for (const auto& p : c["phases"]) {
      std::printf("  %-36s %-14s %-13s %-12s %8zu %12.4e %12.4e\n", p["phase"].get<std::string>().c_str(),
                  p["kind"].get<std::string>().c_str(), p["wall"].get<std::string>().c_str(),
                  p["stream"].get<std::string>().c_str(), p["count"].get<std::size_t>(), p["flops"].get<double>(),
                  p["bytes"].get<double>());
    }
  }
}

void print_dot(const StepGraph& g, const RankClass& rc, const Options& o) {
  std::size_t n = 0;
  for (const auto& op : rc.ops) n += selected(o, op) ? 1 : 0;
  if (n > o.max_ops) {
    throw InputError("graph --format dot: class " + std::to_string(rc.id) + " has " + std::to_string(n) +
                     " selected ops, more than --max-ops " + std::to_string(o.max_ops) +
                     "; narrow it with --layer/--microbatch or raise --max-ops");
  }
  std::printf("digraph \"%s class %d\" {\n  rankdir=LR;\n  node [shape=box, fontsize=9];\n", o.scenario.c_str(), rc.id);
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const auto& op = rc.ops[i];
    if (!selected(o, op)) continue;
    std::printf("  op%zu [label=\"%s\\nL%d mb%d %s\"];\n", i, g.phase_name(op).c_str(), op.layer, op.microbatch,
                g.stream_name(op).c_str());
  }
  // Explicit (cross-stream) dependencies and same-stream order.
  std::map<int, std::size_t> last_on_stream;
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const auto& op = rc.ops[i];
    if (!selected(o, op)) continue;
    auto it = last_on_stream.find(op.stream);
    if (it != last_on_stream.end()) std::printf("  op%zu -> op%zu [color=gray];\n", it->second, i);
    last_on_stream[op.stream] = i;
    for (auto d = op.deps_begin; d < op.deps_end; ++d) {
      const auto dep = rc.deps[d];
      if (selected(o, rc.ops[dep])) std::printf("  op%u -> op%zu;\n", dep, i);
    }
  }
  std::printf("}\n");
}

}  // namespace

void register_graph(CLI::App& app, Commands& cmds) {
  auto* sub = app.add_subcommand("graph", "Expand a scenario into its StepGraph and print op counts per phase and "
                                          "layer with FLOPs and bytes (text, JSON or Graphviz dot).");
  static Options o;
  sub->add_option("scenario", o.scenario, "Scenario file")->required();
  sub->add_option("--format", o.format, "text, json or dot")->check(CLI::IsMember({"text", "json", "dot"}));
  sub->add_option("--step", o.step, "Step index (inference steps differ: prefill, decode)")->check(CLI::NonNegativeNumber);
  sub->add_option("--class", o.cls, "Only this rank class (dot: default 0)");
  sub->add_option("--layer", o.layer, "Only ops of this layer (-1: ops outside layers)");
  sub->add_option("--microbatch", o.microbatch, "Only ops of this micro-batch");
  sub->add_option("--max-ops", o.max_ops, "dot: refuse to draw more ops than this")->check(CLI::PositiveNumber);
  cmds.add(sub, [] {
    Scenario s = load_scenario(o.scenario);
    auto t0 = std::chrono::steady_clock::now();
    StepGraph g = expand(s, o.step);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.cls >= static_cast<int>(g.classes.size())) {
      throw InputError("graph: --class " + std::to_string(o.cls) + " does not exist; the step has " +
                       std::to_string(g.classes.size()) + " rank classes (0.." + std::to_string(g.classes.size() - 1) + ")");
    }
    if (o.format == "dot") {
      print_dot(g, g.classes[static_cast<std::size_t>(std::max(0, o.cls))], o);
      return kExitOk;
    }
    OrderedJson doc;
    doc["scenario"] = s.name;
    doc["step"] = g.step;
    doc["step_kind"] = g.step_kind;
    doc["expand_seconds"] = secs;
    doc["world_size"] = s.world_size();
    doc["rank_classes"] = g.classes.size();
    doc["total_ops"] = g.total_ops();
    doc["megatron_model_flops"] = g.model_flops;
    double graph_flops = 0;
    for (const auto& rc : g.classes) {
      for (const auto& op : rc.ops) {
        if (!(op.flags & kRecompute)) graph_flops += op.flops * static_cast<double>(rc.ranks.size());
      }
    }
    doc["graph_model_flops"] = graph_flops;
    doc["tokens"] = g.tokens;
    OrderedJson streams = OrderedJson::array();
    for (const auto& st : g.streams) streams.push_back({{"name", st.name}, {"kind", to_string(st.kind)}});
    doc["streams"] = streams;
    doc["cuda_graph_scopes"] = g.graphs;
    OrderedJson classes = OrderedJson::array();
    for (const auto& rc : g.classes) {
      if (o.cls >= 0 && rc.id != o.cls) continue;
      classes.push_back(class_json(g, rc, o));
    }
    doc["classes"] = classes;
    if (o.format == "json") {
      std::cout << doc.dump(2) << "\n";
    } else {
      print_text(g, doc);
    }
    return kExitOk;
  });
}

}  // namespace threewalls::cli
