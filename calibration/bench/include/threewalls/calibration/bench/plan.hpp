#pragma once
// The calibration's table of microbenchmark ops and the plan of points it measures (host-only: no
// CUDA here, so that the grids, their byte/FLOP/bus-bandwidth definitions and the time budget are
// tested on a machine without a GPU).
//
// Shape of the benchmark (nccl-tests / nvbench style): one driver (driver.hpp) walks a list of
// points; every point names the op of the table that measures it, the profile family its result
// feeds, the op's parameters and the family's inputs. The grids and op rows are the family modules'
// (threewalls/calibration/grid.hpp); this file puts them together. The GPU side (gpu_runner.hpp, one
// benchmark file per op group in src/families/) has, per op, a setup, a run and a correctness check.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/calibration/grid.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::calibration::bench {

// The op table: every module's op rows (benchmark_ops()).
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

// Every point to measure, in execution order: the family modules' grids in the measurement order of
// families.def (each grid keeps an op's points together, so that one setup serves many points;
// collectives ordered by group size). Throws InputError for an unknown group in `only` (naming the
// known ones) or gpus < 1.
std::vector<PointSpec> make_plan(const PlanOptions& options);

// ---- definitions shared by the plan, the runner and the summary ----

// The nccl-tests bus-bandwidth factor of a collective of collective_ops(): busbw = algbw * factor,
// algbw = size / time (size: the nccl-tests "size" column).
//   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, send_recv 1.
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
