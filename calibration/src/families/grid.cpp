// The benchmark grid put together from the family modules (threewalls/calibration/grid.hpp): the op
// rows row by row of families.def, the grids in its measurement order.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "module.hpp"

namespace threewalls::calibration::bench {

namespace {

using detail::ModuleGrid;

struct GridRow {
  const ModuleGrid& grid;
  std::string group;
};

// The rows of the family table: each module's grid and calibrate group.
const std::vector<GridRow>& family_rows() {
  static const std::vector<GridRow> rows = {
#define THREEWALLS_CALIBRATION_FAMILY(module, group) {detail::module##_grid(), #group},
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_FAMILY
  };
  return rows;
}

struct MeasuredGrid {
  const ModuleGrid& grid;
  std::string_view module;
  int part;
};

// The rows of the measurement order.
const std::vector<MeasuredGrid>& measurement_order() {
  static const std::vector<MeasuredGrid> rows = {
#define THREEWALLS_CALIBRATION_GRID(module, part) {detail::module##_grid(), #module, part},
#include "threewalls/calibration/families.def"
#undef THREEWALLS_CALIBRATION_GRID
  };
  return rows;
}

const std::string& group_of(const MeasuredGrid& m) {
  for (const auto& row : family_rows()) {
    if (&row.grid == &m.grid) return row.group;
  }
  throw std::logic_error("families.def: the measurement order names '" + std::string(m.module) +
                         "', which has no row in the family table");
}

}  // namespace

const char* to_string(Mode m) { return m == Mode::quick ? "quick" : "full"; }

double PointSpec::param(std::string_view key) const {
  for (const auto& p : params) {
    if (p.key == key) return p.value;
  }
  throw std::logic_error("calibration point " + op + " has no parameter '" + std::string(key) + "'");
}

std::int64_t PointSpec::iparam(std::string_view key) const {
  return static_cast<std::int64_t>(std::llround(param(key)));
}

std::string PointSpec::label() const {
  std::string s = op;
  for (const auto& p : params) {
    s += " " + p.key + "=";
    if (p.value == std::floor(p.value) && std::fabs(p.value) < 1e15) {
      s += std::to_string(static_cast<std::int64_t>(p.value));
    } else {
      s += std::to_string(p.value);
    }
  }
  if (held_out) s += " [held-out]";
  return s;
}

void plan_grids(GridPlan& plan, const std::set<std::string>& only) {
  for (const auto& m : measurement_order()) {
    if (only.empty() || only.count(group_of(m)) != 0) m.grid.plan(plan, m.part);
  }
}

const std::vector<OpInfo>& benchmark_ops() {
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> out;
    for (const auto& row : family_rows()) {
      const std::size_t first = out.size();
      row.grid.add_ops(out);
      for (std::size_t i = first; i < out.size(); ++i) out[i].group = row.group;
    }
    return out;
  }();
  return ops;
}

const std::vector<std::string>& benchmark_groups() {
  static const std::vector<std::string> groups = [] {
    std::vector<std::string> g;
    for (const auto& row : family_rows()) {
      if (std::find(g.begin(), g.end(), row.group) == g.end()) g.push_back(row.group);
    }
    return g;
  }();
  return groups;
}

}  // namespace threewalls::calibration::bench
