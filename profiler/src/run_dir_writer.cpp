#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <regex>

#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::profiler {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxBuffer = 8U << 20U;  // write out a rank's buffer beyond 8 MiB

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, p);
}

void append_opt_int(std::string& out, std::int64_t v) {
  if (v == kAbsent) {
    out += "null";
  } else {
    append_int(out, v);
  }
}

constexpr int kCountDigits = 9;  // bytes and FLOPs: 9 significant digits (integers are written exactly)

// Times in microseconds, rounded to the nanosecond (at most 3 decimals, trailing zeros dropped):
// "12.5", "0.001", "1000000000.125". Integer arithmetic, about 3x faster than a precision-based
// to_chars; values beyond 9e12 us (104 days) or not finite go through append_json_number.
void append_time_us(std::string& out, double us) {
  if (!(std::fabs(us) < 9e12)) {
    append_json_number(out, us, 15);
    return;
  }
  auto ns = std::llround(us * 1000.0);
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, ns / 1000);
  out.append(buf, p);
  int frac = static_cast<int>(ns % 1000);
  if (frac == 0) return;
  char f[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
               static_cast<char>('0' + frac % 10)};
  int len = 4;
  while (f[len - 1] == '0') --len;
  out.append(f, static_cast<std::size_t>(len));
}

bool is_run_dir_file(const fs::path& p) {
  static const std::regex kPhases(R"(phases_rank_[0-9]+\.jsonl)");
  auto name = p.filename().string();
  return name == "run.json" || name == "summary.json" || std::regex_match(name, kPhases);
}

}  // namespace

void append_phase_line(std::string& out, const PhaseRecord& r, const Names& names) {
  out += "{\"step\":";
  append_int(out, r.step);
  out += ",\"rank\":";
  append_int(out, r.rank);
  out += ",\"phase\":";
  out += names.phases.json(r.phase);
  out += ",\"layer\":";
  append_opt_int(out, r.layer);
  out += ",\"microbatch\":";
  append_opt_int(out, r.microbatch);
  out += ",\"stream\":";
  out += names.streams.json(r.stream);
  out += ",\"start_us\":";
  append_time_us(out, r.start_us);
  out += ",\"dur_us\":";
  append_time_us(out, r.dur_us);
  out += ",\"wall\":\"";
  out += to_string(r.wall);
  out += "\",\"bytes\":";
  append_json_number(out, r.bytes, kCountDigits);
  out += ",\"flops\":";
  append_json_number(out, r.flops, kCountDigits);
  if (r.expert != kAbsent) {
    out += ",\"expert\":";
    append_int(out, r.expert);
  }
  if (r.peer != kAbsent) {
    out += ",\"peer\":";
    append_int(out, r.peer);
  }
  if (r.group != kNoName) {
    out += ",\"group\":";
    out += names.groups.json(r.group);
  }
  if (r.group_id != kAbsent) {
    out += ",\"group_id\":";
    append_int(out, r.group_id);
  }
  if (r.tokens != kAbsent) {
    out += ",\"tokens\":";
    append_int(out, r.tokens);
  }
  if (r.coarse != CoarseView::none) {
    out += ",\"coarse\":\"";
    out += to_string(r.coarse);
    out += '"';
  }
  out += '}';
}

void append_step_line(std::string& out, const StepRecord& r) {
  out += "{\"record\":\"step\",\"step\":";
  append_int(out, r.step);
  out += ",\"rank\":";
  append_int(out, r.rank);
  out += ",\"epoch_us\":";
  append_time_us(out, r.epoch_us);
  out += ",\"dur_us\":";
  append_time_us(out, r.dur_us);
  out += '}';
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
  header_.ranks = policy_.recording_ranks();
  header_.settings["profiler"] = policy_.to_json();

  std::error_code ec;
  if (options_.mode == WriterOptions::Mode::create) {
    if (fs::exists(dir_, ec)) {
      if (!fs::is_directory(dir_, ec)) throw InputError(dir_.string() + ": exists and is not a directory");
      bool empty = fs::is_empty(dir_, ec);
      if (!empty && !options_.overwrite) {
        throw InputError(dir_.string() +
                         ": run directory exists and is not empty; results are never overwritten (choose another "
                         "directory, or overwrite it explicitly)");
      }
      if (!empty) {
        for (const auto& e : fs::directory_iterator(dir_)) {
          if (e.is_regular_file() && is_run_dir_file(e.path())) fs::remove(e.path());
        }
      }
    } else {
      fs::create_directories(dir_, ec);
      if (ec) throw SystemError(dir_.string() + ": cannot create directory: " + ec.message());
    }
  } else if (!fs::is_directory(dir_, ec)) {
    throw InputError(dir_.string() + ": run directory to join does not exist (the creating process makes it first)");
  }

  if (options_.write_run_json) write_json_file(dir_ / "run.json", run_json(header_));

  file_of_rank_.assign(static_cast<std::size_t>(policy_.world_size()), -1);
  std::vector<int> local = options_.local_ranks.empty() ? policy_.recording_ranks() : options_.local_ranks;
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
    f.buffer = header_line_json(header_, r).dump();
    f.buffer += '\n';
    file_of_rank_[static_cast<std::size_t>(r)] = static_cast<int>(files_.size());
    files_.push_back(std::move(f));
    write_out(files_.back());  // the header reaches the disk at once
  }
}

RunDirWriter::~RunDirWriter() {
  for (auto& f : files_) {
    if (!f.file) continue;
    if (!f.buffer.empty()) {
      // Best effort: a destructor must not throw. No footer: the file reads as cut short.
      (void)std::fwrite(f.buffer.data(), 1, f.buffer.size(), f.file);
    }
    std::fclose(f.file);
    f.file = nullptr;
  }
}

void RunDirWriter::write_out(RankFile& f) {
  if (f.buffer.empty()) return;
  if (std::fwrite(f.buffer.data(), 1, f.buffer.size(), f.file) != f.buffer.size() || std::fflush(f.file) != 0) {
    throw SystemError(f.path.string() + ": write failed: " + std::strerror(errno));
  }
  f.buffer.clear();
}

void RunDirWriter::note_step(RankFile& f, int step) {
  if (f.steps.empty() || f.steps.back() != step) f.steps.push_back(step);
}

bool RunDirWriter::add(const StepRecord& r) {
  if (!policy_.records(r.step) || !is_local(r.rank)) return false;
  if (closed_) throw SystemError(dir_.string() + ": record added after close()");
  RankFile& f = file_of(r.rank);
  append_step_line(f.buffer, r);
  f.buffer += '\n';
  note_step(f, r.step);
  if (options_.keep_records) kept_steps_.push_back(r);
  if (f.buffer.size() > kMaxBuffer) write_out(f);
  return true;
}

bool RunDirWriter::add(const PhaseRecord& r) {
  if (!policy_.records(r.step) || !is_local(r.rank) || !policy_.records_phase(r.coarse)) return false;
  if (closed_) throw SystemError(dir_.string() + ": record added after close()");
  RankFile& f = file_of(r.rank);
  append_phase_line(f.buffer, r, names_);
  f.buffer += '\n';
  ++f.phase_records;
  note_step(f, r.step);
  if (options_.keep_records) kept_phases_.push_back(r);
  if (f.buffer.size() > kMaxBuffer) write_out(f);
  return true;
}

void RunDirWriter::end_step(int step) {
  if (closed_ || !policy_.flush_after(step)) return;
  for (auto& f : files_) write_out(f);
}

void RunDirWriter::write_summary(const OrderedJson& summary) {
  if (!policy_.enabled()) return;
  write_json_file(dir_ / "summary.json", summary);
}

void RunDirWriter::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& f : files_) {
    std::sort(f.steps.begin(), f.steps.end());
    f.steps.erase(std::unique(f.steps.begin(), f.steps.end()), f.steps.end());
    OrderedJson footer = OrderedJson::object();
    footer["record"] = "footer";
    footer["records"] = f.phase_records;
    footer["steps"] = f.steps;
    f.buffer += footer.dump();
    f.buffer += '\n';
    write_out(f);
    if (std::fclose(f.file) != 0) {
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
