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
    case GpuKind::b200: return "b200";
    case GpuKind::gb200: return "gb200";
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
                            BytesPerSecond(450e9),
                            8};
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
                            BytesPerSecond(450e9),
                            8};
  // Blackwell, from NVIDIA's HGX B200 and GB200 NVL72 datasheets (dense tensor figures; the sparse
  // ones are twice these): HGX B200 at 1,000 W: bf16 2,250, fp8 4,500, fp32 80 TFLOP/s; GB200 at
  // 1,200 W: bf16 2,500, fp8 5,000, fp32 90. HBM3e 8 TB/s; 1,440 GB per HGX B200 board of 8 (180 GB
  // each), 13.4 TB per NVL72 rack of 72 (186 GB each); NVLink5 1.8 TB/s per GPU, 900 GB/s per
  // direction; 148 SMs. The memory clock is the bandwidth over the 8,192-bit bus at two transfers per
  // clock. Usable memory: the sold capacity less the 0.6 GiB an H200 loses to the driver, rounded down to
  // 0.1 GiB (167.0 and 172.6 GiB).
  static const GpuSpec b200{GpuKind::b200,
                            "NVIDIA B200",
                            148,
                            1965.0,
                            3906.0,
                            Bytes(180'000'000'000.0),
                            gibibytes(167.0),
                            FlopsPerSecond(2250e12),
                            FlopsPerSecond(4500e12),
                            FlopsPerSecond(80e12),
                            BytesPerSecond(8.0e12),
                            BytesPerSecond(900e9),
                            8};
  static const GpuSpec gb200{GpuKind::gb200,
                             "NVIDIA GB200",
                             148,
                             2062.0,
                             3906.0,
                             Bytes(186'000'000'000.0),
                             gibibytes(172.6),
                             FlopsPerSecond(2500e12),
                             FlopsPerSecond(5000e12),
                             FlopsPerSecond(90e12),
                             BytesPerSecond(8.0e12),
                             BytesPerSecond(900e9),
                             72};
  switch (g) {
    case GpuKind::h100: return h100;
    case GpuKind::h200: return h200;
    case GpuKind::b200: return b200;
    case GpuKind::gb200: return gb200;
  }
  return h100;
}

}  // namespace threewalls
