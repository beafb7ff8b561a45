#pragma once
// The calibration's table of microbenchmark ops and the grids of points it measures (host-only: no
// CUDA here, so that the grids, their byte/FLOP/bus-bandwidth definitions and the time budget are
// tested on a machine without a GPU).
//
// Shape of the benchmark (nccl-tests / nvbench style): one driver (driver.hpp) walks a list of
// points; every point names the op of the table that measures it, the profile family its result
// feeds, the op's parameters and the family's inputs. The GPU side (gpu_runner.hpp, one benchmark
// file per op group in src/families/) has, per op, a setup, a run and a correctness check; this file
// has what needs no GPU.
//
// Grids are deterministic functions of (mode, GPU count). They sample shapes on grids that cover
// and exceed the example scenarios (GEMM m 64..32768, n/k 256..16384); they never look at a
// scenario, and a test checks that no point coincides with a shape of the held-out validation
// scenarios (scenarios/validation/). Points marked `held_out` are measured like the others but never
// given to the fits: they score the fitted models on shapes the fit did not see.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/scenarios/step_graph.hpp"

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

// The table: one entry per microbenchmark op.
struct OpInfo {
  std::string name;        // "gemm_bf16"
  std::string group;       // what --only selects: gemm, grouped, attention, memory, copy, collective, host, concurrency
  std::string family;      // the family (or, for collectives, the family pattern) it feeds
  std::string what;        // what runs (the backend function OpRunner uses for the matching op kind)
  std::string definition;  // FLOPs / bytes / bus-bandwidth definitions of the reported rates
};
const std::vector<OpInfo>& op_table();
const OpInfo* find_op(std::string_view name);
// The --only groups: the calibrate groups of the family table (families.def), in the order of their
// first row.
const std::vector<std::string>& op_groups();

struct PlanOptions {
  Mode mode = Mode::full;
  int gpus = 1;                // GPUs used (collectives run on every group size 2..gpus)
  std::set<std::string> only;  // op groups to run; empty: all
};

// Every point to measure, in execution order (ops grouped so that one setup serves many points;
// collectives ordered by group size). Throws InputError for an unknown group in `only` (naming the
// known ones) or gpus < 1.
std::vector<PointSpec> make_plan(const PlanOptions& options);

// ---- definitions shared by the plan, the runner and the summary ----

// Experts of a concurrency_section point (what a streams:N expert section of a 64-expert layer
// spreads over its streams; n streams run 64 / n sections each).
inline constexpr int kConcurrencySectionExperts = 64;

// Layout codes of the GEMM `layout` parameter (backend::GemmLayout order).
inline constexpr int kLayoutForward = 0;
inline constexpr int kLayoutDgrad = 1;
inline constexpr int kLayoutWgrad = 2;

// Collective kinds measured ("all_reduce", ..., "send_recv") and their nccl-tests bus-bandwidth
// factor: busbw = algbw * factor, algbw = size / time (size: the nccl-tests "size" column).
//   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, send_recv 1.
const std::vector<std::string>& collective_ops();
double bus_bandwidth_factor(std::string_view collective_op, int group_size);
double algorithm_bandwidth(double size_bytes, double seconds);  // bytes / s
double bus_bandwidth(std::string_view collective_op, int group_size, double size_bytes, double seconds);

// The ops of a concurrency_section point: the expert ops of a Switch-like layer (kConcurrencySection-
// Experts experts, top-1, non-gated, `rows` tokens per expert, d_model `hidden`, FFN `ffn`) as the
// step graph expands it with sequential experts: per expert a gather, fc1, the activation, fc2 and a
// scatter-add (scenarios/src/programs.cpp), in issue order, each with its expert index. Throws
// InputError for shapes the layer cannot have (rows x experts not a multiple of 128, hidden not a
// multiple of 64).
std::vector<scenarios::Op> concurrency_section_ops(std::int64_t rows, std::int64_t hidden, std::int64_t ffn);
// The unweighted mean of scenarios::sm_fraction over ops (what the simulator averages over the
// kernels running together); 1 for none.
double mean_sm_fraction(const std::vector<scenarios::Op>& ops, int sm_count);

}  // namespace threewalls::calibration::bench
