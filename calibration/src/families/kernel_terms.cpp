// Family module: kernels whose time is not a function of bytes alone, kernel.*, model
// kernel_terms_v1 (kernel_terms.hpp: the table of kernels, their inputs and terms).
#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

// The terms' factors from the kernel table; parameters overhead_s, then one coefficient per term
// (none when `p` is empty: the fit only needs the factors).
KernelTermsModel kernel_terms_of(const FamilySpec& s, const Params& p) {
  const KernelTermsFamily* k = find_kernel_terms_family(s.name);
  if (!k) throw std::logic_error("family " + s.name + " is not in the kernel_terms table");
  KernelTermsModel m;
  for (const auto& t : k->terms) m.factors.push_back(t.factors);
  if (p.empty()) return m;
  m.overhead_s = scalar(s, p, "overhead_s");
  for (const auto& t : k->terms) m.coefficients_s.push_back(scalar(s, p, t.param));
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  for (const KernelTermsFamily& k : kernel_terms_families()) {
    FamilySpec s;
    s.measured_only = true;
    s.name = k.name;
    s.model = "kernel_terms_v1";
    std::string eq = "t = t0";
    for (const auto& in : k.inputs) s.inputs.push_back({in.key, true, in.description});
    s.params.push_back({"overhead_s", false, false, "t0: fixed time of the launch sequence, seconds"});
    for (const auto& t : k.terms) {
      s.params.push_back({t.param, false, false, t.description + ", seconds"});
      eq += " + " + t.param;
      for (const int i : t.factors) eq += " " + k.inputs[static_cast<std::size_t>(i)].key;
    }
    s.description = k.what + ": " + eq;
    out.push_back(s);
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<KernelTermsModel::Sample> s;
  for (const auto& p : points) s.push_back({p.inputs, p.time.median_s});
  const auto m = KernelTermsModel::fit(kernel_terms_of(spec, {}).factors, s);
  Params out{{m.overhead_s}};
  for (const double c : m.coefficients_s) out.push_back({c});
  return round_all(out);
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return kernel_terms_of(spec, params).time_s(p.inputs);
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  for (const auto& ps : spec.params) {
    if (!(scalar(spec, params, ps.key) >= 0)) return "'" + ps.key + "' must be >= 0";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  models.kernel_terms.insert_or_assign(f.name, kernel_terms_of(f.spec(), f.params));
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  const auto t = cm.fitted_kernel(spec.name, in);
  if (!t) return std::nullopt;
  return t->value;
}

}  // namespace

const FamilyModule& kernel_terms_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

// ---- kernels whose time is not a function of bytes alone (kernel_terms.hpp) ---------------------
//
// The MoE router, permute / unpermute, embedding, cross-entropy and Adam, each as OpRunner launches
// it for its op kind and direction. Token counts are off the powers of two (scenario token counts
// are seq x micro-batch products of powers of two), hidden sizes multiples of 8 off the model
// dimensions, so no validation scenario's shape is measured (a test checks). Grids span decode-sized
// to large-batch token counts: tokens 22..50000 (a decode step routes batch x topk rows, a few dozen,
// where a kernel's fixed latency is all of its time), experts 8..256, topk 1..8, hidden ~1000..7000,
// vocabulary shards ~1000..50000, optimizer shards 1e5..2e8 parameters. OpRunner runs permute and
// unpermute with topk = rows / op.tokens (1 for the StepGraph's ops, which set tokens = rows), so
// topk 1 is the bulk of those grids. One or two held-out points per family.
PointSpec kernel_point(const KernelTermsFamily& k, std::vector<double> inputs, double bytes, bool held_out) {
  PointSpec s;
  s.op = k.op;
  s.family = k.name;
  for (std::size_t i = 0; i < k.inputs.size(); ++i) s.params.push_back({k.inputs[i].key, inputs[i]});
  s.inputs = std::move(inputs);
  s.bytes = bytes;
  s.held_out = held_out;
  return s;
}

void plan_kernels(GridPlan& p) {
  const bool full = p.full();
  auto fam = [](std::string_view name) -> const KernelTermsFamily& {
    const KernelTermsFamily* k = find_kernel_terms_family(name);
    if (!k) throw std::logic_error("kernel_terms family missing: " + std::string(name));
    return *k;
  };
  // Router: {tokens, experts, topk}.
  struct Ek {
    std::int64_t experts, topk;
  };
  const std::vector<std::int64_t> router_tokens = full ? std::vector<std::int64_t>{22, 200, 1000, 3000, 9000, 27000}
                                                       : std::vector<std::int64_t>{22, 300, 3000, 27000};
  const std::vector<Ek> router_ek =
      full ? std::vector<Ek>{{8, 2}, {64, 8}, {128, 1}, {256, 8}} : std::vector<Ek>{{8, 2}, {64, 8}, {256, 4}};
  for (const bool bwd : {false, true}) {
    const auto& k = fam(bwd ? kSoftmaxTopkBwdFamily : kSoftmaxTopkFwdFamily);
    for (const auto t : router_tokens) {
      for (const auto& ek : router_ek) {
        const double bytes = d(t) * d(ek.experts) * 2.0 * (bwd ? 2.0 : 1.0) + d(t) * d(ek.topk) * 8.0;
        p.points.push_back(kernel_point(k, {d(t), d(ek.experts), d(ek.topk)}, bytes, false));
      }
    }
    p.points.push_back(kernel_point(k, {5000.0, 32.0, 4.0}, 5000.0 * 32 * 2 + 5000.0 * 4 * 8, true));
    if (full) p.points.push_back(kernel_point(k, {700.0, 160.0, 6.0}, 700.0 * 160 * 2 + 700.0 * 6 * 8, true));
  }
  // Row gathers: {tokens, topk, hidden}.
  struct Tkh {
    std::int64_t tokens, topk, hidden;
  };
  std::vector<Tkh> rows;
  const std::vector<std::int64_t> row_tokens = full ? std::vector<std::int64_t>{22, 86, 300, 2000, 12000, 50000}
                                                    : std::vector<std::int64_t>{22, 300, 12000, 50000};
  const std::vector<std::int64_t> row_hidden =
      full ? std::vector<std::int64_t>{1000, 2056, 7000} : std::vector<std::int64_t>{1000, 7000};
  for (const auto t : row_tokens) {
    for (const auto h : row_hidden) rows.push_back({t, 1, h});
  }
  rows.push_back({1000, 4, 2056});
  if (full) {
    rows.push_back({1000, 2, 2056});
    rows.push_back({8000, 6, 2056});
    rows.push_back({6000, 8, 1000});
  }
  const std::vector<Tkh> rows_held{{5000, 1, 3000}, {900, 8, 4104}};
  for (std::string_view name : {kPermuteFwdFamily, kPermuteBwdFamily, kUnpermuteFwdFamily, kUnpermuteBwdFamily}) {
    const auto& k = fam(name);
    auto bytes = [&](const Tkh& r) {
      const double gathered = d(r.tokens) * d(r.topk) * d(r.hidden) * 2.0, row = d(r.tokens) * d(r.hidden) * 2.0;
      if (name == kPermuteFwdFamily) return 2.0 * gathered;
      if (name == kUnpermuteBwdFamily) return 2.0 * gathered + row;
      return gathered + row;
    };
    for (const auto& r : rows)
      p.points.push_back(kernel_point(k, {d(r.tokens), d(r.topk), d(r.hidden)}, bytes(r), false));
    for (std::size_t i = 0; i < (full ? rows_held.size() : 1); ++i) {
      const auto& r = rows_held[i];
      p.points.push_back(kernel_point(k, {d(r.tokens), d(r.topk), d(r.hidden)}, bytes(r), true));
    }
  }
  // Embedding: {tokens, hidden}.
  const std::vector<std::int64_t> emb_tokens =
      full ? std::vector<std::int64_t>{300, 2000, 12000, 50000} : std::vector<std::int64_t>{300, 12000, 50000};
  for (const bool bwd : {false, true}) {
    const auto& k = fam(bwd ? kEmbeddingBwdFamily : kEmbeddingFwdFamily);
    const double per = bwd ? 2.0 + 8.0 : 4.0;  // bwd: read dout, read-modify-write fp32 table rows
    for (const auto t : emb_tokens) {
      for (const std::int64_t h : {std::int64_t{1000}, std::int64_t{4104}}) {
        p.points.push_back(kernel_point(k, {d(t), d(h)}, d(t) * d(h) * per, false));
      }
    }
    p.points.push_back(kernel_point(k, {5000.0, 2056.0}, 5000.0 * 2056 * per, true));
  }
  // Cross-entropy: {tokens, shard}; at most 3e8 logits (600 MB of bf16).
  const std::vector<std::int64_t> xent_tokens =
      full ? std::vector<std::int64_t>{300, 2000, 9000} : std::vector<std::int64_t>{300, 9000};
  const std::vector<std::int64_t> xent_shard =
      full ? std::vector<std::int64_t>{1000, 8000, 30000} : std::vector<std::int64_t>{1000, 8000, 30000};
  for (const bool bwd : {false, true}) {
    const auto& k = fam(bwd ? kCrossEntropyBwdFamily : kCrossEntropyFwdFamily);
    for (const auto t : xent_tokens) {
      for (const auto v : xent_shard) {
        p.points.push_back(kernel_point(k, {d(t), d(v)}, d(t) * d(v) * 4.0, false));
      }
    }
    p.points.push_back(kernel_point(k, {5000.0, 12000.0}, 5000.0 * 12000 * 4.0, true));
  }
  // Adam: {parameters}; 30 B per parameter.
  const auto& adam = fam(kAdamStepFamily);
  // The optimizer streams the rank's shard (30 B per parameter) from HBM: beyond 4e6 parameters (120 MB)
  // nothing stays in the 50 MB L2. A grid point inside L2 (1e6 ran 40% faster per parameter on the H100)
  // pulled the fitted per-parameter term 13% below the HBM rate every training step sees; so one tiny
  // point for the launch overhead and the rest well beyond L2, up to a 1.5e9-parameter shard (45 GB).
  const std::vector<double> params =
      full ? std::vector<double>{1.0e5 + 40, 8.0e6 + 40, 4.0e7 + 40, 2.0e8 + 40, 6.0e8 + 40}
           : std::vector<double>{1.0e5 + 40, 8.0e6 + 40, 4.0e7 + 40, 2.0e8 + 40};
  for (const double n : params) p.points.push_back(kernel_point(adam, {n}, 30.0 * n, false));
  p.points.push_back(kernel_point(adam, {3.0e7 + 40}, 30.0 * (3.0e7 + 40), true));
}

void add_ops(std::vector<OpInfo>& out) {
  for (const auto& k : kernel_terms_families()) {
    if (k.points_of == "norm") continue;  // its points are the norm family's (memory module)
    // PyTorch's kernels: points a raw file of the Python benchmark brings (threewalls_refit_raw),
    // never planned by threewalls calibrate.
    const bool python = k.points_of == "python";
    const bool host = k.name.rfind(std::string(kPytorchHostFamilyPrefix), 0) == 0;
    out.push_back({k.op, "", k.name, k.what,
                   host     ? "measured by python3 -m threewalls.bench.pytorch_kernels, not by threewalls calibrate: "
                              "host time per call of the op's body with the device busy (forward with and without "
                              "autograd recording; backward less one empty torch.autograd.grad call)"
                   : python ? "measured by python3 -m threewalls.bench.pytorch_kernels, not by threewalls calibrate: "
                              "device time of one forward or one backward through autograd"
                            : "time of one launch sequence; bytes: the tensors it reads and writes once (reported "
                              "rate only)"});
  }
}

void plan(GridPlan& p, int /*part*/) { plan_kernels(p); }

}  // namespace

const ModuleGrid& kernel_terms_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail
