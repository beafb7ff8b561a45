#pragma once
// From the driver's records to a calibration profile and its report (host-only):
//   * fit points (ok, not held out) go through ProfileBuilder (fits with leave-one-out errors);
//     a family whose points cannot be fitted is dropped with its reason, the others are kept;
//   * held-out points are predicted through CostModel, exactly as the simulator would, and their
//     relative error is reported per family (and written into the family's note in the profile);
//   * families this machine did not measure can be copied from another profile (the shipped
//     synthetic default of the GPU kind); their note then starts with "NOT MEASURED on this machine";
//   * peak figures (large bf16 GEMM, NCCL bus bandwidth at 1 GiB, pinned copies, HBM copy) are set
//     next to the reference facts of the GPU kind (docs/architecture.md, "Reference facts").
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "threewalls/calibration/bench/record.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/jsonl.hpp"

namespace threewalls::calibration::bench {

struct BuildOptions {
  ProfileInfo info;  // source should be "measured"
  Hardware hardware;
  std::string mode;                  // "quick" / "full", for the notes
  // Families not measured here are copied from the first of these that has them (e.g. an earlier
  // calibration of a multi-GPU machine of the same GPU kind, then the kind's default profile). A
  // collective family measured here takes the points of the group sizes larger than this machine's
  // from the first *measured* one of these that has them, and fits them with its own.
  std::vector<Profile> fill_from;
  int gpus_used = 0;                 // GPUs the calibration used (0: unknown)
};

struct FamilyReport {
  std::string name;
  bool measured = true;  // false: copied from one of BuildOptions::fill_from
  std::string why;       // dropped or copied: the reason; measured: the group sizes borrowed, if any
  std::size_t fit_points = 0;
  std::size_t held_out_points = 0;  // usable held-out points predicted
  std::size_t failed_points = 0;    // error or skipped records of the family
  FitQuality quality;
  double held_out_median = std::numeric_limits<double>::quiet_NaN();
  double held_out_max = std::numeric_limits<double>::quiet_NaN();
};

struct PeakFigure {
  std::string what;            // "bf16 GEMM, best grid point"
  std::string unit;            // "TFLOP/s"
  double measured = 0.0;       // in `unit`
  std::string at;              // the point that reached it
  double reference = 0.0;      // best reference fact for the kind, in `unit`; 0 when none
  double reference_low = 0.0;  // the low end where the reference facts give a range ("670-740"); 0 otherwise
  std::string reference_text;  // "670-740 (reference facts, H100)" or "no reference fact for H100"
  [[nodiscard]] double ratio() const { return reference > 0.0 ? measured / reference : 0.0; }
  // "within the range", "within 5%" (of the reference, or of the range's low end), "below 95%" or
  // "above the reference by more than 5%"; empty without a reference.
  [[nodiscard]] std::string verdict() const;
};

struct CalibrationReport {
  Profile profile;
  std::vector<FamilyReport> families;  // measured, then copied, then dropped (measured = false, why set)
  std::vector<PeakFigure> peaks;
  std::size_t records = 0, ok = 0, errors = 0, skipped = 0;
};

// Throws InputError when no family at all can be built.
CalibrationReport build_report(const std::vector<Record>& records, const BuildOptions& options);

// Peak figures alone (also used for the progress output).
std::vector<PeakFigure> peak_figures(const std::vector<Record>& records, const std::string& gpu_kind);

// Why a family is not measured by a calibration on one node (for the copied families' notes).
std::string why_not_measured(const std::string& family, int gpus_used = 0, const std::string& mode = "");

std::string summary_text(const CalibrationReport& report);
OrderedJson summary_json(const CalibrationReport& report);

}  // namespace threewalls::calibration::bench
