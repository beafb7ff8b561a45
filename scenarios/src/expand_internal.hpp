#pragma once
// Internals shared by the training and inference expansions.
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>

#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {

StepGraph expand_training(const Scenario& s);

namespace detail {

inline constexpr std::uint32_t kNoOp = std::numeric_limits<std::uint32_t>::max();

// Interns phase, stream and CUDA-graph scope names of one StepGraph.
class GraphTables {
 public:
  explicit GraphTables(StepGraph& g) : graph_(g) {}
  std::uint16_t phase(std::string_view name);
  std::uint8_t stream(std::string_view name, StreamKind kind);
  std::uint8_t graph_scope(std::string_view name);

 private:
  StepGraph& graph_;
  std::unordered_map<std::string, std::uint16_t> phase_ids_;
};

// Appends ops to a rank class in host issue order, keeping only cross-stream dependencies.
class ClassBuilder {
 public:
  explicit ClassBuilder(RankClass& rc) : rc_(rc) {}
  std::uint32_t emit(Op op, std::initializer_list<std::uint32_t> deps);
  std::uint32_t emit(Op op, const std::uint32_t* deps_begin, const std::uint32_t* deps_end);
  // Adds a dependency to an already emitted op (copies its dependency list when it is not last).
  void add_dep(std::uint32_t op, std::uint32_t dep);
  [[nodiscard]] RankClass& rank_class() { return rc_; }

 private:
  RankClass& rc_;
};

}  // namespace detail
}  // namespace threewalls::scenarios
