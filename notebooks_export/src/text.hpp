#pragma once
// Text helpers for the human-readable reports (never for machine outputs). Internal.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace threewalls::notebooks_export::detail {

inline std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

inline std::string pct(std::optional<double> v, int decimals = 1) {
  if (!v || !std::isfinite(*v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.*f%%", decimals, *v);
  return buf;
}

// Microseconds with a unit that keeps 3-4 significant digits: "812.3 us", "12.41 ms", "1.234 s".
inline std::string duration_us(double us) {
  if (!std::isfinite(us)) return "n/a";
  double a = std::fabs(us);
  if (a >= 1e6) return fixed(us * 1e-6, 3) + " s";
  if (a >= 1e3) return fixed(us * 1e-3, 2) + " ms";
  return fixed(us, 1) + " us";
}

inline std::string gib(double bytes) { return fixed(bytes / (1024.0 * 1024.0 * 1024.0), 2) + " GiB"; }

// A table with a header row; columns after the first are right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  [[nodiscard]] std::size_t rows() const { return rows_.size() - 1; }
  [[nodiscard]] std::string str(const std::string& indent = "  ") const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_) {
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::string out;
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      const auto& r = rows_[k];
      std::string line = indent;
      for (std::size_t i = 0; i < r.size(); ++i) {
        std::string pad(w[i] - r[i].size(), ' ');
        line += i == 0 ? r[i] + pad : pad + r[i];
        if (i + 1 < r.size()) line += "  ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
      if (k == 0) {
        std::string rule = indent;
        std::size_t total = 0;
        for (std::size_t i = 0; i < w.size(); ++i) total += w[i] + (i + 1 < w.size() ? 2 : 0);
        out += rule + std::string(total, '-') + "\n";
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace threewalls::notebooks_export::detail
