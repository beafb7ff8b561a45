#pragma once
// The calibrate group "kernels" (plan.cpp, plan_kernels): the MoE router, permute / unpermute,
// embedding, cross-entropy and Adam launch sequences of OpRunner (backend/src/op_runner.cpp), each on
// buffers of its point's shape, timed back to back and checked against a CPU reference.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "gpu_internal.hpp"

namespace threewalls::calibration::bench::detail {

// Whether `op` is a benchmark op of the group (an op of kernel_terms_families()).
bool is_kernel_op(std::string_view op);

// Measures one point of the group: allocates its buffers, fills them with seeded random data, runs
// the launch sequence OpRunner runs for the op (the routing of permute / unpermute built as
// OpRunner::routing builds it), times it with measure_device and checks the output. Fills the
// record's samples, reps, stop, rel_ci and check.
void measure_kernel_point(const StopRule& rule, const Clock& clock, Timer& timer, cudaStream_t stream,
                          std::uint64_t seed, Record& r);

}  // namespace threewalls::calibration::bench::detail
