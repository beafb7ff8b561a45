#pragma once
// The benchmark grid of the calibration (host-only): the points `threewalls calibrate` measures and
// the table of ops that measure them. Each family module (calibration/src/families/<module>.cpp)
// writes its own grid and op rows next to its fit; the measurement order of the grids is the
// second table of families.def. The benchmark driver (calibration/bench/plan.hpp: make_plan,
// op_table) and the GPU benchmarks (calibration/bench/src/families/<group>.cpp) read them.
//
// Grids are deterministic functions of (mode, GPU count). They sample shapes on grids that cover
// and exceed the example scenarios (GEMM m 16..32768, n/k 256..16384); they never look at a
// scenario, and a test checks that no point coincides with a shape of the held-out validation
// scenarios (scenarios/validation/). Points marked `held_out` are measured like the others but never
// given to the fits: they score the fitted models on shapes the fit did not see.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace threewalls::calibration::bench {

enum class Mode : std::uint8_t { quick, full };
const char* to_string(Mode m);

// One named parameter of a point (shape dimension, size, layout code, ...). Doubles hold integers
// exactly up to 2^53.
struct Param {
  std::string key;
  double value = 0.0;
  friend bool operator==(const Param&, const Param&) = default;
};

struct PointSpec {
  std::string op;              // name of an op of op_table()
  std::string family;          // calibration profile family the point feeds ("gemm.bf16")
  std::vector<Param> params;   // the op's parameters, in the op's order
  std::vector<double> inputs;  // the family's point inputs (FamilySpec::inputs order); a runner
                               // may complete them (concurrency: the measured serial time)
  bool held_out = false;       // measured, never fitted (scores the fit on unseen shapes)
  int group_size = 1;          // GPUs taking part (collectives); 1 for single-GPU ops
  double flops = 0.0;          // FLOPs of one run (0 for ops that are not compute)
  double bytes = 0.0;          // bytes of one run: see OpInfo::definition

  // Value of parameter `key`; throws std::logic_error when the point has none (a plan bug).
  [[nodiscard]] double param(std::string_view key) const;
  [[nodiscard]] std::int64_t iparam(std::string_view key) const;
  // "gemm_bf16 m=1024 n=1408 k=2048 batch=1 layout=1" (held-out points end with " [held-out]").
  [[nodiscard]] std::string label() const;
};

// One microbenchmark op.
struct OpInfo {
  std::string name;        // "gemm_bf16"
  std::string group;       // what --only selects: the calibrate group of its module's row of families.def
  std::string family;      // the family (or, for collectives, the family pattern) it feeds
  std::string what;        // what runs (the backend function OpRunner uses for the matching op kind)
  std::string definition;  // FLOPs / bytes / bus-bandwidth definitions of the reported rates
};

// What a module's grid reads (mode, GPU count) and appends its points to.
struct GridPlan {
  Mode mode = Mode::full;
  int gpus = 1;  // GPUs used (collectives run on every group size 2..gpus)
  std::vector<PointSpec> points;
  [[nodiscard]] bool full() const { return mode == Mode::full; }
};

// Appends the grids of the groups in `only` (empty: every group) to `plan`, in the measurement
// order of families.def. The groups must be known (the driver checks them first).
void plan_grids(GridPlan& plan, const std::set<std::string>& only);
// Every module's op rows, row by row of families.def, each with its row's group.
const std::vector<OpInfo>& benchmark_ops();
// The calibrate groups of families.def, each once, in the order of their first row.
const std::vector<std::string>& benchmark_groups();

// ---- definitions shared by the grids, the runner and the summary ----

// Experts of a concurrency_section point (what a streams:N expert section of a 64-expert layer
// spreads over its streams; n streams run 64 / n sections each).
inline constexpr int kConcurrencySectionExperts = 64;

// Layout codes of the GEMM `layout` parameter (backend::GemmLayout order).
inline constexpr int kLayoutForward = 0;
inline constexpr int kLayoutDgrad = 1;
inline constexpr int kLayoutWgrad = 2;

// Collective kinds measured ("all_reduce", ..., "send_recv"), the ops of the collective group.
const std::vector<std::string>& collective_ops();

}  // namespace threewalls::calibration::bench
