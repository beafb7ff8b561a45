#pragma once
// The calibration's time budget (host-only; times are passed in, so tests drive it with a fake
// clock). A calibration is split into sections (the op groups of plan.hpp, in plan order), each
// with a share of the total. When a section begins it is allocated
//     alloc(s) = remaining_total * share(s) / (sum of the shares of s and every later section)
// so that time a section leaves unused flows to the sections after it. The next point of a section
// may take
//     bound = clamp((alloc(s) - spent(s)) / points_left(s), min_point_s, max_point_s)
// seconds (the stop rule's time bound). A point always gets its minimum samples, so a section can
// overrun; once a section has spent 1.5 alloc(s), or the whole calibration hard_factor * total, the
// remaining points are skipped (recorded as skipped, never silently dropped).
#include <string>
#include <vector>

namespace threewalls::calibration::bench {

class Budget {
 public:
  struct Section {
    std::string name;
    double share = 1.0;
    int points = 0;
  };
  Budget(double total_s, std::vector<Section> sections, double min_point_s, double max_point_s,
         double hard_factor = 1.15);

  // Starts a section (sections may be begun in any order, each once; an unknown name is a logic error).
  void begin(const std::string& section);
  // Seconds the next point of the current section may take.
  [[nodiscard]] double point_bound() const;
  // Seconds spent in the current section: a point (count_point) or setup work.
  void spend(double seconds, bool count_point);
  // Whether the current section's remaining points must be skipped, and why (empty when not).
  [[nodiscard]] std::string skip_reason() const;

  [[nodiscard]] double total() const { return total_; }
  [[nodiscard]] double spent_total() const { return spent_total_; }
  [[nodiscard]] double allocated(const std::string& section) const;
  [[nodiscard]] double spent(const std::string& section) const;
  [[nodiscard]] const std::string& current() const;

 private:
  struct State {
    Section s;
    bool begun = false;
    bool done = false;
    double alloc = 0.0;
    double spent = 0.0;
    int points_done = 0;
  };
  State& state(const std::string& name);
  [[nodiscard]] const State& state(const std::string& name) const;

  double total_;
  double min_point_;
  double max_point_;
  double hard_factor_;
  double spent_total_ = 0.0;
  std::vector<State> sections_;
  int current_ = -1;
};

}  // namespace threewalls::calibration::bench
