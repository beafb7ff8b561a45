#pragma once
// The op vocabulary every layer shares: what bounds an op (Wall), element types, copy kinds,
// collectives, where a collective's traffic flows, how finely a run is recorded, and the GPU kinds
// with their datasheet figures. Each is defined here once; the StepGraph, the calibration models,
// the run records and the benchmarks use these types, and op names, calibration family names and
// record fields derive from the names below. The names are frozen in the file formats (run
// directories, calibration profiles, scenarios): add, never rename.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "threewalls/core/units.hpp"

namespace threewalls {

// What an op is bound by (run_dir.md, `wall`).
enum class Wall : std::uint8_t { compute, memory, communication, host };
inline constexpr int kNumWalls = 4;
inline constexpr std::array<Wall, kNumWalls> kWalls = {Wall::compute, Wall::memory, Wall::communication, Wall::host};

// Element type of a compute op (GEMM inputs; fp32 for optimizer and loss work).
enum class DType : std::uint8_t { bf16, fp8, fp32 };

// Source and destination memory of a copy; disk_read: a file read into pinned host memory.
enum class CopyKind : std::uint8_t { h2d_pinned, h2d_pageable, d2h_pinned, d2h_pageable, d2d, disk_read };
inline constexpr std::array<CopyKind, 6> kCopyKinds = {CopyKind::h2d_pinned, CopyKind::h2d_pageable,
                                                       CopyKind::d2h_pinned, CopyKind::d2h_pageable,
                                                       CopyKind::d2d,        CopyKind::disk_read};

// NCCL operations. send_recv is the point-to-point pair (StepGraph send/recv ops); a StepGraph
// collective op is one of the others.
enum class Collective : std::uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };

// Where a collective's traffic flows: inside one NVLink domain, or across nodes through the NICs.
enum class LinkScope : std::uint8_t { nvlink, network };

// How finely a run is recorded (run.profiler.granularity): one phase record per op, or only the
// ops of the coarse view plus the step records.
enum class Granularity : std::uint8_t { layer, coarse };

// GPU kinds (SXM) the tool models (scenario key cluster.gpu, calibration profiles' gpu_kind).
// B200 (HGX, 8 per NVLink domain) and GB200 (NVL72: 72 per NVLink domain) have no measured profile:
// their defaults are datasheet figures applied to the H200's measured facts (calibration tools).
enum class GpuKind : std::uint8_t { h100, h200, b200, gb200 };
inline constexpr std::array<GpuKind, 4> kGpuKinds = {GpuKind::h100, GpuKind::h200, GpuKind::b200, GpuKind::gb200};

const char* to_string(Wall w);
const char* to_string(DType d);
const char* to_string(CopyKind c);
const char* to_string(Collective c);
const char* to_string(LinkScope s);
const char* to_string(Granularity g);
const char* to_string(GpuKind g);
std::optional<Wall> parse_wall(std::string_view s);
std::optional<GpuKind> parse_gpu_kind(std::string_view s);

// A copy's op name (benchmarks, run records of calibration runs): "copy_h2d_pinned".
std::string copy_op_name(CopyKind c);

// Datasheet figures of one GPU kind (SXM). Measured figures are the calibration profile's, never these.
struct GpuSpec {
  GpuKind kind;
  const char* product;  // the name the driver reports, e.g. "NVIDIA H100 80GB HBM3"
  int sm_count;
  double sm_clock_mhz;  // boost clock
  double memory_clock_mhz;
  Bytes memory;              // HBM capacity as sold (80 GB, 141 GB)
  Bytes usable_memory;       // what the allocator can use: cluster.gpu_memory's default
  FlopsPerSecond peak_bf16;  // dense
  FlopsPerSecond peak_fp8;   // dense
  FlopsPerSecond peak_fp32;
  BytesPerSecond hbm_bandwidth;
  BytesPerSecond nvlink_bandwidth;  // per direction (NVLink4 on Hopper, NVLink5 on Blackwell)
  int nvlink_domain;                // GPUs one NVLink switch fabric joins (an HGX board, an NVL72 rack)
};
const GpuSpec& gpu_spec(GpuKind g);

}  // namespace threewalls
