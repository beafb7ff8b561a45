#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <regex>
#include <set>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::profiler {

namespace fs = std::filesystem;

namespace {

// How many rank files a writer keeps open at once: half the process's limit of open files (the soft
// RLIMIT_NOFILE; the threewalls executables raise it to the hard limit at start-up), the rest left to
// the libraries (NCCL, CUDA). A writer with more recorded ranks opens each file for each write instead
// (a world of 32,768 recorded ranks on a machine that allows 20,000 open files).
std::size_t max_files_kept_open() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 512;
  if (lim.rlim_cur == RLIM_INFINITY) return std::size_t{1} << 20;
  return static_cast<std::size_t>(lim.rlim_cur) / 2;
}

// Every buffer is written out when the buffers of all ranks together hold more than this: one
// writer for 256 simulated ranks holds 8 MiB, not 8 MiB per rank.
constexpr std::size_t kMaxBuffered = 8U << 20U;
// A buffer keeps at most this much storage once written out.
constexpr std::size_t kKeptCapacity = 64U << 10U;
// The storage of written-out buffers kept for the next ones (spare_), at most: a buffer written out
// at the bound holds up to twice it (a string grows by doubling), and one rank's records of a step
// can fill the bound alone, so its storage is kept whole rather than grown again from nothing.
constexpr std::size_t kMaxSpare = 2 * kMaxBuffered;

constexpr int kCountDigits = 9;

// "00" "01" ... "99": the two digits of each value below 100.
constexpr std::array<char, 200> kDigitPairs = [] {
  std::array<char, 200> a{};
  for (int i = 0; i < 100; ++i) {
    a[static_cast<std::size_t>(2 * i)] = static_cast<char>('0' + i / 10);
    a[static_cast<std::size_t>(2 * i + 1)] = static_cast<char>('0' + i % 10);
  }
  return a;
}();

// 10^0 ... 10^19.
constexpr std::array<std::uint64_t, 20> kPowersOf10 = [] {
  std::array<std::uint64_t, 20> a{};
  std::uint64_t p = 1;
  for (std::size_t i = 0; i < a.size(); ++i, p *= 10) a[i] = p;
  return a;
}();

// std::llround(v) for |v| < 2^63 (the callers check the range): the integer part by truncation, then
// half away from zero on the exact remainder (v - trunc(v) is exact), without the call into libm.
std::int64_t round_half_away(double v) {
  auto r = static_cast<std::int64_t>(v);
  const double f = v - static_cast<double>(r);
  if (f >= 0.5) ++r;
  if (f <= -0.5) --r;
  return r;
}

// Formats one record line into a caller's char buffer that is large enough (the caller sizes it
// from the names' lengths): fixed text copied with known lengths, integers in decimal as to_chars
// writes them (their length first, then two digits per step from the end). About three times faster
// than appending piece by piece to a std::string.
class LineWriter {
 public:
  explicit LineWriter(char* p) : p_(p) {}
  template <std::size_t N>
  void lit(const char (&s)[N]) {
    std::memcpy(p_, s, N - 1);
    p_ += N - 1;
  }
  void str(std::string_view s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void i64(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    if (v < 0) {
      *p_++ = '-';
      u = 0 - u;
    }
    // Digits: from the bit width (log10(2) ~ 1233 / 4096), one less below that power of 10.
    const auto t = static_cast<std::size_t>((std::bit_width(u) * 1233) >> 12);
    const std::size_t n = t + (u >= kPowersOf10[t] ? 1 : 0) + (u == 0 ? 1 : 0);
    char* const end = p_ + n;
    char* q = end;
    while (u >= 100) {
      q -= 2;
      std::memcpy(q, &kDigitPairs[2 * (u % 100)], 2);
      u /= 100;
    }
    if (u >= 10) {
      std::memcpy(q - 2, &kDigitPairs[2 * u], 2);
    } else {
      q[-1] = static_cast<char>('0' + u);
    }
    p_ = end;
  }
  void opt(std::int64_t v) {
    if (v == kAbsent) {
      lit("null");
    } else {
      i64(v);
    }
  }
  // Bytes and FLOPs are counts: rounded to an integer (exact below 2^53), 9 significant digits beyond.
  void count(double v) {
    if (std::fabs(v) < 9.007199254740992e15) {
      i64(round_half_away(v));
    } else {
      std::string s;
      append_json_number(s, v, kCountDigits);
      str(s);
    }
  }
  // Microseconds rounded to the nanosecond (at most 3 decimals, trailing zeros dropped): "12.5",
  // "0.001", "1000000000.125"; beyond 9e12 us (104 days) or not finite: append_json_number.
  void time_us(double us) {
    if (!(std::fabs(us) < 9e12)) {
      std::string s;
      append_json_number(s, us, 15);
      str(s);
      return;
    }
    auto ns = round_half_away(us * 1000.0);
    if (ns < 0) {
      *p_++ = '-';
      ns = -ns;
    }
    i64(ns / 1000);
    const int frac = static_cast<int>(ns % 1000);
    if (frac == 0) return;
    p_[0] = '.';
    p_[1] = static_cast<char>('0' + frac / 100);
    p_[2] = static_cast<char>('0' + frac / 10 % 10);
    p_[3] = static_cast<char>('0' + frac % 10);
    int len = 4;
    while (p_[len - 1] == '0') --len;
    p_ += len;
  }
  [[nodiscard]] char* end() const { return p_; }

 private:
  char* p_;
};

constexpr std::string_view kWallJson[kNumWalls] = {"\"compute\"", "\"memory\"", "\"communication\"", "\"host\""};
constexpr std::size_t kFixedLineMax = 768;  // every part of a line but its names, generously

template <class Fill>
void append_line(std::string& out, std::size_t names_size, Fill&& fill) {
  const std::size_t need = kFixedLineMax + names_size;
  char stack[2048];
  std::vector<char> heap;
  char* buf = stack;
  if (need > sizeof stack) {
    heap.resize(need);
    buf = heap.data();
  }
  LineWriter w(buf);
  fill(w);
  out.append(buf, static_cast<std::size_t>(w.end() - buf));
}

bool is_run_dir_file(const fs::path& p) {
  static const std::regex kPhases(R"(phases_rank_[0-9]+\.jsonl)");
  auto name = p.filename().string();
  return name == "run.json" || name == "summary.json" || std::regex_match(name, kPhases);
}

// A path as error messages show it: whole up to 160 bytes, else its start, its end and its length.
std::string shown(const fs::path& p) {
  const std::string s = p.string();
  if (s.size() <= 160) return s;
  return s.substr(0, 60) + "..." + s.substr(s.size() - 40) + " (a path of " + std::to_string(s.size()) + " bytes)";
}

// Whether `dir` holds anything but the lock file.
bool has_entries(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() != kRunDirLockFile) return true;
  }
  if (ec) throw InputError(shown(dir) + ": cannot list the run directory: " + ec.message());
  return false;
}

// Takes the lock file of `dir` (kRunDirLockFile) and returns its descriptor. The file is removed by
// its holder when done; a writer that locked a file which was removed meanwhile locks again.
int lock_run_dir(const fs::path& dir) {
  const fs::path path = dir / std::string(kRunDirLockFile);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw SystemError(shown(path) + ": cannot create the lock file: " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        throw InputError(shown(dir) + ": another threewalls process is writing this run directory (it holds " +
                         std::string(kRunDirLockFile) + "); wait for it to finish or choose another directory");
      }
      throw SystemError(shown(path) + ": cannot lock: " + std::strerror(err));
    }
    struct stat held {};
    struct stat named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      return fd;
    }
    ::close(fd);  // the previous holder removed this file after we opened it: lock the new one
  }
  throw SystemError(shown(path) + ": could not take the lock file (it kept being replaced)");
}

}  // namespace

std::string run_dir_name(std::string_view scenario_name) {
  constexpr std::size_t kMaxName = 96;
  std::string out;
  for (char c : scenario_name) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (out.empty() && c == '.') continue;
    out += keep ? c : '_';
    if (out.size() == kMaxName) break;
  }
  return out.empty() ? std::string("run") : out;
}

bool is_run_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::path run = dir / "run.json";
  if (!fs::is_regular_file(run, ec)) return false;
  try {
    const Json j = read_json_file(run);
    const auto it = j.find("schema");
    return j.is_object() && it != j.end() && *it == kRunDirSchemaName;
  } catch (const std::exception&) {
    return false;
  }
}

void check_run_dir_target(const fs::path& dir, bool overwrite, std::string_view remedy) {
  if (dir.empty()) throw InputError("run directory: the path is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw InputError(shown(dir) + ": cannot be used as a run directory: " + ec.message());
  }
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) {
    throw InputError(shown(dir) + ": exists and is not a directory; a run directory is a directory (choose another)");
  }
  if (!has_entries(dir)) return;
  if (!overwrite) {
    throw InputError(shown(dir) + ": run directory exists and is not empty; results are never overwritten (" +
                     std::string(remedy) + ")");
  }
  if (!is_run_dir(dir)) {
    throw InputError(
        shown(dir) + ": is not empty and is not a run directory (it has no run.json with \"schema\": \"" +
        std::string(kRunDirSchemaName) +
        "\"); overwriting replaces only run directories, so nothing was removed (choose another directory)");
  }
}

void append_phase_line(std::string& out, const PhaseRecord& r, const Names& names) {
  const std::string& phase = names.phases.json(r.phase);
  const std::string& stream = names.streams.json(r.stream);
  const std::size_t group_size = r.group != kNoName ? names.groups.json(r.group).size() : 0;
  append_line(out, phase.size() + stream.size() + group_size, [&](LineWriter& w) {
    w.lit("{\"step\":");
    w.i64(r.step);
    w.lit(",\"rank\":");
    w.i64(r.rank);
    w.lit(",\"phase\":");
    w.str(phase);
    w.lit(",\"layer\":");
    w.opt(r.layer);
    w.lit(",\"microbatch\":");
    w.opt(r.microbatch);
    w.lit(",\"stream\":");
    w.str(stream);
    w.lit(",\"start_us\":");
    w.time_us(r.start_us);
    w.lit(",\"dur_us\":");
    w.time_us(r.dur_us);
    w.lit(",\"wall\":");
    w.str(kWallJson[static_cast<int>(r.wall)]);
    w.lit(",\"bytes\":");
    w.count(r.bytes);
    w.lit(",\"flops\":");
    w.count(r.flops);
    if (r.expert != kAbsent) {
      w.lit(",\"expert\":");
      w.i64(r.expert);
    }
    if (r.peer != kAbsent) {
      w.lit(",\"peer\":");
      w.i64(r.peer);
    }
    if (r.group != kNoName) {
      w.lit(",\"group\":");
      w.str(names.groups.json(r.group));
    }
    if (r.group_id != kAbsent) {
      w.lit(",\"group_id\":");
      w.i64(r.group_id);
    }
    if (r.tokens != kAbsent) {
      w.lit(",\"tokens\":");
      w.i64(r.tokens);
    }
    if (static_cast<double>(r.launch_wait_us) >= 0.0005) {  // what rounds to a nanosecond or more
      w.lit(",\"launch_wait_us\":");
      w.time_us(static_cast<double>(r.launch_wait_us));
    }
    if (r.coarse == CoarseView::host_to_device) {
      w.lit(",\"coarse\":\"host_to_device\"");
    } else if (r.coarse == CoarseView::training_metrics) {
      w.lit(",\"coarse\":\"training_metrics\"");
    }
    w.lit("}");
  });
}

void append_step_line(std::string& out, const StepRecord& r) {
  append_line(out, 0, [&](LineWriter& w) {
    w.lit("{\"record\":\"step\",\"step\":");
    w.i64(r.step);
    w.lit(",\"rank\":");
    w.i64(r.rank);
    w.lit(",\"epoch_us\":");
    w.time_us(r.epoch_us);
    w.lit(",\"dur_us\":");
    w.time_us(r.dur_us);
    w.lit("}");
  });
}

RunDirWriter::RunDirWriter(fs::path dir, RunHeader header, SamplingPolicy policy, WriterOptions options)
    : dir_(std::move(dir)), header_(std::move(header)), policy_(std::move(policy)), options_(std::move(options)) {
  if (!policy_.enabled()) return;  // disabled: no directory, no file
  if (header_.world_size != policy_.world_size()) {
    throw InputError("run header: world_size " + std::to_string(header_.world_size) +
                     " differs from the sampling policy's " + std::to_string(policy_.world_size()));
  }
  if (header_.schema_version.empty()) {
    header_.schema_version = std::to_string(kRunDirSchemaMajor) + "." + std::to_string(kRunDirSchemaMinor);
  }
  if (header_.run_id.empty()) header_.run_id = new_run_id();
  header_.ranks = policy_.recording_ranks();
  header_.settings["profiler"] = policy_.to_json();

  std::error_code ec;
  if (options_.mode == WriterOptions::Mode::create) {
    check_run_dir_target(dir_, options_.overwrite);
    fs::create_directories(dir_, ec);
    if (ec) throw SystemError(shown(dir_) + ": cannot create directory: " + ec.message());
    lock_fd_ = lock_run_dir(dir_);
  }
  try {
    if (options_.mode == WriterOptions::Mode::create) {
      // Checked again under the lock: another writer may have finished a run here meanwhile.
      check_run_dir_target(dir_, options_.overwrite);
      for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->is_regular_file() && is_run_dir_file(it->path())) {
          fs::remove(it->path(), ec);
          if (ec) throw SystemError(shown(it->path()) + ": cannot remove: " + ec.message());
        }
      }
      if (ec) throw SystemError(shown(dir_) + ": cannot list the run directory: " + ec.message());
    } else if (!fs::is_directory(dir_, ec)) {
      throw InputError(shown(dir_) + ": run directory to join does not exist (the creating process makes it first)");
    } else {
      // One run, one id: a joining process takes the creator's from run.json.
      const fs::path run = dir_ / "run.json";
      if (!fs::exists(run, ec))
        throw InputError(shown(run) + ": missing; the creating process writes it before others join");
      header_.run_id = header_from_json(read_json_file(run), run.string()).run_id;
      if (header_.run_id.empty()) throw InputError(shown(run) + ": has no run_id; it was not written by this build");
    }

    if (options_.write_run_json) write_json_file(dir_ / "run.json", run_json(header_));

    file_of_rank_.assign(static_cast<std::size_t>(policy_.world_size()), -1);
    std::vector<int> local = options_.local_ranks.empty() ? policy_.recording_ranks() : options_.local_ranks;
    reopen_each_write_ = local.size() > max_files_kept_open();
    const HeaderLines header_lines(header_);
    for (int r : local) {
      if (r < 0 || r >= policy_.world_size()) {
        throw InputError("writer: local rank " + std::to_string(r) + " is outside the world (0.." +
                         std::to_string(policy_.world_size() - 1) + ")");
      }
      if (!policy_.records_rank(r)) continue;  // a local rank that does not record writes nothing
      if (file_of_rank_[static_cast<std::size_t>(r)] >= 0) continue;
      RankFile f;
      f.rank = r;
      f.path = dir_ / ("phases_rank_" + std::to_string(r) + ".jsonl");
      if (options_.mode == WriterOptions::Mode::join && fs::exists(f.path, ec) && !options_.overwrite) {
        throw InputError(f.path.string() + ": exists; results are never overwritten");
      }
      f.file = std::fopen(f.path.c_str(), "wb");
      if (!f.file) throw SystemError(f.path.string() + ": cannot open for writing: " + std::strerror(errno));
      if (reopen_each_write_) {
        std::fclose(f.file);  // created empty; write_out appends and closes
        f.file = nullptr;
      }
      f.buffer = header_lines.line(r);
      f.buffer += '\n';
      buffered_ += f.buffer.size();
      file_of_rank_[static_cast<std::size_t>(r)] = static_cast<int>(files_.size());
      files_.push_back(std::move(f));
      write_out(files_.back());  // the header reaches the disk at once
    }
  } catch (...) {
    for (auto& f : files_) {
      if (f.file != nullptr) std::fclose(f.file);
      f.file = nullptr;
    }
    release_lock();
    throw;
  }
}

RunDirWriter::~RunDirWriter() {
  for (auto& f : files_) {
    if (!f.file && reopen_each_write_ && !f.buffer.empty()) f.file = std::fopen(f.path.c_str(), "ab");
    if (!f.file) continue;
    if (!f.buffer.empty()) {
      // Best effort: a destructor must not throw. No footer: the file reads as cut short.
      (void)std::fwrite(f.buffer.data(), 1, f.buffer.size(), f.file);
    }
    std::fclose(f.file);
    f.file = nullptr;
  }
  release_lock();
}

void RunDirWriter::release_lock() {
  if (lock_fd_ < 0) return;
  // Removed while held: a writer that opened this file meanwhile sees it replaced and locks anew.
  ::unlink((dir_ / std::string(kRunDirLockFile)).c_str());
  ::close(lock_fd_);
  lock_fd_ = -1;
}

void RunDirWriter::write_out(RankFile& f) {
  if (f.buffer.empty()) return;
  if (f.file == nullptr) {
    f.file = std::fopen(f.path.c_str(), "ab");
    if (!f.file) throw SystemError(f.path.string() + ": cannot open for writing: " + std::strerror(errno));
  }
  if (std::fwrite(f.buffer.data(), 1, f.buffer.size(), f.file) != f.buffer.size() || std::fflush(f.file) != 0) {
    throw SystemError(f.path.string() + ": write failed: " + std::strerror(errno));
  }
  if (reopen_each_write_) {
    const bool closed = std::fclose(f.file) == 0;
    f.file = nullptr;
    if (!closed) throw SystemError(f.path.string() + ": close failed: " + std::strerror(errno));
  }
  buffered_ -= f.buffer.size();
  f.buffer.clear();
  if (f.buffer.capacity() > kKeptCapacity) {
    if (spare_capacity_ + f.buffer.capacity() <= kMaxSpare) {
      spare_capacity_ += f.buffer.capacity();
      spare_.push_back(std::move(f.buffer));
    }
    std::string().swap(f.buffer);
  }
}

std::string& RunDirWriter::buffer_of(RankFile& f) {
  if (f.buffer.empty() && f.buffer.capacity() <= kKeptCapacity && !spare_.empty()) {
    spare_capacity_ -= spare_.back().capacity();
    f.buffer.swap(spare_.back());
    spare_.pop_back();
  }
  return f.buffer;
}

void RunDirWriter::appended(std::size_t bytes) {
  buffered_ += bytes;
  if (buffered_ <= kMaxBuffered) return;
  for (auto& f : files_) write_out(f);
}

void RunDirWriter::note_step(RankFile& f, int step) {
  if (f.steps.empty() || f.steps.back() != step) f.steps.push_back(step);
  if (f.open_steps.find(step) != f.open_steps.end()) return;
  if (std::find(f.ended_steps.begin(), f.ended_steps.end(), step) != f.ended_steps.end()) {
    throw SystemError(f.path.string() + ": a record of step " + std::to_string(step) + " after the step ended");
  }
  f.open_steps.emplace(step, 0);
}

void RunDirWriter::end_step_lines(int step) {
  for (auto& f : files_) {
    const auto it = f.open_steps.find(step);
    if (it == f.open_steps.end()) continue;
    const std::size_t before = f.buffer.size();
    f.buffer += "{\"record\":\"step_end\",\"step\":" + std::to_string(step) +
                ",\"records\":" + std::to_string(it->second) + "}\n";
    buffered_ += f.buffer.size() - before;
    f.open_steps.erase(it);
    f.ended_steps.push_back(step);
  }
}

bool RunDirWriter::add(const StepRecord& r) {
  if (!policy_.records(r.step) || !is_local(r.rank)) return false;
  if (closed_) throw SystemError(dir_.string() + ": record added after close()");
  RankFile& f = file_of(r.rank);
  note_step(f, r.step);
  std::string& buffer = buffer_of(f);
  const std::size_t before = buffer.size();
  append_step_line(buffer, r);
  buffer += '\n';
  if (options_.keep_records) kept_steps_.push_back(r);
  appended(buffer.size() - before);
  return true;
}

bool RunDirWriter::add(const PhaseRecord& r) { return add(std::span<const PhaseRecord>(&r, 1)) == 1; }

std::size_t RunDirWriter::add(std::span<const PhaseRecord> rs) {
  if (rs.empty()) return 0;
  const int step = rs.front().step;
  const int rank = rs.front().rank;
  if (!policy_.records(step) || !is_local(rank)) return 0;
  if (closed_) throw SystemError(dir_.string() + ": record added after close()");
  RankFile& f = file_of(rank);
  std::size_t written = 0;
  for (const PhaseRecord& r : rs) {
    if (r.step != step || r.rank != rank)
      throw std::logic_error("RunDirWriter::add: records of several ranks or steps");
    if (!policy_.records_phase(r.coarse)) continue;
    if (written == 0) note_step(f, step);
    std::string& buffer = buffer_of(f);
    const std::size_t before = buffer.size();
    append_phase_line(buffer, r, names_);
    buffer += '\n';
    ++written;
    if (options_.keep_records) kept_phases_.push_back(r);
    appended(buffer.size() - before);
  }
  f.phase_records += written;
  if (written > 0) f.open_steps[step] += written;
  return written;
}

void RunDirWriter::end_step(int step) {
  if (closed_) return;
  end_step_lines(step);
  if (!policy_.flush_after(step)) return;
  for (auto& f : files_) write_out(f);
}

void RunDirWriter::write_summary(const OrderedJson& summary) {
  if (!policy_.enabled()) return;
  write_json_file(dir_ / "summary.json", summary);
}

void RunDirWriter::close() {
  if (closed_) return;
  std::set<int> open;
  for (const auto& f : files_) {
    for (const auto& [step, unused] : f.open_steps) open.insert(step);
  }
  for (int step : open) end_step_lines(step);
  closed_ = true;
  for (auto& f : files_) {
    std::sort(f.steps.begin(), f.steps.end());
    f.steps.erase(std::unique(f.steps.begin(), f.steps.end()), f.steps.end());
    OrderedJson footer = OrderedJson::object();
    footer["record"] = "footer";
    footer["run_id"] = header_.run_id;
    footer["records"] = f.phase_records;
    footer["steps"] = f.steps;
    const std::size_t before = f.buffer.size();
    f.buffer += footer.dump();
    f.buffer += '\n';
    buffered_ += f.buffer.size() - before;
    write_out(f);
    if (f.file != nullptr && std::fclose(f.file) != 0) {
      f.file = nullptr;
      throw SystemError(f.path.string() + ": close failed: " + std::strerror(errno));
    }
    f.file = nullptr;
  }
}

std::size_t RunDirWriter::phase_records_written() const {
  std::size_t n = 0;
  for (const auto& f : files_) n += f.phase_records;
  return n;
}

}  // namespace threewalls::profiler
