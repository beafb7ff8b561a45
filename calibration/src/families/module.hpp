#pragma once
// Internal: a calibration family module and the table of them (families.def). A module holds,
// for its families, what lies between the generic Family of the profile file (points and parameter
// arrays) and the typed models of models.hpp: the registry entries (inputs, parameters), the fit,
// the prediction of a point, the parameter checks and the decoding into the CostModel's models.
// The reader (parameter checks), the builder (fits, leave-one-out) and the CostModel (decoding once
// at construction) reach the modules only through the dispatch functions below.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/calibration/grid.hpp"
#include "threewalls/calibration/models.hpp"
#include "threewalls/calibration/profile.hpp"

namespace threewalls::calibration::detail {

// Significant digits fitted parameters are stored with (the stored value is the model).
inline constexpr int kParamDigits = 7;
// Significant digits of the fit-error statistics.
inline constexpr int kErrorDigits = 4;

using Params = std::vector<std::vector<double>>;

// What a fit may need beyond its own points: the hardware and families fitted before it.
struct FitContext {
  const Hardware* hardware = nullptr;
  std::function<const Family*(std::string_view)> find;
};

struct DecodedModels;  // decoded.hpp: the CostModel's typed models

struct FamilyModule {
  // Fit order: 0 for the families other fits read (copy.d2d's bandwidth), 1 for the dense GEMMs
  // (the grouped fits reuse their tile and k_half), 2 for the grouped GEMMs, 3 for the rest.
  int fit_stage = 3;
  // Appends the module's registry entries in file order (their `kind` is set by the table).
  void (*add_specs)(std::vector<FamilySpec>& out) = nullptr;
  // The family's parameters from its points, rounded to kParamDigits. Throws FitImpossible.
  Params (*fit)(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx) = nullptr;
  // The model's prediction of a point's measured value (measured_value).
  double (*predict)(const FamilySpec& spec, const Params& params, const Point& point, const Hardware& hw) = nullptr;
  // The model's own checks of parameters that already have the registry's count, shapes, finiteness
  // and integrality; a description of the first problem.
  std::optional<std::string> (*check)(const FamilySpec& spec, const Params& params) = nullptr;
  // Decodes a checked family into the CostModel's models.
  void (*store)(const Family& family, const Hardware& hw, DecodedModels& models) = nullptr;
  // What a point measures when it is not its median time (nullptr: the median time).
  double (*measured)(const Point& point) = nullptr;
  // The CostModel calls the simulator makes for a point of the family (CostModel::predict_point);
  // nullptr when the simulator costs the family otherwise.
  std::optional<double> (*cost)(const CostModel& cm, const FamilySpec& spec,
                                const std::vector<double>& inputs) = nullptr;
  // Appends the registry entries of the module's older models that profiles still load (same family
  // names and point columns, their own model id and parameters); nullptr: none. The module's
  // predict, check, store and cost take them (by spec.model); fit is only called with the current.
  void (*add_older_specs)(std::vector<FamilySpec>& out) = nullptr;
};

// A module's benchmark grid (threewalls/calibration/grid.hpp): what measures its families and where.
struct ModuleGrid {
  // Appends the module's benchmark ops (their `group` is set by the table: the row's group).
  void (*add_ops)(std::vector<bench::OpInfo>& out) = nullptr;
  // Appends the module's points of grid `part` (0, or the part a row of the measurement order of
  // families.def names, for a module measured at two places of it).
  void (*plan)(bench::GridPlan& plan, int part) = nullptr;
};

// The module and the grid of each row of families.def, in table order (index = ModelKind).
#define THREEWALLS_CALIBRATION_FAMILY(module, group) \
  const FamilyModule& module##_module();             \
  const ModuleGrid& module##_grid();
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY

const FamilyModule& module_of(const FamilySpec& spec);
// Every module's registry entries, row by row (family_specs() is this, built once).
std::vector<FamilySpec> table_specs();
// Every module's older models' entries, row by row (older_family_specs()).
std::vector<FamilySpec> older_table_specs();

// ---- dispatch (what the reader, the builder and the CostModel call) ----

// Fits the family's parameters from its points, rounded to kParamDigits. Throws FitImpossible.
Params fit_params(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx);
// The model's prediction of a point's measured value.
double predict(const FamilySpec& spec, const Params& params, const Point& point, const Hardware& hw);
// Whether the parameters have the shape and ranges the model needs; a description of the first
// problem otherwise (the reader reports it with the file location).
std::optional<std::string> check_params(const FamilySpec& spec, const Params& params);
// The quantity a point measures and predict() predicts: its median time, unless the module says
// otherwise (nccl.memory: bytes).
double measured_value(const FamilySpec& spec, const Point& p);
// Decodes a checked family into `models`.
void store_model(const Family& f, const Hardware& hw, DecodedModels& models);

// ---- what modules share ----

std::int64_t as_int(double v);
// Parameter `key` of `spec` in `p`: a scalar, an array, or the array to fill.
double scalar(const FamilySpec& spec, const Params& p, std::string_view key);
const std::vector<double>& array(const FamilySpec& spec, const Params& p, std::string_view key);
std::vector<double>& array_ref(const FamilySpec& spec, Params& p, std::string_view key);
DeviceConstants device_of(const Hardware& hw, DType dt);
double round_param(double v);
Params round_all(Params p);
std::vector<double> measured_medians(const std::vector<Point>& pts);

// Group sizes and stream counts become ints; anything this large is not a machine.
inline constexpr double kMaxRanks = 1 << 20;
// `v` as an int in [0, kMaxRanks]; FitImpossible naming `what` otherwise.
int small_int(double v, const char* what);
// Entries 2..kMaxRanks, strictly increasing (group sizes, stream counts).
bool increasing_counts(const std::vector<double>& n);

// HBM bandwidth (read + write) the compute models use for their memory-bound limit: twice the
// large-size bandwidth of copy.d2d (a copy of S bytes reads S and writes S) when the profile has
// it, else the datasheet bandwidth.
double memory_bandwidth(const FitContext& ctx);

// Typed models other modules read: the dense GEMM (grouped_gemm reuses its tile and k_half) and
// the linear_v1 families (memory_bandwidth reads copy.d2d).
GemmModel decode_gemm(const Family& f, const Hardware& hw);
LinearModel decode_linear(const Family& f);

// attention_wave_v1 (attention and attention_fused modules): the point columns (batch, seq_q,
// seq_kv, heads, kv_heads, head_dim_qk, head_dim_v, causal), the parameters of the v1 form, the
// shape of a point, and the v1 model of a family (attention adds its optional blocked form,
// attention_fused sets the scheduled form, attention_tiles_v1).
std::vector<InputSpec> attention_inputs();
std::vector<ParamSpec> attention_wave_params();
AttentionShape attention_shape(const std::vector<double>& inputs);
// The parameters every attention form has (tile_q, s_half, overhead_s, memory_bandwidth_bytes_per_s),
// the direction and the bf16 peak; the forms add their efficiency's parameters.
AttentionModel attention_common_of(const FamilySpec& spec, const Params& params, const Hardware& hw);
AttentionModel attention_wave_of(const FamilySpec& spec, const Params& params, const Hardware& hw);
Params attention_wave_params_of(const AttentionModel& m);
// Checks of the parameters every attention form has (tile_q, s_half, overhead_s, the bandwidth).
std::optional<std::string> check_attention_common(const FamilySpec& spec, const Params& params);
std::optional<std::string> check_attention_wave(const FamilySpec& spec, const Params& params);

// linear_v1 (memory and copy modules): t = alpha + bytes / beta, piecewise by size.
FamilySpec linear_spec(std::string name, std::string what, std::string input_description);
Params fit_linear(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& ctx);
double predict_linear(const FamilySpec& spec, const Params& params, const Point& point, const Hardware& hw);
std::optional<std::string> check_linear(const FamilySpec& spec, const Params& params);

}  // namespace threewalls::calibration::detail
