#pragma once
// Builds a calibration profile from raw points: a calibration driver (or the default-profile
// generator) adds what it measured, build() fits every family with the models of models.hpp,
// computes fit and leave-one-out errors and returns the Profile. Measured and synthetic profiles
// go through exactly this code.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/units.hpp"

namespace threewalls::calibration {

class ProfileBuilder {
 public:
  ProfileBuilder(ProfileInfo info, Hardware hardware);

  // Adds one point to a family. `inputs` follow FamilySpec::inputs. Throws InputError for an unknown
  // family (with the nearest name), a wrong number of inputs, a non-integer where an integer is
  // needed, a negative input, or a measurement that is not positive with p10 <= median <= p90.
  void add_point(std::string_view family, std::vector<double> inputs, Measurement time);

  // Typed conveniences.
  void add_gemm(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, Measurement time);
  void add_grouped_gemm(DType dt, std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows, std::int64_t n,
                        std::int64_t k, Measurement time);
  void add_attention(const AttentionShape& shape, bool backward, Measurement time);
  void add_elementwise(Bytes bytes, Measurement time);
  void add_norm(Bytes bytes, Measurement time);
  void add_copy(CopyKind dir, Bytes bytes, Measurement time);
  void add_collective(Collective kind, LinkScope scope, int group_size, Bytes bytes, Measurement time);
  // `what`: kernel_launch, framework_op, event_record, stream_sync, gpu_read, graph_launch,
  // graph_node, collective_launch.
  void add_host(std::string_view what, Measurement time);
  void add_concurrency(int streams, double sm_fraction, Seconds serial, Measurement time);

  // Free text saved with the family (where its points come from). The family must exist by build().
  void set_note(std::string_view family, std::string note);

  // Fits every family that has points, in dependency order (copies before the compute models that
  // take their HBM bandwidth, dense GEMM before grouped GEMM), with fit and leave-one-out errors.
  // Throws InputError "family <name>: <why>" when a family cannot be fitted from its points.
  [[nodiscard]] Profile build() const;

  [[nodiscard]] const std::map<std::string, std::vector<Point>>& points() const { return points_; }

 private:
  ProfileInfo info_;
  Hardware hardware_;
  std::map<std::string, std::vector<Point>> points_;
  std::map<std::string, std::string> notes_;
};

// `into` with the families `names` taken from `from` (a calibration of the same GPU kind that
// measured them, e.g. `threewalls calibrate --only attention`): each is refitted from `from`'s points
// with `into`'s hardware and the families its fit reads (FamilySpec::reads: copy.d2d) taken from
// `into`, exactly as a calibration that measured all of them would have fitted it, and replaces or
// joins `into`'s family of that name (its note: `from`'s, naming where it came from). Every other
// family, [profile] and [hardware] stay `into`'s. InputError naming both profiles when the GPU kinds
// differ, a name is unknown or `from` lacks it, or its points cannot be fitted.
[[nodiscard]] Profile merge_families(const Profile& into, const Profile& from, const std::vector<std::string>& names);

}  // namespace threewalls::calibration
