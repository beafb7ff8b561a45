#include "threewalls/scenarios/stages.hpp"

#include <string>

#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

StageSplit::StageSplit(const Scenario& s) : pp_(s.parallel.pp), vpp_(s.parallel.vpp) {
  const auto& p = s.parallel;
  const long long vstages = 1LL * pp_ * vpp_;
  const int layers = s.model.num_layers;
  if (!p.layers_per_stage.empty()) {
    if (static_cast<long long>(p.layers_per_stage.size()) != vstages) {
      throw Error("StageSplit: layers_per_stage has " + std::to_string(p.layers_per_stage.size()) +
                  " entries for pp x vpp = " + std::to_string(vstages) + " virtual stages");
    }
    count_ = p.layers_per_stage;
  } else if (p.first_stage_layers || p.last_stage_layers) {
    const int rest_stages = pp_ - (p.first_stage_layers ? 1 : 0) - (p.last_stage_layers ? 1 : 0);
    const int rest = layers - p.first_stage_layers - p.last_stage_layers;
    count_.assign(static_cast<std::size_t>(vstages), rest_stages > 0 ? rest / rest_stages : 0);
    if (p.first_stage_layers) count_.front() = p.first_stage_layers;
    if (p.last_stage_layers) count_.back() = p.last_stage_layers;
  } else {
    count_.assign(static_cast<std::size_t>(vstages), static_cast<int>(layers / vstages));
  }
  if (s.train) count_.back() += s.model.mtp_num_layers;  // the MTP depths follow the last layer
  first_.assign(count_.size(), 0);
  for (std::size_t v = 1; v < count_.size(); ++v) first_[v] = first_[v - 1] + count_[v - 1];
}

std::vector<int> StageSplit::chunk_layers(int stage, int chunk) const {
  const int v = vstage(stage, chunk);
  std::vector<int> out;
  for (int l = 0; l < count(v); ++l) out.push_back(first(v) + l);
  return out;
}

std::vector<int> StageSplit::stage_layers(int stage) const {
  std::vector<int> out;
  for (int c = 0; c < vpp_; ++c) {
    const auto layers = chunk_layers(stage, c);
    out.insert(out.end(), layers.begin(), layers.end());
  }
  return out;
}

}  // namespace threewalls::scenarios
