#include "threewalls/profiler/sampling.hpp"

#include <algorithm>

#include "threewalls/core/error.hpp"

namespace threewalls::profiler {

SamplingPolicy::SamplingPolicy(SamplingConfig config, int world_size)
    : config_(std::move(config)), world_size_(world_size) {
  auto bad = [](const std::string& knob, const std::string& what) {
    return InputError("profiler." + knob + ": " + what);
  };
  if (world_size_ <= 0) throw bad("ranks", "world size must be positive, not " + std::to_string(world_size_));
  if (config_.start_step < 0) {
    throw bad("start_step", std::to_string(config_.start_step) + " is negative; allowed: 0 or more");
  }
  if (config_.end_step < -1) {
    throw bad("end_step", std::to_string(config_.end_step) + " is not allowed; allowed: -1 (no end) or a step >= start_step");
  }
  if (config_.end_step >= 0 && config_.end_step < config_.start_step) {
    throw bad("end_step", std::to_string(config_.end_step) + " is before start_step " +
                              std::to_string(config_.start_step) + "; allowed: -1 or a step >= start_step");
  }
  if (config_.record_every_n_steps < 1) {
    throw bad("record_every_n_steps", std::to_string(config_.record_every_n_steps) + "; allowed: 1 or more");
  }
  if (config_.flush_every_n_steps < 1) {
    throw bad("flush_every_n_steps", std::to_string(config_.flush_every_n_steps) + "; allowed: 1 or more");
  }
  rank_mask_.assign(static_cast<std::size_t>(world_size_), 0);
  if (config_.ranks.empty()) {
    for (int r = 0; r < world_size_; ++r) ranks_.push_back(r);
    std::fill(rank_mask_.begin(), rank_mask_.end(), 1);
  } else {
    for (int r : config_.ranks) {
      if (r < 0 || r >= world_size_) {
        throw bad("ranks", "rank " + std::to_string(r) + " is outside the world; allowed: 0.." +
                               std::to_string(world_size_ - 1));
      }
      if (rank_mask_[static_cast<std::size_t>(r)] != 0) throw bad("ranks", "rank " + std::to_string(r) + " is listed twice");
      rank_mask_[static_cast<std::size_t>(r)] = 1;
      ranks_.push_back(r);
    }
    std::sort(ranks_.begin(), ranks_.end());
  }
  if (!config_.enabled) {
    ranks_.clear();
    std::fill(rank_mask_.begin(), rank_mask_.end(), 0);
  }
}

OrderedJson SamplingPolicy::to_json() const {
  OrderedJson j = OrderedJson::object();
  j["enabled"] = config_.enabled;
  j["start_step"] = config_.start_step;
  j["end_step"] = config_.end_step;
  j["record_every_n_steps"] = config_.record_every_n_steps;
  j["flush_every_n_steps"] = config_.flush_every_n_steps;
  // A count, not the list: this object is in every phases file's header, and the list (run.json's
  // `ranks`) would make a run recording every rank write world x world header bytes.
  j["recorded_ranks"] = ranks_.size();
  j["granularity"] = to_string(config_.granularity);
  return j;
}

}  // namespace threewalls::profiler
