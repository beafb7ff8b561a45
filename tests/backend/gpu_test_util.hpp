#pragma once
// Helpers shared by the backend tests: GPU presence (tests skip with a one-line reason without
// one), host<->device copies, seeded host data and relative errors against CPU references.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "threewalls/backend/blas.hpp"
#include "threewalls/backend/handles.hpp"

namespace threewalls::backend::testing {

// True when a CUDA device is usable; otherwise `reason` says why.
bool gpu_available(std::string& reason);
int gpu_count();

#define TW_REQUIRE_GPU()                                                            \
  do {                                                                              \
    std::string tw_reason_;                                                         \
    if (!::threewalls::backend::testing::gpu_available(tw_reason_)) {               \
      GTEST_SKIP() << "no CUDA device: " << tw_reason_;                             \
    }                                                                               \
  } while (0)

// The checkout whose scenarios the tests read: $THREEWALLS_SOURCE_DIR when set; else the source
// directory of the build when it holds scenarios/; else the working directory when it does (the
// test binary carried to another machine and run from a checkout's root); else the build's source
// directory, so that a missing file names it.
std::filesystem::path source_root();

// Seeded values in (-scale, -0.1 scale] U [0.1 scale, scale): never zero.
std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0F);
// Rounds through bf16 (what the device sees).
std::vector<float> round_bf16(const std::vector<float>& x);

DeviceBuffer upload_bf16(const std::vector<float>& x);
DeviceBuffer upload_f32(const std::vector<float>& x);
DeviceBuffer upload_i32(const std::vector<std::int32_t>& x);
std::vector<float> download_bf16(const DeviceBuffer& b, std::size_t n);
std::vector<float> download_f32(const DeviceBuffer& b, std::size_t n);
// fp8 (e4m3) elements, as floats.
std::vector<float> download_fp8(const DeviceBuffer& b, std::size_t n);
std::vector<std::int32_t> download_i32(const DeviceBuffer& b, std::size_t n);
// Fills a device buffer with a NaN pattern (0xFF bytes) so unwritten outputs fail the checks.
void poison(DeviceBuffer& b);

// ||out - ref|| / ||ref||; +inf when out holds a NaN/inf or the sizes differ.
double rel_error(const std::vector<float>& out, const std::vector<double>& ref);
double rel_error(const std::vector<float>& out, const std::vector<float>& ref);

// Row-major CPU GEMM in double: C[m,n] = op(A) op(B) (see blas.hpp for storage conventions).
std::vector<double> cpu_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                             const std::vector<float>& a, const std::vector<float>& b);

}  // namespace threewalls::backend::testing
