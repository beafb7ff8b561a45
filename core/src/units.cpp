#include "threewalls/core/units.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace threewalls {
namespace {

struct Split {
  double number = 0.0;
  std::string unit;
};

// "1.5 GiB" -> {1.5, "GiB"}. Leading/trailing blanks and one blank between are accepted.
Split split_number(std::string_view text, const char* what, const char* example) {
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == '+' || text[i] == '-' ||
                             ((text[i] == 'e' || text[i] == 'E') && i > start && i + 1 < text.size() &&
                              (std::isdigit(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '-' ||
                               text[i + 1] == '+')))) {
    ++i;
  }
  Split out;
  if (i == start) {
    throw std::invalid_argument(std::string("invalid ") + what + " '" + std::string(text) +
                                "': expected a number followed by a unit, e.g. \"" + example + "\"");
  }
  auto num = text.substr(start, i - start);
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), out.number);
  if (ec != std::errc() || ptr != num.data() + num.size() || !std::isfinite(out.number)) {
    throw std::invalid_argument(std::string("invalid ") + what + " '" + std::string(text) +
                                "': '" + std::string(num) + "' is not a number");
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t end = text.size();
  while (end > i && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  out.unit = std::string(text.substr(i, end - i));
  if (out.number < 0) {
    throw std::invalid_argument(std::string("invalid ") + what + " '" + std::string(text) +
                                "': must not be negative");
  }
  return out;
}

// Strips an SI or IEC prefix from the front of `unit`; returns the multiplier or 0 when none.
std::pair<double, std::string> strip_prefix(const std::string& unit) {
  static const std::array<std::pair<const char*, double>, 12> kPrefixes = {{
      {"Ki", 1024.0},
      {"Mi", 1024.0 * 1024.0},
      {"Gi", 1024.0 * 1024.0 * 1024.0},
      {"Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0},
      {"Pi", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0},
      {"k", 1e3},
      {"K", 1e3},
      {"M", 1e6},
      {"G", 1e9},
      {"T", 1e12},
      {"P", 1e15},
      {"E", 1e18},
  }};
  for (const auto& [p, mult] : kPrefixes) {
    std::string_view ps(p);
    if (unit.size() > ps.size() && unit.compare(0, ps.size(), ps) == 0) {
      return {mult, unit.substr(ps.size())};
    }
  }
  return {1.0, unit};
}

[[noreturn]] void bad_unit(const char* what, std::string_view text, const std::string& unit, const char* allowed) {
  throw std::invalid_argument(std::string("invalid ") + what + " '" + std::string(text) + "': " +
                              (unit.empty() ? std::string("missing unit") : "unknown unit '" + unit + "'") +
                              "; allowed: " + allowed);
}

std::string fmt(double v, const char* unit) {
  char buf[64];
  if (std::fabs(v) >= 1e-9 && std::fabs(v) < 1e15 && (std::fabs(v) >= 100.0 || std::fabs(v - std::round(v)) < 1e-9)) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, unit);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g %s", v, unit);
  }
  return buf;
}

}  // namespace

Bytes parse_bytes(std::string_view text) {
  static constexpr const char* kAllowed = "B, kB, MB, GB, TB, PB (10^3n) and KiB, MiB, GiB, TiB, PiB (2^10n)";
  auto s = split_number(text, "size", "80GiB");
  auto [mult, rest] = strip_prefix(s.unit);
  if (rest != "B") bad_unit("size", text, s.unit, kAllowed);
  return Bytes(s.number * mult);
}

BytesPerSecond parse_bandwidth(std::string_view text) {
  static constexpr const char* kAllowed =
      "Bps or B/s (bytes/s) and bps or b/s (bits/s), with SI (k, M, G, T) or IEC (Ki, Mi, Gi, Ti) prefixes, "
      "e.g. \"450GBps\", \"400Gbps\"";
  auto s = split_number(text, "bandwidth", "450GBps");
  auto [mult, rest] = strip_prefix(s.unit);
  double per_unit = 0.0;
  if (rest == "Bps" || rest == "B/s") per_unit = 1.0;
  else if (rest == "bps" || rest == "b/s" || rest == "bit/s") per_unit = 0.125;
  else bad_unit("bandwidth", text, s.unit, kAllowed);
  return BytesPerSecond(s.number * mult * per_unit);
}

Seconds parse_duration(std::string_view text) {
  static constexpr const char* kAllowed = "s, ms, us (or µs), ns";
  auto s = split_number(text, "duration", "1.5us");
  double mult = 0.0;
  if (s.unit == "s") mult = 1.0;
  else if (s.unit == "ms") mult = 1e-3;
  else if (s.unit == "us" || s.unit == "\xC2\xB5s" || s.unit == "\xCE\xBCs") mult = 1e-6;
  else if (s.unit == "ns") mult = 1e-9;
  else bad_unit("duration", text, s.unit, kAllowed);
  return Seconds(s.number * mult);
}

FlopsPerSecond parse_flop_rate(std::string_view text) {
  static constexpr const char* kAllowed = "FLOPS, FLOP/s or FLOPs with SI prefixes (k, M, G, T, P), e.g. \"989TFLOPS\"";
  auto s = split_number(text, "FLOP rate", "989TFLOPS");
  auto [mult, rest] = strip_prefix(s.unit);
  if (mult != 1.0 && s.unit.size() > 1 && s.unit[1] == 'i') bad_unit("FLOP rate", text, s.unit, kAllowed);
  if (rest != "FLOPS" && rest != "FLOP/s" && rest != "FLOPs" && rest != "flops" && rest != "flop/s") {
    bad_unit("FLOP rate", text, s.unit, kAllowed);
  }
  return FlopsPerSecond(s.number * mult);
}

std::string format_bytes(Bytes b) {
  static constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = b.value;
  std::size_t u = 0;
  while (std::fabs(v) >= 1024.0 && u + 1 < kUnits.size()) {
    v /= 1024.0;
    ++u;
  }
  return fmt(v, kUnits[u]);
}

std::string format_bandwidth(BytesPerSecond bw) {
  static constexpr std::array<const char*, 5> kUnits = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  double v = bw.value;
  std::size_t u = 0;
  while (std::fabs(v) >= 1000.0 && u + 1 < kUnits.size()) {
    v /= 1000.0;
    ++u;
  }
  return fmt(v, kUnits[u]);
}

std::string format_duration(Seconds s) {
  double v = s.value;
  if (std::fabs(v) >= 1.0) return fmt(v, "s");
  if (std::fabs(v) >= 1e-3) return fmt(v * 1e3, "ms");
  if (std::fabs(v) >= 1e-6) return fmt(v * 1e6, "us");
  if (std::fabs(v) < 1e-12) return "0 ns";  // round-off of sums of microseconds (records hold ns), not a duration
  return fmt(v * 1e9, "ns");
}

std::string format_flop_rate(FlopsPerSecond f) {
  static constexpr std::array<const char*, 6> kUnits = {"FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s",
                                                         "PFLOP/s"};
  double v = f.value;
  std::size_t u = 0;
  while (std::fabs(v) >= 1000.0 && u + 1 < kUnits.size()) {
    v /= 1000.0;
    ++u;
  }
  return fmt(v, kUnits[u]);
}

}  // namespace threewalls
