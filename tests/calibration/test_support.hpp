#pragma once
// Helpers shared by the calibration tests: a small profile built through ProfileBuilder, a scratch
// folder, and the shipped default profiles (built once per process: the generator takes ~1 s).
#include <unistd.h>
#include <map>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "default_profiles.hpp"
#include "threewalls/calibration/profile_builder.hpp"

namespace threewalls::calibration::testing {

inline Hardware test_hardware() {
  Hardware hw;
  hw.gpu_name = "Test GPU";
  hw.gpu_kind = "h200";
  hw.sm_count = 132;
  hw.sm_clock_mhz = 1980;
  hw.memory_clock_mhz = 3201;
  hw.memory_bytes = 141'000'000'000;
  hw.driver_version = "test";
  hw.cuda_version = "test";
  hw.nccl_version = "test";
  hw.gpus_seen = 2;
  hw.links_seen = {"NVLink NV18"};
  hw.machine = "unit test \"with quotes\"\tand a tab";
  hw.date = "2026-11-22";
  hw.peak_bf16_flop_per_s = 989e12;
  hw.peak_fp8_flop_per_s = 1979e12;
  hw.peak_fp32_flop_per_s = 67e12;
  hw.hbm_bandwidth_datasheet_bytes_per_s = 4.8e12;
  return hw;
}

// A profile with a few families; raw samples on some points, a single number on others.
inline Profile small_profile() {
  ProfileBuilder b({"small", "synthetic: unit test", "tests/calibration"}, test_hardware());
  for (double s = 65536; s <= 1 << 30; s *= 4) {
    b.add_copy(CopyKind::d2d, Bytes(s),
               Measurement::from_samples({2.5e-6 + s / 2e12, 2.6e-6 + s / 1.9e12, 2.4e-6 + s / 2.1e12}));
  }
  for (std::int64_t m : {512, 2048, 8192}) {
    for (std::int64_t k : {1024, 4096}) {
      b.add_gemm(DType::bf16, m, 4096, k, 1,
                 Measurement::single(6e-6 + 2.0 * m * 4096 * k / (650e12 * k / (k + 300.0))));
    }
  }
  for (int n : {2, 4}) {
    for (double s = 1024; s <= 1 << 30; s *= 8) {
      b.add_collective(
          Collective::all_reduce, LinkScope::nvlink, n, Bytes(s),
          Measurement::single(8e-6 + n * 1e-6 + s * 2.0 * (n - 1) / n / (300e9 / (1 + std::sqrt(4e6 / s)))));
    }
  }
  b.add_host("kernel_launch", Measurement::from_samples({3.6e-6, 3.7e-6, 3.9e-6, 3.7e-6}));
  b.add_host("kernel_launch", Measurement::single(3.8e-6));
  b.set_note(gemm_family(DType::bf16), "made up for a test, with a \"quote\" and a backslash \\");
  return b.build();
}

// A fresh scratch folder per call, removed by the caller when it cares.
inline std::filesystem::path scratch_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path() /
             ("threewalls_calib_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// The generator's profile of GPU kind `kind`, made once per kind.
inline const Profile& default_profile(const std::string& kind) {
  static std::map<std::string, Profile> made;
  auto it = made.find(kind);
  if (it == made.end()) it = made.emplace(kind, defaults::make_default_profile(kind)).first;
  return it->second;
}

inline std::filesystem::path shipped_profile_path(const std::string& kind) {
  return std::filesystem::path(THREEWALLS_SOURCE_DIR) / "calibration" / "profiles" / ("default_" + kind + ".toml");
}

}  // namespace threewalls::calibration::testing
