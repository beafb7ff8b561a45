#pragma once
// Units as types inside the program, unit strings in files, SI numbers in outputs.
//
// Every physical quantity that crosses a function boundary is one of the types below, so that
// `peak * 1e12 // TFLOPS` style bugs cannot compile. Values are stored in SI base units
// (bytes, seconds, bytes/s, FLOP, FLOP/s) as double.
#include <cmath>
#include <compare>
#include <string>
#include <string_view>

namespace threewalls {

template <class Tag>
struct Quantity {
  double value = 0.0;

  constexpr Quantity() = default;
  constexpr explicit Quantity(double v) : value(v) {}

  constexpr Quantity& operator+=(Quantity o) { value += o.value; return *this; }
  constexpr Quantity& operator-=(Quantity o) { value -= o.value; return *this; }
  constexpr Quantity& operator*=(double k) { value *= k; return *this; }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return Quantity(a.value + b.value); }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return Quantity(a.value - b.value); }
  friend constexpr Quantity operator*(Quantity a, double k) { return Quantity(a.value * k); }
  friend constexpr Quantity operator*(double k, Quantity a) { return Quantity(a.value * k); }
  friend constexpr Quantity operator/(Quantity a, double k) { return Quantity(a.value / k); }
  friend constexpr double operator/(Quantity a, Quantity b) { return a.value / b.value; }
  friend constexpr auto operator<=>(Quantity a, Quantity b) = default;
};

struct BytesTag {};
struct SecondsTag {};
struct BytesPerSecondTag {};
struct FlopsTag {};
struct FlopsPerSecondTag {};

using Bytes = Quantity<BytesTag>;
using Seconds = Quantity<SecondsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using Flops = Quantity<FlopsTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;

constexpr Seconds operator/(Bytes b, BytesPerSecond bw) { return Seconds(b.value / bw.value); }
constexpr BytesPerSecond operator/(Bytes b, Seconds t) { return BytesPerSecond(b.value / t.value); }
constexpr Bytes operator*(BytesPerSecond bw, Seconds t) { return Bytes(bw.value * t.value); }
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.value / r.value); }
constexpr FlopsPerSecond operator/(Flops f, Seconds t) { return FlopsPerSecond(f.value / t.value); }

// Convenience constructors for code and tests.
constexpr Seconds microseconds(double us) { return Seconds(us * 1e-6); }
constexpr double to_us(Seconds s) { return s.value * 1e6; }
constexpr Bytes kibibytes(double k) { return Bytes(k * 1024.0); }
constexpr Bytes mebibytes(double m) { return Bytes(m * 1024.0 * 1024.0); }
constexpr Bytes gibibytes(double g) { return Bytes(g * 1024.0 * 1024.0 * 1024.0); }
constexpr BytesPerSecond gigabytes_per_second(double g) { return BytesPerSecond(g * 1e9); }

// Parsers for unit strings. Each throws std::invalid_argument whose message says what was expected
// and lists the accepted units; callers add the file location.
//   bytes:     "80GiB", "1.5 MB", "4096B"      (SI k,M,G,T,P = 10^3n; IEC Ki,Mi,Gi,Ti,Pi = 2^10n)
//   bandwidth: "450GBps", "450GB/s" (bytes/s), "400Gbps", "400Gb/s" (bits/s), "50GiBps"
//   duration:  "1.5us", "1.5µs", "2ms", "100ns", "3s"
//   flop rate: "989TFLOPS", "989TFLOP/s", "1.9PFLOPS"
Bytes parse_bytes(std::string_view text);
BytesPerSecond parse_bandwidth(std::string_view text);
Seconds parse_duration(std::string_view text);
FlopsPerSecond parse_flop_rate(std::string_view text);

// Human-readable formatting (for text tables and docs, never for machine outputs).
std::string format_bytes(Bytes b);            // "80 GiB", "1.5 MiB", "512 B"
std::string format_bandwidth(BytesPerSecond bw);  // "450 GB/s"
std::string format_duration(Seconds s);       // "1.25 ms", "3.7 us"
std::string format_flop_rate(FlopsPerSecond f);   // "989 TFLOP/s"

}  // namespace threewalls
