#pragma once
// Emission helpers shared by the training and inference expansions: interning a StepGraph's names
// (GraphTables), appending ops to a rank class in host issue order (ClassBuilder), instantiating a
// program's forward, recompute and backward ops (Emitter) and marking CUDA-graph runs.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "program.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios::detail {

inline constexpr std::uint32_t kNoOp = std::numeric_limits<std::uint32_t>::max();

// Interns phase, stream and CUDA-graph scope names of one StepGraph.
class GraphTables {
 public:
  explicit GraphTables(StepGraph& g);
  // Unique per GraphTables of the process (never 0): what a program's cached phase ids belong to.
  [[nodiscard]] std::uint64_t serial() const { return serial_; }
  std::uint16_t phase(std::string_view name);
  [[nodiscard]] const std::string& phase_name(std::uint16_t id) const { return graph_.phases[id]; }
  std::uint8_t stream(std::string_view name, StreamKind kind);
  std::uint8_t graph_scope(std::string_view name);

 private:
  StepGraph& graph_;
  std::uint64_t serial_;
  // Looked up by string_view without building a string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
  };
  std::unordered_map<std::string, std::uint16_t, NameHash, std::equal_to<>> phase_ids_;
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

// Records the CUDA-graph runs of a class: maximal runs of consecutive ops captured in the same scope.
void mark_graph_runs(RankClass& rc);

// A copy of `bytes` (its shape holds them) of kind `kind`, on the memory wall; the caller sets its
// stream, phase, indices and flags.
Op copy_op(CopyKind kind, double bytes);
// A host op of kind `kind` on `stream`, on the host wall; the caller sets its phase, indices and flags.
Op host_op(HostKind kind, std::uint8_t stream);

// Instantiates programs into the ops of one rank class.
class Emitter {
 public:
  Emitter(const Ctx& c, const ClassInfo& ci, GraphTables& tables, ClassBuilder& b);
  [[nodiscard]] std::uint8_t compute_stream() const { return compute_; }
  // Forward (or recompute when `recompute`): returns the op id of each spec (kNoOp when skipped).
  std::vector<std::uint32_t> forward(const Program& p, int layer, int mb, int chunk, std::uint32_t input,
                                     bool recompute, const std::vector<bool>* subset, bool dense_layer);
  // Backward: returns the op id that produces the program input's gradient (or the last op).
  std::uint32_t backward(const Program& p, int layer, int mb, int chunk, std::uint32_t grad_in,
                         const std::vector<std::uint32_t>& recomputed, bool dense_layer);

  // A program instance emitted in parts (the nodes of a fine-grained schedule), each part a subset of
  // its specs. Forward parts go in spec order and backward parts in reverse, so that every producer
  // (forward) or consumer (backward) of a spec is emitted before it.
  struct Instance {
    const Program* p = nullptr;
    int layer = 0, mb = 0, chunk = 0;
    bool dense_layer = false;
    std::uint32_t input = kNoOp;              // forward: the program's input
    std::uint32_t grad_in = kNoOp;            // backward: gradient of the program's output
    std::vector<std::uint32_t> ids;           // forward: op of each spec
    std::vector<std::uint32_t> recomputed;    // backward: recomputed op of each spec (or empty)
    std::vector<std::uint32_t> grad_of;       // backward: the op producing each spec's input gradient
    const std::vector<std::vector<int>>* consumers = nullptr;  // backward: consumers of each spec
    std::uint32_t last = kNoOp;               // backward: the last op emitted
    std::uint32_t input_grad = kNoOp;         // backward: the op producing the program input's gradient
    [[nodiscard]] std::uint32_t backward_result() const { return input_grad != kNoOp ? input_grad : last; }
  };
  // A weight-gradient GEMM held back by backward_part, with the dgrad it follows.
  struct DeferredWgrad {
    Op op;
    std::uint32_t after = kNoOp;
  };
  static constexpr std::uint8_t kDefaultStream = 0xFF;
  Instance begin_forward(const Program& p, int layer, int mb, int chunk, std::uint32_t input, bool dense_layer) const;
  Instance begin_backward(const Program& p, int layer, int mb, int chunk, std::uint32_t grad_in,
                          std::vector<std::uint32_t> recomputed, bool dense_layer);
  // Emits the forward ops of the specs in `part` (all when null), on `stream` unless kDefaultStream;
  // returns the number of ops emitted.
  std::size_t forward_part(Instance& in, bool recompute, const std::vector<bool>* part,
                           std::uint8_t stream = kDefaultStream);
  // Emits the backward ops of the specs in `part` (all when null), on `stream` unless kDefaultStream.
  // With `deferred`, weight-gradient GEMMs are appended there instead of being emitted.
  std::size_t backward_part(Instance& in, const std::vector<bool>* part, std::uint8_t stream = kDefaultStream,
                            std::vector<DeferredWgrad>* deferred = nullptr);

 private:
  std::uint8_t stream_for(const Spec& sp);
  // The CUDA-graph scope that captures `sp` (0: none), from the scenario's cuda_graph_scope.
  std::uint8_t graph_of(const Spec& sp, bool dense_layer);
  // The phase name suffixes of a spec's ops.
  enum class Suffix : std::uint8_t { fwd, recompute, dgrad, wgrad, bwd };
  static constexpr std::size_t kSuffixes = 5;
  // The phase of the name of spec `index` of `p` + the suffix's text, interned (cached in the
  // program: Program::phase_ids).
  std::uint16_t phase_of(const Program& p, std::size_t index, Suffix suffix);
  // The op of spec `index` of `p` under phase name `name` + the suffix's text, before its dependencies.
  Op base_op(const Program& p, std::size_t index, Suffix suffix, int layer, int mb, int chunk, std::uint8_t flags,
             bool dense_layer);
  // FP8 quantisation (docs/stepgraph.md, "FP8 quantisation"). Which operand of an fp8 GEMM is cast.
  enum class Operand : std::uint8_t { input, weight, grad };
  [[nodiscard]] bool casts(const Spec& sp) const;
  // Emits the quantisation of `operand` of the fp8 GEMM `sp` (the amax pass, the tp amax all-reduce,
  // the cast, by the recipe) after the ops in deps_, on the GEMM's stream; returns the cast's id.
  // `tp_reduce`: the operand is gathered over tp (sequence parallelism).
  std::uint32_t quantize(const Spec& sp, Operand operand, const Instance& in, bool recompute, bool tp_reduce);
  // Before the dgrad of the fp8 GEMM `sp` (spec `index` of `in`): its output gradient's quantisation;
  // deps_ becomes the cast. Returns the ops emitted.
  std::size_t quantize_grad(const Spec& sp, const Instance& in, std::size_t index);

  const Ctx& c_;
  const ClassInfo& ci_;
  GraphTables& t_;
  ClassBuilder& b_;
  std::uint8_t compute_;
  std::uint8_t stream_override_ = kDefaultStream;
  std::vector<std::uint32_t> deps_;
  std::string phase_name_;  // interned_phase's name
  // The phase of spec `index` of `p`'s name + `what` + `kind` + `dir` (quantize's names), interned
  // (cached in the program's Program::phase_ids, slot kSuffixSlots + `code`, `code` < kQuantSlots).
  // Both go through interned_phase: slot `slot` of the spec, its name made by `name` (which appends
  // to the spec's name) when first asked for.
  template <class Name>
  std::uint16_t interned_phase(const Program& p, std::size_t index, std::size_t slot, const Name& name);
  std::uint16_t quant_phase(const Program& p, std::size_t index, unsigned code, std::string_view what,
                            std::string_view kind, std::string_view dir);
  static constexpr std::uint16_t kNoPhase = 0xFFFF;
  // The consumers of each spec of a program emitted backward (begin_backward), per program: a program
  // given to backward or begin_backward stays in place and unchanged while this Emitter emits.
  std::unordered_map<const Program*, std::vector<std::vector<int>>> consumers_;
  std::vector<std::uint8_t> expert_streams_;  // stream of each expert stream slot (kNoStream: not yet interned)
  static constexpr std::uint8_t kNoStream = 0xFF;
};

}  // namespace threewalls::scenarios::detail
