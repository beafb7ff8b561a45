// The what-if planner: search space, candidates, the closed-form estimator and the streaming sweep
// (planner.hpp, docs/planner.md). Output formats and the flow re-simulation: planner_output.cpp.
#include "threewalls/sim/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <list>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_map>

#include "threewalls/core/error.hpp"
#include "threewalls/core/strings.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/registry.hpp"
#include "threewalls/scenarios/stages.hpp"
#include "threewalls/scenarios/step_graph.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim {

namespace {

using scenarios::Dispatcher;
using scenarios::Group;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::Precision;
using scenarios::RecomputeGranularity;
using scenarios::Scenario;

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

std::vector<int> powers_of_two(int lo, int hi) {
  std::vector<int> v;
  for (long long x = 1; x <= hi; x *= 2) {
    if (x >= lo) v.push_back(static_cast<int>(x));
  }
  return v;
}

std::string ints_spec(const std::vector<int>& v) {
  std::vector<std::string> s;
  for (int x : v) s.push_back(std::to_string(x));
  return join(s, ",");
}

// The knobs that are scenario keys take their names from the key's registry choices.
constexpr const char* kRecomputeKey = "train.recompute_granularity";
constexpr const char* kDispatcherKey = "train.token_dispatcher";
constexpr const char* kPrecisionKey = "train.precision";

const std::vector<std::string>& choices_of(const char* key) { return scenarios::choice_param(key).choices; }

const std::vector<std::string>& graph_scope_names() {
  static const std::vector<std::string>& names =
      scenarios::Registry::instance().find_param("train.cuda_graph_scope")->choices;
  return names;
}

template <class E>
E parse_choice(const char* knob, const char* key, const std::string& v) {
  if (const auto e = scenarios::choice_value<E>(key, v)) return *e;
  throw InputError("--search: " + std::string(knob) + " value '" + v + "' is not one of " + join(choices_of(key)));
}
RecomputeGranularity parse_recompute(const std::string& v) {
  return parse_choice<RecomputeGranularity>("recompute", kRecomputeKey, v);
}
Dispatcher parse_dispatcher(const std::string& v) { return parse_choice<Dispatcher>("dispatcher", kDispatcherKey, v); }
Precision parse_precision(const std::string& v) { return parse_choice<Precision>("precision", kPrecisionKey, v); }

// "none" or scopes joined by '+', each a known CUDA-graph scope.
std::string check_graphs(const std::string& v) {
  if (v == "none") return v;
  const auto& known = graph_scope_names();
  for (const auto& part : split(v, '+')) {
    if (std::find(known.begin(), known.end(), part) == known.end()) {
      auto near = nearest(part, known);
      throw InputError("--search: cuda_graphs value '" + v + "': unknown scope '" + part + "'" +
                       (near ? " (did you mean '" + *near + "'?)" : "") +
                       "; allowed: none, or scopes joined by '+' among " + join(known, ", "));
    }
  }
  return v;
}

std::vector<std::string> graph_scopes(const std::string& name) {
  if (name == "none") return {};
  return split(name, '+');
}

std::vector<int> parse_ints(const std::string& key, const std::string& text) {
  std::vector<int> out;
  for (const auto& raw : split(text, ',')) {
    const std::string item = trim(raw);
    auto to_int = [&](const std::string& t) {
      try {
        std::size_t used = 0;
        const long long v = std::stoll(t, &used);
        if (used != t.size() || v < 1 || v > (1 << 20)) throw std::invalid_argument(t);
        return static_cast<int>(v);
      } catch (const std::exception&) {
        throw InputError("--search: " + key + " value '" + t + "' is not a positive integer (1 .. 1048576)");
      }
    };
    const auto dots = item.find("..");
    if (dots != std::string::npos) {
      const int lo = to_int(trim(item.substr(0, dots)));
      const int hi = to_int(trim(item.substr(dots + 2)));
      if (lo > hi) throw InputError("--search: " + key + " range '" + item + "' is empty (lower bound above upper)");
      // Ranges of layout sizes and micro-batch sizes are powers of two: every size Megatron users
      // pick, and a range of 1..256 stays 9 values instead of 256. pp and vpp take every integer
      // (layer counts such as 61 split unevenly anyway).
      if (key == "pp" || key == "vpp") {
        for (int x = lo; x <= hi; ++x) out.push_back(x);
      } else {
        const auto p = powers_of_two(lo, hi);
        out.insert(out.end(), p.begin(), p.end());
      }
    } else {
      out.push_back(to_int(item));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

template <class T, class F>
std::vector<T> parse_list(const std::string& text, F parse_one) {
  std::vector<T> out;
  for (const auto& raw : split(text, ',')) {
    T v = parse_one(trim(raw));
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

// An uneven split of L layers over V virtual stages (L % V != 0, V <= L): every stage gets floor or
// ceil of L / V; the short ones are the first and the last (they carry the embedding and the loss)
// and then spread evenly, as the DeepSeek-V3 example does.
std::vector<int> uneven_split(int L, int V) {
  const int base = L / V;
  const int rem = L % V;
  const int shorts = V - rem;
  std::vector<int> count(static_cast<std::size_t>(V), base + 1);
  if (shorts == 1) {
    count.back() = base;
  } else {
    for (int i = 0; i < shorts; ++i) {
      const auto pos = static_cast<std::size_t>(std::lround(static_cast<double>(i) * (V - 1) / (shorts - 1)));
      count[pos] = base;
    }
  }
  return count;
}

std::vector<std::string> default_selective_modules(const Scenario& s) {
  std::vector<std::string> m;
  if (s.model.attention == scenarios::AttentionKind::mla) m.emplace_back("mla_up_proj");
  if (s.model.is_moe()) {
    m.emplace_back("moe_act");
    m.emplace_back("layernorm");
  } else {
    m.emplace_back("core_attn");
  }
  return m;
}

// Time of a collective alone (nccl-tests convention): alpha + f(n) S / busbw.
// A collective alone; a ring, chain or tree across nodes with `rails` members per node as the executor
// prices it (rails_bus_time).
double comm_seconds(const OpCoster& coster, Collective kind, double bytes, int n, LinkScope scope, int rails = 1) {
  if (n <= 1 || bytes <= 0.0) return 0.0;
  const CommParams p = coster.comm_params(kind, Bytes(bytes), n, scope);
  const double traffic = bus_factor(kind, n) * bytes;
  if (scope == LinkScope::network && rails > 1 && kind != Collective::all_to_all) {
    const CommParams nv = coster.comm_params(kind, Bytes(bytes), rails, LinkScope::nvlink);
    return p.latency.value + rails_bus_time(traffic, rails, p.bus_bandwidth.value, nv.bus_bandwidth.value);
  }
  return p.latency.value + traffic / p.bus_bandwidth.value;
}

double memory_kernel_seconds(const OpCoster& coster, OpKind kind, double bytes, double elements) {
  Op op;
  op.kind = kind;
  op.wall = scenarios::Wall::memory;
  op.bytes = bytes;
  op.shape = {static_cast<std::int64_t>(elements), 0, 0, 0, 0, 0};
  op.sub = static_cast<std::uint8_t>(scenarios::ElementwiseKind::reduce);
  return coster.kernel_time(op).value;
}

// One stretch of a step (a layer's forward, the head's backward...): its span and how the span
// splits into kernels, exposed communication and the rest (host launches and other gaps).
struct Span {
  double span = 0.0, compute = 0.0, comm = 0.0, host = 0.0;
  Span& operator+=(const Span& o) {
    span += o.span;
    compute += o.compute;
    comm += o.comm;
    host += o.host;
    return *this;
  }
  friend Span operator*(double k, const Span& s) { return {k * s.span, k * s.compute, k * s.comm, k * s.host}; }
};

// The ops that set a stage's runner memory (memory_model.hpp, runner_ops) in one reduced scenario:
// those of its layers (every stage), of the embedding (the first stage) and of the head (the last).
struct RunnerOps {
  std::vector<Op> layers, embedding, head;
};

// Per-micro-batch costs of one (tp, cp, ep, etp, mbs, recompute, dispatcher, graphs, precision).
struct Reduced {
  Span fwd[2], bwd[2];  // [0] dense layer, [1] MoE layer
  Span emb_fwd, emb_bwd, head_fwd, head_bwd;
  // With train.overlap_moe_expert_parallel_comm: how much sooner two micro-batches end when the
  // second's forward is issued beside the first's backward than when they run one after the other,
  // per MoE layer (the communication the pair hides, net of the kernels it slows).
  double pair_saving = 0.0;
};

bool dp_side_group(Group g) {
  return g == Group::dp || g == Group::dp_cp || g == Group::edp || g == Group::world || g == Group::embedding;
}

// The ops whose communicators, peers and streams size a stage's NCCL buffers (memory model,
// MemoryOptions::communication_ops), for every candidate of one layout, dispatcher, CUDA-graph
// scope set and precision: the candidate's own expansion, cut to what sets them apart. One layer per
// virtual stage, an MoE layer in an MoE model (a dense layer's communicators are its attention's,
// which an MoE layer has as well); one-row micro-batches without recomputation (a recomputed forward
// runs on the forward's groups and streams); the micro-batches one pass of the schedule needs (1, or
// pp for the interleaved schedule). Every stage keeps its pipeline peers and its data-parallel groups.
scenarios::StepGraph communication_graph(const Scenario& s) {
  Scenario r = s;
  auto& p = r.parallel;
  r.model.num_layers = p.pp * p.vpp;
  r.model.mtp_num_layers = 0;  // an MTP depth's communicators are its layer's and the head's
  r.model.first_dense_layers = 0;
  r.model.moe_layer_freq = 1;
  p.layers_per_stage.clear();
  p.first_stage_layers = 0;
  p.last_stage_layers = 0;
  auto& t = *r.train;
  const int m = p.vpp > 1 ? p.pp : 1;
  t.micro_batch_size = 1;
  t.set_microbatches(m, p.dp);
  t.recompute_granularity = RecomputeGranularity::none;
  t.recompute_modules.clear();
  scenarios::StepGraph g = scenarios::expand(r, 0);
  // Only the distinct communication ops are read: keep one of each per class.
  for (auto& rc : g.classes) {
    std::set<std::tuple<int, int, int, int, int>> seen;
    std::vector<Op> kept;
    for (const Op& op : rc.ops) {
      if (!op.is_comm()) continue;
      if (seen.insert({static_cast<int>(op.kind), static_cast<int>(op.group), op.stream, op.sub, op.peer}).second) {
        kept.push_back(op);
      }
    }
    rc.ops = std::move(kept);
    rc.deps.clear();
  }
  return g;
}

// What sets a candidate's communication graph apart. The training expansion emits a group's
// collectives only where the group has more than one rank, and the sends and receives of a stage
// follow from its place in the pipeline: the first stage, a middle one, the last (with vpp > 1 every
// stage has both neighbours). So the distinct communication ops of each stage (the only thing
// communication_graph keeps) are one function of which groups have more than one rank, whether the
// pipeline has 1, 2 or more stages, whether it is interleaved, and the candidate's dispatcher,
// CUDA-graph scopes and precision; the NCCL rule reads the group sizes and spans from the candidate's
// own layout (tests/sim/planner_test.cpp compares it with each candidate's own graph).
std::string communication_key(const scenarios::Layout& L, const Candidate& c) {
  std::string k;
  for (Group g : {Group::tp, Group::cp, Group::dp, Group::dp_cp, Group::ep, Group::etp, Group::edp, Group::pp,
                  Group::world, Group::embedding}) {
    k += L.group_size(g) > 1 ? '1' : '0';
  }
  k += ' ';
  k += std::to_string(std::min(c.pp, 3)) + (c.vpp > 1 ? " vpp " : " ") +
       std::to_string(static_cast<int>(c.dispatcher)) + ' ' + c.cuda_graphs + ' ' +
       std::to_string(static_cast<int>(c.precision));
  return k;
}

// A graph of `pp` stages whose stage st has the ops of the first class of `g` at the same place in
// the pipeline (first, middle or last): what MemoryOptions::communication_ops reads for a candidate
// with `g`'s communication_key.
scenarios::StepGraph stage_view(const scenarios::StepGraph& g, int pp) {
  int stages = 0;
  for (const auto& rc : g.classes) stages = std::max(stages, rc.pp_stage + 1);
  scenarios::StepGraph v;
  for (int st = 0; st < pp; ++st) {
    const int at = st == 0 ? 0 : (st == pp - 1 ? stages - 1 : 1);
    const auto it = std::find_if(g.classes.begin(), g.classes.end(),
                                 [&](const scenarios::RankClass& rc) { return rc.pp_stage == at; });
    scenarios::RankClass rc;
    rc.id = st;
    rc.pp_stage = st;
    if (it != g.classes.end()) rc.ops = it->ops;
    v.classes.push_back(std::move(rc));
  }
  return v;
}

// A bounded map from key to value that drops the least recently used entry when full.
template <typename V>
class LruCache {
 public:
  explicit LruCache(std::size_t entries) : entries_(entries) {}
  // The value of `key`, made by `make()` when it is not held. The reference holds until the next get.
  template <typename Make>
  const V& get(const std::string& key, Make&& make) {
    auto it = map_.find(key);
    if (it != map_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      return it->second.first;
    }
    V value = make();
    if (map_.size() >= entries_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    return map_.emplace(key, std::make_pair(std::move(value), order_.begin())).first->second.first;
  }

 private:
  std::size_t entries_;
  std::list<std::string> order_;
  std::unordered_map<std::string, std::pair<V, std::list<std::string>::iterator>> map_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Search space
// ---------------------------------------------------------------------------------------------

const std::vector<std::pair<std::string, std::string>>& search_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"tp", "positive integers, or a..b (powers of two)"},
      {"cp", "positive integers, or a..b (powers of two)"},
      {"ep", "positive integers, or a..b (powers of two)"},
      {"etp", "positive integers, or a..b (powers of two)"},
      {"mbs", "positive integers, or a..b (powers of two)"},
      {"recompute", join(choices_of(kRecomputeKey))},
      {"dispatcher", join(choices_of(kDispatcherKey))},
      {"cuda_graphs", "none, or scopes joined by '+' among " + join(graph_scope_names())},
      {"precision", join(choices_of(kPrecisionKey))},
      {"pp", "positive integers, or a..b (every integer)"},
      {"vpp", "positive integers, or a..b (every integer)"},
  };
  return keys;
}

std::uint64_t SearchSpace::size() const {
  std::uint64_t n = 1;
  for (std::size_t k : {tp.size(), cp.size(), ep.size(), etp.size(), mbs.size(), recompute.size(), dispatcher.size(),
                        cuda_graphs.size(), precision.size(), pp.size(), vpp.size()}) {
    n *= k;
  }
  return n;
}

std::string SearchSpace::spec() const {
  std::vector<std::string> r, d, p;
  for (auto v : recompute) r.emplace_back(scenarios::to_string(v));
  for (auto v : dispatcher) d.emplace_back(scenarios::to_string(v));
  for (auto v : precision) p.emplace_back(scenarios::to_string(v));
  return "tp=" + ints_spec(tp) + ";cp=" + ints_spec(cp) + ";ep=" + ints_spec(ep) + ";etp=" + ints_spec(etp) +
         ";mbs=" + ints_spec(mbs) + ";recompute=" + join(r, ",") + ";dispatcher=" + join(d, ",") +
         ";cuda_graphs=" + join(cuda_graphs, ",") + ";precision=" + join(p, ",") + ";pp=" + ints_spec(pp) +
         ";vpp=" + ints_spec(vpp);
}

SearchSpace default_search(const Scenario& base, int gpus) {
  SearchSpace s;
  const int gpn = std::max(1, base.cluster.gpus_per_node);
  s.tp = powers_of_two(1, std::min(gpn, 8));
  s.cp = {1};
  if (base.train && base.train->seq_length >= 16384) s.cp.push_back(2);
  const int L = base.model.num_layers;
  for (int p = 1; p <= std::min({L, gpus, 16}); ++p) {
    if (p == 1 || L % p == 0 || p % 2 == 0) s.pp.push_back(p);
  }
  s.vpp = {1, 2, 4};
  if (base.model.is_moe()) {
    s.ep = powers_of_two(1, std::min(base.model.num_experts, gpus));
  } else {
    s.ep = {1};
  }
  s.etp = {1};
  s.mbs = {1, 2};
  if (base.train && std::find(s.mbs.begin(), s.mbs.end(), base.train->micro_batch_size) == s.mbs.end()) {
    s.mbs.push_back(base.train->micro_batch_size);
  }
  s.recompute = {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full};
  s.dispatcher = {base.exec().token_dispatcher};
  s.cuda_graphs = {"none"};
  s.precision = {base.exec().precision};
  return s;
}

SearchSpace parse_search(std::string_view spec, SearchSpace s) {
  std::set<std::string> seen;
  std::vector<std::string> keys;
  for (const auto& [k, v] : search_keys()) keys.push_back(k);
  for (const auto& raw : split(spec, ';')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw InputError("--search: '" + item + "' is not key=values; keys: " + join(keys, ", "));
    }
    const std::string key = trim(item.substr(0, eq));
    const std::string val = trim(item.substr(eq + 1));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      auto near = nearest(key, keys);
      throw InputError("--search: unknown key '" + key + "'" + (near ? " (did you mean '" + *near + "'?)" : "") +
                       "; keys: " + join(keys, ", "));
    }
    if (!seen.insert(key).second) throw InputError("--search: key '" + key + "' given twice");
    if (val.empty()) throw InputError("--search: key '" + key + "' has no values");
    if (key == "tp") s.tp = parse_ints(key, val);
    else if (key == "cp") s.cp = parse_ints(key, val);
    else if (key == "pp") s.pp = parse_ints(key, val);
    else if (key == "vpp") s.vpp = parse_ints(key, val);
    else if (key == "ep") s.ep = parse_ints(key, val);
    else if (key == "etp") s.etp = parse_ints(key, val);
    else if (key == "mbs") s.mbs = parse_ints(key, val);
    else if (key == "recompute") s.recompute = parse_list<RecomputeGranularity>(val, parse_recompute);
    else if (key == "dispatcher") s.dispatcher = parse_list<Dispatcher>(val, parse_dispatcher);
    else if (key == "cuda_graphs") s.cuda_graphs = parse_list<std::string>(val, check_graphs);
    else if (key == "precision") s.precision = parse_list<Precision>(val, parse_precision);
  }
  return s;
}

std::string Candidate::layout() const {
  std::ostringstream os;
  os << "tp" << tp << " cp" << cp << " pp" << pp << " vpp" << vpp << " dp" << dp << " | ep" << ep << " etp" << etp
     << " edp" << edp;
  return os.str();
}

std::string Candidate::options() const {
  std::ostringstream os;
  os << "mbs" << mbs << " recompute=" << scenarios::to_string(recompute)
     << " dispatcher=" << scenarios::to_string(dispatcher) << " graphs=" << cuda_graphs << " "
     << scenarios::to_string(precision);
  return os.str();
}

Candidate candidate_at(const SearchSpace& sp, int gpus, std::uint64_t index) {
  Candidate c;
  c.index = index;
  std::uint64_t i = index;
  auto digit = [&i](std::size_t radix) {
    const std::size_t d = static_cast<std::size_t>(i % radix);
    i /= radix;
    return d;
  };
  // Fastest digit last in search_keys(): vpp, pp, precision, ... tp.
  c.vpp = sp.vpp[digit(sp.vpp.size())];
  c.pp = sp.pp[digit(sp.pp.size())];
  c.precision = sp.precision[digit(sp.precision.size())];
  c.cuda_graphs = sp.cuda_graphs[digit(sp.cuda_graphs.size())];
  c.dispatcher = sp.dispatcher[digit(sp.dispatcher.size())];
  c.recompute = sp.recompute[digit(sp.recompute.size())];
  c.mbs = sp.mbs[digit(sp.mbs.size())];
  c.etp = sp.etp[digit(sp.etp.size())];
  c.ep = sp.ep[digit(sp.ep.size())];
  c.cp = sp.cp[digit(sp.cp.size())];
  c.tp = sp.tp[digit(sp.tp.size())];
  const long long mp = 1LL * c.tp * c.cp * c.pp;
  c.dp = gpus % mp == 0 ? static_cast<int>(gpus / mp) : 0;
  const long long emp = 1LL * c.etp * c.ep * c.pp;
  c.edp = gpus % emp == 0 ? static_cast<int>(gpus / emp) : 0;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Estimator
// ---------------------------------------------------------------------------------------------

struct PlanEstimator::Impl {
  scenarios::LoadedScenario base;
  const OpCoster& coster;
  int gpus;
  MemoryOptions memory;
  double model_flops = 0.0;
  double tokens = 0.0;
  std::uint64_t reduced_runs = 0;
  // Reduced results by candidate key (Impl::reduced), and the runner ops of the same reduced scenarios
  // (Impl::runner_ops).
  LruCache<Reduced> cache;
  LruCache<RunnerOps> runner_cache;
  // Communication graphs (communication_graph) by communication_key, and the per-stage views of
  // them that candidates with that key and a pipeline depth read (Impl::communication).
  LruCache<scenarios::StepGraph> comm_graphs;
  LruCache<scenarios::StepGraph> comm_views;

  Impl(scenarios::LoadedScenario b, const OpCoster& c, int g, MemoryOptions m, std::size_t entries)
      : base(std::move(b)), coster(c), gpus(g), memory(m), cache(std::max<std::size_t>(entries, 1)),
        runner_cache(std::max<std::size_t>(entries, 1)),
        comm_graphs(std::min<std::size_t>(std::max<std::size_t>(entries, 1), 64)),
        comm_views(std::min<std::size_t>(std::max<std::size_t>(entries, 1), 64)) {}

  Scenario candidate_scenario(const Candidate& c, scenarios::KeyLocations& where) const;
  Reduced reduced(const Scenario& s, const Candidate& c);
  const RunnerOps& runner_ops(const Scenario& s, const Candidate& c);
  const scenarios::StepGraph& communication(const Scenario& s, const scenarios::Layout& L, const Candidate& c);
  Scenario reduced_scenario(const Scenario& s, const Candidate& c) const;
  Reduced run_reduced(const Scenario& s, const Candidate& c);
};

PlanEstimator::PlanEstimator(scenarios::LoadedScenario base, const OpCoster& coster, int gpus, MemoryOptions memory,
                             std::size_t cache_entries)
    : impl_(std::make_unique<Impl>(std::move(base), coster, gpus, memory, cache_entries)) {
  const Scenario& s = impl_->base.scenario;
  if (!s.train) throw InputError(s.source_path + ": plan needs a training scenario ([train]); inference is not planned");
  const int gpn = s.cluster.gpus_per_node;
  if (gpus < 1 || gpus % gpn != 0) {
    throw InputError("plan: --gpus " + std::to_string(gpus) + " is not a positive multiple of the scenario's "
                     "cluster.gpus_per_node = " + std::to_string(gpn) + " (" + s.source_path + ")");
  }
  impl_->model_flops = scenarios::megatron_flops_per_iteration(s);
  impl_->tokens = static_cast<double>(s.train->global_batch_size) * s.train->seq_length;
}

PlanEstimator::~PlanEstimator() = default;

std::uint64_t PlanEstimator::reduced_simulations() const { return impl_->reduced_runs; }

Scenario PlanEstimator::Impl::candidate_scenario(const Candidate& c, scenarios::KeyLocations& where) const {
  Scenario s = base.scenario;
  where = base.locations;
  const SourceLocation here{s.source_path, 1, 1};
  auto& p = s.parallel;
  const bool same_pipeline = p.pp == c.pp && p.vpp == c.vpp;
  p.tp = c.tp;
  p.cp = c.cp;
  p.pp = c.pp;
  p.vpp = c.vpp;
  p.ep = c.ep;
  p.etp = c.etp;
  p.dp = 0;  // derived again
  p.edp = 0;
  p.sequence_parallel = c.tp > 1;
  if (!same_pipeline || (p.layers_per_stage.empty() && !p.first_stage_layers && !p.last_stage_layers)) {
    p.layers_per_stage.clear();
    p.first_stage_layers = 0;
    p.last_stage_layers = 0;
    const int L = s.model.num_layers;
    const int V = c.pp * c.vpp;
    if (L % V != 0 && V <= L) p.layers_per_stage = uneven_split(L, V);
  }
  auto& t = *s.train;
  t.micro_batch_size = c.mbs;
  t.num_microbatches = 0;
  const bool was_selective = t.recompute_granularity == RecomputeGranularity::selective;
  t.recompute_granularity = c.recompute;
  where.erase("train.recompute_modules");
  if (c.recompute == RecomputeGranularity::selective) {
    if (!was_selective) t.recompute_modules = default_selective_modules(s);
    where["train.recompute_modules"] = here;
  } else {
    t.recompute_modules.clear();
  }
  if (c.recompute == RecomputeGranularity::full && base.scenario.train->recompute_granularity != RecomputeGranularity::full) {
    t.recompute_method = scenarios::RecomputeMethod::uniform;
    t.recompute_num_layers = 1;
  }
  t.exec.token_dispatcher = c.dispatcher;
  t.exec.cuda_graph_scope = graph_scopes(c.cuda_graphs);
  t.exec.precision = c.precision;
  s.cluster.nodes = gpus / s.cluster.gpus_per_node;
  // Slowdowns and profiler ranks name ranks of the base cluster; the planner predicts steady,
  // unprofiled steps of healthy machines (docs/planner.md).
  s.cluster.slowdowns.clear();
  if (s.run.profiler.recorded == scenarios::RecordedRanks::listed) {
    s.run.profiler.recorded = scenarios::RecordedRanks::automatic;
    s.run.profiler.ranks.clear();
  }
  return s;
}

Scenario PlanEstimator::scenario_of(const Candidate& c) const {
  scenarios::KeyLocations where;
  Scenario s = impl_->candidate_scenario(c, where);
  // The layout rules are the loader's own: a candidate is pruned exactly when `threewalls sim` would
  // refuse its scenario (more virtual stages than layers only with an explicit split that leaves
  // stages empty, which sim accepts).
  scenarios::recheck_scenario(s, where);
  return s;
}

namespace {
// The knobs a reduced scenario depends on.
std::string reduced_key(const Candidate& c) {
  std::ostringstream key;
  key << c.tp << ' ' << c.cp << ' ' << c.ep << ' ' << c.etp << ' ' << c.mbs << ' ' << static_cast<int>(c.recompute)
      << ' ' << static_cast<int>(c.dispatcher) << ' ' << c.cuda_graphs << ' ' << static_cast<int>(c.precision) << ' '
      << (c.pp > 1);
  return key.str();
}

// Where an op outside the layers belongs: the embedding, the head, or every stage (data loading, the
// optimizer: the ops on the parameter state set no operand buffers).
enum class OpRole { layer, embedding, head };
OpRole role_of(const scenarios::StepGraph& g, const Op& op) {
  if (op.layer >= 0) return OpRole::layer;
  const std::string& ph = g.phase_name(op);
  if (ph.rfind("embedding", 0) == 0) return OpRole::embedding;
  if (ph.rfind("final_norm", 0) == 0 || ph.rfind("lm_head", 0) == 0 || ph.rfind("loss", 0) == 0) return OpRole::head;
  return OpRole::layer;
}
}  // namespace

Reduced PlanEstimator::Impl::reduced(const Scenario& s, const Candidate& c) {
  return cache.get(reduced_key(c), [&] { return run_reduced(s, c); });
}

// The reduced scenario's ops (its expansion, no simulation), kept to those that set the runners' memory.
const RunnerOps& PlanEstimator::Impl::runner_ops(const Scenario& s, const Candidate& c) {
  return runner_cache.get(reduced_key(c), [&] {
    const Scenario r = reduced_scenario(s, c);
    const scenarios::StepGraph g = scenarios::expand(r, 0);
    std::vector<Op> by_role[3];
    for (const auto& rc : g.classes) {
      for (const Op& op : rc.ops) by_role[static_cast<int>(role_of(g, op))].push_back(op);
    }
    RunnerOps out;
    out.layers = sim::runner_ops(r, by_role[static_cast<int>(OpRole::layer)]);
    out.embedding = sim::runner_ops(r, by_role[static_cast<int>(OpRole::embedding)]);
    out.head = sim::runner_ops(r, by_role[static_cast<int>(OpRole::head)]);
    return out;
  });
}

const scenarios::StepGraph& PlanEstimator::Impl::communication(const Scenario& s, const scenarios::Layout& L,
                                                               const Candidate& c) {
  const std::string k = communication_key(L, c);
  return comm_views.get(k + " pp" + std::to_string(c.pp),
                        [&] { return stage_view(comm_graphs.get(k, [&] { return communication_graph(s); }), c.pp); });
}

// The reduced scenario: the candidate without its pipeline, one micro-batch, 2 dense and 3 MoE
// layers (or 3 of the one kind), on the smallest cluster that holds the same tp/cp and etp/ep groups
// on the same nodes (pp is the outermost coordinate of both layouts, so a stage's groups do not
// depend on pp or dp). The analytic executor runs it; a middle layer of each kind gives the
// per-layer forward and backward times, with every overlap, launch and CUDA-graph effect of the
// simulator.
// Layers of the reduced scenario: dense, then MoE (2 and 3, or 3 of the one kind).
std::pair<int, int> reduced_layers(const scenarios::ModelSpec& m) {
  const bool has_dense = !m.is_moe() || m.first_dense_layers > 0 || m.moe_layer_freq > 1;
  return {m.is_moe() ? (has_dense ? 2 : 0) : 3, m.is_moe() ? 3 : 0};
}

Scenario PlanEstimator::Impl::reduced_scenario(const Scenario& cand, const Candidate& c) const {
  Scenario r = cand;
  const auto& m = base.scenario.model;
  const auto [nd, nm] = reduced_layers(m);
  r.model.num_layers = nd + nm;
  r.model.mtp_num_layers = 0;  // an MTP depth is priced as a layer of its kind and a head (estimate)
  if (m.is_moe()) {
    r.model.first_dense_layers = nd;
    r.model.moe_layer_freq = 1;
  }
  const int gpn = base.scenario.cluster.gpus_per_node;
  long long world = std::lcm(1LL * c.tp * c.cp, 1LL * c.etp * c.ep);
  if (world > gpn) {
    world = std::lcm(world, static_cast<long long>(gpn));
    r.cluster.gpus_per_node = gpn;
    r.cluster.nodes = static_cast<int>(world / gpn);
  } else {
    r.cluster.gpus_per_node = static_cast<int>(world);
    r.cluster.nodes = 1;
  }
  auto& p = r.parallel;
  p.pp = 1;
  p.vpp = 1;
  p.layers_per_stage.clear();
  p.first_stage_layers = 0;
  p.last_stage_layers = 0;
  p.dp = static_cast<int>(world / (1LL * c.tp * c.cp));
  p.edp = static_cast<int>(world / (1LL * c.etp * c.ep));
  auto& t = *r.train;
  t.set_microbatches(1, p.dp);
  if (t.recompute_granularity == RecomputeGranularity::full) t.recompute_num_layers = 1;
  r.run.steps = 1;
  r.run.warmup_steps = 0;
  r.run.profiler.enabled = false;
  r.run.profiler.recorded = scenarios::RecordedRanks::automatic;
  r.run.profiler.ranks.clear();
  return r;
}

namespace {
// The ops of a reduced run that make up its micro-batches' work: not the data-parallel side
// (gradient reduction, parameter gathering, optimizer, gradient norm, metrics, data loading).
bool micro_batch_work(const scenarios::StepGraph& g, const Op& op) {
  if (op.is_comm() && dp_side_group(op.group)) return false;
  if (op.flags & scenarios::kMetrics) return false;
  if (op.kind == OpKind::optimizer) return false;
  return op.layer >= 0 || role_of(g, op) != OpRole::layer;
}

// When class `ci`'s micro-batch work ends in a run of `g`.
double micro_batch_work_end(const scenarios::StepGraph& g, const StepResult& res, std::size_t ci) {
  double end = 0.0;
  const auto& ops = g.classes[ci].ops;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (micro_batch_work(g, ops[i])) end = std::max(end, res.classes[ci].end[i]);
  }
  return end;
}
}  // namespace

Reduced PlanEstimator::Impl::run_reduced(const Scenario& cand, const Candidate& c) {
  ++reduced_runs;
  const Scenario r = reduced_scenario(cand, c);
  const auto [nd, nm] = reduced_layers(base.scenario.model);
  const auto& t = *r.train;
  const scenarios::StepGraph g = scenarios::expand(r, 0);
  const Platform platform(r.cluster);
  ExecutorOptions eo = executor_options_of(r);  // as the flow re-simulation's simulate() runs it
  eo.fidelity = Fidelity::analytic;
  // A pipeline stage has a posted receive resident nearly all step (docs/planner.md): the reduced
  // graph has no pipeline, so its kernels run beside one throughout. With one hardware queue the
  // receive is dispatched in issue order, after the compute issued before it: none beside the kernels.
  eo.pending_receive_throughout = c.pp > 1 && eo.hardware_queues != 1;
  const Executor ex(coster, eo);
  const StepResult res = ex.run_step(g, platform, {}, 0.0, nullptr);

  const HostCosts hc = coster.host_costs();
  Reduced best;
  double best_total = -1.0;
  std::size_t best_class = 0;
  const int L = r.model.num_layers;
  for (std::size_t ci = 0; ci < g.classes.size(); ++ci) {
    const auto& rc = g.classes[ci];
    const auto& tl = res.classes[ci];
    // Ends of each layer's forward and backward, index L = head, L + 1 = embedding.
    std::vector<double> fend(static_cast<std::size_t>(L + 2), 0.0), bend(static_cast<std::size_t>(L + 2), 0.0);
    std::vector<Span> fsum(static_cast<std::size_t>(L + 2)), bsum(static_cast<std::size_t>(L + 2));
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const Op& op = rc.ops[i];
      if (!micro_batch_work(g, op)) continue;
      int slot = op.layer;
      if (op.layer < 0) slot = role_of(g, op) == OpRole::embedding ? L + 1 : L;
      const bool bwd = (op.flags & (scenarios::kBackward | scenarios::kRecompute)) != 0;
      auto& ends = bwd ? bend : fend;
      auto& sums = bwd ? bsum : fsum;
      const auto s = static_cast<std::size_t>(slot);
      ends[s] = std::max(ends[s], tl.end[i]);
      if (op.is_comm()) {
        sums[s].comm += tl.end[i] - tl.start[i];
      } else if (op.kind != OpKind::host && op.kind != OpKind::copy) {
        sums[s].compute +=
            coster.kernel_time(op).value * nccl_resident_factor(coster, op, eo.pending_receive_throughout, false) +
            (op.graph ? hc.graph_node.value : 0.0);
      }
    }
    auto make = [](double span, const Span& sum) {
      Span out;
      out.span = std::max(0.0, span);
      out.compute = std::min(out.span, sum.compute);
      out.comm = std::min(out.span - out.compute, sum.comm);
      out.host = out.span - out.compute - out.comm;
      return out;
    };
    const auto H = static_cast<std::size_t>(L), E = static_cast<std::size_t>(L + 1);
    Reduced red;
    auto layer_spans = [&](int idx, int kind) {
      const auto i = static_cast<std::size_t>(idx);
      red.fwd[kind] = make(fend[i] - fend[i - 1], fsum[i]);
      red.bwd[kind] = make(bend[i] - bend[i + 1], bsum[i]);
    };
    if (nd > 0) layer_spans(1, 0);
    if (nm > 0) layer_spans(nd + 1, 1);
    red.emb_fwd = make(fend[E], fsum[E]);
    red.head_fwd = make(fend[H] - fend[H - 1], fsum[H]);
    red.head_bwd = make(bend[H] - fend[H], bsum[H]);
    red.emb_bwd = make(bend[E] - bend[0], bsum[E]);
    const double total = red.fwd[0].span + red.bwd[0].span + red.fwd[1].span + red.bwd[1].span;
    if (total > best_total) {
      best_total = total;
      best = red;
      best_class = ci;
    }
  }
  if (t.overlap_moe_expert_parallel_comm && nm > 0) {
    // The steady state of the combined 1F1B schedule: two micro-batches of the reduced scenario, the
    // second's forward paired with the first's backward, against the same two one after the other.
    auto two_micro_batches = [&](bool paired) {
      Scenario r2 = r;
      r2.train->set_microbatches(2, r2.parallel.dp);
      r2.train->overlap_moe_expert_parallel_comm = paired;
      r2.train->delay_wgrad_compute = paired && t.delay_wgrad_compute;
      const scenarios::StepGraph g2 = scenarios::expand(r2, 0);
      return micro_batch_work_end(g2, ex.run_step(g2, platform, {}, 0.0, nullptr), best_class);
    };
    best.pair_saving = std::max(0.0, two_micro_batches(false) - two_micro_batches(true)) / nm;
  }
  return best;
}

// The memory model on a skeleton StepGraph: one class per pipeline stage (two with routing
// imbalance: the hot EP rank and a cold one) with its layers and, of its ops, those that set its
// runners' memory (Impl::runner_ops); the NCCL buffers counted on the candidate's communication graph
// (docs/planner.md).
MemoryReport PlanEstimator::memory(const Scenario& s, const Candidate& c) {
  const scenarios::StageSplit split(s);
  const auto& t = *s.train;
  const int pp = c.pp;
  scenarios::StepGraph skel;
  skel.layout = scenarios::Layout(s);
  const scenarios::RoutingModel routing(c.ep, t.routing_imbalance);
  const bool split_hot = !routing.balanced() && s.model.is_moe();
  const int per_stage = impl_->gpus / pp;
  for (int st = 0; st < pp; ++st) {
    for (int cold = 0; cold < (split_hot ? 2 : 1); ++cold) {  // EP rank 0 is the hot one
      scenarios::RankClass rc;
      rc.id = static_cast<int>(skel.classes.size());
      rc.pp_stage = st;
      rc.label = "stage " + std::to_string(st);
      rc.ranks = {st * per_stage + (cold ? c.etp : 0)};
      rc.expert_load = split_hot ? routing.load(cold) : 1.0;
      rc.layers = split.stage_layers(st);
      // The ops that set its runners' memory (streams, handles, operand buffers), from the reduced
      // scenario of the same knobs: its layers', and the embedding's and head's on the end stages.
      const RunnerOps& ro = impl_->runner_ops(s, c);
      std::vector<Op> ops = ro.layers;
      if (st == 0) ops.insert(ops.end(), ro.embedding.begin(), ro.embedding.end());
      if (st == pp - 1) ops.insert(ops.end(), ro.head.begin(), ro.head.end());
      rc.ops = sim::runner_ops(s, ops);
      skel.classes.push_back(std::move(rc));
    }
  }
  MemoryOptions memory = impl_->memory;
  if (!memory.nccl) memory.nccl = impl_->coster.nccl_memory();  // the profile's nccl.memory, when it has one
  if (!memory.device) memory.device = impl_->coster.device_memory();  // and its device.memory
  if (memory.nccl) memory.communication_ops = &impl_->communication(s, skel.layout, c);
  return memory_model(s, skel, memory);
}

PlanRow PlanEstimator::evaluate(const Candidate& c) {
  PlanRow row;
  row.cand = c;
  const Scenario& base = impl_->base.scenario;
  row.capacity_bytes = base.cluster.gpu_memory.value;
  if (c.dp == 0 || c.edp == 0) {
    row.outcome = Outcome::rule;
    row.rule = c.dp == 0 ? "world-size" : "expert-world";
    return row;
  }
  Scenario s;
  try {
    s = scenario_of(c);
  } catch (const scenarios::ScenarioError& e) {
    row.outcome = Outcome::rule;
    std::vector<std::string> ids;
    for (const auto& msg : e.messages()) {
      const auto at = msg.rfind("[rule ");
      if (at == std::string::npos) continue;
      const std::string id = msg.substr(at + 6, msg.find(']', at) - at - 6);
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    row.rule = ids.empty() ? "invalid" : join(ids, "+");
    return row;
  }
  const auto& t = *s.train;
  row.microbatches = t.num_microbatches;
  const int pp = c.pp, vpp = c.vpp, m = t.num_microbatches;

  // ---- memory first ----
  const scenarios::StageSplit split(s);
  const scenarios::Layout layout(s);
  const MemoryReport mem = memory(s, c);
  const int per_stage = impl_->gpus / pp;
  const std::size_t classes_per_stage = mem.classes.size() / static_cast<std::size_t>(pp);  // hot and cold
  for (const auto& cm : mem.classes) row.peak_bytes = std::max(row.peak_bytes, cm.peak().value);
  if (mem.oom()) {
    row.outcome = Outcome::oom;
    return row;
  }

  // ---- step time ----
  const Reduced red = impl_->reduced(s, c);
  const OpCoster& coster = impl_->coster;
  std::vector<Span> stage(static_cast<std::size_t>(pp));
  double mean_span = 0.0;
  int crit = 0;
  for (int st = 0; st < pp; ++st) {
    Span sp;
    for (int l : split.stage_layers(st)) {
      const int kind = s.model.layer_is_moe(l) ? 1 : 0;
      sp += red.fwd[kind];
      sp += red.bwd[kind];
      if (s.model.is_mtp_layer(l)) {  // its pass through the output head; its eh_proj and norms not priced
        sp += red.head_fwd;
        sp += red.head_bwd;
      }
    }
    if (st == 0) {
      sp += red.emb_fwd;
      sp += red.emb_bwd;
    }
    if (st == pp - 1) {
      sp += red.head_fwd;
      sp += red.head_bwd;
    }
    stage[static_cast<std::size_t>(st)] = sp;
    mean_span += sp.span / pp;
    if (sp.span > stage[static_cast<std::size_t>(crit)].span) crit = st;
  }
  const Span& cs = stage[static_cast<std::size_t>(crit)];
  // Backward of the critical stage, one micro-batch (the window the last gradient buckets overlap).
  double crit_bwd = 0.0;
  for (int l : split.stage_layers(crit)) crit_bwd += red.bwd[s.model.layer_is_moe(l) ? 1 : 0].span;

  PlanWalls w;
  w.compute_us = m * cs.compute;
  w.exposed_comm_us = m * cs.comm;
  w.host_us = m * cs.host;
  // Expert-parallel overlap: the critical stage's paired chunk passes (2 x pairs of its 2 x m x vpp)
  // hide the reduced run's saving per pair and MoE layer (a pass holds the stage's MoE layers over vpp
  // on average) of its exposed communication.
  if (const int pairs = scenarios::overlapped_pairs(s, crit); pairs > 0) {
    int moe_layers = 0;
    for (int l : split.stage_layers(crit)) moe_layers += s.model.layer_is_moe(l) ? 1 : 0;
    const double hidden = 1.0 * pairs * moe_layers / vpp * red.pair_saving;
    w.exposed_comm_us -= std::min(hidden, w.exposed_comm_us);
  }
  // Pipeline fill and drain: (pp - 1) / vpp micro-batches of a mean stage (interleaved schedule).
  w.bubble_us = pp > 1 ? (pp - 1.0) / vpp * mean_span : 0.0;
  // Pipeline sends on the fill and drain path (they overlap compute in the steady state).
  if (pp > 1) {
    const double act = 1.0 * c.mbs * (t.seq_length / c.cp) * s.model.hidden_size * 2.0 / (c.tp > 1 ? c.tp : 1);
    const LinkScope scope = per_stage >= s.cluster.gpus_per_node ? LinkScope::network : LinkScope::nvlink;
    const double hop = comm_seconds(coster, Collective::send_recv, act, 2, scope);
    w.exposed_comm_us += 2.0 * (pp * vpp - 1) * hop;
  }
  // Data-parallel gradient reduction and parameter gathering, the optimizer.
  const ClassMemory& cmem = mem.classes[static_cast<std::size_t>(crit) * classes_per_stage];
  const int rep = crit * per_stage;
  auto scope_of = [&](Group grp) {
    return layout.group_within_node(grp, rep) ? LinkScope::nvlink : LinkScope::network;
  };
  auto rails_in = [&](Group grp) {
    return layout.group_within_node(grp, rep) ? 1 : rails_of(layout.group_members(grp, rep), layout.gpus_per_node());
  };
  const int nd = c.dp * c.cp, ne = c.edp;
  const bool dist = t.use_distributed_optimizer;
  const Collective red_kind = dist ? Collective::reduce_scatter : Collective::all_reduce;
  const double bucket = t.grad_bucket_size_params;
  const double dense = cmem.params.dense, expert = cmem.params.expert;
  const scenarios::ParameterBytes per = scenarios::parameter_bytes(t);
  const double rs_all =
      comm_seconds(coster, red_kind, dense * per.gradient, nd, scope_of(Group::dp_cp), rails_in(Group::dp_cp)) +
      comm_seconds(coster, red_kind, expert * per.gradient, ne, scope_of(Group::edp), rails_in(Group::edp));
  const double rs_last = std::max(comm_seconds(coster, red_kind, std::min(bucket, dense) * per.gradient, nd,
                                               scope_of(Group::dp_cp), rails_in(Group::dp_cp)),
                                  comm_seconds(coster, red_kind, std::min(bucket, expert) * per.gradient, ne,
                                               scope_of(Group::edp), rails_in(Group::edp)));
  w.exposed_comm_us += t.overlap_grad_reduce ? std::max(rs_last, rs_all - crit_bwd) : rs_all;
  if (dist) {
    const double ag_all = comm_seconds(coster, Collective::all_gather, dense * per.weight, nd, scope_of(Group::dp_cp),
                                       rails_in(Group::dp_cp)) +
                          comm_seconds(coster, Collective::all_gather, expert * per.weight, ne, scope_of(Group::edp),
                                       rails_in(Group::edp));
    const double ag_first = comm_seconds(coster, Collective::all_gather, std::min(bucket, dense) * per.weight, nd,
                                         scope_of(Group::dp_cp), rails_in(Group::dp_cp));
    w.exposed_comm_us += t.overlap_param_gather ? ag_first : ag_all;
  }
  const double shard = dist ? dense / nd + expert / ne : dense + expert;
  w.compute_us += memory_kernel_seconds(coster, OpKind::elementwise, shard * per.gradient, shard) +
                  memory_kernel_seconds(coster, OpKind::optimizer, shard * per.adam_traffic(), shard);
  w.exposed_comm_us += comm_seconds(coster, Collective::all_reduce, 4.0, impl_->gpus, LinkScope::network);
  // Seconds so far; report microseconds.
  w.compute_us *= 1e6;
  w.exposed_comm_us *= 1e6;
  w.bubble_us *= 1e6;
  w.host_us *= 1e6;
  row.walls = w;
  row.step_time_us = w.compute_us + w.exposed_comm_us + w.bubble_us + w.host_us;
  const double step_s = row.step_time_us * 1e-6;
  row.tokens_per_s = step_s > 0 ? impl_->tokens / step_s : 0.0;
  row.tflops_per_gpu = step_s > 0 ? impl_->model_flops / impl_->gpus / step_s / 1e12 : 0.0;
  row.mfu = row.tflops_per_gpu * 1e12 / gpu_spec(s.cluster.gpu).peak_bf16.value;  // as the summary's mfu
  // Dominant overhead: the largest wall besides compute, unless the overheads are under 10%.
  const double over[3] = {w.exposed_comm_us, w.bubble_us, w.host_us};
  const char* names[3] = {"exposed_comm", "bubble", "launch_bound"};
  const int arg = static_cast<int>(std::max_element(over, over + 3) - over);
  row.dominant = (over[0] + over[1] + over[2]) < 0.1 * row.step_time_us ? "compute" : names[arg];
  return row;
}

// ---------------------------------------------------------------------------------------------
// The sweep
// ---------------------------------------------------------------------------------------------

namespace {

// Rows ordered best first: estimated by step time, then peak memory, then index.
bool better(const PlanRow& a, const PlanRow& b) {
  if (a.step_time_us != b.step_time_us) return a.step_time_us < b.step_time_us;
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  return a.cand.index < b.cand.index;
}

// OOM losers: closest to fitting first.
bool better_oom(const PlanRow& a, const PlanRow& b) {
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  return a.cand.index < b.cand.index;
}

std::string loser_reason(const PlanRow& r) { return r.outcome == Outcome::oom ? "oom" : r.dominant; }

// Keeps the best `limit` rows per reason (bounded; order-independent, so shards merge exactly).
class LoserSample {
 public:
  explicit LoserSample(int limit) : limit_(static_cast<std::size_t>(std::max(0, limit))) {}
  void offer(PlanRow row) {
    if (limit_ == 0) return;
    auto& v = by_reason_[loser_reason(row)];
    const bool oom = row.outcome == Outcome::oom;
    auto cmp = [oom](const PlanRow& a, const PlanRow& b) { return oom ? better_oom(a, b) : better(a, b); };
    if (v.size() >= limit_ && !cmp(row, v.back())) return;
    v.insert(std::upper_bound(v.begin(), v.end(), row, cmp), std::move(row));
    if (v.size() > limit_) v.pop_back();
  }
  std::vector<PlanRow> rows() const {
    std::vector<PlanRow> out;
    for (const auto& [reason, v] : by_reason_) out.insert(out.end(), v.begin(), v.end());
    return out;
  }

 private:
  std::size_t limit_;
  std::map<std::string, std::vector<PlanRow>> by_reason_;
};

// The best `k` rows; evicted rows go to the loser sample.
class TopK {
 public:
  TopK(int k, LoserSample& losers) : k_(static_cast<std::size_t>(std::max(1, k))), losers_(losers) {}
  void offer(PlanRow row) {
    if (rows_.size() >= k_ && !better(row, rows_.back())) {
      losers_.offer(std::move(row));
      return;
    }
    rows_.insert(std::upper_bound(rows_.begin(), rows_.end(), row, better), std::move(row));
    if (rows_.size() > k_) {
      losers_.offer(std::move(rows_.back()));
      rows_.pop_back();
    }
  }
  [[nodiscard]] const std::vector<PlanRow>& rows() const { return rows_; }

 private:
  std::size_t k_;
  LoserSample& losers_;
  std::vector<PlanRow> rows_;
};

}  // namespace

// The candidates of shard i of N. The enumeration's fastest digits are pp and vpp, so it is a run of
// blocks of pp x vpp candidates, each block one reduced-scenario key (every other knob fixed); the
// shard takes one block of each round of N consecutive blocks, in snake order: position i of
// even rounds, N - 1 - i of odd ones (blocks i, 2N - 1 - i, 2N + i, ...). Neighbouring blocks differ
// in the fast knobs (precision, CUDA graphs, dispatcher, recompute, mbs), so each shard gets a like
// mix of cheap (pruned) and costly (estimated) blocks; the snake keeps a knob of two values from
// landing on the same shards every round. A block's reduced simulation stays in one shard.
class ShardBlocks {
 public:
  ShardBlocks(const SearchSpace& space, int shard_index, int shard_count)
      : block_(static_cast<std::uint64_t>(space.pp.size() * space.vpp.size())),
        i_(static_cast<std::uint64_t>(shard_index)), n_(static_cast<std::uint64_t>(shard_count)) {
    const std::uint64_t blocks = space.size() / block_;  // the size is a multiple of the block size
    const std::uint64_t rounds = blocks / n_;
    blocks_ = rounds + (position(rounds) < blocks % n_ ? 1 : 0);  // the last round may be partial
  }
  [[nodiscard]] std::uint64_t size() const { return blocks_ * block_; }
  // The enumeration index of this shard's j-th candidate (0 <= j < size()).
  [[nodiscard]] std::uint64_t index(std::uint64_t j) const {
    const std::uint64_t round = j / block_;
    return (round * n_ + position(round)) * block_ + j % block_;
  }

 private:
  [[nodiscard]] std::uint64_t position(std::uint64_t round) const { return round % 2 == 0 ? i_ : n_ - 1 - i_; }
  std::uint64_t block_, i_, n_, blocks_ = 0;
};

PlanResult run_plan(const scenarios::LoadedScenario& base, const OpCoster& coster, const PlanOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count) {
    throw InputError("plan: --shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) +
                     " is not i/N with 0 <= i < N");
  }
  const std::uint64_t S = o.search.size();
  if (S == 0) throw InputError("plan: the search space is empty (" + o.search.spec() + ")");
  PlanEstimator est(base, coster, o.gpus, o.memory, o.cache_entries);
  PlanResult r;
  r.scenario_path = base.scenario.source_path;
  r.scenario_name = base.scenario.name;
  r.scenario_hash = base.scenario.content_hash;
  r.gpus = o.gpus;
  r.search = o.search.spec();
  r.shard_index = o.shard_index;
  r.shard_count = o.shard_count;
  r.top_k = o.top_k;
  r.losers_per_reason = o.losers_per_reason;
  const ShardBlocks shard(o.search, o.shard_index, o.shard_count);
  r.counters.total = shard.size();
  LoserSample losers(o.losers_per_reason);
  TopK top(o.top_k, losers);
  for (std::uint64_t j = 0; j < r.counters.total; ++j) {
    PlanRow row = est.evaluate(candidate_at(o.search, o.gpus, shard.index(j)));
    ++r.counters.enumerated;
    switch (row.outcome) {
      case Outcome::rule: ++r.counters.rule[row.rule.substr(0, row.rule.find('+'))]; break;
      case Outcome::oom:
        ++r.counters.oom;
        losers.offer(std::move(row));
        break;
      case Outcome::estimated:
        ++r.counters.estimated;
        ++r.counters.dominant[row.dominant];
        top.offer(std::move(row));
        break;
    }
    if (r.counters.enumerated % std::max<std::uint64_t>(1, o.progress_every) == 0) {
      if (o.progress) o.progress(r.counters.enumerated, r.counters.total);
      if (o.best_so_far) o.best_so_far(top.rows());
    }
  }
  if (o.progress) o.progress(r.counters.enumerated, r.counters.total);
  r.top = top.rows();
  r.losers = losers.rows();
  r.counters.reduced_simulations = est.reduced_simulations();
  r.counters.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  explain_rows(r);
  return r;
}

void explain_rows(PlanResult& r) {
  std::sort(r.top.begin(), r.top.end(), better);
  if (r.top.empty()) {
    for (auto& row : r.losers) {
      if (row.outcome == Outcome::oom) row.why = "out of memory";
    }
    return;
  }
  const PlanRow& best = r.top.front();
  auto explain = [&best](PlanRow& row) {
    char buf[256];
    if (row.outcome == Outcome::oom) {
      std::snprintf(buf, sizeof buf, "OOM: peak %.1f GiB > %.1f GiB", row.peak_bytes / 1073741824.0,
                    row.capacity_bytes / 1073741824.0);
      row.why = buf;
      return;
    }
    if (&row == &best) {
      row.why = "best";
      return;
    }
    const double d[4] = {row.walls.compute_us - best.walls.compute_us,
                         row.walls.exposed_comm_us - best.walls.exposed_comm_us,
                         row.walls.bubble_us - best.walls.bubble_us, row.walls.host_us - best.walls.host_us};
    const char* names[4] = {"compute (recompute, GEMM efficiency)", "exposed communication", "pipeline bubble",
                            "launch-bound (host)"};
    const int arg = static_cast<int>(std::max_element(d, d + 4) - d);
    const double slower = best.step_time_us > 0 ? 100.0 * (row.step_time_us / best.step_time_us - 1.0) : 0.0;
    std::snprintf(buf, sizeof buf, "+%.1f%% step: %s +%.1f ms", slower, names[arg], d[arg] / 1000.0);
    row.why = buf;
  };
  for (auto& row : r.top) explain(row);
  for (auto& row : r.losers) explain(row);
}

PlanResult merge_plans(const std::vector<PlanResult>& shards) {
  if (shards.empty()) throw InputError("plan-merge: no shard files given");
  const PlanResult& a = shards.front();
  // Indices seen, kept as a set: the work is bounded by the files given, not by the shard count a
  // file claims (a count of 2^31 - 1 must not allocate a slot per shard).
  std::set<int> seen;
  for (const auto& s : shards) {
    auto mismatch = [&](const std::string& field, const std::string& x, const std::string& y) {
      if (x != y) {
        throw InputError("plan-merge: shards differ in " + field + " ('" + x + "' vs '" + y +
                         "'); merge only the shards of one sweep");
      }
    };
    mismatch("scenario_hash", a.scenario_hash, s.scenario_hash);
    mismatch("profile_id", a.profile_id, s.profile_id);
    mismatch("gpus", std::to_string(a.gpus), std::to_string(s.gpus));
    mismatch("search", a.search, s.search);
    mismatch("top_k", std::to_string(a.top_k), std::to_string(s.top_k));
    mismatch("losers_per_reason", std::to_string(a.losers_per_reason), std::to_string(s.losers_per_reason));
    mismatch("shard_count", std::to_string(a.shard_count), std::to_string(s.shard_count));
    if (s.shard_index < 0 || s.shard_index >= a.shard_count) {
      throw InputError("plan-merge: shard index " + std::to_string(s.shard_index) + " out of range; allowed: 0.." +
                       std::to_string(a.shard_count - 1));
    }
    if (!seen.insert(s.shard_index).second) {
      throw InputError("plan-merge: shard " + std::to_string(s.shard_index) + "/" + std::to_string(a.shard_count) +
                       " given twice");
    }
  }
  if (seen.size() != static_cast<std::size_t>(std::max(1, a.shard_count))) {
    constexpr std::size_t kListed = 10;  // missing shards named in the message
    std::vector<std::string> missing;
    for (int i = 0; i < a.shard_count && missing.size() < kListed; ++i) {
      if (!seen.count(i)) missing.push_back(std::to_string(i) + "/" + std::to_string(a.shard_count));
    }
    const long long absent = static_cast<long long>(a.shard_count) - static_cast<long long>(seen.size());
    throw InputError("plan-merge: missing shard(s) " + join(missing, ", ") +
                     (absent > static_cast<long long>(missing.size()) ? ", ... (" + std::to_string(absent) + " in all)"
                                                                      : std::string()));
  }
  PlanResult r = a;
  r.shard_index = 0;
  r.shard_count = 1;
  r.counters = {};
  r.top.clear();
  r.losers.clear();
  LoserSample losers(a.losers_per_reason);
  TopK top(a.top_k, losers);
  for (const auto& s : shards) {
    const auto& c = s.counters;
    r.counters.total += c.total;
    r.counters.enumerated += c.enumerated;
    r.counters.estimated += c.estimated;
    r.counters.oom += c.oom;
    r.counters.reduced_simulations += c.reduced_simulations;
    r.counters.wall_s += c.wall_s;
    for (const auto& [k, v] : c.rule) r.counters.rule[k] += v;
    for (const auto& [k, v] : c.dominant) r.counters.dominant[k] += v;
    for (auto row : s.top) {
      row.flow_step_time_us.reset();
      row.flow_walls.reset();
      row.flow_peak_bytes.reset();
      row.flow_error.clear();
      top.offer(std::move(row));
    }
    for (const auto& row : s.losers) losers.offer(row);
  }
  r.top = top.rows();
  r.losers = losers.rows();
  explain_rows(r);
  return r;
}

}  // namespace threewalls::sim
