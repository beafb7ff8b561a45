#pragma once
// Output files of the exporters: refuse to replace an existing file unless forced, write through a
// large buffer, report I/O errors by path. Internal.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "threewalls/core/error.hpp"
#include "threewalls/core/jsonl.hpp"

namespace threewalls::notebooks_export::detail {

inline void check_output(const std::filesystem::path& p, bool force) {
  std::error_code ec;
  if (std::filesystem::exists(p, ec) && !force) {
    throw InputError(p.string() + ": exists; outputs are never overwritten (pass --overwrite to replace it)");
  }
  if (p.has_parent_path() && !std::filesystem::exists(p.parent_path(), ec)) {
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) throw SystemError(p.parent_path().string() + ": cannot create directory: " + ec.message());
  }
}

class OutFile {
 public:
  OutFile(const std::filesystem::path& p, bool force) : path_(p) {
    check_output(p, force);
    file_ = std::fopen(p.c_str(), "wb");
    if (!file_) throw SystemError(p.string() + ": cannot open for writing: " + std::strerror(errno));
    buf_.reserve(kChunk + 4096);
  }
  ~OutFile() {
    if (file_) std::fclose(file_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  std::string& buf() { return buf_; }
  // Writes the buffer out when it is large; call after each appended item.
  void maybe_flush() {
    if (buf_.size() >= kChunk) flush();
  }
  void close() {
    flush();
    if (std::fclose(file_) != 0) {
      file_ = nullptr;
      throw SystemError(path_.string() + ": close failed: " + std::strerror(errno));
    }
    file_ = nullptr;
  }

 private:
  static constexpr std::size_t kChunk = 4U << 20U;
  void flush() {
    if (buf_.empty()) return;
    if (std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size()) {
      throw SystemError(path_.string() + ": write failed: " + std::strerror(errno));
    }
    buf_.clear();
  }
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::string buf_;
};

inline void append_int(std::string& out, long long v) {
  char b[24];
  auto [p, ec] = std::to_chars(b, b + sizeof b, v);
  out.append(b, p);
}

// Whole nanoseconds written as microseconds with up to three decimals (no trailing zeros): exact,
// so a Perfetto event's ts + dur equals the ts of the event that starts where it ends.
inline void append_ns_as_us(std::string& out, long long ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  append_int(out, ns / 1000);
  const int frac = static_cast<int>(ns % 1000);
  if (frac == 0) return;
  char f[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
               static_cast<char>('0' + frac % 10)};
  int len = 4;
  while (f[len - 1] == '0') --len;
  out.append(f, static_cast<std::size_t>(len));
}

// Microseconds rounded to the nanosecond, as the run directory writes them.
inline void append_us(std::string& out, double us) {
  if (!(std::fabs(us) < 9e12)) {
    append_json_number(out, us, 15);
    return;
  }
  append_ns_as_us(out, std::llround(us * 1000.0));
}

}  // namespace threewalls::notebooks_export::detail
