// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include "gpu_test_util.hpp"

#include <cuda_fp8.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "threewalls/backend/error.hpp"

namespace threewalls::backend::testing {

bool gpu_available(std::string& reason) {
  const int n = device_count(&reason);
  return n > 0;
}

int gpu_count() { return device_count(nullptr); }

std::filesystem::path source_root() {
  if (const char* env = std::getenv("THREEWALLS_SOURCE_DIR"); env != nullptr) return env;
  const std::filesystem::path built = THREEWALLS_SOURCE_DIR;
  std::error_code ec;
  if (std::filesystem::is_directory(built / "scenarios", ec)) return built;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  if (!ec && std::filesystem::is_directory(here / "scenarios", ec)) return here;
  return built;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mag(0.1F, 1.0F);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> x(n);
  for (auto& v : x) v = (sign(gen) ? -1.0F : 1.0F) * mag(gen) * scale;
  return x;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = __bfloat162float(__float2bfloat16(x[i]));
  return r;
}

DeviceBuffer upload_bf16(const std::vector<float>& x) {
  std::vector<bf16> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16(x[i]);
  DeviceBuffer d(h.size() * sizeof(bf16));
  TW_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.size(), cudaMemcpyHostToDevice));
  return d;
}
DeviceBuffer upload_f32(const std::vector<float>& x) {
  DeviceBuffer d(x.size() * sizeof(float));
  TW_CUDA_CHECK(cudaMemcpy(d.data(), x.data(), d.size(), cudaMemcpyHostToDevice));
  return d;
}
DeviceBuffer upload_i32(const std::vector<std::int32_t>& x) {
  DeviceBuffer d(x.size() * sizeof(std::int32_t));
  TW_CUDA_CHECK(cudaMemcpy(d.data(), x.data(), d.size(), cudaMemcpyHostToDevice));
  return d;
}
std::vector<float> download_bf16(const DeviceBuffer& b, std::size_t n) {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<bf16> h(n);
  TW_CUDA_CHECK(cudaMemcpy(h.data(), b.data(), n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = __bfloat162float(h[i]);
  return r;
}
std::vector<float> download_fp8(const DeviceBuffer& b, std::size_t n) {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<__nv_fp8_e4m3> h(n);
  TW_CUDA_CHECK(cudaMemcpy(h.data(), b.data(), n * sizeof(__nv_fp8_e4m3), cudaMemcpyDeviceToHost));
  std::vector<float> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = static_cast<float>(h[i]);
  return r;
}
std::vector<float> download_f32(const DeviceBuffer& b, std::size_t n) {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> r(n);
  TW_CUDA_CHECK(cudaMemcpy(r.data(), b.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return r;
}
std::vector<std::int32_t> download_i32(const DeviceBuffer& b, std::size_t n) {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::int32_t> r(n);
  TW_CUDA_CHECK(cudaMemcpy(r.data(), b.data(), n * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  return r;
}
void poison(DeviceBuffer& b) { TW_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.size())); }

double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  return rel_error(out, std::vector<double>(ref.begin(), ref.end()));
}

std::vector<double> cpu_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                             const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const float av = ta == Trans::n ? a[static_cast<std::size_t>(i * k + p)] : a[static_cast<std::size_t>(p * m + i)];
        const float bv = tb == Trans::n ? b[static_cast<std::size_t>(p * n + j)] : b[static_cast<std::size_t>(j * k + p)];
        acc += static_cast<double>(av) * static_cast<double>(bv);
      }
      c[static_cast<std::size_t>(i * n + j)] = acc;
    }
  }
  return c;
}

}  // namespace threewalls::backend::testing
