// kernel_terms_v1: t = t0 + sum_j c_j prod_{i in F_j} x_i (kernel_terms.hpp), and the table of its
// families: for each, the inputs and the terms, chosen from what the backend kernel does per unit of
// work (backend/src/router.cu, elementwise.cu).
#include "threewalls/calibration/kernel_terms.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/models.hpp"

namespace threewalls::calibration {

namespace {

std::vector<KernelTermsFamily> build() {
  const std::vector<KernelTermsInput> router_in = {{"tokens", "tokens routed (rows of the router logits)"},
                                                   {"experts", "experts scored per token"},
                                                   {"topk", "experts chosen per token"}};
  const std::vector<KernelTermsInput> rows_in = {
      {"tokens", "tokens (OpRunner: the op's rows / topk)"},
      {"topk", "rows per token (OpRunner: rows / op.tokens when that divides, else 1)"},
      {"hidden", "elements per row"}};
  const std::vector<KernelTermsInput> emb_in = {{"tokens", "tokens looked up"}, {"hidden", "elements per row"}};
  const std::vector<KernelTermsInput> norm_in = {{"rows", "rows normalised"}, {"hidden", "elements per row"}};
  const std::vector<KernelTermsInput> xent_in = {{"tokens", "tokens (rows of the logits)"},
                                                 {"shard", "vocabulary entries of this rank's shard"}};
  // One block per row (or token) walks its row: with fewer rows than the GPU has block slots (a
  // decode step's few dozen) the kernel takes one block's walk, whose length is the row's.
  const KernelTerm row_walk = {
      "per_hidden_s", {2}, "per element of one row: a block's serial walk along its row (the latency of a wave)"};
  std::vector<KernelTermsFamily> f;
  // Router: one warp per token; a fixed 32-lane sweep of up to 1024 experts per pass (softmax, then
  // one pass per chosen expert) and one atomic per choice on the expert counts.
  const std::vector<KernelTerm> router_terms = {
      {"per_token_s", {0}, "per token: the warp's fixed softmax sweeps"},
      {"per_choice_s", {0, 2}, "per (token, chosen expert): one arg-max pass and a count atomic"},
      {"per_score_s", {0, 1}, "per (token, expert): reading a logit (and writing its gradient backward)"}};
  f.push_back({std::string(kSoftmaxTopkFwdFamily), "softmax_topk_fwd",
               "backend::softmax_topk (renormalised), OpRunner's softmax_topk forward", router_in, router_terms});
  f.push_back({std::string(kSoftmaxTopkBwdFamily), "softmax_topk_bwd",
               "backend::softmax_topk_bwd, OpRunner's softmax_topk backward", router_in, router_terms});
  // permute forward: one block per output row (tokens x topk), 16-byte vector copies of a row.
  f.push_back({std::string(kPermuteFwdFamily),
               "permute_fwd",
               "backend::permute_fwd through a row map of build_row_map, OpRunner's permute forward",
               rows_in,
               {{"per_row_s", {0, 1}, "per row copied (one block each)"},
                {"per_element_s", {0, 1, 2}, "per element copied (read + write of 2 B)"},
                row_walk}});
  // gather-sum (permute backward, unpermute forward): one block per token; each thread sums topk
  // gathered elements and writes one.
  const std::vector<KernelTerm> gather_terms = {
      {"per_token_s", {0}, "per token (one block each)"},
      {"per_gathered_element_s", {0, 1, 2}, "per element gathered through the row map (2 B read)"},
      {"per_element_s", {0, 2}, "per element written (2 B)"},
      row_walk};
  f.push_back({std::string(kPermuteBwdFamily), "permute_bwd",
               "backend::permute_bwd (gather-sum through the row map), OpRunner's permute backward", rows_in,
               gather_terms});
  f.push_back({std::string(kUnpermuteFwdFamily), "unpermute_fwd",
               "backend::unpermute_fwd (probability-weighted gather-sum), OpRunner's unpermute forward", rows_in,
               gather_terms});
  // unpermute backward: one block per token; per choice a scaled row write and a block-wide dot.
  f.push_back({std::string(kUnpermuteBwdFamily),
               "unpermute_bwd",
               "backend::unpermute_bwd (rows and router-probability gradients), OpRunner's unpermute backward",
               rows_in,
               {{"per_token_s", {0}, "per token (one block each)"},
                {"per_choice_s", {0, 1}, "per (token, choice): a block reduction of the dot product"},
                {"per_element_s", {0, 1, 2}, "per element of a choice (dy and expert row read, gradient written)"},
                row_walk}});
  const std::vector<KernelTerm> emb_terms = {{"per_token_s", {0}, "per row (one block each)"},
                                             {"per_element_s", {0, 1}, "per element of a row"}};
  f.push_back({std::string(kEmbeddingFwdFamily), "embedding_fwd",
               "backend::embedding_fwd (row gather from a table of OpRunnerConfig::embedding_rows rows)", emb_in,
               emb_terms});
  f.push_back({std::string(kEmbeddingBwdFamily), "embedding_bwd",
               "backend::embedding_bwd (fp32 atomic scatter-add into the table gradient)", emb_in, emb_terms});
  const std::vector<KernelTerm> xent_terms = {{"per_token_s", {0}, "per token (one block per row)"},
                                              {"per_logit_s", {0, 1}, "per logit of the shard"}};
  f.push_back({std::string(kCrossEntropyFwdFamily), "cross_entropy_fwd",
               "backend::xent_max, xent_sum_exp, xent_loss back to back (OpRunner's cross_entropy forward)", xent_in,
               xent_terms});
  f.push_back({std::string(kCrossEntropyBwdFamily), "cross_entropy_bwd",
               "backend::xent_bwd (OpRunner's cross_entropy backward)", xent_in, xent_terms});
  // Norms: one block of 256 threads per row (grid-stride); per row, block-wide reductions (RMSNorm
  // forward one, LayerNorm forward two, the backwards two) and passes over the row (RMSNorm two,
  // LayerNorm three). The points are the `norm` family's (plan_norm), whose bytes-only fits cannot
  // tell 16k short rows from 2k long ones of the same bytes.
  const std::vector<KernelTerm> norm_terms = {
      {"per_row_s", {0}, "per row: the block's reductions and synchronisations"},
      {"per_element_s", {0, 1}, "per element: the passes' memory traffic"},
      {"per_hidden_s", {1}, "per element of one row: a block's serial walk along a row (the latency of a wave)"}};
  f.push_back({std::string(kRmsnormFwdFamily), "norm_rmsnorm_fwd", "backend::rmsnorm_fwd, OpRunner's RMSNorm forward",
               norm_in, norm_terms, "norm"});
  f.push_back({std::string(kRmsnormBwdFamily), "norm_rmsnorm_bwd", "backend::rmsnorm_bwd, OpRunner's RMSNorm backward",
               norm_in, norm_terms, "norm"});
  f.push_back({std::string(kLayernormFwdFamily), "norm_layernorm_fwd",
               "backend::layernorm_fwd, OpRunner's LayerNorm forward", norm_in, norm_terms, "norm"});
  f.push_back({std::string(kLayernormBwdFamily), "norm_layernorm_bwd",
               "backend::layernorm_bwd, OpRunner's LayerNorm backward", norm_in, norm_terms, "norm"});
  f.push_back({std::string(kAdamStepFamily), "adam_step",
               "backend::adam_step (fp32 master, grad, m, v; bf16 weight copy), OpRunner's optimizer op",
               {{"parameters", "parameters of the shard updated"}},
               {{"per_parameter_s", {0}, "per parameter (30 B of traffic)"}}});

  // PyTorch eager's implementations (points_of "python"): each family times what a PyTorch program
  // runs for the op, forward or backward through autograd, between the op's input and output
  // (threewalls.runner.kernels, measured by threewalls.bench.pytorch_kernels). The terms are per unit
  // of the work those kernels do; the several kernels of one op share the fixed term.
  const std::string py = "python";
  auto twin = [&](std::string_view backend, std::string what, std::vector<KernelTermsInput> in,
                  std::vector<KernelTerm> terms) {
    const std::string name = pytorch_twin(backend);
    f.push_back({name, "pytorch_" + name.substr(kPytorchFamilyPrefix.size()), std::move(what), std::move(in),
                 std::move(terms), py});
  };
  const std::vector<KernelTerm> py_router = {
      {"per_token_s", {0}, "per token"},
      {"per_score_s", {0, 1}, "per (token, expert): the fp32 softmax's passes (and its gradient backward)"},
      {"per_choice_s", {0, 2}, "per (token, chosen expert): top-k selection and the gather of its weight"}};
  twin(kSoftmaxTopkFwdFamily, "PyTorch: softmax of the fp32 logits, top-k, gather of the chosen weights, cast",
       router_in, py_router);
  twin(kSoftmaxTopkBwdFamily, "PyTorch autograd: the gather's, softmax's and cast's backward", router_in, py_router);
  // Row gathers by tokens, topk (rows = tokens x topk) and hidden: an index_select forward; its
  // backward an index_add_ into a zeroed [tokens, hidden] gradient (bf16 atomics).
  const std::vector<KernelTermsInput> py_rows_in = {{"tokens", "tokens whose rows are gathered (rows / topk)"},
                                                    {"topk", "rows per token"},
                                                    {"hidden", "elements per row"}};
  const std::vector<KernelTerm> py_row_terms = {
      {"per_row_s", {0, 1}, "per row gathered or scattered"},
      {"per_element_s", {0, 1, 2}, "per element of the rows (read, multiplied, written or atomically added)"},
      {"per_token_element_s", {0, 2}, "per element of the tokens' side (zero fill, the summed output)"}};
  twin(kPermuteFwdFamily, "PyTorch: index_select of the token rows into expert order", py_rows_in, py_row_terms);
  twin(kPermuteBwdFamily, "PyTorch autograd: index_select's backward (zeros, then index_add_ of the rows)", py_rows_in,
       py_row_terms);
  twin(kUnpermuteFwdFamily,
       "PyTorch: rows times their router weights, index_add_ into a zeroed [tokens, hidden] output", py_rows_in,
       py_row_terms);
  twin(kUnpermuteBwdFamily,
       "PyTorch autograd: index_add_'s and the product's backward (row gather, products, weight gradient)", py_rows_in,
       py_row_terms);
  const std::vector<KernelTermsInput> py_emb_in = {
      {"tokens", "tokens looked up"}, {"hidden", "elements per row"}, {"vocab", "rows of this rank's table"}};
  const std::vector<KernelTerm> py_emb_terms = {
      {"per_token_s", {0}, "per token"},
      {"per_element_s", {0, 1}, "per element of a looked-up row"},
      {"per_table_element_s", {1, 2}, "per element of the table (zeroed gradient)"}};
  twin(kEmbeddingFwdFamily, "PyTorch: F.embedding", py_emb_in, py_emb_terms);
  twin(kEmbeddingBwdFamily, "PyTorch autograd: F.embedding's dense backward (sort-based, zeroed table gradient)",
       py_emb_in, py_emb_terms);
  const std::vector<KernelTerm> py_xent_terms = {{"per_token_s", {0}, "per token"},
                                                 {"per_logit_s", {0, 1}, "per logit (fp32 copy, log-softmax passes)"}};
  twin(kCrossEntropyFwdFamily, "PyTorch: F.cross_entropy of the logits cast to fp32", xent_in, py_xent_terms);
  twin(kCrossEntropyBwdFamily, "PyTorch autograd: cross-entropy's, log-softmax's and the cast's backward", xent_in,
       py_xent_terms);
  twin(kRmsnormFwdFamily, "PyTorch: F.rms_norm", norm_in, norm_terms);
  twin(kRmsnormBwdFamily, "PyTorch autograd: F.rms_norm's backward", norm_in, norm_terms);
  twin(kLayernormFwdFamily, "PyTorch: F.layer_norm", norm_in, norm_terms);
  twin(kLayernormBwdFamily, "PyTorch autograd: F.layer_norm's backward", norm_in, norm_terms);
  const std::vector<KernelTermsInput> params_in = {{"parameters", "parameters of the shard"}};
  twin(kAdamStepFamily,
       "PyTorch: gradient clipping's scale, torch.optim.Adam (fused) on fp32 master weights, the bf16 weight copy",
       params_in, {{"per_parameter_s", {0}, "per parameter"}});
  const std::vector<KernelTermsInput> elements_in = {{"elements", "output elements of the op (shape[0])"}};
  const std::vector<KernelTerm> per_element = {{"per_element_s", {0}, "per output element"}};
  auto own = [&](std::string_view name, std::string what, std::vector<KernelTermsInput> in, std::vector<KernelTerm> t) {
    f.push_back({std::string(name), "pytorch_" + std::string(name.substr(kPytorchFamilyPrefix.size())), std::move(what),
                 std::move(in), std::move(t), py});
  };
  own(kPytorchSwigluFwdFamily, "PyTorch: silu of the gate half times the up half (two kernels)", elements_in,
      per_element);
  own(kPytorchSwigluBwdFamily, "PyTorch autograd: the product's, silu's and the slices' backward", elements_in,
      per_element);
  own(kPytorchGeluFwdFamily, "PyTorch: F.gelu", elements_in, per_element);
  own(kPytorchGeluBwdFamily, "PyTorch autograd: F.gelu's backward", elements_in, per_element);
  own(kPytorchAddBwdFamily, "PyTorch autograd: a residual add's backward (the gradient passed to both inputs)",
      elements_in, per_element);
  own(kPytorchGradNormFamily,
      "PyTorch: the squared norm of the fp32 main gradients (sum of g * g per buffer, stacked and summed)", params_in,
      {{"per_parameter_s", {0}, "per parameter"}});
  own(kPytorchAttentionDecodeFamily,
      "PyTorch: a decode step's attention core (the KV cache slices made contiguous, scaled_dot_product_attention "
      "of one query per sequence, heads laid side by side)",
      {{"batch", "sequences (one query each)"},
       {"seq_kv", "keys per sequence (the cache's length)"},
       {"heads", "query heads"},
       {"kv_heads", "key / value heads"},
       {"head_dims", "qk plus v head dimension"}},
      {{"per_kv_element_s", {0, 1, 3, 4}, "per element of the K and V slices (read, copied contiguous, written)"},
       {"per_query_head_element_s", {0, 1, 2, 4}, "per element of K and V as each query head reads it"}});

  // PyTorch eager's host time per op body (kernel_terms.hpp): a twin of every per-layer pytorch.*
  // family above, and the bodies whose device time other families price.
  const std::vector<KernelTermsInput> autograd_in = {
      {"autograd", "1: the forward records autograd nodes (training); 0: it does not (inference); backward: 1"}};
  const std::vector<KernelTerm> fwd_host_terms = {
      {"per_autograd_s", {0}, "recording the body's autograd nodes and saving its tensors"}};
  auto host = [&](std::string name, std::string what) {
    const bool bwd = name.size() > 4 && name.compare(name.size() - 4, 4, "_bwd") == 0;
    std::string op = "pytorch_host_" + name.substr(kPytorchHostFamilyPrefix.size());
    f.push_back({std::move(name), std::move(op),
                 "host time of " + what + (bwd ? " (one node's share of an autograd engine run)" : ""), autograd_in,
                 bwd ? std::vector<KernelTerm>{} : fwd_host_terms, py});
  };
  const std::size_t device_families = f.size();
  for (std::size_t i = 0; i < device_families; ++i) {
    const KernelTermsFamily& k = f[i];
    if (k.points_of != py || k.inputs.front().key == "parameters") continue;  // the optimizer's: per tensor
    host(pytorch_host_twin(k.name), f[i].what);
  }
  host(std::string(kPytorchHostLinearFwdFamily), "PyTorch: F.linear (cuBLASLt's heuristics and launch)");
  host(std::string(kPytorchHostLinearBwdFamily), "PyTorch autograd: F.linear's backward (data and weight gradients)");
  host(std::string(kPytorchHostAttentionFwdFamily),
       "PyTorch: the attention core (q, k, v made contiguous, scaled_dot_product_attention, heads laid side by "
       "side)");
  host(std::string(kPytorchHostAttentionBwdFamily), "PyTorch autograd: the attention core's backward");
  host(std::string(kPytorchHostExpertGatherFwdFamily), "PyTorch: an eager expert loop's index_select of its rows");
  host(std::string(kPytorchHostExpertGatherBwdFamily),
       "PyTorch autograd: the expert rows' index_select backward (zeros, index_add_)");
  host(std::string(kPytorchHostExpertScatterFwdFamily),
       "PyTorch: an eager expert loop's combine (router weights by row and slot, product, index_add_)");
  host(std::string(kPytorchHostExpertScatterBwdFamily),
       "PyTorch autograd: the combine's backward (index_add_'s, the product's, the accumulating index_put_ of the "
       "weights' gradient)");
  host(std::string(kPytorchHostExpertScatterUnweightedFwdFamily),
       "PyTorch: an eager expert loop's combine without router weights (index_add_)");
  host(std::string(kPytorchHostExpertScatterUnweightedBwdFamily),
       "PyTorch autograd: the unweighted combine's backward (index_add_'s: an index_select)");
  return f;
}

}  // namespace

const std::vector<KernelTermsFamily>& kernel_terms_families() {
  static const std::vector<KernelTermsFamily> families = build();
  return families;
}

const KernelTermsFamily* find_kernel_terms_family(std::string_view name) {
  for (const auto& f : kernel_terms_families()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string pytorch_twin(std::string_view backend_family) {
  const std::string_view backend_prefix = "kernel.";
  if (backend_family.substr(0, backend_prefix.size()) != backend_prefix) {
    throw std::logic_error("pytorch_twin: '" + std::string(backend_family) + "' is not a kernel.* family");
  }
  return std::string(kPytorchFamilyPrefix) + std::string(backend_family.substr(backend_prefix.size()));
}

std::string pytorch_host_twin(std::string_view pytorch_family) {
  if (pytorch_family.substr(0, kPytorchFamilyPrefix.size()) != kPytorchFamilyPrefix) {
    throw std::logic_error("pytorch_host_twin: '" + std::string(pytorch_family) + "' is not a pytorch.* family");
  }
  return std::string(kPytorchHostFamilyPrefix) + std::string(pytorch_family.substr(kPytorchFamilyPrefix.size()));
}

const KernelTermsFamily* norm_kernel_terms_family(std::string_view op) {
  for (const auto& f : kernel_terms_families()) {
    if (f.op == op && f.points_of == "norm") return &f;
  }
  return nullptr;
}

std::vector<double> KernelTermsModel::term_values(const std::vector<std::vector<int>>& factors,
                                                  const std::vector<double>& inputs) {
  std::vector<double> v;
  v.reserve(factors.size());
  for (const auto& fj : factors) {
    double x = 1.0;
    for (const int i : fj) {
      if (i < 0 || static_cast<std::size_t>(i) >= inputs.size()) {
        throw FitImpossible("term factor " + std::to_string(i) + " is not an input column (" +
                            std::to_string(inputs.size()) + " inputs)");
      }
      x *= inputs[static_cast<std::size_t>(i)];
    }
    v.push_back(x);
  }
  return v;
}

double KernelTermsModel::time_s(const std::vector<double>& inputs) const {
  const auto x = term_values(factors, inputs);
  double t = overhead_s;
  for (std::size_t j = 0; j < x.size() && j < coefficients_s.size(); ++j) t += coefficients_s[j] * x[j];
  return t;
}

KernelTermsModel KernelTermsModel::fit(const std::vector<std::vector<int>>& factors,
                                       const std::vector<Sample>& samples) {
  const std::size_t cols = factors.size() + 1;
  if (samples.size() < cols) {
    throw FitImpossible("needs at least " + std::to_string(cols) + " points (overhead and " +
                        std::to_string(factors.size()) + " terms), has " + std::to_string(samples.size()));
  }
  // Columns scaled to a largest value of 1 (the terms span 1 to 1e11): the solver sees numbers of
  // one magnitude; coefficients are scaled back.
  std::vector<std::vector<double>> rows;
  std::vector<double> scale(cols, 0.0);
  std::vector<double> y, w;
  for (const auto& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds)) throw FitImpossible("times must be positive seconds");
    std::vector<double> r{1.0};
    for (const double v : term_values(factors, s.inputs)) {
      if (!(v >= 0) || !std::isfinite(v)) throw FitImpossible("inputs must be finite numbers >= 0");
      r.push_back(v);
    }
    for (std::size_t j = 0; j < cols; ++j) scale[j] = std::max(scale[j], r[j]);
    rows.push_back(std::move(r));
    y.push_back(s.seconds);
    w.push_back(1.0 / (s.seconds * s.seconds));
  }
  fit::Design a;
  a.cols = cols;
  for (auto& r : rows) {
    for (std::size_t j = 0; j < cols; ++j) r[j] = scale[j] > 0 ? r[j] / scale[j] : 0.0;
    a.add_row(r);
  }
  std::vector<double> x;
  try {
    x = fit::nonnegative_least_squares(a, y, w);
  } catch (const std::invalid_argument& e) {
    throw FitImpossible(std::string("the points do not determine the terms: ") + e.what());
  }
  KernelTermsModel m;
  m.factors = factors;
  m.overhead_s = scale[0] > 0 ? x[0] / scale[0] : 0.0;
  for (std::size_t j = 1; j < cols; ++j) m.coefficients_s.push_back(scale[j] > 0 ? x[j] / scale[j] : 0.0);
  return m;
}

}  // namespace threewalls::calibration
