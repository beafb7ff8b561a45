// The plan of a calibration: the family modules' grids (threewalls/calibration/grid.hpp) for the
// groups asked for, the op table, the collectives' bus bandwidth and the concurrency sections' ops.
#include "threewalls/calibration/bench/plan.hpp"

#include <algorithm>
#include <stdexcept>

#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace threewalls::calibration::bench {

const std::vector<OpInfo>& op_table() { return benchmark_ops(); }

const OpInfo* find_op(std::string_view name) {
  for (const auto& o : op_table()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

const std::vector<std::string>& op_groups() { return benchmark_groups(); }

double bus_bandwidth_factor(std::string_view op, int n) {
  if (n < 1) throw std::invalid_argument("bus_bandwidth_factor: group size must be >= 1");
  const double dn = n;
  if (op == "all_reduce") return 2.0 * (dn - 1.0) / dn;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (dn - 1.0) / dn;
  if (op == "broadcast" || op == "send_recv") return 1.0;
  throw std::invalid_argument("bus_bandwidth_factor: unknown collective '" + std::string(op) + "'");
}

double algorithm_bandwidth(double size_bytes, double seconds) {
  if (!(seconds > 0.0)) throw std::invalid_argument("algorithm_bandwidth: time must be > 0");
  return size_bytes / seconds;
}

double bus_bandwidth(std::string_view op, int n, double size_bytes, double seconds) {
  return algorithm_bandwidth(size_bytes, seconds) * bus_bandwidth_factor(op, n);
}

std::vector<scenarios::Op> concurrency_section_ops(std::int64_t rows, std::int64_t hidden, std::int64_t ffn) {
  const std::int64_t seq = 128;
  const std::int64_t tokens = rows * kConcurrencySectionExperts;
  if (rows < 1 || hidden < 64 || hidden % 64 != 0 || ffn < 1 || tokens % seq != 0) {
    throw InputError("concurrency_section: rows = " + std::to_string(rows) + ", hidden = " + std::to_string(hidden) +
                     ", ffn = " + std::to_string(ffn) + ": needs rows x " + std::to_string(kConcurrencySectionExperts) +
                     " a multiple of 128, hidden a multiple of 64 and ffn >= 1");
  }
  const std::string text = "schema_version = 1\nname = \"calibration_concurrency_section\"\n"
                           "[model]\nnum_layers = 1\nhidden_size = " + std::to_string(hidden) +
                           "\nnum_attention_heads = " + std::to_string(hidden / 64) +
                           "\nvocab_size = 1024\nswiglu = false\nnormalization = \"layernorm\"\nnum_experts = " +
                           std::to_string(kConcurrencySectionExperts) + "\nmoe_ffn_hidden_size = " + std::to_string(ffn) +
                           "\nmoe_router_topk = 1\n[infer]\nbatch_size = " + std::to_string(tokens / seq) +
                           "\nprompt_length = " + std::to_string(seq) +
                           "\ngenerate_tokens = 0\nexpert_execution = \"sequential\"\n"
                           "[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n";
  const scenarios::StepGraph g = scenarios::expand(scenarios::load_scenario_text(text, "<concurrency_section>").scenario);
  std::vector<scenarios::Op> ops;
  for (const auto& op : g.classes.front().ops) {
    if (op.expert >= 0) ops.push_back(op);
  }
  if (ops.size() != static_cast<std::size_t>(5 * kConcurrencySectionExperts)) {
    throw std::logic_error("concurrency_section: expected 5 ops per expert, the step graph has " +
                           std::to_string(ops.size()) + " expert ops");
  }
  return ops;
}

double mean_sm_fraction(const std::vector<scenarios::Op>& ops, int sm_count) {
  if (ops.empty()) return 1.0;
  double f = 0.0;
  for (const auto& op : ops) f += scenarios::sm_fraction(op, sm_count);
  return f / static_cast<double>(ops.size());
}

std::vector<PointSpec> make_plan(const PlanOptions& options) {
  if (options.gpus < 1) throw InputError("calibration plan: gpus = " + std::to_string(options.gpus) + " must be >= 1");
  for (const auto& g : options.only) {
    if (std::find(op_groups().begin(), op_groups().end(), g) == op_groups().end()) {
      std::string msg = "unknown benchmark group '" + g + "'";
      if (auto near = nearest(g, op_groups())) msg += " (did you mean '" + *near + "'?)";
      throw InputError(msg + "; allowed: " + join(op_groups()));
    }
  }
  GridPlan p{options.mode, options.gpus, {}};
  plan_grids(p, options.only);
  return p.points;
}

}  // namespace threewalls::calibration::bench
