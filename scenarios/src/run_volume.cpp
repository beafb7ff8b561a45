#include "threewalls/scenarios/run_volume.hpp"

#include <algorithm>

namespace threewalls::scenarios {

long long saturating_mul(long long a, long long b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kProductCap / b ? kProductCap : a * b;
}

long long recorded_steps(const Scenario& s) {
  const ProfilerSpec& pr = s.run.profiler;
  if (!pr.enabled || pr.record_every_n_steps < 1) return 0;
  const int last = pr.end_step >= 0 ? std::min(pr.end_step, s.run.steps - 1) : s.run.steps - 1;
  return last < pr.start_step ? 0 : (last - pr.start_step) / pr.record_every_n_steps + 1;
}

long long records_per_rank_step(const Scenario& s, long long ops_per_rank_step) {
  return s.run.profiler.granularity == Granularity::coarse ? 3 : ops_per_rank_step;
}

long long run_dir_bytes(long long steps, long long ranks, long long records_per_rank_and_step) {
  const long long records =
      saturating_mul(saturating_mul(saturating_mul(steps, ranks), records_per_rank_and_step), kBytesPerRecord);
  const long long headers = saturating_mul(ranks, kHeaderBytesPerFile);
  return records > kProductCap - headers ? kProductCap : records + headers;
}

bool auto_records_every_rank(const Scenario& s, long long ops_per_rank_step) {
  const long long bytes = run_dir_bytes(recorded_steps(s), s.world_size(), records_per_rank_step(s, ops_per_rank_step));
  return bytes <= kAutoEveryRankMaxBytes;
}

}  // namespace threewalls::scenarios
