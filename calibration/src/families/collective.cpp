// Family module: NCCL collectives, collective.<kind>.<scope>, model collective_hill_v1 (models.hpp
// CollectiveModel), parameters per group size with optional per-size correction knots.
#include <algorithm>

#include "decoded.hpp"
#include "grid_common.hpp"
#include "module.hpp"

namespace threewalls::calibration::detail {

namespace {

CollectiveModel collective_of(const FamilySpec& s, const Params& p) {
  CollectiveModel m;
  m.kind = s.collective;
  const auto& n = array(s, p, "group_size");
  for (std::size_t i = 0; i < n.size(); ++i) {
    CollectiveGroupParams g;
    g.group_size = static_cast<int>(as_int(n[i]));
    g.alpha_s = array(s, p, "alpha_s")[i];
    g.beta_max_bytes_per_s = array(s, p, "beta_max_bytes_per_s")[i];
    g.s_half_bytes = array(s, p, "s_half_bytes")[i];
    g.gamma = array(s, p, "gamma")[i];
    m.groups.push_back(g);
  }
  const auto& kn = array(s, p, "correction_group_size");
  for (std::size_t i = 0; i < kn.size(); ++i) {
    m.knots.push_back(
        {static_cast<int>(as_int(kn[i])), array(s, p, "correction_bytes")[i], array(s, p, "correction_log_factor")[i]});
  }
  return m;
}

void add_specs(std::vector<FamilySpec>& out) {
  for (LinkScope sc : {LinkScope::nvlink, LinkScope::network}) {
    for (Collective k : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                         Collective::all_to_all, Collective::broadcast, Collective::send_recv}) {
      FamilySpec s;
      s.name = collective_family(k, sc);
      s.model = "collective_hill_v1";
      s.collective = k;
      s.scope = sc;
      s.description = std::string("NCCL ") + to_string(k) + " over " + to_string(sc) +
                      ": t = alpha + S f(n) / beta_eff(S), beta_eff = beta_max S^g / (S^g + S_half^g), per group size";
      s.inputs = {{"group_size", true, "ranks in the group"},
                  {"bytes", true,
                   "nccl-tests size (all_reduce: buffer; all_gather: output; reduce_scatter: input; "
                   "all_to_all: bytes each rank sends; send_recv: message)"}};
      s.params = {
          {"group_size", true, true, "measured group sizes, increasing"},
          {"alpha_s", false, true, "latency per group size, seconds"},
          {"beta_max_bytes_per_s", false, true, "asymptotic bus bandwidth per group size"},
          {"s_half_bytes", false, true, "size at which the bus bandwidth is half of beta_max (0: no ramp)"},
          {"gamma", false, true, "steepness of the bandwidth ramp, in (0, 1]"},
          {"correction_group_size", true, true, "per-size correction knots (optional): group size of each knot", true},
          {"correction_bytes", false, true, "per-size correction knots: measured size S_j, bytes", true},
          {"correction_log_factor", false, true,
           "per-size correction knots: r_j = ln(measured / smooth curve), interpolated in log2 S", true}};
      out.push_back(s);
    }
  }
}

Params fit(const FamilySpec& spec, const std::vector<Point>& points, const FitContext& /*ctx*/) {
  std::vector<CollectiveModel::Sample> s;
  for (const auto& p : points) s.push_back({small_int(p.inputs[0], "group_size"), p.inputs[1], p.time.median_s});
  const auto m = CollectiveModel::fit(spec.collective, s);
  Params out(8);
  for (const auto& g : m.groups) {
    out[0].push_back(g.group_size);
    out[1].push_back(g.alpha_s);
    out[2].push_back(g.beta_max_bytes_per_s);
    out[3].push_back(g.s_half_bytes);
    out[4].push_back(g.gamma);
  }
  for (const auto& k : m.knots) {
    out[5].push_back(k.group_size);
    out[6].push_back(k.bytes);
    out[7].push_back(k.log_factor);
  }
  return round_all(out);
}

double predict_point(const FamilySpec& spec, const Params& params, const Point& p, const Hardware& /*hw*/) {
  return collective_of(spec, params).time_s(p.inputs[1], static_cast<int>(as_int(p.inputs[0])));
}

std::optional<std::string> check(const FamilySpec& spec, const Params& params) {
  auto a = [&](std::string_view k) -> const std::vector<double>& { return array(spec, params, k); };
  const auto& n = a("group_size");
  if (n.empty()) return "'group_size' needs at least one group size";
  for (const char* k : {"alpha_s", "beta_max_bytes_per_s", "s_half_bytes", "gamma"}) {
    if (a(k).size() != n.size()) return std::string("'") + k + "' must have one entry per group size";
  }
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (n[i] < 2 || n[i] > kMaxRanks || (i > 0 && !(n[i] > n[i - 1]))) {
      return "'group_size' entries must be between 2 and 1048576 and increasing";
    }
    if (a("alpha_s")[i] < 0) return "'alpha_s' entries must be >= 0";
    if (!(a("beta_max_bytes_per_s")[i] > 0)) return "'beta_max_bytes_per_s' entries must be > 0";
    if (a("s_half_bytes")[i] < 0) return "'s_half_bytes' entries must be >= 0";
    if (!(a("gamma")[i] > 0 && a("gamma")[i] <= 1)) return "'gamma' entries must be in (0, 1]";
  }
  // Optional per-size correction knots: parallel arrays, each knot of a measured group size,
  // sorted by (group size, bytes) with distinct sizes per group size.
  const auto& kn = a("correction_group_size");
  const auto& kb = a("correction_bytes");
  const auto& kr = a("correction_log_factor");
  if (kb.size() != kn.size() || kr.size() != kn.size()) {
    return "'correction_group_size', 'correction_bytes' and 'correction_log_factor' must have the same length";
  }
  for (std::size_t i = 0; i < kn.size(); ++i) {
    if (std::find(n.begin(), n.end(), kn[i]) == n.end()) {
      return "'correction_group_size' entries must be measured group sizes (entries of 'group_size')";
    }
    if (!(kb[i] >= 1)) return "'correction_bytes' entries must be >= 1";
    if (i > 0 && (kn[i] < kn[i - 1] || (kn[i] == kn[i - 1] && !(kb[i] > kb[i - 1])))) {
      return "correction knots must be sorted by group size, then by increasing 'correction_bytes'";
    }
    if (!(std::fabs(kr[i]) <= 5)) return "'correction_log_factor' entries must be in [-5, 5]";
  }
  return std::nullopt;
}

void store(const Family& f, const Hardware& /*hw*/, DecodedModels& models) {
  const FamilySpec& s = f.spec();
  models.collective[idx(s.collective)][idx(s.scope)] = collective_of(s, f.params);
}

std::optional<double> cost(const CostModel& cm, const FamilySpec& spec, const std::vector<double>& in) {
  return cm.collective(spec.collective, Bytes(in[1]), static_cast<int>(as_int(in[0])), spec.scope).value;
}

}  // namespace

const FamilyModule& collective_module() {
  static const FamilyModule m{3, add_specs, fit, predict_point, check, store, nullptr, cost};
  return m;
}

// ---- benchmark grid ------------------------------------------------------------------------------

namespace {

// The nccl-tests size actually moved for a requested size: bf16 elements, and for the kinds that
// split the buffer over members a whole number of 16-byte units per member, so that every member's
// chunk starts 16-byte aligned as a step's messages do (OpRunner then moves exactly this size). With
// 2 or 4 members the grid's sizes are such already; with 3, 2^i + 768 bytes were not, and NCCL ran
// those points on a slower path than the aligned held-out sizes (4 x H200: all-gather
// held-out error 5.7% median, 50% max, docs/calibration.md).
double collective_size(const std::string& op, int n, double requested) {
  const bool split = op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
  const double unit = split ? 16.0 * n : 2.0;
  return std::max(unit, std::floor(requested / unit) * unit);
}

void add_collective(GridPlan& p, const std::string& op, int n, double requested, bool held_out) {
  const double bytes = collective_size(op, n, requested);
  PointSpec s;
  s.op = op;
  s.family = "collective." + op + ".nvlink";
  s.params = {{"group_size", static_cast<double>(n)}, {"bytes", bytes}};
  s.inputs = {static_cast<double>(n), bytes};
  s.held_out = held_out;
  s.group_size = n;
  s.bytes = bytes;
  p.points.push_back(std::move(s));
}

void plan_collectives(GridPlan& p) {
  // 1 KiB to 1 GiB by factors of 2 (quick: 4), each size a power of two plus 128 bf16 elements
  // (256 bytes) per member: model dimensions make power-of-two message sizes, and the calibration
  // must not measure a validation scenario's exact size (a test checks). The offset keeps every
  // member's chunk 16-byte aligned, as a step's messages are: with 7 extra elements per member each
  // member's chunk of all-gather, reduce-scatter and all-to-all started misaligned and NCCL took about
  // twice as long as for the aligned messages that threewalls run sends (all-to-all busbw 169 vs 296
  // GB/s at 1 GiB on 2 H200). Held-out sizes sit between grid sizes (3 x 2^i).
  const std::vector<double> grid = sizes(kKiB, kGiB, p.full() ? 2.0 : 4.0);
  const std::vector<double> held = p.full()
                                       ? std::vector<double>{3 * kKiB, 48 * kKiB, 768 * kKiB, 12 * kMiB, 192 * kMiB}
                                       : std::vector<double>{48 * kKiB, 12 * kMiB};
  for (int n = 2; n <= p.gpus; ++n) {
    for (const auto& op : collective_ops()) {
      if (op == "send_recv" && n != 2) continue;  // point-to-point: one pair, group size 2
      const double off = 256.0 * n;
      for (const double s : grid) add_collective(p, op, n, s + off, false);
      for (const double s : held) add_collective(p, op, n, s + off, true);
    }
  }
}

void add_ops(std::vector<OpInfo>& out) {
  for (const auto& c : collective_ops()) {
    out.push_back({c, "", "collective." + c + ".nvlink",
                   c == "send_recv"
                       ? "backend::send on member 0, backend::recv on member 1 (one message)"
                       : "backend::" + c + " (NCCL, bf16) with OpRunner's size -> count mapping, one thread per GPU",
                   "algbw = size / time; busbw = algbw x " +
                       std::string(c == "all_reduce"                      ? "2(n-1)/n"
                                   : c == "broadcast" || c == "send_recv" ? "1"
                                                                          : "(n-1)/n") +
                       " (nccl-tests)"});
  }
}

void plan(GridPlan& p, int /*part*/) { plan_collectives(p); }

}  // namespace

const ModuleGrid& collective_grid() {
  static const ModuleGrid g{add_ops, plan};
  return g;
}

}  // namespace threewalls::calibration::detail

namespace threewalls::calibration::bench {

const std::vector<std::string>& collective_ops() {
  static const std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter",
                                            "all_to_all", "broadcast",  "send_recv"};
  return ops;
}

}  // namespace threewalls::calibration::bench
