#include "threewalls/profiler/record_sink.hpp"

#include <algorithm>
#include <string>

#include "threewalls/core/error.hpp"

namespace threewalls::profiler {

RecordSink::RecordSink(RunDirWriter* writer, std::vector<int> local_ranks)
    : writer_(writer != nullptr && writer->enabled() ? writer : nullptr), local_ranks_(std::move(local_ranks)) {
  done_through_.assign(local_ranks_.size(), -1);
  if (writer_ != nullptr) thread_ = std::thread([this] { writer_loop(); });
}

RecordSink::~RecordSink() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; close() reported it if called
  }
}

std::uint32_t RecordSink::phase_id(std::string_view name) {
  if (writer_ == nullptr) return 0;
  std::lock_guard<std::mutex> lock(names_mu_);
  return writer_->phase_id(name);
}
std::uint32_t RecordSink::stream_id(std::string_view name) {
  if (writer_ == nullptr) return 0;
  std::lock_guard<std::mutex> lock(names_mu_);
  return writer_->stream_id(name);
}
std::uint32_t RecordSink::group_id(std::string_view name) {
  if (writer_ == nullptr) return kNoName;
  std::lock_guard<std::mutex> lock(names_mu_);
  return writer_->group_id(name);
}

void RecordSink::rethrow_if_failed() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    e = error_;
  }
  if (e) std::rethrow_exception(e);
}

void RecordSink::submit(const StepRecord& step, std::vector<PhaseRecord>&& phases) {
  if (writer_ == nullptr) return;
  Item it;
  it.rank = step.rank;
  it.step = step.step;
  it.step_record = step;
  it.phases = std::move(phases);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (error_) std::rethrow_exception(error_);
    if (stopping_) throw SystemError("profiler: records of rank " + std::to_string(step.rank) + " step " +
                                     std::to_string(step.step) + " arrived after the record sink was closed");
    submitted_ += it.phases.size();
    queue_.push_back(std::move(it));
  }
  queue_cv_.notify_one();
}

void RecordSink::step_done(int rank, int step) {
  if (writer_ == nullptr) return;
  Item it;
  it.is_done = true;
  it.rank = rank;
  it.step = step;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (error_) std::rethrow_exception(error_);
    if (stopping_) return;
    queue_.push_back(std::move(it));
  }
  queue_cv_.notify_one();
}

std::size_t RecordSink::submitted_records() const {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return submitted_;
}

void RecordSink::writer_loop() {
  for (;;) {
    std::deque<Item> batch;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty() && stopping_) return;
      batch.swap(queue_);
    }
    try {
      std::lock_guard<std::mutex> names_lock(names_mu_);
      for (Item& it : batch) {
        if (!it.is_done) {
          writer_->add(it.step_record);
          for (const PhaseRecord& p : it.phases) writer_->add(p);
          continue;
        }
        const auto pos = std::find(local_ranks_.begin(), local_ranks_.end(), it.rank);
        if (pos == local_ranks_.end()) continue;
        int& d = done_through_[static_cast<std::size_t>(pos - local_ranks_.begin())];
        d = std::max(d, it.step);
        const int all = *std::min_element(done_through_.begin(), done_through_.end());
        while (flushed_through_ < all) writer_->end_step(++flushed_through_);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
      queue_.clear();
      return;
    }
  }
}

void RecordSink::close() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  rethrow_if_failed();
}

}  // namespace threewalls::profiler
