#pragma once
// Minimal inline-SVG charts for the HTML report: stacked columns, a line with points, horizontal bars.
// No scripts, no external fonts (the report must render offline and in headless Chromium). Internal.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "text.hpp"

namespace threewalls::notebooks_export::detail {

inline std::string xml(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string num(double v) { return fixed(v, 1); }

// Round axis ticks from 0 to at least `max`: steps of 1, 2 or 5 times a power of ten.
inline std::vector<double> nice_ticks(double max, int target = 5) {
  if (!(max > 0) || !std::isfinite(max)) return {0.0, 1.0};
  double raw = max / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = 0; v < max + step * 0.999; v += step) t.push_back(v);
  if (t.size() < 2) t.push_back(step);
  return t;
}

inline std::string tick_label(double v) {
  if (v == 0) return "0";
  double a = std::fabs(v);
  if (a >= 100) return fixed(v, 0);
  if (a >= 10) return fixed(v, 1);
  if (a >= 1) return fixed(v, 2);
  return fixed(v, 3);
}

struct Series {
  std::string name;
  std::string color;
  std::vector<double> values;
};

class Chart {
 public:
  static constexpr double kW = 620;
  static constexpr double kH = 280;
  static constexpr double kLeft = 62;
  static constexpr double kRight = 12;
  static constexpr double kTop = 44;
  static constexpr double kBottom = 46;

  Chart(const std::string& title, double height = kH) : h_(height) {
    out_ = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kW) + "\" height=\"" + num(h_) +
           "\" viewBox=\"0 0 " + num(kW) + " " + num(h_) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
    out_ += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
    out_ += "<text x=\"" + num(kW / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">" +
            xml(title) + "</text>\n";
  }

  [[nodiscard]] double plot_w() const { return kW - kLeft - kRight; }
  [[nodiscard]] double plot_h() const { return h_ - kTop - kBottom; }
  [[nodiscard]] double y_of(double v) const { return kTop + plot_h() * (1.0 - v / ymax_); }

  // A y axis from 0 to the ticks' top, with grid lines and a unit label.
  void y_axis(double max, const std::string& unit) {
    auto ticks = nice_ticks(max);
    ymax_ = ticks.back();
    for (double t : ticks) {
      double y = y_of(t);
      out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kW - kRight) + "\" y2=\"" + num(y) +
              "\" stroke=\"#e0e0e0\"/>\n";
      out_ += "<text x=\"" + num(kLeft - 4) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" + tick_label(t) + "</text>\n";
    }
    out_ += "<text transform=\"translate(14," + num(kTop + plot_h() / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
            xml(unit) + "</text>\n";
  }

  // Category labels under slots of equal width; every k-th label when they would overlap.
  void x_labels(const std::vector<std::string>& labels, const std::string& title) {
    if (labels.empty()) return;
    double slot = plot_w() / static_cast<double>(labels.size());
    std::size_t every = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(36.0 / slot)));
    for (std::size_t i = 0; i < labels.size(); i += every) {
      double x = kLeft + slot * (static_cast<double>(i) + 0.5);
      out_ += "<text x=\"" + num(x) + "\" y=\"" + num(h_ - kBottom + 14) + "\" text-anchor=\"middle\">" + xml(labels[i]) +
              "</text>\n";
    }
    out_ += "<text x=\"" + num(kLeft + plot_w() / 2) + "\" y=\"" + num(h_ - 8) + "\" text-anchor=\"middle\">" + xml(title) +
            "</text>\n";
  }

  void legend(const std::vector<std::pair<std::string, std::string>>& items) {
    double x = kLeft + 4;
    const double y = kTop - 12;
    for (const auto& [name, color] : items) {
      out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y - 8) + "\" width=\"9\" height=\"9\" fill=\"" + color + "\"/>\n";
      out_ += "<text x=\"" + num(x + 12) + "\" y=\"" + num(y) + "\">" + xml(name) + "</text>\n";
      x += 18 + 6.2 * static_cast<double>(name.size());
    }
  }

  void raw(const std::string& s) { out_ += s; }
  std::string finish() {
    out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(kTop + plot_h()) + "\" x2=\"" + num(kW - kRight) + "\" y2=\"" +
            num(kTop + plot_h()) + "\" stroke=\"#444\"/>\n</svg>\n";
    return out_;
  }

 private:
  double h_;
  double ymax_ = 1.0;
  std::string out_;
};

// Stacked columns: one column per category, one segment per series.
inline std::string stacked_columns(const std::string& title, const std::vector<std::string>& categories,
                                   const std::vector<Series>& series, const std::string& unit, const std::string& x_title,
                                   const std::vector<bool>& highlight = {}) {
  Chart c(title);
  double max = 0;
  for (std::size_t i = 0; i < categories.size(); ++i) {
    double sum = 0;
    for (const auto& s : series) sum += i < s.values.size() && std::isfinite(s.values[i]) ? s.values[i] : 0.0;
    max = std::max(max, sum);
  }
  c.y_axis(max, unit);
  double slot = c.plot_w() / static_cast<double>(std::max<std::size_t>(1, categories.size()));
  double bw = std::clamp(slot * 0.8, 0.5, 48.0);  // a few categories: columns, not walls of colour
  for (std::size_t i = 0; i < categories.size(); ++i) {
    double x = Chart::kLeft + slot * static_cast<double>(i) + (slot - bw) / 2;
    double acc = 0;
    for (const auto& s : series) {
      double v = i < s.values.size() && std::isfinite(s.values[i]) ? s.values[i] : 0.0;
      if (v <= 0) continue;
      double y0 = c.y_of(acc);
      double y1 = c.y_of(acc + v);
      c.raw("<rect x=\"" + num(x) + "\" y=\"" + num(y1) + "\" width=\"" + fixed(bw, 2) + "\" height=\"" + fixed(y0 - y1, 2) +
            "\" fill=\"" + s.color + "\"><title>" + xml(categories[i] + " " + s.name + ": " + tick_label(v) + " " + unit) +
            "</title></rect>\n");
      acc += v;
    }
    if (i < highlight.size() && highlight[i]) {
      c.raw("<text x=\"" + num(x + bw / 2) + "\" y=\"" + num(c.y_of(acc) - 3) + "\" text-anchor=\"middle\" fill=\"#C44E52\" "
            "font-weight=\"bold\">&#9650;</text>\n");
    }
  }
  c.x_labels(categories, x_title);
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& s : series) items.emplace_back(s.name, s.color);
  c.legend(items);
  return c.finish();
}

// One line with points per series over shared categories.
inline std::string lines(const std::string& title, const std::vector<std::string>& categories,
                         const std::vector<Series>& series, const std::string& unit, const std::string& x_title) {
  Chart c(title);
  double max = 0;
  for (const auto& s : series) {
    for (double v : s.values) {
      if (std::isfinite(v)) max = std::max(max, v);
    }
  }
  c.y_axis(max, unit);
  double slot = c.plot_w() / static_cast<double>(std::max<std::size_t>(1, categories.size()));
  for (const auto& s : series) {
    std::string pts;
    for (std::size_t i = 0; i < s.values.size() && i < categories.size(); ++i) {
      if (!std::isfinite(s.values[i])) continue;
      double x = Chart::kLeft + slot * (static_cast<double>(i) + 0.5);
      double y = c.y_of(s.values[i]);
      pts += num(x) + "," + num(y) + " ";
      c.raw("<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"2.5\" fill=\"" + s.color + "\"><title>" +
            xml(s.name + " " + categories[i] + ": " + tick_label(s.values[i]) + " " + unit) + "</title></circle>\n");
    }
    c.raw("<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\"/>\n");
  }
  c.x_labels(categories, x_title);
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& s : series) items.emplace_back(s.name, s.color);
  c.legend(items);
  return c.finish();
}

// Horizontal bars, one per label, each with its own colour; labels left of the bars. With a negative
// value the axis is symmetric around 0 (bars left of the zero line are negative).
inline std::string hbars(const std::string& title, const std::vector<std::string>& labels, const std::vector<double>& values,
                         const std::vector<std::string>& colors, const std::string& unit,
                         const std::vector<std::pair<std::string, std::string>>& legend) {
  const double row = 17;
  const double label_w = 190;
  const double top = 44;
  const double h = top + row * static_cast<double>(labels.size()) + 34;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(Chart::kW) + "\" height=\"" + num(h) +
                    "\" viewBox=\"0 0 " + num(Chart::kW) + " " + num(h) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + num(Chart::kW / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">" +
         xml(title) + "</text>\n";
  double x_leg = label_w;
  for (const auto& [name, color] : legend) {
    out += "<rect x=\"" + num(x_leg) + "\" y=\"26\" width=\"9\" height=\"9\" fill=\"" + color + "\"/>\n";
    out += "<text x=\"" + num(x_leg + 12) + "\" y=\"34\">" + xml(name) + "</text>\n";
    x_leg += 18 + 6.2 * static_cast<double>(name.size());
  }
  double max = 0;
  double min = 0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    max = std::max(max, v);
    min = std::min(min, v);
  }
  const bool has_negative = min < 0;
  auto ticks = nice_ticks(has_negative ? std::max(max, -min) : max);
  const double span = ticks.back();
  const double lo = has_negative ? -span : 0.0;
  const double plot_w = Chart::kW - label_w - 20;
  auto x_of = [&](double v) { return label_w + plot_w * (v - lo) / (span - lo); };
  if (has_negative) {
    std::vector<double> both;
    for (auto it = ticks.rbegin(); it != ticks.rend(); ++it) {
      if (*it > 0) both.push_back(-*it);
    }
    both.insert(both.end(), ticks.begin(), ticks.end());
    ticks = std::move(both);
  }
  for (double t : ticks) {
    double x = x_of(t);
    out += "<line x1=\"" + num(x) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x) + "\" y2=\"" + num(h - 30) +
           "\" stroke=\"" + (t == 0 && has_negative ? "#444444" : "#e0e0e0") + "\"/>\n";
    out += "<text x=\"" + num(x) + "\" y=\"" + num(h - 18) + "\" text-anchor=\"middle\">" + tick_label(t) + "</text>\n";
  }
  out += "<text x=\"" + num(label_w + plot_w / 2) + "\" y=\"" + num(h - 4) + "\" text-anchor=\"middle\">" + xml(unit) +
         "</text>\n";
  for (std::size_t i = 0; i < labels.size(); ++i) {
    double y = top + row * static_cast<double>(i);
    const double v = std::isfinite(values[i]) ? values[i] : 0.0;
    const double x0 = x_of(std::min(0.0, v));
    const double w = x_of(std::max(0.0, v)) - x0;
    std::string name = labels[i].size() > 30 ? labels[i].substr(0, 29) + "~" : labels[i];
    out += "<text x=\"" + num(label_w - 6) + "\" y=\"" + num(y + 12) + "\" text-anchor=\"end\">" + xml(name) + "</text>\n";
    out += "<rect x=\"" + fixed(x0, 2) + "\" y=\"" + num(y + 2) + "\" width=\"" + fixed(std::max(0.0, w), 2) +
           "\" height=\"" + num(row - 4) + "\" fill=\"" + (i < colors.size() ? colors[i] : "#888") + "\"><title>" +
           xml(labels[i] + ": " + tick_label(values[i]) + " " + unit) + "</title></rect>\n";
  }
  out += "</svg>\n";
  return out;
}

// A diverging heat map of values in percent: rows x columns, white at 0, red above, blue below,
// saturated at +-`limit`. Cells with no value are grey. `marked` rows get a red label.
inline std::string heatmap(const std::string& title, const std::vector<std::string>& rows,
                           const std::vector<std::string>& cols, const std::vector<std::vector<double>>& values,
                           double limit, const std::string& unit, const std::vector<bool>& marked = {}) {
  const double label_w = 60;
  const double top = 40;
  const double plot_w = Chart::kW - label_w - 20;
  const double cell_h = rows.size() > 64 ? std::max(1.0, 256.0 / static_cast<double>(rows.size())) : 12.0;
  const double cell_w = plot_w / static_cast<double>(std::max<std::size_t>(1, cols.size()));
  const double h = top + cell_h * static_cast<double>(rows.size()) + 52;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(Chart::kW) + "\" height=\"" + num(h) +
                    "\" viewBox=\"0 0 " + num(Chart::kW) + " " + num(h) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + num(Chart::kW / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">" +
         xml(title) + "</text>\n";
  auto color = [&](double v) {
    if (!std::isfinite(v)) return std::string("#cccccc");
    double f = std::clamp(std::fabs(v) / limit, 0.0, 1.0);
    int fade = static_cast<int>(std::lround(255 * (1 - f)));
    char buf[8];
    if (v >= 0) {
      std::snprintf(buf, sizeof buf, "#%02x%02x%02x", 255, fade, fade);
    } else {
      std::snprintf(buf, sizeof buf, "#%02x%02x%02x", fade, fade, 255);
    }
    return std::string(buf);
  };
  // Colour scale.
  for (int k = 0; k <= 10; ++k) {
    double v = -limit + 2 * limit * k / 10.0;
    out += "<rect x=\"" + num(label_w + 14 * k) + "\" y=\"24\" width=\"14\" height=\"9\" fill=\"" + color(v) + "\"/>\n";
  }
  out += "<text x=\"" + num(label_w + 160) + "\" y=\"33\">" + xml("-" + tick_label(limit) + " .. +" + tick_label(limit) + " " + unit) +
         "</text>\n";
  const std::size_t label_every = rows.size() > 32 ? rows.size() / 16 : 1;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    double y = top + cell_h * static_cast<double>(r);
    bool mark = r < marked.size() && marked[r];
    if (r % label_every == 0 || mark) {
      out += "<text x=\"" + num(label_w - 6) + "\" y=\"" + num(y + std::min(cell_h, 12.0) - 2) + "\" text-anchor=\"end\"" +
             (mark ? " fill=\"#C44E52\" font-weight=\"bold\"" : "") + ">" + xml(rows[r]) + "</text>\n";
    }
    for (std::size_t c = 0; c < cols.size(); ++c) {
      double v = r < values.size() && c < values[r].size() ? values[r][c] : std::nan("");
      out += "<rect x=\"" + fixed(label_w + cell_w * static_cast<double>(c), 2) + "\" y=\"" + fixed(y, 2) + "\" width=\"" +
             fixed(cell_w, 2) + "\" height=\"" + fixed(cell_h, 2) + "\" fill=\"" + color(v) + "\"><title>" +
             xml(rows[r] + ", step " + cols[c] + ": " + (std::isfinite(v) ? fixed(v, 1) + " " + unit : "no record")) +
             "</title></rect>\n";
    }
  }
  const double y_axis = top + cell_h * static_cast<double>(rows.size());
  const std::size_t col_every = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(30.0 / cell_w)));
  for (std::size_t c = 0; c < cols.size(); c += col_every) {
    out += "<text x=\"" + num(label_w + cell_w * (static_cast<double>(c) + 0.5)) + "\" y=\"" + num(y_axis + 14) +
           "\" text-anchor=\"middle\">" + xml(cols[c]) + "</text>\n";
  }
  out += "<text x=\"" + num(label_w + plot_w / 2) + "\" y=\"" + num(h - 8) + "\" text-anchor=\"middle\">step</text>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace threewalls::notebooks_export::detail
