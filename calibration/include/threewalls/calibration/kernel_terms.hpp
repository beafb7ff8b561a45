#pragma once
// Per-kernel fits of the kernels whose time is not a function of bytes alone ("kernel_terms_v1"):
// the MoE router (softmax + top-k), permute / unpermute (row gathers through an index map),
// embedding, vocab-parallel cross-entropy, the Adam step, and RMSNorm / LayerNorm by rows and hidden.
// Each family is one backend launch sequence of OpRunner (backend/src/op_runner.cpp) for one op kind
// and direction, measured by the calibrate group "kernels" (calibration/bench/src/plan.cpp,
// plan_kernels); the norms' points are those of the group "memory" (plan_norm, `points_of`).
//
//   t = t0 + sum_j c_j * prod_{i in F_j} x_i
//
// x = the family's inputs (shape dimensions), F_j the input columns multiplied into term j (for
// example tokens x experts for the router's score reads). The terms follow the kernels' work: one
// warp per token for the router, one block per row for permute, one block per token for the
// gathers, per-element traffic for the rest (the table in kernel_terms.cpp states each).
// Fit: non-negative weighted least squares on (t0, c_1..c_J) with weights 1/t^2 (relative error),
// the same solver the linear families use. Pure functions of the parameters: no I/O, no Eigen here.
#include <string>
#include <string_view>
#include <vector>

namespace threewalls::calibration {

struct KernelTerm {
  std::string param;         // parameter key in the profile ("per_token_s")
  std::vector<int> factors;  // input columns multiplied together (empty: never; a constant is t0)
  std::string description;
};

struct KernelTermsInput {
  std::string key;
  std::string description;
};

struct KernelTermsFamily {
  std::string name;   // profile family ("kernel.permute_fwd")
  std::string op;     // calibrate benchmark op that measures it ("permute_fwd")
  std::string what;   // the launch sequence measured
  std::vector<KernelTermsInput> inputs;
  std::vector<KernelTerm> terms;
  // Empty: measured by its own points in the calibrate group "kernels". "norm": fits the points of the
  // `norm` family's op `op` (plan_norm), with inputs from their parameters. "python": measured by the
  // Python package's benchmark of PyTorch's kernels (python3 -m threewalls.bench.pytorch_kernels, op
  // `op`), not by threewalls calibrate.
  std::string points_of = {};
};

// Every kernel_terms family, in file order.
const std::vector<KernelTermsFamily>& kernel_terms_families();
const KernelTermsFamily* find_kernel_terms_family(std::string_view name);

// Family names (what the simulator asks the CostModel for).
inline constexpr std::string_view kSoftmaxTopkFwdFamily = "kernel.softmax_topk_fwd";
inline constexpr std::string_view kSoftmaxTopkBwdFamily = "kernel.softmax_topk_bwd";
inline constexpr std::string_view kPermuteFwdFamily = "kernel.permute_fwd";
inline constexpr std::string_view kPermuteBwdFamily = "kernel.permute_bwd";
inline constexpr std::string_view kUnpermuteFwdFamily = "kernel.unpermute_fwd";
inline constexpr std::string_view kUnpermuteBwdFamily = "kernel.unpermute_bwd";
inline constexpr std::string_view kEmbeddingFwdFamily = "kernel.embedding_fwd";
inline constexpr std::string_view kEmbeddingBwdFamily = "kernel.embedding_bwd";
inline constexpr std::string_view kCrossEntropyFwdFamily = "kernel.cross_entropy_fwd";
inline constexpr std::string_view kCrossEntropyBwdFamily = "kernel.cross_entropy_bwd";
inline constexpr std::string_view kAdamStepFamily = "kernel.adam_step";
// Norms by rows and hidden (their points are the `norm` family's: calibrate op norm_<kind>_<dir>).
inline constexpr std::string_view kRmsnormFwdFamily = "kernel.rmsnorm_fwd";
inline constexpr std::string_view kRmsnormBwdFamily = "kernel.rmsnorm_bwd";
inline constexpr std::string_view kLayernormFwdFamily = "kernel.layernorm_fwd";
inline constexpr std::string_view kLayernormBwdFamily = "kernel.layernorm_bwd";
// PyTorch eager's implementation of the same ops (points_of "python"), as a PyTorch program runs them
// (python/threewalls/runner, the op bodies in threewalls.runner.kernels): what the simulator prices
// for run.framework = "pytorch_eager" where the profile has them (docs/simulator.md, "Framework
// kernels"). The element-wise activations and the gradient norm have no kernel_terms family of the
// backend's (it prices them by bytes); PyTorch's run as several kernels each.
inline constexpr std::string_view kPytorchFamilyPrefix = "pytorch.";
inline constexpr std::string_view kPytorchSwigluFwdFamily = "pytorch.swiglu_fwd";
inline constexpr std::string_view kPytorchSwigluBwdFamily = "pytorch.swiglu_bwd";
inline constexpr std::string_view kPytorchGeluFwdFamily = "pytorch.gelu_fwd";
inline constexpr std::string_view kPytorchGeluBwdFamily = "pytorch.gelu_bwd";
inline constexpr std::string_view kPytorchAddBwdFamily = "pytorch.add_bwd";
inline constexpr std::string_view kPytorchGradNormFamily = "pytorch.grad_norm";
// A decode step's attention core in PyTorch (one query per sequence over its KV cache): the cache
// slices made contiguous and the scaled_dot_product_attention kernel PyTorch picks.
inline constexpr std::string_view kPytorchAttentionDecodeFamily = "pytorch.attention_decode";
// The PyTorch twin of a backend kernel_terms family ("kernel.permute_fwd" -> "pytorch.permute_fwd").
std::string pytorch_twin(std::string_view backend_family);

// PyTorch eager's host time per op body (points_of "python"): what the host spends issuing one op's
// body, its Python, dispatcher and kernel launches, with the device busy (threewalls.bench.
// pytorch_kernels). A forward family has input `autograd` (1 when the forward records autograd
// nodes, a training step's; 0 for an inference step's) and term per_autograd_s; a backward family
// is the node's share of one autograd engine run (the measured torch.autograd.grad call less that
// of a graph without work). Each per-layer pytorch.* family has one ("pytorch.permute_fwd" ->
// "pytorch_host.permute_fwd"); the ops priced by other families have their own below.
inline constexpr std::string_view kPytorchHostFamilyPrefix = "pytorch_host.";
inline constexpr std::string_view kPytorchHostLinearFwdFamily = "pytorch_host.linear_fwd";
inline constexpr std::string_view kPytorchHostLinearBwdFamily = "pytorch_host.linear_bwd";
inline constexpr std::string_view kPytorchHostAttentionFwdFamily = "pytorch_host.attention_fwd";
inline constexpr std::string_view kPytorchHostAttentionBwdFamily = "pytorch_host.attention_bwd";
inline constexpr std::string_view kPytorchHostExpertGatherFwdFamily = "pytorch_host.expert_gather_fwd";
inline constexpr std::string_view kPytorchHostExpertGatherBwdFamily = "pytorch_host.expert_gather_bwd";
inline constexpr std::string_view kPytorchHostExpertScatterFwdFamily = "pytorch_host.expert_scatter_fwd";
inline constexpr std::string_view kPytorchHostExpertScatterBwdFamily = "pytorch_host.expert_scatter_bwd";
// The same loop's scatter without router weights (one index_add_; its backward one index_select): the
// loop over the rows an EP rank received, whose weights moe_unpermute applies after the combine. A
// profile without these prices such a scatter with the weighted families above, and sim warns.
inline constexpr std::string_view kPytorchHostExpertScatterUnweightedFwdFamily =
    "pytorch_host.expert_scatter_unweighted_fwd";
inline constexpr std::string_view kPytorchHostExpertScatterUnweightedBwdFamily =
    "pytorch_host.expert_scatter_unweighted_bwd";
// The host family of a pytorch.* family ("pytorch.permute_fwd" -> "pytorch_host.permute_fwd"); the
// table has one for every per-layer op (not the optimizer's: a host loop per tensor).
std::string pytorch_host_twin(std::string_view pytorch_family);

// The kernel_terms family whose points are those of the `norm` family's calibrate op `op`
// ("norm_rmsnorm_fwd" -> kRmsnormFwdFamily); nullptr for any other op.
const KernelTermsFamily* norm_kernel_terms_family(std::string_view op);

struct KernelTermsModel {
  double overhead_s = 0.0;                 // t0
  std::vector<double> coefficients_s;      // c_j, seconds per unit of term j
  std::vector<std::vector<int>> factors;   // F_j

  // The term values of one point (prod of its factor inputs).
  [[nodiscard]] static std::vector<double> term_values(const std::vector<std::vector<int>>& factors,
                                                       const std::vector<double>& inputs);
  [[nodiscard]] double time_s(const std::vector<double>& inputs) const;

  struct Sample {
    std::vector<double> inputs;
    double seconds;
  };
  // Throws FitImpossible (models.hpp) for fewer points than parameters, a non-positive time or an
  // input index outside the inputs.
  static KernelTermsModel fit(const std::vector<std::vector<int>>& factors, const std::vector<Sample>& samples);
};

}  // namespace threewalls::calibration
