#include "threewalls/calibration/bench/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/fit.hpp"
#include "threewalls/calibration/kernel_terms.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/profile_builder.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/core/vocabulary.hpp"

namespace threewalls::calibration::bench {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string pct(double v) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * v);
  return b;
}

std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// The inputs family `f` fits and predicts a record by: its point's inputs, except for the norm
// kernel_terms families, which read rows and hidden from the parameters of the `norm` family's points
// (whose inputs are bytes; their raw records carry rows and hidden as parameters).
std::vector<double> inputs_for(const Record& r, const std::string& f) {
  if (r.point.family == "norm") {
    if (const KernelTermsFamily* k = norm_kernel_terms_family(r.point.op); k && k->name == f) {
      std::vector<double> in;
      for (const auto& i : k->inputs) in.push_back(r.point.param(i.key));
      return in;
    }
  }
  return r.point.inputs;
}

// The prediction the simulator would make for a point (through CostModel).
double predict(const CostModel& cm, const Record& r, const std::string& f) {
  const std::optional<Seconds> t = cm.predict_point(f, inputs_for(r, f));
  if (!t) throw std::logic_error("no held-out prediction for family " + f);
  return t->value;
}

void add_points(ProfileBuilder& b, const std::map<std::string, std::vector<const Record*>>& fit,
                const std::string& family) {
  const auto it = fit.find(family);
  if (it == fit.end()) return;
  for (const Record* r : it->second) {
    Measurement m = r->measurement();
    m.samples_s.clear();  // the raw samples live in the raw output; the profile keeps the statistics
    b.add_point(family, inputs_for(*r, family), std::move(m));
  }
}

std::string ops_of(const std::vector<const Record*>& recs) {
  std::set<std::string> ops;
  for (const Record* r : recs) ops.insert(r->point.op);
  return join(std::vector<std::string>(ops.begin(), ops.end()));
}

struct Ref {
  double gemm_bf16_tflops = 0;  // best large-shape bf16 GEMM (the range's high end)
  double gemm_bf16_low_tflops = 0;
  std::string gemm_text;
  double hbm_tb_per_s = 0;      // HBM copy read+write
  double pinned_gb_per_s = 55;  // PCIe pinned H2D/D2H >= 16 MiB
  double pageable_h2d_gb_per_s = 0;
  std::map<std::pair<std::string, int>, double> busbw;  // (collective, n) -> GB/s at 1 GiB
};

Ref reference_for(const std::string& kind) {
  Ref r;
  if (kind == "h200") {
    r.gemm_bf16_tflops = 890;
    r.gemm_bf16_low_tflops = 770;
    r.gemm_text = "770-890";
    r.hbm_tb_per_s = 4.0;
    r.pageable_h2d_gb_per_s = 16;
    r.busbw = {{{"all_reduce", 2}, 321}, {{"all_reduce", 4}, 355}, {{"all_to_all", 2}, 320}, {{"all_to_all", 4}, 336}};
  } else if (kind == "h100") {
    r.gemm_bf16_tflops = 740;
    r.gemm_bf16_low_tflops = 670;
    r.gemm_text = "670-740";
    r.hbm_tb_per_s = 3.0;
  }
  return r;
}

}  // namespace

std::string why_not_measured(const std::string& family, int gpus_used, const std::string& mode) {
  if (family == copy_family(CopyKind::disk_read) && mode == "quick")
    return "the quick mode does not measure the disk tier";
  if (family == "host.framework_op") return "an eager framework's per-op dispatch (PyTorch) is not run by threewalls";
  if (starts_with(family, "collective.") && family.size() > 8 &&
      family.compare(family.size() - 8, 8, ".network") == 0) {
    return "network-scope collectives need more than one node";
  }
  if (starts_with(family, "collective.") && gpus_used == 1) {
    return "one GPU was used: collectives need a group of 2 GPUs or more";
  }
  if ((family == kNcclInterferenceFamily || family == kNcclMemoryFamily) && gpus_used < 2) {
    return "one GPU was used: needs 2 GPUs (GPU 1 is the NCCL peer); the simulator applies no slowdown beside NCCL "
           "kernels and the memory model keeps its fixed NCCL constants";
  }
  if (family == kDeviceMemoryFamily) {
    return "the calibrate group device did not run; the memory model keeps its fixed constants for the CUDA context "
           "and the libraries' handles";
  }
  if (family == "grouped_gemm.fp8")
    return "the backend has no fp8 grouped GEMM (an fp8 grouped op is an error in threewalls run)";
  if (starts_with(family, "gemm.fp32") || starts_with(family, "grouped_gemm.fp32"))
    return "the backend runs no fp32 GEMMs";
  return "not measured in this calibration run (see the raw output for errors or skipped points)";
}

std::string PeakFigure::verdict() const {
  if (reference <= 0.0) return "";
  const double low = reference_low > 0.0 ? reference_low : reference;
  if (measured > 1.05 * reference) return "above the reference by more than 5%";
  if (reference_low > 0.0 && measured >= low) return "within the range";
  if (measured >= 0.95 * low) return reference_low > 0.0 ? "within 5% of the range's low end" : "within 5%";
  return reference_low > 0.0 ? "below 95% of the range's low end" : "below 95%";
}

std::vector<PeakFigure> peak_figures(const std::vector<Record>& records, const std::string& gpu_kind) {
  const Ref ref = reference_for(gpu_kind);
  const std::string kind_up = gpu_kind == "h200" ? "H200" : gpu_kind == "h100" ? "H100" : gpu_kind;
  std::vector<PeakFigure> out;
  auto best = [&](const std::string& op, auto rate) {
    const Record* b = nullptr;
    double v = 0.0;
    for (const auto& r : records) {
      if (r.point.op != op || !r.usable()) continue;
      const double x = rate(r);
      if (x > v) {
        v = x;
        b = &r;
      }
    }
    return std::pair{b, v};
  };
  auto largest = [&](const std::string& op) {
    const Record* b = nullptr;
    for (const auto& r : records) {
      if (r.point.op == op && r.usable() && (!b || r.point.bytes > b->point.bytes)) b = &r;
    }
    return b;
  };
  auto refs = [&](double v, const std::string& text) {
    return v > 0.0 ? text + " (reference facts, " + kind_up + ")" : std::string("no reference fact for ") + kind_up;
  };
  if (auto [r, v] = best("gemm_bf16", [](const Record& x) { return x.point.flops / x.median_s() / 1e12; }); r) {
    out.push_back({"bf16 GEMM, best grid point", "TFLOP/s", v, r->point.label(), ref.gemm_bf16_tflops,
                   ref.gemm_bf16_low_tflops, refs(ref.gemm_bf16_tflops, ref.gemm_text)});
  }
  if (auto [r, v] = best("gemm_fp8", [](const Record& x) { return x.point.flops / x.median_s() / 1e12; }); r) {
    out.push_back({"fp8 GEMM, best grid point", "TFLOP/s", v, r->point.label(), 0.0, 0.0, refs(0.0, "")});
  }
  if (const Record* r = largest(copy_op_name(CopyKind::d2d))) {
    out.push_back({"HBM copy (read + write)", "TB/s", 2.0 * r->point.bytes / r->median_s() / 1e12, r->point.label(),
                   ref.hbm_tb_per_s, 0.0, refs(ref.hbm_tb_per_s, fixed(ref.hbm_tb_per_s, 1))});
  }
  for (const CopyKind k :
       {CopyKind::h2d_pinned, CopyKind::d2h_pinned, CopyKind::h2d_pageable, CopyKind::d2h_pageable}) {
    if (const Record* r = largest(copy_op_name(k))) {
      const bool pinned = k == CopyKind::h2d_pinned || k == CopyKind::d2h_pinned;
      const bool h2d = k == CopyKind::h2d_pinned || k == CopyKind::h2d_pageable;
      const double rv = pinned ? ref.pinned_gb_per_s : (h2d ? ref.pageable_h2d_gb_per_s : 0.0);
      out.push_back({std::string(h2d ? "H2D " : "D2H ") + (pinned ? "pinned" : "pageable") + ", largest size", "GB/s",
                     r->point.bytes / r->median_s() / 1e9, r->point.label(), rv, 0.0, refs(rv, fixed(rv, 0))});
    }
  }
  // NCCL bus bandwidth at 1 GiB (the grid point nearest to it) per collective and group size.
  std::map<std::pair<std::string, int>, const Record*> at_1g;
  for (const auto& r : records) {
    const OpInfo* op = find_op(r.point.op);
    if (!op || op->group != "collective" || !r.usable() || r.point.held_out) continue;
    auto& cur = at_1g[{r.point.op, r.point.group_size}];
    if (!cur || std::fabs(std::log(r.point.bytes / kGiB)) < std::fabs(std::log(cur->point.bytes / kGiB))) cur = &r;
  }
  for (const auto& [key, r] : at_1g) {
    if (std::fabs(std::log(r->point.bytes / kGiB)) > 0.1) continue;  // the grid did not reach 1 GiB
    const auto it = ref.busbw.find(key);
    const double rv = it == ref.busbw.end() ? 0.0 : it->second;
    out.push_back({"NCCL " + key.first + " busbw at 1 GiB, " + std::to_string(key.second) + " GPUs", "GB/s",
                   bus_bandwidth(key.first, key.second, r->point.bytes, r->median_s()) / 1e9, r->point.label(), rv,
                   0.0, refs(rv, fixed(rv, 0))});
  }
  return out;
}

CalibrationReport build_report(const std::vector<Record>& records, const BuildOptions& options) {
  CalibrationReport rep;
  std::map<std::string, std::vector<const Record*>> fit, held, failed;
  for (const auto& r : records) {
    ++rep.records;
    if (r.status == Status::ok) ++rep.ok;
    if (r.status == Status::error) ++rep.errors;
    if (r.status == Status::skipped) ++rep.skipped;
    if (!r.usable()) {
      failed[r.point.family].push_back(&r);
    } else if (r.point.held_out) {
      held[r.point.family].push_back(&r);
    } else {
      fit[r.point.family].push_back(&r);
    }
    // A memory-bound kernel's points also fit the family of that kernel alone (profile.hpp,
    // kMemoryKernelFamilies): the pooled family mixes kernels whose bandwidths differ by 7x.
    if (r.usable() && (r.point.family == "elementwise" || r.point.family == "norm") &&
        is_memory_kernel_family(r.point.op)) {
      (r.point.held_out ? held : fit)[r.point.op].push_back(&r);
    }
    // A norm's points also fit its kernel_terms family by rows and hidden (kernel_terms.hpp).
    if (r.usable() && r.point.family == "norm") {
      if (const KernelTermsFamily* k = norm_kernel_terms_family(r.point.op)) {
        (r.point.held_out ? held : fit)[k->name].push_back(&r);
      }
    }
  }

  // Families in fit order; a family whose points cannot be fitted is dropped (with its reason).
  std::vector<std::string> families;
  for (const auto& s : family_specs()) {
    if (fit.count(s.name)) families.push_back(s.name);
  }
  // Collective group sizes this machine cannot form (a 2-GPU box, a profile of a 4- or 8-GPU one):
  // the points of the larger groups come from the first measured fill profile that has them, and are
  // fitted with this run's (the model is fitted per group size, docs/calibration.md).
  struct Borrowed {
    std::vector<Point> points;
    std::set<int> sizes;
    std::string from;
  };
  std::map<std::string, Borrowed> borrowed;
  for (const auto& [name, recs] : fit) {
    if (!starts_with(name, "collective.")) continue;
    int largest = 0;
    for (const Record* r : recs) largest = std::max(largest, r->point.group_size);
    for (const Profile& from : options.fill_from) {
      if (from.info().source != "measured") continue;
      const Family* f = from.find(name);
      if (!f) continue;
      Borrowed b;
      for (const Point& pt : f->points) {
        const int n = static_cast<int>(pt.inputs.at(0));
        if (n <= largest) continue;
        b.points.push_back(pt);
        b.sizes.insert(n);
      }
      if (b.points.empty()) continue;
      b.from = from.id() + " (" + from.hardware().gpu_name + " x" + std::to_string(from.hardware().gpus_seen) + ", " +
               from.hardware().date + ")";
      borrowed[name] = std::move(b);
      break;
    }
  }
  std::map<std::string, std::string> dropped;
  auto make_builder = [&](const std::vector<std::string>& names) {
    ProfileBuilder b(options.info, options.hardware);
    for (const auto& n : names) {
      add_points(b, fit, n);
      if (const auto it = borrowed.find(n); it != borrowed.end()) {
        for (const Point& pt : it->second.points) b.add_point(n, pt.inputs, pt.time);
      }
    }
    return b;
  };
  std::optional<Profile> built;
  try {
    built = make_builder(families).build();
  } catch (const InputError&) {
    // Find the culprits one family at a time, each with the families it reads.
    std::vector<std::string> kept;
    std::vector<std::string> order = families;
    std::stable_sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
      return find_family_spec(a)->fit_stage < find_family_spec(b)->fit_stage;
    });
    for (const auto& f : order) {
      std::vector<std::string> trial{f};
      for (const auto& d : find_family_spec(f)->reads) {
        if (std::find(kept.begin(), kept.end(), d) != kept.end()) trial.push_back(d);
      }
      try {
        (void)make_builder(trial).build();
        kept.push_back(f);
      } catch (const InputError& e) {
        dropped[f] = e.what();
      }
    }
    if (kept.empty()) throw InputError("calibration: no family could be fitted from the measured points");
    built = make_builder(kept).build();
  }

  // Held-out errors through the CostModel (what the simulator evaluates).
  const CostModel cm(*built);
  std::vector<Family> fams = built->families();
  for (auto& f : fams) {
    FamilyReport fr;
    fr.name = f.name;
    fr.fit_points = f.points.size();
    fr.quality = f.quality;
    if (auto it = failed.find(f.name); it != failed.end()) fr.failed_points = it->second.size();
    std::vector<double> pred, meas;
    if (auto it = held.find(f.name); it != held.end()) {
      for (const Record* r : it->second) {
        pred.push_back(predict(cm, *r, f.name));
        meas.push_back(r->median_s());
      }
    }
    if (!meas.empty()) {
      const auto e = fit::relative_error_stats(pred, meas);
      fr.held_out_points = e.count;
      fr.held_out_median = e.median;
      fr.held_out_max = e.max;
    }
    const auto& recs = fit.at(f.name);
    // host.timing_marker points appended from calibration/tools/timed_op_gap.cu (before calibrate measured
    // it) say so in their check; calibrate's own say "every marker completed".
    const bool by_tool = f.name == "host.timing_marker" && !recs.empty() &&
                         std::all_of(recs.begin(), recs.end(), [](const Record* x) {
                           return x->check.find("timed_op_gap") != std::string::npos;
                         });
    // PyTorch's kernels come from the Python package's benchmark, whose raw output is refitted here.
    const KernelTermsFamily* kt = find_kernel_terms_family(f.name);
    const bool by_python = kt != nullptr && kt->points_of == "python";
    std::string note =
        (by_tool     ? std::string("measured by calibration/tools/timed_op_gap.cu, appended to the raw output of "
                                       "threewalls calibrate (")
         : by_python ? std::string("measured by python3 -m threewalls.bench.pytorch_kernels (PyTorch's kernels; ")
                     : std::string("measured by threewalls calibrate (")) +
        options.mode + ") on " + options.hardware.gpu_name + ", " + options.hardware.date + ": " +
        std::to_string(recs.size()) + " points (" + ops_of(recs) + ")";
    if (fr.held_out_points > 0) {
      note += "; " + std::to_string(fr.held_out_points) + " held-out points, not fitted, predicted with median error " +
              pct(fr.held_out_median) + ", max " + pct(fr.held_out_max);
    }
    if (fr.failed_points > 0)
      note += "; " + std::to_string(fr.failed_points) + " points failed or skipped (raw output)";
    if (const auto it = borrowed.find(f.name); it != borrowed.end()) {
      std::string sizes;
      for (const int n : it->second.sizes) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
      note += "; group sizes " + sizes + " NOT MEASURED on this machine (" + std::to_string(options.gpus_used) +
              " GPUs): their " + std::to_string(it->second.points.size()) + " points come from " + it->second.from;
      fr.why = "group sizes " + sizes + " from " + it->second.from;
    }
    f.note = note;
    rep.families.push_back(fr);
  }
  // Families not measured: copied from the fill profile, saying so.
  std::set<std::string> copied_names;
  for (const Profile& from : options.fill_from) {
    for (const auto& f : from.families()) {
      if (built->find(f.name) || copied_names.count(f.name)) continue;
      copied_names.insert(f.name);
      Family c = f;
      const std::string why = dropped.count(f.name) ? "its points could not be fitted: " + dropped.at(f.name)
                                                    : why_not_measured(f.name, options.gpus_used, options.mode);
      c.note = "NOT MEASURED on this machine (" + why + "): copied from " + from.id() +
               (c.note.empty() ? "" : ". Its note: " + c.note);
      FamilyReport fr;
      fr.name = f.name;
      fr.measured = false;
      fr.why = "copied from " + from.info().name + " (" + from.id() + "): " + why;
      fr.fit_points = f.points.size();
      fr.quality = f.quality;
      rep.families.push_back(fr);
      fams.push_back(std::move(c));
    }
  }
  // Optional families no fill profile has: say that they were not measured, and why.
  for (const std::string_view opt : {kNcclInterferenceFamily, kNcclMemoryFamily, kDeviceMemoryFamily}) {
    bool listed = dropped.count(std::string(opt)) != 0;
    for (const auto& fr : rep.families) listed = listed || fr.name == opt;
    if (listed) continue;
    FamilyReport fr;
    fr.name = std::string(opt);
    fr.measured = false;
    fr.why = why_not_measured(fr.name, options.gpus_used, options.mode);
    rep.families.push_back(fr);
  }
  for (const auto& [name, why] : dropped) {
    bool copied = false;
    for (const auto& fr : rep.families) copied = copied || (fr.name == name && !fr.measured);
    if (copied) continue;
    FamilyReport fr;
    fr.name = name;
    fr.measured = false;
    fr.why = "dropped: " + why;
    rep.families.push_back(fr);
  }
  rep.profile = Profile(options.info, options.hardware, std::move(fams));
  (void)Profile::parse(rep.profile.to_toml(), "<calibrated profile " + options.info.name + ">");
  rep.peaks = peak_figures(records, options.hardware.gpu_kind);
  return rep;
}

std::string summary_text(const CalibrationReport& rep) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "calibration: %zu points: %zu ok, %zu failed, %zu skipped; profile %s\n\n",
                rep.records, rep.ok, rep.errors, rep.skipped, rep.profile.id().c_str());
  s += line;
  std::snprintf(line, sizeof line, "%-32s %6s %5s  %-15s  %-15s  %-15s\n", "family", "fit", "held", "fit err med/max",
                "LOO med/max", "held-out med/max");
  s += line;
  for (const auto& f : rep.families) {
    if (!f.measured) continue;
    std::snprintf(line, sizeof line, "%-32s %6zu %5zu  %-15s  %-15s  %-15s%s\n", f.name.c_str(), f.fit_points,
                  f.held_out_points, (pct(f.quality.rel_err_median) + " / " + pct(f.quality.rel_err_max)).c_str(),
                  (pct(f.quality.loo_rel_err_median) + " / " + pct(f.quality.loo_rel_err_max)).c_str(),
                  f.held_out_points ? (pct(f.held_out_median) + " / " + pct(f.held_out_max)).c_str() : "-",
                  f.failed_points ? ("  (" + std::to_string(f.failed_points) + " failed/skipped)").c_str() : "");
    s += line;
  }
  bool partial = false;
  for (const auto& f : rep.families) {
    if (!f.measured || f.why.empty()) continue;
    if (!partial) s += "\npartly measured here (the fit points include an earlier profile's):\n";
    partial = true;
    s += "  " + f.name + ": " + f.why + "\n";
  }
  bool header = false;
  for (const auto& f : rep.families) {
    if (f.measured) continue;
    if (!header) s += "\nnot measured here:\n";
    header = true;
    s += "  " + f.name + ": " + f.why + "\n";
  }
  s += "\n";
  std::snprintf(line, sizeof line, "%-44s %12s  %-34s %s\n", "peak figure", "measured", "reference", "ratio");
  s += line;
  for (const auto& p : rep.peaks) {
    std::snprintf(line, sizeof line, "%-44s %8.1f %-4s %-34s %s\n", p.what.c_str(), p.measured, p.unit.c_str(),
                  p.reference_text.c_str(),
                  p.reference > 0.0 ? (fixed(p.ratio(), 3) + " (" + p.verdict() + ")").c_str() : "-");
    s += line;
  }
  return s;
}

OrderedJson summary_json(const CalibrationReport& rep) {
  OrderedJson j;
  j["profile_id"] = rep.profile.id();
  j["points"] = {{"total", rep.records}, {"ok", rep.ok}, {"error", rep.errors}, {"skipped", rep.skipped}};
  auto num = [](double v) { return std::isfinite(v) ? OrderedJson(v) : OrderedJson(nullptr); };
  OrderedJson fams = OrderedJson::array();
  for (const auto& f : rep.families) {
    OrderedJson x;
    x["family"] = f.name;
    x["measured"] = f.measured;
    if (!f.why.empty()) x["why"] = f.why;
    x["fit_points"] = f.fit_points;
    x["held_out_points"] = f.held_out_points;
    x["failed_points"] = f.failed_points;
    x["rel_err_median"] = num(f.quality.rel_err_median);
    x["rel_err_max"] = num(f.quality.rel_err_max);
    x["loo_rel_err_median"] = num(f.quality.loo_rel_err_median);
    x["loo_rel_err_max"] = num(f.quality.loo_rel_err_max);
    x["held_out_rel_err_median"] = num(f.held_out_median);
    x["held_out_rel_err_max"] = num(f.held_out_max);
    fams.push_back(x);
  }
  j["families"] = fams;
  OrderedJson peaks = OrderedJson::array();
  for (const auto& p : rep.peaks) {
    peaks.push_back({{"what", p.what},
                     {"unit", p.unit},
                     {"measured", p.measured},
                     {"at", p.at},
                     {"reference", num(p.reference > 0 ? p.reference : std::nan(""))},
                     {"reference_text", p.reference_text},
                     {"ratio", num(p.reference > 0 ? p.ratio() : std::nan(""))},
                     {"verdict", p.verdict()}});
  }
  j["peaks"] = peaks;
  return j;
}

}  // namespace threewalls::calibration::bench
