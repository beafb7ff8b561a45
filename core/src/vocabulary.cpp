#include "threewalls/core/vocabulary.hpp"

namespace threewalls {

const char* to_string(Wall w) {
  switch (w) {
    case Wall::compute: return "compute";
    case Wall::memory: return "memory";
    case Wall::communication: return "communication";
    case Wall::host: return "host";
  }
  return "?";
}

const char* to_string(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::fp8: return "fp8";
    case DType::fp32: return "fp32";
  }
  return "?";
}

const char* to_string(CopyKind c) {
  switch (c) {
    case CopyKind::h2d_pinned: return "h2d_pinned";
    case CopyKind::h2d_pageable: return "h2d_pageable";
    case CopyKind::d2h_pinned: return "d2h_pinned";
    case CopyKind::d2h_pageable: return "d2h_pageable";
    case CopyKind::d2d: return "d2d";
    case CopyKind::disk_read: return "disk_read";
  }
  return "?";
}

const char* to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_to_all: return "all_to_all";
    case Collective::broadcast: return "broadcast";
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}

const char* to_string(LinkScope s) {
  switch (s) {
    case LinkScope::nvlink: return "nvlink";
    case LinkScope::network: return "network";
  }
  return "?";
}

const char* to_string(Granularity g) {
  switch (g) {
    case Granularity::layer: return "layer";
    case Granularity::coarse: return "coarse";
  }
  return "?";
}

const char* to_string(GpuKind g) {
  switch (g) {
    case GpuKind::h100: return "h100";
    case GpuKind::h200: return "h200";
  }
  return "?";
}

std::optional<Wall> parse_wall(std::string_view s) {
  for (Wall w : kWalls) {
    if (s == to_string(w)) return w;
  }
  return std::nullopt;
}

std::optional<GpuKind> parse_gpu_kind(std::string_view s) {
  for (GpuKind g : kGpuKinds) {
    if (s == to_string(g)) return g;
  }
  return std::nullopt;
}

std::string copy_op_name(CopyKind c) { return std::string("copy_") + to_string(c); }

const GpuSpec& gpu_spec(GpuKind g) {
  // Datasheets of the H100 and H200 SXM: dense bf16 989 TFLOP/s, fp8 1979, fp32 67; HBM 3.35 / 4.8
  // TB/s; NVLink4 450 GB/s per direction. Usable memory: what cudaMemGetInfo leaves on an idle card.
  static const GpuSpec h100{GpuKind::h100,
                            "NVIDIA H100 80GB HBM3",
                            132,
                            1980.0,
                            2619.0,
                            Bytes(80'000'000'000.0),
                            gibibytes(79.6),
                            FlopsPerSecond(989e12),
                            FlopsPerSecond(1979e12),
                            FlopsPerSecond(67e12),
                            BytesPerSecond(3.35e12),
                            BytesPerSecond(450e9)};
  static const GpuSpec h200{GpuKind::h200,
                            "NVIDIA H200",
                            132,
                            1980.0,
                            3201.0,
                            Bytes(141'000'000'000.0),
                            gibibytes(140.4),
                            FlopsPerSecond(989e12),
                            FlopsPerSecond(1979e12),
                            FlopsPerSecond(67e12),
                            BytesPerSecond(4.8e12),
                            BytesPerSecond(450e9)};
  return g == GpuKind::h200 ? h200 : h100;
}

}  // namespace threewalls
