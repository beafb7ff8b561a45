#pragma once
// RecordSink: the one place where timed records of every rank of a process go (docs/profiler.md,
// "Device timing"). Rank threads hand over the records of a finished step; a background thread owns
// the RunDirWriter (which is not thread-safe) and writes them, so that formatting and disk I/O never
// run on a thread that launches GPU work.
//
// Threading: submit(), step_done() and the name functions may be called from any thread. The
// writer's flush points (RunDirWriter::end_step) are honoured once every local rank has reported
// the step done. close() waits until everything queued is written and rethrows the first error the
// writer raised (a full disk, say); errors are also re-raised by the next submit().
//
// A sink without a writer (profiler disabled) accepts nothing and costs nothing: submit() and
// step_done() return at once.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "threewalls/profiler/record.hpp"
#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::profiler {

class RecordSink {
 public:
  // `writer` (may be null = disabled) stays owned by the caller and must outlive the sink.
  // `local_ranks`: the ranks whose steps this process reports (every one must call step_done()).
  RecordSink(RunDirWriter* writer, std::vector<int> local_ranks);
  ~RecordSink();
  RecordSink(const RecordSink&) = delete;
  RecordSink& operator=(const RecordSink&) = delete;

  [[nodiscard]] bool enabled() const { return writer_ != nullptr; }

  // Interned ids of the writer's name tables (thread-safe; the writer thread reads the tables).
  std::uint32_t phase_id(std::string_view name);
  std::uint32_t stream_id(std::string_view name);
  std::uint32_t group_id(std::string_view name);

  // The records of one recorded step of `rank` (phase records may be empty in coarse views).
  void submit(const StepRecord& step, std::vector<PhaseRecord>&& phases);
  // Every step of every local rank, recorded or not, in increasing order: the step is finished on
  // this rank (its records, if any, were submitted before).
  void step_done(int rank, int step);

  // Writes everything queued, stops the writer thread and rethrows a writer error. Idempotent. The
  // caller closes the RunDirWriter afterwards.
  void close();
  // Records submitted and steps reported so far (for tests).
  [[nodiscard]] std::size_t submitted_records() const;

 private:
  struct Item {
    bool is_done = false;  // true: step_done(rank, step); false: records
    int rank = 0;
    int step = 0;
    StepRecord step_record;
    std::vector<PhaseRecord> phases;
  };
  void writer_loop();
  void rethrow_if_failed();

  RunDirWriter* writer_;
  std::vector<int> local_ranks_;
  std::vector<int> done_through_;  // per local rank index: last step reported done (-1 = none)
  int flushed_through_ = -1;       // RunDirWriter::end_step called for every step <= this
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::size_t submitted_ = 0;
  std::mutex names_mu_;  // the writer's name tables and the writer itself
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace threewalls::profiler
