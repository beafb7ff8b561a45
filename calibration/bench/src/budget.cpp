#include "threewalls/calibration/bench/budget.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace threewalls::calibration::bench {

Budget::Budget(double total_s, std::vector<Section> sections, double min_point_s, double max_point_s,
               double hard_factor)
    : total_(total_s), min_point_(min_point_s), max_point_(max_point_s), hard_factor_(hard_factor) {
  if (!(total_s > 0.0) || !(min_point_s > 0.0) || max_point_s < min_point_s || hard_factor < 1.0) {
    throw std::invalid_argument("Budget: need total > 0, 0 < min_point <= max_point and hard_factor >= 1");
  }
  for (auto& s : sections) {
    if (!(s.share > 0.0) || s.points < 0)
      throw std::invalid_argument("Budget: section " + s.name + " needs share > 0, points >= 0");
    sections_.push_back(State{std::move(s)});
  }
}

Budget::State& Budget::state(const std::string& name) {
  for (auto& s : sections_) {
    if (s.s.name == name) return s;
  }
  throw std::logic_error("Budget: unknown section '" + name + "'");
}

const Budget::State& Budget::state(const std::string& name) const {
  for (const auto& s : sections_) {
    if (s.s.name == name) return s;
  }
  throw std::logic_error("Budget: unknown section '" + name + "'");
}

void Budget::begin(const std::string& section) {
  if (current_ >= 0) sections_[static_cast<std::size_t>(current_)].done = true;
  State& st = state(section);
  if (st.begun) throw std::logic_error("Budget: section '" + section + "' begun twice");
  st.begun = true;
  double shares = 0.0;
  for (const auto& s : sections_) {
    if (!s.done) shares += s.s.share;
  }
  const double remaining = std::max(0.0, total_ - spent_total_);
  st.alloc = shares > 0.0 ? remaining * st.s.share / shares : 0.0;
  current_ = static_cast<int>(&st - sections_.data());
}

const std::string& Budget::current() const {
  if (current_ < 0) throw std::logic_error("Budget: no section begun");
  return sections_[static_cast<std::size_t>(current_)].s.name;
}

double Budget::point_bound() const {
  if (current_ < 0) throw std::logic_error("Budget: no section begun");
  const State& st = sections_[static_cast<std::size_t>(current_)];
  const int left = std::max(1, st.s.points - st.points_done);
  return std::clamp((st.alloc - st.spent) / left, min_point_, max_point_);
}

void Budget::spend(double seconds, bool count_point) {
  if (current_ < 0) throw std::logic_error("Budget: no section begun");
  State& st = sections_[static_cast<std::size_t>(current_)];
  const double s = std::max(0.0, seconds);
  st.spent += s;
  spent_total_ += s;
  if (count_point) ++st.points_done;
}

std::string Budget::skip_reason() const {
  if (current_ < 0) throw std::logic_error("Budget: no section begun");
  const State& st = sections_[static_cast<std::size_t>(current_)];
  char buf[200];
  if (spent_total_ >= hard_factor_ * total_) {
    std::snprintf(buf, sizeof buf, "skipped: the calibration's time budget is spent (%.0f s of %.0f s)", spent_total_,
                  total_);
    return buf;
  }
  if (st.spent >= 1.5 * st.alloc) {
    std::snprintf(buf, sizeof buf, "skipped: section '%s' spent %.1f s of its %.1f s (1.5x its allocation)",
                  st.s.name.c_str(), st.spent, st.alloc);
    return buf;
  }
  return {};
}

double Budget::allocated(const std::string& section) const { return state(section).alloc; }
double Budget::spent(const std::string& section) const { return state(section).spent; }

}  // namespace threewalls::calibration::bench
