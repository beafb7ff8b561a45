#include "threewalls/scenarios/graph_report.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>

#include "threewalls/core/error.hpp"

namespace threewalls::scenarios {
namespace {

struct PhaseAgg {
  std::size_t count = 0;
  double flops = 0;
  double bytes = 0;
  std::string kind;
  std::string wall;
  std::string stream;
};

bool selected(const GraphSelection& sel, const Op& op) {
  if (sel.layer && op.layer != *sel.layer) return false;
  if (sel.microbatch && op.microbatch != *sel.microbatch) return false;
  return true;
}

void check_class(const StepGraph& g, int cls) {
  if (cls >= static_cast<int>(g.classes.size())) {
    throw InputError("--class " + std::to_string(cls) + " does not exist; the step has " +
                     std::to_string(g.classes.size()) + " rank classes (0.." + std::to_string(g.classes.size() - 1) +
                     ")");
  }
}

OrderedJson class_json(const StepGraph& g, const RankClass& rc, const GraphSelection& sel) {
  std::map<std::string, PhaseAgg> phases;
  std::map<int, std::size_t> per_layer;
  double flops = 0;
  double model_flops = 0;
  double bytes = 0;
  std::size_t n = 0;
  for (const auto& op : rc.ops) {
    if (!selected(sel, op)) continue;
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
    ph.push_back({{"phase", name},
                  {"kind", a.kind},
                  {"wall", a.wall},
                  {"stream", a.stream},
                  {"count", a.count},
                  {"flops", a.flops},
                  {"bytes", a.bytes}});
  }
  j["phases"] = ph;
  OrderedJson layers = OrderedJson::object();
  for (const auto& [l, c] : per_layer) layers[l < 0 ? std::string("none") : std::to_string(l)] = c;
  j["ops_per_layer"] = layers;
  return j;
}

// printf into the end of a std::string (the report's lines are short; long phase names are not cut).
__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  if (n > 0) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<std::size_t>(n) + 1, fmt, again);
    out.resize(at + static_cast<std::size_t>(n));
  }
  va_end(again);
}

}  // namespace

OrderedJson graph_json(const Scenario& s, const StepGraph& g, const GraphSelection& sel, double expand_seconds) {
  check_class(g, sel.cls);
  OrderedJson doc;
  doc["scenario"] = s.name;
  doc["step"] = g.step;
  doc["step_kind"] = g.step_kind;
  doc["expand_seconds"] = expand_seconds;
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
    if (sel.cls >= 0 && rc.id != sel.cls) continue;
    classes.push_back(class_json(g, rc, sel));
  }
  doc["classes"] = classes;
  return doc;
}

std::string graph_text(const StepGraph& g, const OrderedJson& doc) {
  std::string out;
  appendf(out, "scenario %s, step %d (%s): %zu rank classes, %zu ops in all, expanded in %.3f s\n",
          doc["scenario"].get<std::string>().c_str(), g.step, g.step_kind.c_str(), g.classes.size(), g.total_ops(),
          doc["expand_seconds"].get<double>());
  appendf(out, "model FLOPs per step %.4e (Megatron formula %.4e), tokens per step %.0f\n",
          doc["graph_model_flops"].get<double>(), g.model_flops, g.tokens);
  for (const auto& c : doc["classes"]) {
    appendf(out, "\nclass %d  %s  (%zu ranks, representative %d)\n", c["class"].get<int>(),
            c["label"].get<std::string>().c_str(), c["ranks"].get<std::size_t>(), c["representative"].get<int>());
    appendf(out, "  ops %zu, FLOPs %.4e (model %.4e), bytes %.4e, params dense %.4e expert %.4e, graph runs %zu\n",
            c["ops"].get<std::size_t>(), c["flops"].get<double>(), c["model_flops"].get<double>(),
            c["bytes"].get<double>(), c["dense_params"].get<double>(), c["expert_params"].get<double>(),
            c["cuda_graph_runs"].get<std::size_t>());
    appendf(out, "  %-36s %-14s %-13s %-12s %8s %12s %12s\n", "phase", "kind", "wall", "stream", "count", "FLOPs",
            "bytes");
    for (const auto& p : c["phases"]) {
      appendf(out, "  %-36s %-14s %-13s %-12s %8zu %12.4e %12.4e\n", p["phase"].get<std::string>().c_str(),
              p["kind"].get<std::string>().c_str(), p["wall"].get<std::string>().c_str(),
              p["stream"].get<std::string>().c_str(), p["count"].get<std::size_t>(), p["flops"].get<double>(),
              p["bytes"].get<double>());
    }
  }
  return out;
}

std::string graph_dot(const std::string& title, const StepGraph& g, const GraphSelection& sel) {
  check_class(g, sel.cls);
  const RankClass& rc = g.classes[static_cast<std::size_t>(std::max(0, sel.cls))];
  std::size_t n = 0;
  for (const auto& op : rc.ops) n += selected(sel, op) ? 1 : 0;
  if (n > sel.max_ops) {
    throw InputError("--format dot: class " + std::to_string(rc.id) + " has " + std::to_string(n) +
                     " selected ops, more than --max-ops " + std::to_string(sel.max_ops) +
                     "; narrow it with --layer/--microbatch or raise --max-ops");
  }
  std::string out;
  appendf(out, "digraph \"%s class %d\" {\n  rankdir=LR;\n  node [shape=box, fontsize=9];\n", title.c_str(), rc.id);
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const auto& op = rc.ops[i];
    if (!selected(sel, op)) continue;
    appendf(out, "  op%zu [label=\"%s\\nL%d mb%d %s\"];\n", i, g.phase_name(op).c_str(), op.layer, op.microbatch,
            g.stream_name(op).c_str());
  }
  // Same-stream order, then the explicit (cross-stream) dependencies.
  std::map<int, std::size_t> last_on_stream;
  for (std::size_t i = 0; i < rc.ops.size(); ++i) {
    const auto& op = rc.ops[i];
    if (!selected(sel, op)) continue;
    auto it = last_on_stream.find(op.stream);
    if (it != last_on_stream.end()) appendf(out, "  op%zu -> op%zu [color=gray];\n", it->second, i);
    last_on_stream[op.stream] = i;
    for (auto d = op.deps_begin; d < op.deps_end; ++d) {
      const auto dep = rc.deps[d];
      if (selected(sel, rc.ops[dep])) appendf(out, "  op%u -> op%zu;\n", dep, i);
    }
  }
  out += "}\n";
  return out;
}

}  // namespace threewalls::scenarios
