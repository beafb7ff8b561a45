// Collectives for the calibration: one process, one thread per GPU (nccl-tests' -t mode), one team
// per group size (GPUs 0..n-1), each rank with its own non-blocking communicator, stream, timer
// and buffers. The coordinator (the driver's thread) runs every step on all ranks in lockstep:
// each rank enqueues a batch behind its blocking kernel, the ranks meet at a barrier, all release
// together, and each times its batch with events; a sample is the slowest rank's time per run.
// The sizes map to NCCL calls exactly as OpRunner::run_collective does (bf16, count = bytes / 2;
// all_gather / reduce_scatter / all_to_all count per member = count / n; broadcast from member 0).
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bench.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/kernels.hpp"
#include "threewalls/backend/nccl.hpp"

namespace threewalls::calibration::bench::detail {

namespace be = threewalls::backend;

class CollectiveBench {
 public:
  CollectiveBench(std::uint64_t seed, Clock clock);
  ~CollectiveBench();
  CollectiveBench(const CollectiveBench&) = delete;
  CollectiveBench& operator=(const CollectiveBench&) = delete;
  // Sets up the team for the point's group size if needed (communicators, buffers of `max_bytes`),
  // then measures and checks the point.
  void measure(const StopRule& rule, double max_bytes, Record& r);

 private:
  struct Team;
  std::unique_ptr<Team> team_;
  std::uint64_t seed_;
  Clock clock_;
};

namespace {
constexpr auto kCommTimeout = std::chrono::seconds(30);
constexpr auto kStepTimeout = std::chrono::seconds(90);  // longer than a communicator's own timeout
constexpr double kTargetSampleS = 4e-4;
constexpr int kMaxReps = 32;
constexpr int kMinReps = 8;
constexpr const char* kBlockerPrefix = "blocker timeout: ";

std::size_t elems_of(double bytes) { return static_cast<std::size_t>(std::max(1.0, std::floor(bytes / 2.0))); }

void enqueue(const std::string& op, double bytes, be::NcclComm& c, const void* in, void* out, cudaStream_t s) {
  const std::size_t elems = elems_of(bytes);
  const auto n = static_cast<std::size_t>(c.size());
  const std::size_t per = std::max<std::size_t>(elems / n, 1);
  if (op == "all_reduce") {
    be::all_reduce(in, out, elems, c, s);
  } else if (op == "all_gather") {
    be::all_gather(in, out, per, c, s);
  } else if (op == "reduce_scatter") {
    be::reduce_scatter(in, out, per, c, s);
  } else if (op == "all_to_all") {
    be::all_to_all(in, out, per, c, s);
  } else if (op == "broadcast") {
    be::broadcast(in, out, elems, 0, c, s);
  } else if (op == "send_recv") {
    if (c.index() == 0) be::send(in, elems, 1, c, s);
    if (c.index() == 1) be::recv(out, elems, 0, c, s);
  } else {
    throw std::logic_error("unknown collective op " + op);
  }
}

}  // namespace

struct CollectiveBench::Team {
  enum class Kind { setup, run, check, quit };
  struct Cmd {
    Kind kind = Kind::setup;
    std::string op;
    double bytes = 0.0;
    int reps = 1;
    bool blocker = false;
  };

  int n;
  double max_bytes;
  std::uint64_t seed;
  std::barrier<> meet;
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;  // of the current command
  int done = 0;
  Cmd cmd;
  std::vector<double> times;
  std::vector<std::string> errors, checks;
  std::vector<std::thread> threads;
  std::string broken;  // why the team can no longer be used

  Team(int size, double bytes, std::uint64_t base_seed)
      : n(size), max_bytes(bytes), seed(base_seed), meet(size), times(static_cast<std::size_t>(size)),
        errors(static_cast<std::size_t>(size)), checks(static_cast<std::size_t>(size)) {}

  std::uint64_t rank_seed(int r) const { return seed + 1000 + static_cast<std::uint64_t>(r); }
  double value(int r, std::size_t i) const {
    return bf16_round(static_cast<double>(be::random_value(rank_seed(r), static_cast<std::int64_t>(i), 1.0F)));
  }

  // Posts `c` to every rank and waits until all finished it; throws with the ranks' errors.
  void step(const Cmd& c) {
    if (!broken.empty())
      throw std::runtime_error("collective team of " + std::to_string(n) + " GPUs unusable: " + broken);
    std::unique_lock<std::mutex> lock(mu);
    cmd = c;
    done = 0;
    for (auto& e : errors) e.clear();
    ++generation;
    cv.notify_all();
    if (!cv.wait_for(lock, kStepTimeout, [&] { return done == n; })) {
      broken = "a step did not finish within 90 s";
      throw std::runtime_error("collective " + c.op + ": " + broken);
    }
    std::string err;
    for (int r = 0; r < n; ++r) {
      if (!errors[static_cast<std::size_t>(r)].empty())
        err += (err.empty() ? "" : "; ") + errors[static_cast<std::size_t>(r)];
    }
    if (!err.empty()) {
      bool only_blocker = true;
      for (const auto& e : errors) only_blocker = only_blocker && (e.empty() || e.rfind(kBlockerPrefix, 0) == 0);
      if (only_blocker) throw BlockerTimeout(err);  // the communicators are fine
      if (c.kind != Kind::check) broken = err;
      throw std::runtime_error(err);
    }
  }

  void rank_main(int rank, const be::UniqueIdTable& ids, const scenarios::Layout& layout) {
    std::uint64_t seen = 0;
    std::unique_ptr<be::CommTable> table;
    std::unique_ptr<be::Stream> stream;
    std::unique_ptr<Timer> timer;
    be::DeviceBuffer in, out;
    while (true) {
      Cmd c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return generation != seen; });
        seen = generation;
        c = cmd;
      }
      if (c.kind == Kind::quit) break;
      std::string error, check;
      double t = 0.0;
      bool met = false;
      try {
        be::set_device(rank);
        be::set_thread_rank(rank);
        if (c.kind == Kind::setup) {
          table = std::make_unique<be::CommTable>(
              be::CommTable::create(layout, rank, ids, {scenarios::Group::dp}, kCommTimeout));
          stream = std::make_unique<be::Stream>();
          timer = std::make_unique<Timer>(stream->get());
          const std::size_t elems = elems_of(max_bytes) + 2 * static_cast<std::size_t>(n);  // OpRunner's slack
          in = be::DeviceBuffer(elems * 2);
          out = be::DeviceBuffer(elems * 2);
          be::fill_random(in.as<be::bf16>(), static_cast<std::int64_t>(elems), rank_seed(rank), 1.0F, stream->get());
          TW_CUDA_CHECK(cudaStreamSynchronize(stream->get()));
        } else if (c.kind == Kind::run) {
          be::NcclComm& comm = table->comm(scenarios::Group::dp);
          timer->begin(c.blocker);
          try {
            for (int i = 0; i < c.reps; ++i) enqueue(c.op, c.bytes, comm, in.data(), out.data(), stream->get());
          } catch (...) {
            timer->release();
            meet.arrive_and_drop();
            met = true;
            throw;
          }
          timer->end();
          meet.arrive_and_wait();  // every rank has its batch enqueued: release together
          met = true;
          timer->release();
          comm.wait_stream(stream->get(), ("calibration " + c.op).c_str());
          t = timer->elapsed_s() / c.reps;
        } else if (c.kind == Kind::check) {
          check = check_rank(rank, c, out);
        }
      } catch (const BlockerTimeout& e) {
        error = std::string(kBlockerPrefix) + e.what();
      } catch (const std::exception& e) {
        error = e.what();
        if (c.kind == Kind::run && !met) meet.arrive_and_drop();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        times[static_cast<std::size_t>(rank)] = t;
        errors[static_cast<std::size_t>(rank)] = error;
        checks[static_cast<std::size_t>(rank)] = check;
        ++done;
      }
      cv.notify_all();
    }
    if (table) table->abort_all();  // nothing is in flight; abort frees without waiting for peers
  }

  // Checks this rank's output of the last run against the values every rank's input holds.
  std::string check_rank(int rank, const Cmd& c, const be::DeviceBuffer& out) const {
    const std::size_t elems = elems_of(c.bytes);
    const std::size_t per = std::max<std::size_t>(elems / static_cast<std::size_t>(n), 1);
    CheckLog log(c.op + " output of rank " + std::to_string(rank));
    auto got = [&](std::size_t i) { return download_bf16(out.data(), static_cast<std::int64_t>(i), 1)[0]; };
    auto sum_of = [&](std::size_t i, double& abs_sum) {
      double s = 0.0;
      abs_sum = 0.0;
      for (int r = 0; r < n; ++r) {
        s += value(r, i);
        abs_sum += std::fabs(value(r, i));
      }
      return s;
    };
    const std::vector<std::size_t> at_all{0, elems / 2, elems - 1};
    const std::vector<std::size_t> at_per{0, per / 2, per - 1};
    const auto q = static_cast<std::size_t>(rank);
    if (c.op == "all_reduce") {
      for (const auto i : at_all) {
        double a = 0.0;
        const double want = sum_of(i, a);
        log.expect_near(got(i), want, 0.02 * a, "element " + std::to_string(i));
      }
    } else if (c.op == "reduce_scatter") {
      for (const auto i : at_per) {
        double a = 0.0;
        const double want = sum_of(q * per + i, a);
        log.expect_near(got(i), want, 0.02 * a, "element " + std::to_string(i));
      }
    } else if (c.op == "all_gather") {
      for (const int p : {0, n - 1}) {
        for (const auto i : at_per) {
          log.expect_near(got(static_cast<std::size_t>(p) * per + i), value(p, i), 1e-30, "block " + std::to_string(p));
        }
      }
    } else if (c.op == "all_to_all") {
      for (const int p : {0, n - 1}) {
        for (const auto i : at_per) {
          log.expect_near(got(static_cast<std::size_t>(p) * per + i), value(p, q * per + i), 1e-30,
                          "block " + std::to_string(p));
        }
      }
    } else if (c.op == "broadcast" || (c.op == "send_recv" && rank == 1)) {
      for (const auto i : at_all) log.expect_near(got(i), value(0, i), 1e-30, "element " + std::to_string(i));
    } else {
      return "";  // send_recv's sender: its message is checked where it arrives (rank 1)
    }
    return log.passed();
  }
};

CollectiveBench::CollectiveBench(std::uint64_t seed, Clock clock) : seed_(seed), clock_(std::move(clock)) {}

CollectiveBench::~CollectiveBench() {
  if (!team_) return;
  {
    std::lock_guard<std::mutex> lock(team_->mu);
    team_->cmd = Team::Cmd{Team::Kind::quit, "", 0.0, 1, false};
    ++team_->generation;
  }
  team_->cv.notify_all();
  for (auto& t : team_->threads) t.join();
}

void CollectiveBench::measure(const StopRule& rule, double max_bytes, Record& r) {
  const int n = r.point.group_size;
  if (!team_ || team_->n != n) {
    if (team_) {
      {
        std::lock_guard<std::mutex> lock(team_->mu);
        team_->cmd = Team::Cmd{Team::Kind::quit, "", 0.0, 1, false};
        ++team_->generation;
      }
      team_->cv.notify_all();
      for (auto& t : team_->threads) t.join();
      team_.reset();
    }
    int visible = be::device_count(nullptr);
    if (visible < n)
      throw std::runtime_error("group size " + std::to_string(n) + " needs " + std::to_string(n) + " GPUs");
    team_ = std::make_unique<Team>(n, max_bytes, seed_);
    const scenarios::Layout layout(1, 1, n, 1, 1, n, 1, n);
    const auto ids = std::make_shared<be::UniqueIdTable>(be::UniqueIdTable::create(layout, {scenarios::Group::dp}));
    Team* t = team_.get();
    for (int rank = 0; rank < n; ++rank) {
      t->threads.emplace_back([t, rank, ids, layout] { t->rank_main(rank, *ids, layout); });
    }
    t->step(Team::Cmd{Team::Kind::setup, "setup", 0.0, 1, false});
  }
  Team& t = *team_;
  auto run = [&](int reps, bool blocker) {
    t.step(Team::Cmd{Team::Kind::run, r.point.op, r.point.bytes, reps, blocker});
    return *std::max_element(t.times.begin(), t.times.end());
  };
  run(1, false);  // warm-up: NCCL's first call of a size sets up its channels and protocol
  const double t1 = std::min(run(1, false), run(1, false));
  // Every size is measured the same way: a batch of at least kMinReps calls, enqueued behind the
  // blocking kernels and released on all ranks together. A lone call costs more than a call in a
  // stream of calls (the ranks' start skew and the protocol's pipeline fill; about 100 us at 4 GPUs);
  // a batch of one at the sizes that take longer than the target would switch regime there.
  const int reps = std::max(kMinReps, reps_per_sample(t1, kTargetSampleS, kMaxReps));
  bool blocker = true;
  try {
    run(reps, true);
  } catch (const BlockerTimeout&) {
    blocker = false;  // batches without the blocking kernels
  }
  const Sampling s = sample_until(rule, clock_, [&] { return run(reps, blocker); });
  r.samples_s = s.samples;
  r.reps = reps;
  r.stop = std::string(to_string(s.reason)) + (!blocker ? " (batches without the blocking kernel)" : "");
  r.rel_ci = s.rel_ci;
  t.step(Team::Cmd{Team::Kind::check, r.point.op, r.point.bytes, 1, false});
  std::string all;
  for (const auto& c : t.checks) {
    if (!c.empty()) all += (all.empty() ? "" : "; ") + c;
  }
  r.check = all;
}

namespace {

class CollectiveGroupBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;
  void begin(const std::vector<PointSpec>& points) override {
    for (const auto& p : points) max_bytes_ = std::max(max_bytes_, p.bytes);
    collectives_ = std::make_unique<CollectiveBench>(opt().seed, ctx_.clock);
  }
  void measure(const StopRule& rule, Record& r) override { collectives_->measure(rule, max_bytes_, r); }

 private:
  double max_bytes_ = 0.0;  // the largest point of the section: every team's buffers hold it
  std::unique_ptr<CollectiveBench> collectives_;
};

}  // namespace

std::unique_ptr<GroupBench> make_collective_bench(const BenchContext& ctx) {
  return std::make_unique<CollectiveGroupBench>(ctx);
}

}  // namespace threewalls::calibration::bench::detail
