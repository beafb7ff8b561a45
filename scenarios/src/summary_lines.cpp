// One-line descriptions of a scenario (summary_lines.hpp).
#include "threewalls/scenarios/summary_lines.hpp"

#include <cstdio>

#include "threewalls/scenarios/parameters.hpp"

namespace threewalls::scenarios {

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "235 B", "47.3 M": a parameter count.
std::string count_text(double n) {
  if (n >= 1e9) return fixed(n / 1e9, n >= 1e11 ? 0 : 1) + " B";
  if (n >= 1e6) return fixed(n / 1e6, n >= 1e8 ? 0 : 1) + " M";
  return fixed(n, 0);
}

}  // namespace

std::string model_line(const scenarios::Scenario& s) {
  const auto& m = s.model;
  std::string out = count_text(model_parameters(m)) + " parameters";
  std::string layers = std::to_string(m.num_layers) + " layers";
  if (m.mtp_num_layers > 0) {
    layers += " + " + std::to_string(m.mtp_num_layers) + " MTP depth" + (m.mtp_num_layers > 1 ? "s" : "");
  }
  if (m.is_moe()) {
    out += ", " + count_text(active_parameters(m)) + " active per token (" + layers + ", " +
           std::to_string(m.num_experts) + " experts, top-" + std::to_string(m.moe_router_topk) + ")";
  } else {
    out += " (" + layers + ", dense)";
  }
  return out;
}

// The parallel layout and the batch of one step, in Megatron-LM's terms.
std::string layout_line(const scenarios::Scenario& s) {
  const auto& p = s.parallel;
  std::string out = "TP " + std::to_string(p.tp) + ", CP " + std::to_string(p.cp) + ", PP " + std::to_string(p.pp) +
                    ", VPP " + std::to_string(p.vpp) + ", DP " + std::to_string(p.dp);
  if (s.model.is_moe()) {
    out += "; EP " + std::to_string(p.ep) + ", ETP " + std::to_string(p.etp) + " (expert DP " + std::to_string(p.edp) +
           ")";
  }
  if (s.train) {
    const auto& t = *s.train;
    out += "; " + std::to_string(t.num_microbatches) + " micro-batch" + (t.num_microbatches == 1 ? "" : "es") + " of " +
           std::to_string(t.micro_batch_size) + " x " + std::to_string(t.seq_length) +
           " tokens per DP rank (global batch " + std::to_string(t.global_batch_size) + ")";
  } else if (s.infer) {
    const auto& i = *s.infer;
    out += "; batch " + std::to_string(i.batch_size) + ", prompt " + std::to_string(i.prompt_length) + " tokens, " +
           std::to_string(i.generate_tokens) + " generated";
  }
  return out;
}

}  // namespace threewalls::scenarios
