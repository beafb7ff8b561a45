#pragma once
// The CUDA-graph scopes a step can capture (the `cuda_graph_scope` key of [train] and [infer]). The
// names are written here once: the registry offers them as the key's choices, the expansion tags the
// ops of each scope with them, the rules and the memory model read them. They are frozen in scenario
// files: add, never rename.
#include <array>

namespace threewalls::scenarios::graph_scopes {

inline constexpr const char* kAttn = "attn";
inline constexpr const char* kMlp = "mlp";
inline constexpr const char* kMoeRouter = "moe_router";
inline constexpr const char* kMoePreprocess = "moe_preprocess";
inline constexpr const char* kFullIteration = "full_iteration";  // the whole step; listed alone

// The scopes that capture a part of every layer, and every scope in the key's order.
inline constexpr std::array<const char*, 4> kPerLayer = {kAttn, kMlp, kMoeRouter, kMoePreprocess};
inline constexpr std::array<const char*, 5> kAll = {kAttn, kMlp, kMoeRouter, kMoePreprocess, kFullIteration};

}  // namespace threewalls::scenarios::graph_scopes
