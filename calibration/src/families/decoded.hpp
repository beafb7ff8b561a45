#pragma once
// Internal: the typed models the CostModel evaluates, decoded once from a profile by each family
// module's `store` (module.hpp). A slot is empty when the profile lacks the family; the CostModel
// says so at the call that needs it (or takes the documented fallback of an optional family).
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/models.hpp"

namespace threewalls::calibration::detail {

// The host costs of the median_v1 families host.<name> (names and meaning: families/host.cpp).
enum class HostCost : std::uint8_t {
  kernel_launch,
  framework_op,
  event_record,
  stream_sync,
  gpu_read,
  graph_launch,
  graph_node,
  collective_launch,
  timing_marker,
  gemm_launch,
  grouped_gemm_launch,
  attention_launch,
  attention_bwd_launch,
  op_dispatch,
  record_op,
  stream_wait,
  framework_backward_op,
  framework_sync,
  framework_attention_plan,
  framework_autograd_op,
  framework_record_op,
};
inline constexpr std::size_t kHostCosts = static_cast<std::size_t>(HostCost::framework_record_op) + 1;
// "kernel_launch" for HostCost::kernel_launch: the family is host.<name>.
std::string_view host_cost_name(HostCost c);

struct DecodedModels {
  std::array<std::optional<GemmModel>, 3> gemm;            // by DType
  std::array<std::optional<GroupedGemmModel>, 3> grouped;  // by DType
  std::array<std::optional<AttentionModel>, 2> attention;  // forward, backward
  std::array<std::optional<AttentionModel>, 2> attention_fused;  // optional: forward, backward
  std::optional<DecodeAttentionModel> attention_decode;          // optional
  std::optional<LinearModel> elementwise;
  std::optional<LinearModel> norm;
  std::map<std::string, LinearModel, std::less<>> kernels;                  // per-kernel memory-bound fits (optional)
  std::map<std::string, KernelTermsModel, std::less<>> kernel_terms;        // per-kernel shape fits (optional)
  std::array<std::optional<LinearModel>, 6> copy;                           // by CopyKind
  std::array<std::array<std::optional<CollectiveModel>, 2>, 6> collective;  // by Collective, LinkScope
  std::array<std::optional<ConstantModel>, kHostCosts> host;                // by HostCost
  std::optional<ConcurrencyModel> concurrency;
  std::optional<NcclInterferenceModel> nccl_interference;  // optional family (absent: no slowdown)
  std::optional<NcclMemoryModel> nccl_memory;              // optional family (absent: sim constants)
  std::optional<DeviceMemoryModel> device_memory;          // optional family (absent: sim constants)
  std::optional<ExpertDispatchModel> expert_dispatch;      // optional family (absent: the NCCL curve)
  std::optional<GemmCallModel> gemm_call;                  // optional: host.gemm_call
  std::optional<GroupedCallModel> grouped_call;            // optional: host.grouped_gemm_call
  std::optional<StreamCycleModel> stream_cycle;            // optional: host.stream_cycle
  std::optional<StreamCycleModel> framework_stream;        // optional: host.framework_stream_op
};

template <class E>
std::size_t idx(E e) {
  return static_cast<std::size_t>(e);
}

}  // namespace threewalls::calibration::detail
