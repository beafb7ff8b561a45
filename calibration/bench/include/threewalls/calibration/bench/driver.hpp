#pragma once
// The one driver of the calibration: walks a plan (plan.hpp) section by section under a time
// budget (budget.hpp), asks a PointRunner to measure each point under the stop rule
// (stop_rule.hpp), and turns every outcome into a Record (record.hpp): a point that throws becomes
// an error record and the sweep goes on; a point the budget cannot afford becomes a skipped record.
// Host-only: the GPU runner (gpu_runner.hpp) and the tests' fakes implement PointRunner.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "threewalls/calibration/bench/budget.hpp"
#include "threewalls/calibration/bench/plan.hpp"
#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/bench/stop_rule.hpp"

namespace threewalls::calibration::bench {

// Seconds since some fixed start (steady). Tests pass a fake.
using Clock = std::function<double()>;
Clock steady_clock();

class PointRunner {
 public:
  virtual ~PointRunner() = default;
  PointRunner() = default;
  PointRunner(const PointRunner&) = delete;
  PointRunner& operator=(const PointRunner&) = delete;

  // Prepares a section (op group): buffers, communicators. Throwing fails every point of the
  // section (error records naming the cause); the driver goes on with the next section.
  virtual void begin_section(const std::string& section, const std::vector<PointSpec>& points) = 0;
  virtual void end_section(const std::string& section) = 0;
  // Measures `r.point` under `rule`: fills samples_s, reps, stop, rel_ci and check (and may
  // complete r.point.inputs). Throws on failure, including a failed correctness check.
  virtual void measure(const StopRule& rule, Record& r) = 0;
};

// Takes samples from `one_sample` (seconds per run) until the stop rule says stop.
struct Sampling {
  std::vector<double> samples;
  StopReason reason = StopReason::keep_going;
  double rel_ci = 0.0;
};
Sampling sample_until(const StopRule& rule, const Clock& clock, const std::function<double()>& one_sample);

// Called after each point (for progress lines).
using Progress = std::function<void(const Record& r, std::size_t index, std::size_t total)>;

// The sections of a plan in order, with their point counts and shares of the budget (budget.hpp):
// collectives weigh most, then GEMMs and attention.
std::vector<Budget::Section> sections_of(const std::vector<PointSpec>& plan);
// Seconds of measurement a calibration may use: full 270 s, quick 75 s (the rest of the 5-minute /
// 90-second targets is left for start-up, fitting and writing).
double default_budget_s(Mode mode);
// The stop rule's sample counts and noise target per mode (the time bound comes from the budget).
StopRule default_stop_rule(Mode mode);
// Per-point time bounds (min, max) per mode.
std::pair<double, double> point_bounds(Mode mode);

std::vector<Record> run_points(const std::vector<PointSpec>& plan, PointRunner& runner, Budget& budget,
                               const StopRule& rule, const Clock& clock, const Progress& progress = {});

}  // namespace threewalls::calibration::bench
