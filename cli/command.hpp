#pragma once
// Each subcommand lives in its own cmd_<name>.cpp and registers itself here. Libraries throw;
// main() alone turns exceptions into exit codes (core/error.hpp).
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace threewalls::cli {

using Runner = std::function<int()>;

class Commands {
 public:
  void add(CLI::App* sub, Runner run) { commands_.emplace_back(sub, std::move(run)); }
  [[nodiscard]] const std::vector<std::pair<CLI::App*, Runner>>& all() const { return commands_; }

 private:
  std::vector<std::pair<CLI::App*, Runner>> commands_;
};

// Registration functions, one per subcommand file.
void register_validate(CLI::App& app, Commands& cmds);
void register_describe(CLI::App& app, Commands& cmds);
void register_graph(CLI::App& app, Commands& cmds);
void register_sim(CLI::App& app, Commands& cmds);
void register_plan(CLI::App& app, Commands& cmds);  // plan and plan-merge (cmd_plan.cpp)
void register_compare(CLI::App& app, Commands& cmds);
void register_analyze(CLI::App& app, Commands& cmds);
void register_export(CLI::App& app, Commands& cmds);
void register_import(CLI::App& app, Commands& cmds);
// The commands that need a GPU, in threewalls-gpu (builds with the GPU parts only).
void register_run(CLI::App& app, Commands& cmds);
void register_calibrate(CLI::App& app, Commands& cmds);
inline constexpr const char* kRunSummary =
    "Execute a scenario's steps for real on GPUs (CUDA, cuBLASLt, NCCL; one thread per GPU, or one process per GPU "
    "under mpirun) and write a run directory in the schema of a simulated run.";
inline constexpr const char* kCalibrateSummary =
    "Measure this machine's GPUs (GEMM, grouped GEMM, attention, memory-bound kernels, copies, NCCL collectives on "
    "every group size, host overheads, stream concurrency), fit the cost models and write a calibration profile.";
// In threewalls: run and calibrate as listed commands that exec threewalls-gpu, found beside the
// running executable, with the same arguments (`argv`: main's), so that no other command loads the
// CUDA libraries.
void register_gpu_commands(CLI::App& app, Commands& cmds, char** argv);

}  // namespace threewalls::cli
