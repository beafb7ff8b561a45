#include "threewalls/scenarios/scenario.hpp"

#include <algorithm>
#include <stdexcept>

#include "threewalls/scenarios/graph_scopes.hpp"
#include "threewalls/scenarios/registry.hpp"

namespace threewalls::scenarios {

int ModelSpec::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_layers; ++l) n += layer_is_moe(l) ? 1 : 0;
  return n;
}

std::int64_t ModelSpec::padded_vocab_size(int tp) const {
  const std::int64_t multiple = 128LL * tp;
  return (static_cast<std::int64_t>(vocab_size) + multiple - 1) / multiple * multiple;
}

bool ExecOptions::graph_scope(const std::string& s) const {
  return std::find(cuda_graph_scope.begin(), cuda_graph_scope.end(), s) != cuda_graph_scope.end() ||
         std::find(cuda_graph_scope.begin(), cuda_graph_scope.end(), graph_scopes::kFullIteration) !=
             cuda_graph_scope.end();
}

bool TrainSpec::recompute_module(const std::string& m) const {
  return recompute_granularity == RecomputeGranularity::selective &&
         std::find(recompute_modules.begin(), recompute_modules.end(), m) != recompute_modules.end();
}

void TrainSpec::set_microbatches(int m, int dp) {
  if (m < 1 || dp < 1) throw std::logic_error("TrainSpec::set_microbatches: m and dp must be >= 1");
  global_batch_size = static_cast<decltype(global_batch_size)>(m) * micro_batch_size * dp;
  num_microbatches = m;
}

bool TrainSpec::shards_optimizer_state() const {
  if (data_parallel_sharding_strategy == DataParallelSharding::none) return use_distributed_optimizer;
  return data_parallel_sharding_strategy != DataParallelSharding::no_shard;
}

bool TrainSpec::shards_gradients() const {
  return data_parallel_sharding_strategy == DataParallelSharding::optim_grads ||
         data_parallel_sharding_strategy == DataParallelSharding::optim_grads_params;
}

bool TrainSpec::shards_parameters() const {
  return data_parallel_sharding_strategy == DataParallelSharding::optim_grads_params;
}

namespace {
// The name of `v`: the registry's choices of the key that reads the enum (registry.hpp). Each enum is
// read by one key (or keys sharing its choices), looked up once: the registry is immutable once built.
template <class E>
const char* name_of(const char* key_path, E v) {
  static const ParamSpec& key = choice_param(key_path);
  return key.choices.at(static_cast<std::size_t>(v)).c_str();
}
}  // namespace

const char* to_string(AttentionKind v) { return name_of("model.attention", v); }
const char* to_string(AttentionImpl v) { return name_of("model.attention_impl", v); }
const char* to_string(Precision v) { return name_of("train.precision", v); }
const char* to_string(Fp8Recipe v) { return name_of("train.fp8_recipe", v); }
const char* to_string(Fp8Format v) { return name_of("train.fp8_format", v); }
const char* to_string(Dispatcher v) { return name_of("train.token_dispatcher", v); }
const char* to_string(RecomputeGranularity v) { return name_of("train.recompute_granularity", v); }
const char* to_string(DataParallelSharding v) { return name_of("train.data_parallel_sharding_strategy", v); }
const char* to_string(Framework v) { return name_of("run.framework", v); }
const char* to_string(OffloadTier v) { return name_of("infer.expert_offload.tier", v); }
std::string to_string(const ExpertExecution& v) {
  switch (v.kind) {
    case ExpertExecutionKind::sequential: return "sequential";
    case ExpertExecutionKind::grouped: return "grouped";
    case ExpertExecutionKind::streams: return "streams:" + std::to_string(v.streams);
    case ExpertExecutionKind::split: return "split:" + std::to_string(v.streams);
  }
  return "?";
}

}  // namespace threewalls::scenarios
