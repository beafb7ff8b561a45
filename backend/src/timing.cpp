#include "threewalls/backend/timing.hpp"

#include <algorithm>

#include "threewalls/backend/error.hpp"
#include "threewalls/backend/handles.hpp"

namespace threewalls::backend {

double TimingResult::median_ms() const {
  if (samples_ms.empty()) return 0.0;
  std::vector<double> s = samples_ms;
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}
double TimingResult::min_ms() const {
  return samples_ms.empty() ? 0.0 : *std::min_element(samples_ms.begin(), samples_ms.end());
}
double TimingResult::spread() const {
  if (samples_ms.empty()) return 0.0;
  const auto [lo, hi] = std::minmax_element(samples_ms.begin(), samples_ms.end());
  const double med = median_ms();
  return med > 0.0 ? (*hi - *lo) / med : 0.0;
}

TimingResult time_device(const std::function<void(cudaStream_t)>& work, cudaStream_t stream,
                         const TimingOptions& options) {
  for (int i = 0; i < options.warmup; ++i) work(stream);
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  TimingResult r;
  Event start(true);
  Event stop(true);
  double total_ms = 0.0;
  for (int i = 0; i < options.max_reps; ++i) {
    start.record(stream);
    work(stream);
    stop.record(stream);
    stop.synchronize();
    const double ms = Event::elapsed_ms(start, stop);
    r.samples_ms.push_back(ms);
    total_ms += ms;
    if (i + 1 >= options.min_reps && total_ms > options.max_seconds * 1e3) break;
  }
  return r;
}

}  // namespace threewalls::backend
