#include "threewalls/calibration/profile_builder.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "families/module.hpp"
#include "threewalls/calibration/fit.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"

namespace threewalls::calibration {

namespace {

const FamilySpec& spec_or_throw(std::string_view family) {
  if (const FamilySpec* s = find_family_spec(family)) return *s;
  std::vector<std::string> names;
  for (const auto& s : family_specs()) names.push_back(s.name);
  std::string msg = "unknown calibration family '" + std::string(family) + "'";
  if (auto near = nearest(family, names)) msg += " (did you mean '" + *near + "'?)";
  msg += "; known: " + join(names);
  throw InputError(msg);
}

// Errors are kept to 1e-6 (absolute) and 4 significant digits: below that they are floating-point
// noise, which would make the file differ between machines.
double round_error(double v) {
  if (!std::isfinite(v)) return v;
  return fit::round_significant(std::round(v * 1e6) / 1e6, detail::kErrorDigits);
}

}  // namespace

ProfileBuilder::ProfileBuilder(ProfileInfo info, Hardware hardware)
    : info_(std::move(info)), hardware_(std::move(hardware)) {}

void ProfileBuilder::add_point(std::string_view family, std::vector<double> inputs, Measurement time) {
  const FamilySpec& spec = spec_or_throw(family);
  const std::string where = "family " + spec.name + " point " + std::to_string(points_[spec.name].size());
  if (inputs.size() != spec.inputs.size()) {
    std::vector<std::string> keys;
    for (const auto& in : spec.inputs) keys.push_back(in.key);
    throw InputError(where + ": " + std::to_string(inputs.size()) + " inputs given, the family takes " +
                     std::to_string(keys.size()) + (keys.empty() ? "" : " (" + join(keys) + ")"));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = spec.inputs[i];
    if (!std::isfinite(inputs[i]) || inputs[i] < 0)
      throw InputError(where + ": '" + in.key + "' must be a finite number >= 0");
    if (in.integer && (inputs[i] != std::floor(inputs[i]) || inputs[i] > 9.007199254740992e15)) {
      throw InputError(where + ": '" + in.key + "' must be an integer");
    }
  }
  const auto& t = time;
  if (!(t.median_s > 0 && t.p10_s > 0 && t.p90_s > 0) || !std::isfinite(t.p90_s) || !(t.p10_s <= t.median_s) ||
      !(t.median_s <= t.p90_s) || t.count < 1) {
    throw InputError(where + ": the measurement needs 0 < p10_s <= median_s <= p90_s and count >= 1");
  }
  if (!t.samples_s.empty() && static_cast<std::int64_t>(t.samples_s.size()) != t.count) {
    throw InputError(where + ": samples_s has " + std::to_string(t.samples_s.size()) +
                     " entries but count = " + std::to_string(t.count));
  }
  for (double s : t.samples_s) {
    if (!(s > 0) || !std::isfinite(s)) throw InputError(where + ": samples_s entries must be positive seconds");
  }
  points_[spec.name].push_back(Point{std::move(inputs), std::move(time)});
}

void ProfileBuilder::add_gemm(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                              Measurement time) {
  add_point(gemm_family(dt),
            {static_cast<double>(m), static_cast<double>(n), static_cast<double>(k), static_cast<double>(batch)},
            std::move(time));
}

void ProfileBuilder::add_grouped_gemm(DType dt, std::int64_t groups, std::int64_t total_rows, std::int64_t max_rows,
                                      std::int64_t n, std::int64_t k, Measurement time) {
  add_point(grouped_gemm_family(dt),
            {static_cast<double>(groups), static_cast<double>(total_rows), static_cast<double>(max_rows),
             static_cast<double>(n), static_cast<double>(k)},
            std::move(time));
}

void ProfileBuilder::add_attention(const AttentionShape& s, bool backward, Measurement time) {
  add_point(attention_family(backward),
            {static_cast<double>(s.batch), static_cast<double>(s.seq_q), static_cast<double>(s.seq_kv),
             static_cast<double>(s.heads), static_cast<double>(s.kv_heads), static_cast<double>(s.head_dim_qk),
             static_cast<double>(s.head_dim_v), s.causal ? 1.0 : 0.0},
            std::move(time));
}

void ProfileBuilder::add_elementwise(Bytes bytes, Measurement time) {
  add_point(kElementwiseFamily, {std::round(bytes.value)}, std::move(time));
}

void ProfileBuilder::add_norm(Bytes bytes, Measurement time) {
  add_point(kNormFamily, {std::round(bytes.value)}, std::move(time));
}

void ProfileBuilder::add_copy(CopyKind dir, Bytes bytes, Measurement time) {
  add_point(copy_family(dir), {std::round(bytes.value)}, std::move(time));
}

void ProfileBuilder::add_collective(Collective kind, LinkScope scope, int group_size, Bytes bytes, Measurement time) {
  add_point(collective_family(kind, scope), {static_cast<double>(group_size), std::round(bytes.value)},
            std::move(time));
}

void ProfileBuilder::add_host(std::string_view what, Measurement time) {
  add_point(host_family(what), {}, std::move(time));
}

void ProfileBuilder::add_concurrency(int streams, double sm_fraction, Seconds serial, Measurement time) {
  add_point(kConcurrencyFamily, {static_cast<double>(streams), sm_fraction, serial.value}, std::move(time));
}

void ProfileBuilder::set_note(std::string_view family, std::string note) {
  const FamilySpec& spec = spec_or_throw(family);
  notes_[spec.name] = std::move(note);
}

Profile ProfileBuilder::build() const {
  for (const auto& [name, note] : notes_) {
    if (!points_.count(name)) throw InputError("family " + name + ": has a note but no points");
  }
  std::vector<const FamilySpec*> order;
  for (const auto& s : family_specs()) {
    if (points_.count(s.name)) order.push_back(&s);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const FamilySpec* a, const FamilySpec* b) { return a->fit_stage < b->fit_stage; });
  if (order.empty()) throw InputError("calibration profile " + info_.name + ": no points were added");

  std::vector<Family> fitted;
  fitted.reserve(order.size());
  detail::FitContext ctx;
  ctx.hardware = &hardware_;
  ctx.find = [&fitted](std::string_view name) -> const Family* {
    for (const auto& f : fitted) {
      if (f.name == name) return &f;
    }
    return nullptr;
  };
  for (const FamilySpec* spec : order) {
    const auto& pts = points_.at(spec->name);
    Family f;
    f.name = spec->name;
    if (auto it = notes_.find(spec->name); it != notes_.end()) f.note = it->second;
    f.points = pts;
    try {
      f.params = detail::fit_params(*spec, pts, ctx);
    } catch (const FitImpossible& e) {
      throw InputError("family " + spec->name + ": cannot fit " + spec->model + ": " + e.what());
    } catch (const std::invalid_argument& e) {
      throw InputError("family " + spec->name + ": cannot fit " + spec->model + ": " + e.what());
    }
    std::vector<double> measured;
    std::vector<double> predicted;
    for (const auto& p : pts) {
      measured.push_back(detail::measured_value(*spec, p));
      predicted.push_back(detail::predict(*spec, f.params, p, hardware_));
    }
    const auto err = fit::relative_error_stats(predicted, measured);
    const auto loo = fit::leave_one_out(
        pts.size(),
        [&](std::size_t i) -> std::optional<double> {
          std::vector<Point> rest;
          rest.reserve(pts.size() - 1);
          for (std::size_t j = 0; j < pts.size(); ++j) {
            if (j != i) rest.push_back(pts[j]);
          }
          if (rest.empty()) return std::nullopt;
          try {
            return detail::predict(*spec, detail::fit_params(*spec, rest, ctx), pts[i], hardware_);
          } catch (const FitImpossible&) {
            return std::nullopt;
          } catch (const std::invalid_argument&) {
            return std::nullopt;
          }
        },
        measured);
    f.quality.rel_err_median = round_error(err.median);
    f.quality.rel_err_max = round_error(err.max);
    f.quality.loo_rel_err_median = round_error(loo.median);
    f.quality.loo_rel_err_max = round_error(loo.max);
    f.quality.loo_points = static_cast<std::int64_t>(loo.count);
    fitted.push_back(std::move(f));
  }
  Profile built(info_, hardware_, std::move(fitted));
  // What we hand out must be what a reader accepts: check it through the reader itself.
  (void)Profile::parse(built.to_toml(), "<profile " + info_.name + " being built>");
  return built;
}

Profile merge_families(const Profile& into, const Profile& from, const std::vector<std::string>& names) {
  if (into.hardware().gpu_kind != from.hardware().gpu_kind) {
    throw InputError("merge: " + from.describe() + " is of GPU kind '" + from.hardware().gpu_kind + "', " +
                     into.describe() + " of '" + into.hardware().gpu_kind + "'; allowed: profiles of one GPU kind");
  }
  if (names.empty()) throw InputError("merge: no family named; allowed: families of " + from.describe());
  ProfileBuilder b(into.info(), into.hardware());
  std::set<std::string> added;
  for (const auto& name : names) {
    if (!find_family_spec(name)) {
      std::vector<std::string> known;
      for (const auto& s : family_specs()) known.push_back(s.name);
      std::string msg = "merge: unknown family '" + name + "'";
      if (auto near = nearest(name, known)) msg += " (did you mean '" + *near + "'?)";
      throw InputError(msg);
    }
    const Family& f = from.family(name);  // InputError naming `from` and what it has
    if (!added.insert(name).second) throw InputError("merge: family '" + name + "' named twice");
    for (const Point& pt : f.points) b.add_point(name, pt.inputs, pt.time);
    b.set_note(name, f.note + (f.note.empty() ? "" : "; ") + "merged from " + from.id() +
                         (from.path().empty() ? "" : " (" + from.path() + ")"));
  }
  for (const auto& name : names) {
    for (const auto& r : find_family_spec(name)->reads) {
      if (added.count(r)) continue;
      if (const Family* dep = into.find(r)) {
        for (const Point& pt : dep->points) b.add_point(r, pt.inputs, pt.time);
        added.insert(r);
      }
    }
  }
  Profile built;
  try {
    built = b.build();
  } catch (const InputError& e) {
    throw InputError("merge into " + into.describe() + ": " + e.what());
  }
  std::vector<Family> families;
  for (const Family& f : into.families()) {
    if (std::find(names.begin(), names.end(), f.name) == names.end()) families.push_back(f);
  }
  for (const auto& name : names) families.push_back(built.family(name));
  return Profile(into.info(), into.hardware(), std::move(families));
}

}  // namespace threewalls::calibration
