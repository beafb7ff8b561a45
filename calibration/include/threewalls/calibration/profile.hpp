#pragma once
#include <array>
// A calibration profile: the machine it describes, and per model family the raw points measured,
// the fitted parameters and the fit's errors. Format: docs/formats/calibration_profile.md
// ([profile] format = "threewalls.calibration_profile", format_version = "1.0").
//
// A Profile is a value: load() reads and checks a file, save() writes it back byte for byte the way
// to_toml() formats it (load -> save of a saved file reproduces it exactly), id() names it for
// output headers. Profiles are built by ProfileBuilder (profile_builder.hpp), which runs the fits;
// the CostModel (cost_model.hpp) evaluates them.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/calibration/cost_model.hpp"

namespace threewalls::calibration {

// ---- what a family is ------------------------------------------------------------------------

// The model family modules, one per row of families.def (in table order): what a family's
// registry entry, fit, prediction, checks and decoding belong to (calibration/src/families/).
enum class ModelKind : std::uint8_t {
#define THREEWALLS_CALIBRATION_FAMILY(module, group) module,
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY
};
inline constexpr std::size_t kModelKinds = 0
#define THREEWALLS_CALIBRATION_FAMILY(module, group) +1
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY
    ;

// One input column of a family's points (all numbers; `integer` ones are written without a point).
struct InputSpec {
  std::string key;
  bool integer = true;
  std::string description;
};

// One fitted parameter: a number, or an array of numbers (per segment, per group size, ...).
struct ParamSpec {
  std::string key;
  bool integer = false;
  bool array = false;
  std::string description;
  // Optional arrays: a file without the key reads as an empty array, and an empty one is not
  // written; the model then takes its form without that part.
  bool optional = false;
};

// The registry entry of a model family: its name (the TOML table path, "gemm.bf16"), the model
// equation it is fitted with (frozen id, "gemm_roofline_v2"), the columns of its points and its
// parameters. The registry drives the reader, the writer and the docs.
struct FamilySpec {
  std::string name;
  std::string model;
  ModelKind kind = ModelKind::host;  // set by the family table
  std::vector<InputSpec> inputs;
  std::vector<ParamSpec> params;
  std::string description;
  // Fit order (set by the family table from the module): 0 for what other fits read (copies and
  // memory-bound kernels), 1 dense GEMMs, 2 grouped GEMMs, 3 the rest. ProfileBuilder fits in this
  // order; `reads` names the families whose fitted parameters the fit uses when present.
  int fit_stage = 3;
  std::vector<std::string> reads;
  // Only a measurement gives it (no synthetic default): a profile without it is complete, and the
  // simulator charges what the family's module says in its place.
  bool measured_only = false;
  // Set where meaningful for the kind.
  DType dtype = DType::bf16;
  bool backward = false;
  Collective collective = Collective::all_reduce;
  LinkScope scope = LinkScope::nvlink;
};

// Every family this threewalls knows, in the canonical (file) order, each with the model it fits.
const std::vector<FamilySpec>& family_specs();
const FamilySpec* find_family_spec(std::string_view name);
// The registry entry of family `name` with model id `model`: the one of family_specs(), or an older
// model of the family that profiles written before it still load (read, checked, simulated; a
// calibration fits and writes the current one). Empty `model`: the current one.
const FamilySpec* find_family_spec(std::string_view name, std::string_view model);
// The older models' entries (see find_family_spec), in table order.
const std::vector<FamilySpec>& older_family_specs();

// Family names.
std::string gemm_family(DType dt);                                // "gemm.bf16"
std::string grouped_gemm_family(DType dt);                        // "grouped_gemm.bf16"
std::string attention_family(bool backward);                      // "attention.fwd" / "attention.bwd"
// Fused (flash-style, through cuDNN) attention and the split-KV decode attention; optional families:
// a profile without them costs those kernels from attention.fwd / attention.bwd, with a warning.
std::string attention_fused_family(bool backward);  // "attention_fused.fwd" / ".bwd"
inline constexpr std::string_view kAttentionDecodeFamily = "attention_decode";
std::string copy_family(CopyKind dir);                            // "copy.h2d_pinned"
std::string collective_family(Collective kind, LinkScope scope);  // "collective.all_reduce.nvlink"
inline constexpr std::string_view kElementwiseFamily = "elementwise";
inline constexpr std::string_view kNormFamily = "norm";
// Per-kernel fits of memory-bound kernels, named after the calibration benchmark that measures them
// (its raw `op`); their points are the pooled family's points of that op.
inline constexpr std::array<std::string_view, 8> kMemoryKernelFamilies = {
    "elementwise_add",  "elementwise_copy", "elementwise_swiglu",  "elementwise_swiglu_bwd",
    "norm_rmsnorm_fwd", "norm_rmsnorm_bwd", "norm_layernorm_fwd", "norm_layernorm_bwd"};
[[nodiscard]] inline bool is_memory_kernel_family(std::string_view name) {
  for (std::string_view k : kMemoryKernelFamilies) {
    if (k == name) return true;
  }
  return false;
}
inline constexpr std::string_view kConcurrencyFamily = "concurrency";
// Optional families (a profile without them: no slowdown of compute beside NCCL kernels, and the
// memory model's fixed NCCL constants).
inline constexpr std::string_view kNcclInterferenceFamily = "nccl.interference";
inline constexpr std::string_view kNcclMemoryFamily = "nccl.memory";
// Expert dispatch and combine over RDMA with NVLink forwarding (DeepEP); optional.
inline constexpr std::string_view kExpertDispatchFamily = "dispatch.flex.network";
// Optional: per-process device memory (a profile without it: the memory model's fixed constants for
// the CUDA context and the libraries' handles and workspaces).
inline constexpr std::string_view kDeviceMemoryFamily = "device.memory";
// Shape-aware library-call host costs (optional; the simulator prefers them to the median families
// host.gemm_launch and host.grouped_gemm_launch).
inline constexpr std::string_view kGemmCallFamily = "host.gemm_call";
inline constexpr std::string_view kGroupedCallFamily = "host.grouped_gemm_call";
// Host time per launch when launches rotate over N streams (optional; absent: no extra).
inline constexpr std::string_view kStreamCycleFamily = "host.stream_cycle";
inline constexpr std::string_view kFrameworkStreamFamily = "host.framework_stream_op";
// Host families: "host.kernel_launch", "host.framework_op", "host.event_record", "host.stream_sync",
// "host.gpu_read", "host.graph_launch", "host.graph_node", "host.collective_launch".
std::string host_family(std::string_view what);

// GPU kinds that have a shipped profile (core's kGpuKinds): "h100", "h200" measured and synthetic;
// "b200", "gb200" synthetic only.
const std::vector<std::string>& known_gpu_kinds();

// ---- contents --------------------------------------------------------------------------------

// The timing of one point: median and 10th/90th percentiles over `count` runs, and optionally the
// raw samples themselves. A single reported number is median = p10 = p90, count = 1.
struct Measurement {
  double median_s = 0.0;
  double p10_s = 0.0;
  double p90_s = 0.0;
  std::int64_t count = 0;
  std::vector<double> samples_s;  // empty, or exactly `count` raw samples

  static Measurement from_samples(std::vector<double> samples_s);
  static Measurement single(double seconds);
  friend bool operator==(const Measurement&, const Measurement&) = default;
};

struct Point {
  std::vector<double> inputs;  // in the order of FamilySpec::inputs
  Measurement time;
  friend bool operator==(const Point&, const Point&) = default;
};

// Fit errors over the family's points: |predicted - median| / median. Leave-one-out refits without
// each point in turn and predicts it; loo_points says for how many points that was possible (NaN
// statistics when none, e.g. a family with a single point).
struct FitQuality {
  double rel_err_median = std::numeric_limits<double>::quiet_NaN();
  double rel_err_max = std::numeric_limits<double>::quiet_NaN();
  double loo_rel_err_median = std::numeric_limits<double>::quiet_NaN();
  double loo_rel_err_max = std::numeric_limits<double>::quiet_NaN();
  std::int64_t loo_points = 0;
};

struct Family {
  std::string name;  // a FamilySpec name
  // The model id the family was read with when it is an older model of the family
  // (older_family_specs()); empty: the registry's current model.
  std::string model;
  std::string note;  // where the points come from, caveats (free text, may be empty)
  std::vector<Point> points;
  std::vector<std::vector<double>> params;  // in the order of FamilySpec::params; scalars have one value
  FitQuality quality;

  [[nodiscard]] const FamilySpec& spec() const;            // of `model`; throws std::logic_error for an unknown name
  [[nodiscard]] double param(std::string_view key) const;  // a scalar parameter
  [[nodiscard]] const std::vector<double>& param_array(std::string_view key) const;  // an array parameter
};

// [profile]: identity of the file. `source` is "measured" or "synthetic: <where the numbers come from>".
struct ProfileInfo {
  std::string name;  // e.g. "default_h200", "h200"
  std::string source;
  std::string generator;  // what wrote it (a tool and version, or the generator program)
};

// [hardware]: the machine the points describe.
struct Hardware {
  std::string gpu_name;
  std::string gpu_kind;  // one of known_gpu_kinds()
  int sm_count = 0;
  double sm_clock_mhz = 0.0;
  double memory_clock_mhz = 0.0;
  std::int64_t memory_bytes = 0;
  std::string driver_version;
  std::string cuda_version;
  std::string nccl_version;
  int gpus_seen = 0;
  std::vector<std::string> links_seen;  // e.g. "NVLink NV18"
  std::string machine;                  // free text: host, CPU, NICs
  std::string date;                     // when the points were measured (ISO 8601 date or month)
  double peak_bf16_flop_per_s = 0.0;    // datasheet dense peaks
  double peak_fp8_flop_per_s = 0.0;
  double peak_fp32_flop_per_s = 0.0;
  double hbm_bandwidth_datasheet_bytes_per_s = 0.0;

  [[nodiscard]] double peak_flop_per_s(DType dt) const;
};

class Profile {
 public:
  Profile() = default;
  // Families are kept in the canonical order of family_specs(); duplicate names are a logic error.
  Profile(ProfileInfo info, Hardware hardware, std::vector<Family> families);

  // Reads and checks a profile. Throws InputError naming file:line:col, the key and what is allowed:
  // malformed TOML, a format name or major version it does not know, unknown keys (with the nearest
  // known key), missing keys, wrong types, inconsistent points.
  static Profile load(const std::filesystem::path& path);
  static Profile parse(std::string_view toml_text, const std::string& file);

  // Writes to_toml() atomically (temporary file, then rename). Throws SystemError on I/O failure.
  void save(const std::filesystem::path& path) const;
  // The canonical text of the profile: fixed layout, numbers in shortest round-trip form.
  [[nodiscard]] std::string to_toml() const;

  // "<name>@<16 hex digits>": the name and an FNV-1a 64 hash of to_toml(), for run headers.
  [[nodiscard]] std::string id() const;

  [[nodiscard]] const ProfileInfo& info() const { return info_; }
  [[nodiscard]] const Hardware& hardware() const { return hardware_; }
  [[nodiscard]] const std::vector<Family>& families() const { return families_; }
  [[nodiscard]] const Family* find(std::string_view family) const;
  // Throws InputError naming the profile, the missing family and the families it has.
  [[nodiscard]] const Family& family(std::string_view family) const;
  // The file it was loaded from; empty for a profile built in memory.
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] bool measured() const { return info_.source == "measured"; }
  // "profile <id> (<path>)" for error messages.
  [[nodiscard]] std::string describe() const;

 private:
  ProfileInfo info_;
  Hardware hardware_;
  std::vector<Family> families_;
  std::string path_;
};

}  // namespace threewalls::calibration
