// Family module: memory-bound kernels, elementwise, norm and the per-kernel fits of
// kMemoryKernelFamilies, model linear_v1 (linear.cpp).
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

void add_specs(std::vector<FamilySpec>& out) {
  out.push_back(linear_spec(std::string(kElementwiseFamily), "memory-bound element-wise kernels (bytes read + written)",
                            "bytes read + written"));
  out.push_back(
      linear_spec(std::string(kNormFamily), "normalisation kernels (bytes read + written)", "bytes read + written"));
  for (std::string_view k : kMemoryKernelFamilies) {
    out.push_back(linear_spec(
        std::string(k), "one memory-bound kernel, the calibration benchmark of the same name (bytes read + written)",
        "bytes read + written"));
  }
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  const LinearModel m = decode_linear(f);
  if (f.name == kElementwiseFamily) {
    models.elementwise = m;
  } else if (f.name == kNormFamily) {
    models.norm = m;
  } else {
    models.kernels.insert_or_assign(f.name, m);
  }
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  if (spec.name == kElementwiseFamily) return cm.elementwise(Bytes(in[0])).value;
  if (spec.name == kNormFamily) return cm.norm(Bytes(in[0])).value;
  return cm.memory_kernel(spec.name, Bytes(in[0])).value;
}

}  // namespace

const FamilyModule& memory_module() {
  static const FamilyModule m{0, add_specs, fit_linear, predict_linear, check_linear, store, nullptr, cost};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

void plan_elementwise(GridPlan& p) {
  struct K {
    const char* op;
    double bytes_per_element;  // bytes read + written per output element (StepGraph's definition)
  };
  // add: read a, b, write out (3 x 2 B); swiglu: read gate and up, write y (3 x 2 B); swiglu_bwd:
  // read dy and x [2 per element], write dx [2 per element] (5 x 2 B); copy: read + write (2 x 2 B).
  const std::vector<K> kernels = p.full() ? std::vector<K>{{"elementwise_add", 6},
                                                           {"elementwise_swiglu", 6},
                                                           {"elementwise_swiglu_bwd", 10},
                                                           {"elementwise_copy", 4}}
                                          : std::vector<K>{{"elementwise_add", 6}, {"elementwise_swiglu_bwd", 10}};
  for (const auto& kern : kernels) {
    for (const double target : sizes(64 * kKiB, kGiB, p.full() ? 4.0 : 16.0)) {
      // A multiple of 64 elements plus 40: off the round sizes model dimensions make (a test checks
      // that no validation scenario's exact size is measured).
      const auto e = static_cast<std::int64_t>(target / kern.bytes_per_element) / 64 * 64 + 40;
      PointSpec s;
      s.op = kern.op;
      s.family = "elementwise";
      s.params = {{"elements", d(e)}};
      s.bytes = d(e) * kern.bytes_per_element;
      s.inputs = {s.bytes};
      p.points.push_back(std::move(s));
    }
  }
}

// Norms: rows x hidden, since a norm's time is not a function of bytes alone (one block per row: 16k
// rows of 768 take longer than 2k rows of 6144). Hidden sizes off the model dimensions (multiples of
// 8), from short rows (Switch-like d768) to long ones (d7168); two held-out shapes per kernel between
// the grid's hidden sizes. The points' inputs are bytes (the `norm` family and one bytes fit per
// kernel); their rows and hidden parameters feed the kernel.<norm>_<dir> families (kernel_terms.hpp).
void plan_norm(GridPlan& p) {
  const std::vector<std::int64_t> hidden =
      p.full() ? std::vector<std::int64_t>{712, 1416, 2824, 5640} : std::vector<std::int64_t>{1416, 5640};
  for (const char* norm : {"rmsnorm", "layernorm"}) {
    for (const bool backward : {false, true}) {
      // Forward reads x and writes y (2 x 2 B per element); backward reads x and dy and writes dx
      // (3 x 2 B): the StepGraph's norm bytes.
      const double per_element = backward ? 6.0 : 4.0;
      auto point = [&](std::int64_t h, double target, bool held_out) {
        const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(target / (per_element * d(h))));
        PointSpec s;
        s.op = std::string("norm_") + norm + (backward ? "_bwd" : "_fwd");
        s.family = "norm";
        s.params = {{"rows", d(rows)}, {"hidden", d(h)}};
        s.bytes = per_element * d(rows) * d(h);
        s.inputs = {s.bytes};
        s.held_out = held_out;
        p.points.push_back(std::move(s));
      };
      for (const std::int64_t h : hidden) {
        for (const double target : sizes(72 * kKiB, 1.1 * kGiB, p.full() ? 4.0 : 16.0)) point(h, target, false);
      }
      point(1032, 5.0 * kMiB, true);
      point(4104, 70.0 * kMiB, true);
    }
  }
}

void add_ops(std::vector<OpInfo>& out) {
  out.push_back({"elementwise_add", "", "elementwise", "backend::add (residual add)", "bytes 3 x 2 per element"});
  out.push_back(
      {"elementwise_swiglu", "", "elementwise", "backend::swiglu_fwd (1 row of e)", "bytes 3 x 2 per output element"});
  out.push_back({"elementwise_swiglu_bwd", "", "elementwise", "backend::swiglu_bwd (1 row of e)",
                 "bytes 5 x 2 per output element"});
  out.push_back({"elementwise_copy", "", "elementwise", "backend::copy_d2d of e bf16 elements (KV-cache append)",
                 "bytes 2 x 2 per element"});
  out.push_back({"norm_rmsnorm_fwd", "", "norm", "backend::rmsnorm_fwd", "bytes 2 x 2 x rows x hidden"});
  out.push_back({"norm_rmsnorm_bwd", "", "norm", "backend::rmsnorm_bwd", "bytes 3 x 2 x rows x hidden"});
  out.push_back({"norm_layernorm_fwd", "", "norm", "backend::layernorm_fwd", "bytes 2 x 2 x rows x hidden"});
  out.push_back({"norm_layernorm_bwd", "", "norm", "backend::layernorm_bwd", "bytes 3 x 2 x rows x hidden"});
}

void plan(GridPlan& p, int /*part*/) {
  plan_elementwise(p);
  plan_norm(p);
}

}  // namespace

const ModuleGrid& memory_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
