#include "threewalls/scenarios/registry.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "threewalls/core/strings.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/graph_scopes.hpp"

namespace threewalls::scenarios {
namespace {

// ---- field <-> Value, by the field's C++ type (the loader guarantees the variant alternative of
// each ParamType; bind() checks at registration that the field's type fits the key's ParamType) ----
template <class T>
struct IsQuantity : std::false_type {};
template <class Tag>
struct IsQuantity<Quantity<Tag>> : std::true_type {};

template <class T>
bool type_fits(ParamType t) {
  if constexpr (std::is_enum_v<T>) {
    return t == ParamType::choice;
  } else if constexpr (std::is_same_v<T, bool>) {
    return t == ParamType::boolean;
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, std::uint64_t>) {
    return t == ParamType::integer;
  } else if constexpr (std::is_same_v<T, double>) {
    return t == ParamType::real;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return t == ParamType::string || t == ParamType::choice;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return t == ParamType::choice_list;
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    return t == ParamType::int_list;
  } else if constexpr (IsQuantity<T>::value) {
    return t == ParamType::bytes || t == ParamType::bandwidth || t == ParamType::duration || t == ParamType::flop_rate;
  } else {
    return false;
  }
}

template <class T>
void from_value(T& out, const Value& v, const std::vector<std::string>& choices) {
  if constexpr (std::is_enum_v<T>) {
    const auto it = std::find(choices.begin(), choices.end(), std::get<std::string>(v));
    out = static_cast<T>(it - choices.begin());
  } else if constexpr (std::is_same_v<T, int>) {
    out = static_cast<int>(std::get<std::int64_t>(v));
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    out = static_cast<std::uint64_t>(std::get<std::int64_t>(v));
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    const auto& l = std::get<std::vector<std::int64_t>>(v);
    out.assign(l.begin(), l.end());
  } else if constexpr (IsQuantity<T>::value) {
    out = T(std::get<double>(v));
  } else {
    out = std::get<T>(v);
  }
}

template <class T>
Value to_value(const T& field, const std::vector<std::string>& choices) {
  if constexpr (std::is_enum_v<T>) {
    return choices.at(static_cast<std::size_t>(field));
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, std::uint64_t>) {
    return static_cast<std::int64_t>(field);
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    return std::vector<std::int64_t>(field.begin(), field.end());
  } else if constexpr (IsQuantity<T>::value) {
    return field.value;
  } else {
    return field;
  }
}

// The part of the scenario a table's keys live in. Each is a generic lambda so that one accessor
// serves the setter (Scenario&) and the getter (const Scenario&); `i` is the array element.
constexpr auto kTop = [](auto& s, std::size_t) -> auto& { return s; };
constexpr auto kModel = [](auto& s, std::size_t) -> auto& { return s.model; };
constexpr auto kParallel = [](auto& s, std::size_t) -> auto& { return s.parallel; };
constexpr auto kTrain = [](auto& s, std::size_t) -> auto& { return *s.train; };
constexpr auto kInfer = [](auto& s, std::size_t) -> auto& { return *s.infer; };
constexpr auto kOffload = [](auto& s, std::size_t) -> auto& { return s.infer->expert_offload; };
constexpr auto kCluster = [](auto& s, std::size_t) -> auto& { return s.cluster; };
constexpr auto kSlowdown = [](auto& s, std::size_t i) -> auto& { return s.cluster.slowdowns.at(i); };
constexpr auto kRun = [](auto& s, std::size_t) -> auto& { return s.run; };
constexpr auto kProfiler = [](auto& s, std::size_t) -> auto& { return s.run.profiler; };

// ---- a small builder so each key reads as one declaration ----
class Decl {
 public:
  Decl(Registry& r, std::string path, ParamType t) : r_(r) {
    p_.path = std::move(path);
    p_.type = t;
  }
  Decl(const Decl&) = delete;
  Decl& operator=(const Decl&) = delete;
  ~Decl() { r_.add_param(std::move(p_)); }
  // One line per builder step.
  // clang-format off
  Decl& required() { p_.required = true; return *this; }
  Decl& def(std::string toml) { p_.default_toml = std::move(toml); return *this; }
  Decl& derived(std::string note) { p_.default_note = std::move(note); return *this; }
  Decl& doc(std::string d) { p_.description = std::move(d); return *this; }
  Decl& choices(std::vector<std::string> c) { p_.choices = std::move(c); return *this; }
  Decl& min(double m) { p_.min = m; return *this; }
  Decl& max(double m) { p_.max = m; return *this; }
  Decl& set(Setter s) { p_.set = std::move(s); return *this; }
  Decl& get(Getter g) { p_.get = std::move(g); return *this; }
  // clang-format on

  // The key is the field `member` of the scenario part `part` (kModel, kTrain, ...): setter and getter
  // both, converted by the field's type (enums by the key's choices, declared before).
  template <class Part, class Owner, class T>
  Decl& bind(Part part, T Owner::*member) {
    if (!type_fits<T>(p_.type)) {
      throw std::logic_error("registry: " + p_.path + " is declared " + to_string(p_.type) +
                             " but bound to a field of another type");
    }
    if constexpr (std::is_enum_v<T>) {
      if (p_.choices.empty()) throw std::logic_error("registry: " + p_.path + " binds an enum before its choices");
    }
    const std::vector<std::string> choices = p_.choices;
    p_.set = [part, member, choices](Scenario& s, const Value& v, std::size_t i) {
      from_value(part(s, i).*member, v, choices);
    };
    p_.get = [part, member, choices](const Scenario& s, std::size_t i) -> std::optional<Value> {
      return to_value(part(s, i).*member, choices);
    };
    return *this;
  }
  // Writes the key only for scenarios where `applies` holds (after bind or get).
  template <class Pred>
  Decl& written_when(Pred applies) {
    p_.get = [applies, g = std::move(p_.get)](const Scenario& s, std::size_t i) -> std::optional<Value> {
      if (!applies(s)) return std::nullopt;
      return g(s, i);
    };
    return *this;
  }

 private:
  Registry& r_;
  ParamSpec p_;
};

// [train] and [infer] share these execution options: declared once, mounted under both tables.
// The declarations here and in Registry() are a table laid out by hand, one key per statement.
// clang-format off
template <class Exec>
void add_exec_options(Registry& r, const std::string& table, Exec exec) {
  static const std::vector<std::string> kPrecision = {"bf16", "fp8"};
  static const std::vector<std::string> kFp8Recipe = {"delayed", "tensorwise", "blockwise", "mxfp8"};
  static const std::vector<std::string> kFp8Format = {"e4m3", "hybrid"};
  static const std::vector<std::string> kGraphScopes(graph_scopes::kAll.begin(), graph_scopes::kAll.end());
  static const std::vector<std::string> kDispatcher = {"alltoall", "allgather", "flex"};
  Decl(r, table + ".precision", ParamType::choice)
      .def("\"bf16\"")
      .choices(kPrecision)
      .doc("GEMM precision of the linear layers (fp8 needs a Hopper GPU).")
      .bind(exec, &ExecOptions::precision);
  Decl(r, table + ".fp8_recipe", ParamType::choice)
      .def("\"delayed\"")
      .choices(kFp8Recipe)
      .doc("Megatron's --fp8-recipe, with precision = \"fp8\" (ignored with bf16): how Transformer Engine scales "
           "the fp8 operands, and so which quantisation kernels each fp8 GEMM pays. delayed: scale from an amax "
           "history, the amax recorded by the cast; one amax all-reduce per forward and backward pass of a model "
           "chunk. tensorwise (current scaling, Megatron-Bridge's FP8_CS): an amax pass over each tensor before "
           "its cast, and with sequence parallelism an amax all-reduce over tp. blockwise (1 x 128 / 128 x 128 "
           "scales, DeepSeek-V3's recipe) and mxfp8 (1 x 32 E8M0 scales, Blackwell only): scales computed in the "
           "cast. docs/stepgraph.md, \"FP8 quantisation\".")
      .bind(exec, &ExecOptions::fp8_recipe);
  Decl(r, table + ".fp8_format", ParamType::choice)
      .def("\"hybrid\"")
      .choices(kFp8Format)
      .doc("Megatron's --fp8-format, with precision = \"fp8\": e4m3 everywhere, or hybrid (e4m3 forward, e5m2 "
           "gradients). Same bytes and kernels either way, so it changes no prediction; blockwise needs e4m3 "
           "(Transformer Engine's rule).")
      .bind(exec, &ExecOptions::fp8_format);
  Decl(r, table + ".cuda_graph_scope", ParamType::choice_list)
      .def("[]")
      .choices(kGraphScopes)
      .doc("Parts of each step captured into CUDA graphs and replayed (one graph launch plus per-node "
           "costs instead of per-op launches). full_iteration needs static shapes.")
      .bind(exec, &ExecOptions::cuda_graph_scope);
  Decl(r, table + ".token_dispatcher", ParamType::choice)
      .def("\"alltoall\"")
      .choices(kDispatcher)
      .doc("MoE token dispatcher (Megatron's --moe-token-dispatcher-type): all-to-all over the EP group (NCCL: "
           "peers in the node over NVLink, others over the network), all-gather of all tokens, or flex "
           "(DeepEP-style, --moe-enable-deepep: one network copy per token and destination node, forwarded over "
           "NVLink there, the received tokens permuted into expert order and back by kernels of their own; "
           "docs/simulator.md, \"Expert dispatch across nodes\").")
      .bind(exec, &ExecOptions::token_dispatcher);
  Decl(r, table + ".expert_execution", ParamType::choice)
      .def("\"grouped\"")
      .choices({"sequential", "streams:N", "grouped", "split:N"})
      .doc("How a rank runs its local experts: one expert after another on one stream, round-robin over "
           "N streams with events (both as Hugging Face's loop: a gather, gate, up, down and a scatter per "
           "expert), one grouped GEMM per projection, or split:N as Transformer Engine's GroupedLinear runs "
           "them with its multi-stream cuBLAS backend (Megatron-Core's TEGroupedMLP, bf16 and fp8, before TE's "
           "cuBLASLt grouped GEMM): the permuted rows split per expert without a copy, one GEMM per expert "
           "and projection (gate and up fused) round-robin over N streams, one activation over all rows; "
           "training steps.")
      .set([exec](Scenario& s, const Value& v, std::size_t i) {
        const auto& t = std::get<std::string>(v);
        auto& e = exec(s, i).expert_execution;
        if (t == "sequential") {
          e = {ExpertExecutionKind::sequential, 1};
        } else if (t == "grouped") {
          e = {ExpertExecutionKind::grouped, 1};
        } else if (t.rfind("split:", 0) == 0) {
          e = {ExpertExecutionKind::split, std::stoi(t.substr(t.find(':') + 1))};
        } else {
          e = {ExpertExecutionKind::streams, std::stoi(t.substr(t.find(':') + 1))};
        }
      })
      .get([exec](const Scenario& s, std::size_t i) -> std::optional<Value> {
        return to_string(exec(s, i).expert_execution);
      });
  Decl(r, table + ".sync_routing_stats", ParamType::boolean)
      .def("false")
      .doc("A GPU-to-CPU read of the routing statistics (tokens per expert) in every MoE layer, as "
           "dropless dispatchers without CUDA graphs do; blocks the host.")
      .bind(exec, &ExecOptions::sync_routing_stats);
  Decl(r, table + ".sync_after_copy", ParamType::boolean)
      .def("false")
      .doc("A stream synchronisation after every host/device copy; blocks the host.")
      .bind(exec, &ExecOptions::sync_after_copy);
}
// clang-format on

}  // namespace

std::string rank_list_allowed() {
  std::string out;
  for (std::string_view w : kRankListWords) out += "\"" + std::string(w) + "\", ";
  out.resize(out.size() - 2);
  return out + " or an array of ranks";
}

const char* to_string(ParamType t) {
  switch (t) {
    case ParamType::integer: return "integer";
    case ParamType::real: return "number";
    case ParamType::boolean: return "boolean";
    case ParamType::string: return "string";
    case ParamType::choice: return "choice";
    case ParamType::choice_list: return "list of choices";
    case ParamType::int_list: return "list of integers";
    case ParamType::rank_list: return "rank selection";
    case ParamType::bytes: return "size";
    case ParamType::bandwidth: return "bandwidth";
    case ParamType::duration: return "duration";
    case ParamType::flop_rate: return "FLOP rate";
  }
  return "?";
}

std::string ParamSpec::table() const {
  auto pos = path.rfind('.');
  return pos == std::string::npos ? std::string() : path.substr(0, pos);
}

std::string ParamSpec::key() const {
  auto pos = path.rfind('.');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

std::string ParamSpec::unit_hint() const {
  switch (type) {
    case ParamType::bytes: return "string with a size unit (B, kB, MB, GB, KiB, MiB, GiB, ...), e.g. \"80GiB\"";
    case ParamType::bandwidth: return "string with a rate unit (GBps = bytes/s, Gbps = bits/s), e.g. \"450GBps\"";
    case ParamType::duration: return "string with a time unit (s, ms, us, ns), e.g. \"1.5us\"";
    case ParamType::flop_rate: return "string with a FLOP/s unit, e.g. \"989TFLOPS\"";
    case ParamType::choice: return "one of " + join(choices, ", ", true);
    case ParamType::choice_list: return "array of distinct values from " + join(choices, ", ", true);
    case ParamType::int_list: return "array of integers";
    case ParamType::rank_list: return rank_list_allowed();
    case ParamType::integer: return "integer";
    case ParamType::real: return "number";
    case ParamType::boolean: return "true or false";
    case ParamType::string: return "string";
  }
  return "";
}

std::string ParamSpec::format_value(double v) const {
  switch (type) {
    case ParamType::bytes: return format_bytes(Bytes(v));
    case ParamType::bandwidth: return format_bandwidth(BytesPerSecond(v));
    case ParamType::duration: return format_duration(Seconds(v));
    case ParamType::flop_rate: return format_flop_rate(FlopsPerSecond(v));
    default: break;
  }
  std::ostringstream os;
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18)
    os << static_cast<long long>(v);
  else
    os << v;
  return os.str();
}

const Registry& Registry::instance() {
  static const Registry r;
  return r;
}

const ParamSpec* Registry::find_param(const std::string& path) const {
  for (const auto& p : params_) {
    if (p.path == path) return &p;
  }
  return nullptr;
}

const TableSpec* Registry::find_table(const std::string& path) const {
  for (const auto& t : tables_) {
    if (t.path == path) return &t;
  }
  return nullptr;
}

std::vector<std::string> Registry::children(const std::string& table) const {
  std::vector<std::string> out;
  for (const auto& p : params_) {
    if (p.table() == table) out.push_back(p.key());
  }
  for (const auto& t : tables_) {
    auto pos = t.path.rfind('.');
    std::string parent = pos == std::string::npos ? std::string() : t.path.substr(0, pos);
    std::string leaf = pos == std::string::npos ? t.path : t.path.substr(pos + 1);
    if (parent == table) out.push_back(leaf);
  }
  return out;
}

std::vector<const ParamSpec*> Registry::params_in(const std::string& table) const {
  std::vector<const ParamSpec*> out;
  for (const auto& p : params_) {
    if (p.table() == table) out.push_back(&p);
  }
  return out;
}

namespace {

std::string default_column(const ParamSpec& p) {
  if (p.required) return "required";
  if (!p.default_toml.empty()) return "`" + p.default_toml + "`";
  if (!p.default_note.empty()) return p.default_note;
  return "none";
}

std::string range_text(const ParamSpec& p) {
  std::ostringstream os;
  if (p.min && p.max)
    os << p.format_value(*p.min) << " to " << p.format_value(*p.max);
  else if (p.min)
    os << ">= " << p.format_value(*p.min);
  else if (p.max)
    os << "<= " << p.format_value(*p.max);
  return os.str();
}

}  // namespace

std::string Registry::markdown_reference() const {
  std::ostringstream os;
  os << "# Scenario reference (schema_version " << 1 << ")\n\n"
     << "<!-- Generated by `threewalls describe --markdown` from scenarios/src/registry.cpp; "
        "do not edit by hand (tests/scenarios/reference_test.cpp fails when this file is stale). -->\n\n"
     << "A scenario is a TOML file. Unknown tables and keys are errors. Sizes, bandwidths and durations are "
        "strings with units: sizes take SI (`kB`, `MB`, `GB` = 10^3n bytes) and IEC (`KiB`, `MiB`, `GiB` = "
        "2^10n bytes) prefixes; bandwidths are bytes per second (`GBps`, `GB/s`) or bits per second "
        "(`Gbps`, `Gb/s`); durations take `s`, `ms`, `us`, `ns`. Consistency rules are listed in "
        "[docs/scenario_rules.md](scenario_rules.md).\n\n";
  auto emit_table = [&](const std::string& path, const std::string& title, const std::string& desc) {
    os << "## " << title << "\n\n" << desc << "\n\n";
    auto ps = params_in(path);
    if (ps.empty()) return;
    os << "| key | type | default | description |\n|---|---|---|---|\n";
    for (const auto* p : ps) {
      std::string type = p->unit_hint();
      auto range = range_text(*p);
      if (!range.empty()) type += " (" + range + ")";
      std::string d = p->description;
      std::replace(d.begin(), d.end(), '|', '/');
      os << "| `" << p->key() << "` | " << type << " | " << default_column(*p) << " | " << d << " |\n";
    }
    os << "\n";
  };
  emit_table("", "Top level", "Keys outside any table.");
  for (const auto& t : tables_) {
    std::string title = t.is_array ? "[[" + t.path + "]]" : "[" + t.path + "]";
    std::string desc = t.description + (t.required ? " **Required.**" : " Optional.");
    if (!t.exclusive_with.empty()) desc += " Not together with " + join(t.exclusive_with, ", ") + ".";
    emit_table(t.path, "`" + title + "`", desc);
  }
  return os.str();
}

std::string Registry::text_reference(const std::string& only_table) const {
  std::ostringstream os;
  auto emit = [&](const std::string& path, const std::string& header) {
    os << header << "\n";
    for (const auto* p : params_in(path)) {
      os << "  " << p->key() << "  (" << p->unit_hint();
      auto range = range_text(*p);
      if (!range.empty()) os << ", " << range;
      os << "; " << default_column(*p) << ")\n      " << p->description << "\n";
    }
    os << "\n";
  };
  if (only_table.empty()) emit("", "top level");
  for (const auto& t : tables_) {
    if (!only_table.empty() && t.path != only_table) continue;
    emit(t.path, (t.is_array ? "[[" + t.path + "]]" : "[" + t.path + "]") + "  " + t.description +
                     (t.required ? " (required)" : ""));
  }
  return os.str();
}

std::optional<std::size_t> ParamSpec::choice_index(std::string_view text) const {
  const auto it = std::find(choices.begin(), choices.end(), text);
  if (it == choices.end()) return std::nullopt;
  return static_cast<std::size_t>(it - choices.begin());
}

const ParamSpec& choice_param(const std::string& path) {
  const ParamSpec* p = Registry::instance().find_param(path);
  if (p == nullptr || p->type != ParamType::choice) {
    throw std::logic_error("registry: '" + path + "' is not a choice key");
  }
  return *p;
}
// ----------------------------------------------------------------------------------------------
// The declarations. Names follow Megatron-Core's arguments where one exists.
// ----------------------------------------------------------------------------------------------
// clang-format off
// Allowed ranges of the cluster's sizes, rates and latencies: wide enough for any real machine, narrow
// enough that every time and rate computed from them stays a finite, normal double.
constexpr double kMinGpuMemoryBytes = 1024.0 * 1024.0;                        // 1 MiB
constexpr double kMaxGpuMemoryBytes = 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0;  // 1 PiB
constexpr double kMinLinkBandwidth = 1e6;   // 1 MB/s
constexpr double kMaxLinkBandwidth = 1e15;  // 1 PB/s
constexpr double kMaxLatencySeconds = 1.0;
// Integer keys: at least 10x past today's largest models and runs; each bound keeps the products the
// expansion forms (tokens x width, experts x layers) inside 64-bit integers and doubles.
constexpr double kMaxLayers = 100000;
constexpr double kMaxMtpLayers = 16;  // Megatron-Core runs a handful of MTP depths; DeepSeek-V3 trains with 1
constexpr double kMaxWidth = 1 << 20;         // hidden size, LoRA ranks
constexpr double kMaxFfnWidth = 1 << 22;      // FFN and expert FFN sizes
constexpr double kMaxHeads = 1 << 16;
constexpr double kMaxHeadDim = 1 << 16;
constexpr double kMaxVocab = 1 << 24;
constexpr double kMaxExperts = 1 << 20;
constexpr double kMaxTopk = 1024;
constexpr double kMaxSequences = 1 << 20;     // sequences per micro-batch or inference batch
constexpr double kMaxSequenceTokens = 1 << 24;  // tokens of one sequence
constexpr double kMaxSwitchPorts = 1 << 16;
constexpr double kMaxSteps = 1000000;

Registry::Registry() {
  Registry& r = *this;
  const auto is_mla = [](const Scenario& s) { return s.model.attention == AttentionKind::mla; };

  // ---- top level ----
  Decl(r, "schema_version", ParamType::integer)
      .required()
      .min(1)
      .doc("Version of the scenario language this file is written in. This threewalls reads 1.")
      .bind(kTop, &Scenario::schema_version);
  Decl(r, "name", ParamType::string)
      .derived("the file name without .toml")
      .doc("Scenario name, written into every output header.")
      .bind(kTop, &Scenario::name);
  Decl(r, "description", ParamType::string)
      .def("\"\"")
      .doc("Free text: what the scenario is and where its numbers come from.")
      .bind(kTop, &Scenario::description);

  // ---- [model] ----
  r.add_table({"model", "Model dimensions (dense and MoE), as in Megatron-Core's arguments.", true, false, {}, {}, {}});
  Decl(r, "model.name", ParamType::string).def("\"\"").doc("Model name, e.g. \"DeepSeek-V3\".")
      .bind(kModel, &ModelSpec::name);
  // Upper bounds below keep derived arithmetic in range (world = nodes x gpus_per_node fits an int; per-layer
  // loops stay short); both are far beyond any real model or cluster.
  Decl(r, "model.num_layers", ParamType::integer).required().min(1).max(kMaxLayers).doc("Number of transformer layers.")
      .bind(kModel, &ModelSpec::num_layers);
  Decl(r, "model.hidden_size", ParamType::integer).required().min(1).max(kMaxWidth).doc("Model (embedding) dimension.")
      .bind(kModel, &ModelSpec::hidden_size);
  Decl(r, "model.ffn_hidden_size", ParamType::integer).def("0").min(0).max(kMaxFfnWidth)
      .doc("Hidden size of the dense MLP; required when any layer is dense.")
      .bind(kModel, &ModelSpec::ffn_hidden_size);
  Decl(r, "model.num_attention_heads", ParamType::integer).required().min(1).max(kMaxHeads).doc("Number of query heads.")
      .bind(kModel, &ModelSpec::num_attention_heads);
  // Written for gqa only: mha derives it (= num_attention_heads) and mla refuses it.
  Decl(r, "model.num_query_groups", ParamType::integer).derived("num_attention_heads").min(1).max(kMaxHeads)
      .doc("Key/value head groups for grouped-query attention (gqa).")
      .bind(kModel, &ModelSpec::num_query_groups)
      .written_when([](const Scenario& s) { return s.model.attention == AttentionKind::gqa; });
  Decl(r, "model.kv_channels", ParamType::integer).derived("hidden_size / num_attention_heads").min(1).max(kMaxHeadDim)
      .doc("Head dimension of mha/gqa attention.")
      .bind(kModel, &ModelSpec::kv_channels)
      .written_when([is_mla](const Scenario& s) { return !is_mla(s); });
  {
    static const std::vector<std::string> kAttn = {"mha", "gqa", "mla"};
    Decl(r, "model.attention", ParamType::choice).def("\"mha\"").choices(kAttn)
        .doc("Attention kind: multi-head, grouped-query or multi-latent (DeepSeek).")
        .bind(kModel, &ModelSpec::attention);
  }
  {
    static const std::vector<std::string> kImpl = {"fused", "unfused"};
    // Written only when not the default, so that scenarios written before the key read back the same.
    Decl(r, "model.attention_impl", ParamType::choice).def("\"fused\"").choices(kImpl)
        .doc("How attention runs: \"fused\" (flash-style: cuDNN's SDPA graph, a split-KV kernel for decode) or "
             "\"unfused\" (batched GEMMs with the scores in memory and a softmax kernel between them, as eager "
             "frameworks run it). threewalls run runs the chosen kernels; the simulator costs each from its "
             "calibration family, and costs fused attention from the unfused fits (with a warning) when the "
             "profile has no fused attention family.")
        .bind(kModel, &ModelSpec::attention_impl)
        .written_when([](const Scenario& s) { return s.model.attention_impl != AttentionImpl::fused; });
  }
  Decl(r, "model.q_lora_rank", ParamType::integer).def("0").min(0).max(kMaxWidth)
      .doc("mla: rank of the query down-projection; 0 = queries are not compressed.")
      .bind(kModel, &ModelSpec::q_lora_rank);
  // The other MLA dimensions have no default: attention = "mla" needs each of them, others none.
  Decl(r, "model.kv_lora_rank", ParamType::integer).derived("none; required by attention = \"mla\"").min(0).max(kMaxWidth)
      .doc("mla: rank of the joint key/value down-projection.")
      .bind(kModel, &ModelSpec::kv_lora_rank)
      .written_when(is_mla);
  Decl(r, "model.qk_head_dim", ParamType::integer).derived("none; required by attention = \"mla\"").min(0).max(kMaxHeadDim)
      .doc("mla: query/key head dimension without the rotary part.")
      .bind(kModel, &ModelSpec::qk_head_dim)
      .written_when(is_mla);
  Decl(r, "model.qk_pos_emb_head_dim", ParamType::integer).derived("none; required by attention = \"mla\"").min(0).max(kMaxHeadDim)
      .doc("mla: rotary (decoupled) query/key head dimension.")
      .bind(kModel, &ModelSpec::qk_pos_emb_head_dim)
      .written_when(is_mla);
  Decl(r, "model.v_head_dim", ParamType::integer).derived("none; required by attention = \"mla\"").min(0).max(kMaxHeadDim)
      .doc("mla: value head dimension.")
      .bind(kModel, &ModelSpec::v_head_dim)
      .written_when(is_mla);
  Decl(r, "model.vocab_size", ParamType::integer).required().min(1).max(kMaxVocab)
      .doc("Vocabulary size (padded to a multiple of 128 x tp as Megatron does).")
      .bind(kModel, &ModelSpec::vocab_size);
  Decl(r, "model.swiglu", ParamType::boolean).def("true").doc("Gated linear unit (SwiGLU) in MLPs and experts.")
      .bind(kModel, &ModelSpec::swiglu);
  Decl(r, "model.untie_embeddings_and_output_weights", ParamType::boolean).def("true")
      .doc("Separate input embedding and output layer weights; false ties them (an extra gradient "
           "all-reduce between the first and last pipeline stage).")
      .bind(kModel, &ModelSpec::untie_embeddings_and_output_weights);
  {
    static const std::vector<std::string> kNorm = {"rmsnorm", "layernorm"};
    Decl(r, "model.normalization", ParamType::choice).def("\"rmsnorm\"").choices(kNorm).doc("Normalization layer.")
        .bind(kModel, &ModelSpec::normalization);
  }
  Decl(r, "model.qk_layernorm", ParamType::boolean).def("false")
      .doc("A norm (model.normalization) of every query and key head before attention (Megatron --qk-layernorm; "
           "Qwen3, OLMoE): one norm op over (query + key heads) x head-dim rows, forward and backward, its input "
           "kept for the backward. MHA and GQA only (MLA normalises its latents).")
      .bind(kModel, &ModelSpec::qk_layernorm);
  {
    static const std::vector<std::string> kPos = {"none", "rope"};
    Decl(r, "model.position_embedding_type", ParamType::choice).def("\"none\"").choices(kPos)
        .doc("Position embedding the step times: rope (Megatron --position-embedding-type rope, fused: one "
             "streaming op over the queries and keys, MLA's over their rotary part, forward and backward) or "
             "none (not timed).")
        .bind(kModel, &ModelSpec::position_embedding_type);
  }
  Decl(r, "model.window_size", ParamType::integer).def("0").min(0).max(kMaxSequenceTokens)
      .doc("Sliding-window attention (Megatron --window-size (window_size - 1, 0); Hugging Face sliding_window; "
           "GPT-OSS: 128): a windowed layer's query attends to itself and the window_size - 1 keys before it, "
           "and fused attention visits only those keys (training, prefill and decode). 0 = full causal attention "
           "in every layer. The KV cache of an inference step keeps every key (no sliding-window cache).")
      .bind(kModel, &ModelSpec::window_size);
  Decl(r, "model.window_attn_skip_freq", ParamType::integer).def("0").min(0).max(kMaxLayers)
      .doc("With window_size: every n-th layer (1-based: layers n, 2n, ...) keeps full attention, as Megatron's "
           "--window-attn-skip-freq n (GPT-OSS: 2, Hugging Face layer_types alternating sliding and full); "
           "0 = every layer is windowed.")
      .bind(kModel, &ModelSpec::window_attn_skip_freq);
  Decl(r, "model.num_experts", ParamType::integer).def("0").min(0).max(kMaxExperts)
      .doc("Routed experts per MoE layer; 0 = dense model.")
      .bind(kModel, &ModelSpec::num_experts);
  Decl(r, "model.moe_ffn_hidden_size", ParamType::integer).def("0").min(0).max(kMaxFfnWidth)
      .doc("Hidden size of each routed expert; required when num_experts > 0.")
      .bind(kModel, &ModelSpec::moe_ffn_hidden_size);
  Decl(r, "model.moe_router_topk", ParamType::integer).def("0").min(0).max(kMaxTopk)
      .doc("Experts each token is routed to; required when num_experts > 0.")
      .bind(kModel, &ModelSpec::moe_router_topk);
  Decl(r, "model.moe_router_num_groups", ParamType::integer).def("0").min(0).max(kMaxExperts)
      .doc("Group-limited routing (Megatron's --moe-router-num-groups; DeepSeek-V3: 8): the experts form this many "
           "contiguous groups and each token's experts come from moe_router_group_topk of them; with expert "
           "parallelism across nodes this bounds the nodes a token is sent to. 0 = no group limit.")
      .bind(kModel, &ModelSpec::moe_router_num_groups);
  Decl(r, "model.moe_router_group_topk", ParamType::integer).def("0").min(0).max(kMaxExperts)
      .doc("Groups each token's experts may come from (Megatron's --moe-router-group-topk; DeepSeek-V3: 4); "
           "required with moe_router_num_groups.")
      .bind(kModel, &ModelSpec::moe_router_group_topk);
  Decl(r, "model.moe_shared_expert_intermediate_size", ParamType::integer).def("0").min(0).max(kMaxFfnWidth)
      .doc("Total hidden size of the shared experts of an MoE layer; 0 = no shared expert.")
      .bind(kModel, &ModelSpec::moe_shared_expert_intermediate_size);
  Decl(r, "model.first_dense_layers", ParamType::integer).def("0").min(0).max(kMaxLayers)
      .doc("The first layers use the dense MLP instead of experts (DeepSeek: 3; V2-Lite: 1).")
      .bind(kModel, &ModelSpec::first_dense_layers);
  Decl(r, "model.moe_layer_freq", ParamType::integer).def("1").min(1).max(kMaxLayers)
      .doc("After the first dense layers, every n-th layer is an MoE layer, the others dense.")
      .bind(kModel, &ModelSpec::moe_layer_freq);
  Decl(r, "model.mtp_num_layers", ParamType::integer).def("0").min(0).max(kMaxMtpLayers)
      .doc("Multi-token prediction depths (Megatron --mtp-num-layers; DeepSeek-V3: 1), training only: each runs "
           "on the last pipeline stage after the last layer, as Megatron-Core's MTP layer does: the embedding of "
           "the tokens shifted by the depth, a norm of it and of the incoming hidden state, their concatenation "
           "projected to the hidden size (eh_proj), a transformer layer of the last layer's kind, a final norm "
           "and the shared output head with its loss. Inference steps run the main model only.")
      .bind(kModel, &ModelSpec::mtp_num_layers);

  // ---- [parallel] ----
  r.add_table({"parallel", "Parallel layout. Ranks are ordered tp, cp, dp, pp (dense) and etp, ep, edp, pp "
                           "(experts) from fastest to slowest, as Megatron-Core's default order.",
               false, false, {}, {}, {}});
  Decl(r, "parallel.tp", ParamType::integer).def("1").min(1).doc("Tensor-parallel size.")
      .bind(kParallel, &ParallelSpec::tp);
  Decl(r, "parallel.cp", ParamType::integer).def("1").min(1).doc("Context-parallel size.")
      .bind(kParallel, &ParallelSpec::cp);
  Decl(r, "parallel.pp", ParamType::integer).def("1").min(1).doc("Pipeline-parallel size.")
      .bind(kParallel, &ParallelSpec::pp);
  Decl(r, "parallel.vpp", ParamType::integer).def("1").min(1)
      .doc("Virtual pipeline stages (model chunks) per pipeline rank; > 1 selects the interleaved schedule.")
      .bind(kParallel, &ParallelSpec::vpp);
  Decl(r, "parallel.dp", ParamType::integer).derived("world / (tp x cp x pp)").min(1)
      .doc("Data-parallel size; when given it must equal world / (tp x cp x pp).")
      .bind(kParallel, &ParallelSpec::dp);
  Decl(r, "parallel.ep", ParamType::integer).def("1").min(1).doc("Expert-parallel size.")
      .bind(kParallel, &ParallelSpec::ep);
  Decl(r, "parallel.etp", ParamType::integer).def("1").min(1).doc("Expert tensor-parallel size.")
      .bind(kParallel, &ParallelSpec::etp);
  Decl(r, "parallel.sequence_parallel", ParamType::boolean).def("false")
      .doc("Sequence parallelism over the TP group (all-gather / reduce-scatter instead of all-reduce).")
      .bind(kParallel, &ParallelSpec::sequence_parallel);
  Decl(r, "parallel.layers_per_stage", ParamType::int_list).def("[]")
      .doc("Explicit layer count of each of the pp x vpp virtual stages (chunk-major: all stages' chunk 0 "
           "first); empty = even split.")
      .bind(kParallel, &ParallelSpec::layers_per_stage);
  Decl(r, "parallel.first_stage_layers", ParamType::integer).def("0").min(0)
      .doc("Layers on the first pipeline stage (Megatron's decoder_first_pipeline_num_layers); 0 = even split.")
      .bind(kParallel, &ParallelSpec::first_stage_layers);
  Decl(r, "parallel.last_stage_layers", ParamType::integer).def("0").min(0)
      .doc("Layers on the last pipeline stage (Megatron's decoder_last_pipeline_num_layers); 0 = even split.")
      .bind(kParallel, &ParallelSpec::last_stage_layers);

  // ---- [train] ----
  r.add_table({"train", "Training step options.", false, false, [](Scenario& s) { s.train.emplace(); }, {"infer"},
               [](const Scenario& s) -> std::size_t { return s.train ? 1 : 0; }});
  add_exec_options(r, "train", [](auto& s, std::size_t) -> auto& { return s.train->exec; });
  Decl(r, "train.micro_batch_size", ParamType::integer).required().min(1).max(kMaxSequences).doc("Sequences per micro-batch.")
      .bind(kTrain, &TrainSpec::micro_batch_size);
  Decl(r, "train.global_batch_size", ParamType::integer).required().min(1)
      .doc("Sequences per optimizer step over all data-parallel ranks.")
      .bind(kTrain, &TrainSpec::global_batch_size);
  Decl(r, "train.seq_length", ParamType::integer).required().min(1).max(kMaxSequenceTokens).doc("Sequence length in tokens.")
      .bind(kTrain, &TrainSpec::seq_length);
  {
    static const std::vector<std::string> kGran = {"none", "selective", "full"};
    Decl(r, "train.recompute_granularity", ParamType::choice).def("\"none\"").choices(kGran)
        .doc("Activation recomputation: none, selective (recompute_modules) or full layers.")
        .bind(kTrain, &TrainSpec::recompute_granularity);
    static const std::vector<std::string> kMethod = {"uniform", "block"};
    Decl(r, "train.recompute_method", ParamType::choice).def("\"uniform\"").choices(kMethod)
        .doc("full recompute: uniform (checkpoint groups of recompute_num_layers) or block (the first "
             "recompute_num_layers layers of each stage).")
        .bind(kTrain, &TrainSpec::recompute_method);
  }
  Decl(r, "train.recompute_num_layers", ParamType::integer).def("1").min(1).max(kMaxLayers)
      .doc("full recompute: layers per checkpoint group (uniform) or layers recomputed per stage (block).")
      .bind(kTrain, &TrainSpec::recompute_num_layers);
  // Written for selective recompute only: the rules refuse the key with any other granularity.
  Decl(r, "train.recompute_modules", ParamType::choice_list).def("[\"core_attn\"]")
      .choices({"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"})
      .doc("selective recompute: modules whose activations are recomputed in backward.")
      .bind(kTrain, &TrainSpec::recompute_modules)
      .written_when([](const Scenario& s) {
        return s.train->recompute_granularity == RecomputeGranularity::selective;
      });
  Decl(r, "train.use_distributed_optimizer", ParamType::boolean).def("true")
      .doc("Shard optimizer state over data-parallel ranks (reduce-scatter gradients, all-gather parameters).")
      .bind(kTrain, &TrainSpec::use_distributed_optimizer);
  Decl(r, "train.overlap_grad_reduce", ParamType::boolean).def("false")
      .doc("Overlap the data-parallel gradient reduction with backward compute (bucketed).")
      .bind(kTrain, &TrainSpec::overlap_grad_reduce);
  Decl(r, "train.overlap_param_gather", ParamType::boolean).def("false")
      .doc("Overlap the parameter all-gather of the distributed optimizer with the next forward (needs "
           "use_distributed_optimizer; Megatron-Core does not need overlap_grad_reduce with it, Megatron-LM's "
           "arguments do).")
      .bind(kTrain, &TrainSpec::overlap_param_gather);
  Decl(r, "train.tp_comm_overlap", ParamType::boolean).def("false")
      .doc("Overlap tensor-parallel all-gather/reduce-scatter with the neighbouring GEMMs.")
      .bind(kTrain, &TrainSpec::tp_comm_overlap);
  Decl(r, "train.moe_shared_expert_overlap", ParamType::boolean).def("false")
      .doc("Run the shared experts on their own stream, overlapped with token dispatch and combine.")
      .bind(kTrain, &TrainSpec::moe_shared_expert_overlap);
  Decl(r, "train.overlap_moe_expert_parallel_comm", ParamType::boolean).def("false")
      .doc("Megatron's --overlap-moe-expert-parallel-comm (combined 1F1B): in the steady state the forward of one "
           "micro-batch and the backward of another run layer by layer together, the dispatch and combine of "
           "each on the expert-parallel communication stream while the other computes (docs/simulator.md, "
           "\"Expert-parallel communication overlap\"). Needs ep > 1, the alltoall or flex dispatcher, no full "
           "recompute, and pp = 1 or vpp > 1.")
      .bind(kTrain, &TrainSpec::overlap_moe_expert_parallel_comm);
  Decl(r, "train.delay_wgrad_compute", ParamType::boolean).def("false")
      .doc("Megatron's --delay-wgrad-compute: with overlap_moe_expert_parallel_comm, the experts' weight-gradient "
           "GEMMs are issued after the dispatch backward so that they overlap it, and a communication node waits "
           "only for the data it moves, not for the weight gradients of the node before it.")
      .bind(kTrain, &TrainSpec::delay_wgrad_compute);
  {
    static const std::vector<std::string> kSharding = {"none", "no_shard", "optim", "optim_grads",
                                                       "optim_grads_params"};
    Decl(r, "train.data_parallel_sharding_strategy", ParamType::choice).def("\"none\"").choices(kSharding)
        .doc("Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy; PyTorch FSDP2's "
             "--use-torch-fsdp2 is optim_grads_params): what the data-parallel ranks shard, the expert-data-parallel "
             "ranks for expert parameters. none: no FSDP (use_distributed_optimizer decides); no_shard: nothing "
             "(gradients all-reduced); optim: optimizer state; optim_grads: also gradients, reduce-scattered after "
             "every backward of a layer; optim_grads_params: also parameters, all-gathered before every forward and "
             "backward of a layer, the next layer's prefetched (docs/stepgraph.md, \"Megatron-FSDP\"). Not with "
             "use_distributed_optimizer = false.")
        .bind(kTrain, &TrainSpec::data_parallel_sharding_strategy);
  }
  Decl(r, "train.grad_reduce_in_fp32", ParamType::boolean).def("true")
      .doc("Accumulate and reduce gradients in fp32 (Megatron's DDP grad_reduce_in_fp32, the default with bf16); "
           "false is --grad-reduce-in-bf16: the gradient buffer and the data-parallel reductions in bf16, half "
           "the bytes (docs/memory_model.md, \"Weights, gradients, optimizer state\").")
      .bind(kTrain, &TrainSpec::grad_reduce_in_fp32);
  Decl(r, "train.fp8_param_gather", ParamType::boolean).def("false")
      .doc("Megatron's --fp8-param-gather (on in Megatron-Bridge's fp8 recipes): the model weights are kept in "
           "fp8 (1 byte per parameter; the optimizer keeps its fp32 master copy) and the distributed "
           "optimizer's parameter all-gather moves fp8. Needs precision = \"fp8\" and sharded optimizer state "
           "(the distributed optimizer or Megatron-FSDP).")
      .bind(kTrain, &TrainSpec::fp8_param_gather);
  Decl(r, "train.first_last_layers_bf16", ParamType::boolean).def("false")
      .doc("Megatron's --first-last-layers-bf16 (on in Megatron-Bridge's fp8 current-scaling config, off in its "
           "performance scripts): with precision = \"fp8\" the first num_layers_at_start_in_bf16 and the last "
           "num_layers_at_end_in_bf16 layers run their GEMMs in bf16, without fp8 casts (an MTP depth stays in "
           "fp8). Not with fp8_recipe = \"delayed\", as Megatron-Core refuses. Memory: those layers' weights and "
           "saved inputs are counted at the fp8 sizes (not modelled).")
      .bind(kTrain, &TrainSpec::first_last_layers_bf16);
  Decl(r, "train.num_layers_at_start_in_bf16", ParamType::integer).def("1").min(0).max(kMaxLayers)
      .doc("With first_last_layers_bf16: how many of the first layers run in bf16 (Megatron's "
           "--num-layers-at-start-in-bf16).")
      .bind(kTrain, &TrainSpec::num_layers_at_start_in_bf16);
  Decl(r, "train.num_layers_at_end_in_bf16", ParamType::integer).def("1").min(0).max(kMaxLayers)
      .doc("With first_last_layers_bf16: how many of the last layers run in bf16 (Megatron's "
           "--num-layers-at-end-in-bf16).")
      .bind(kTrain, &TrainSpec::num_layers_at_end_in_bf16);
  {
    static const std::vector<std::string> kMoment = {"fp32", "bf16", "fp16", "fp8"};
    Decl(r, "train.exp_avg_dtype", ParamType::choice).def("\"fp32\"").choices(kMoment)
        .doc("Storage type of Adam's first moment (Megatron's --use-precision-aware-optimizer --exp-avg-dtype): "
             "4, 2, 2 or 1 bytes per optimizer-shard parameter.")
        .bind(kTrain, &TrainSpec::exp_avg_dtype);
    Decl(r, "train.exp_avg_sq_dtype", ParamType::choice).def("\"fp32\"").choices(kMoment)
        .doc("Storage type of Adam's second moment (Megatron's --use-precision-aware-optimizer "
             "--exp-avg-sq-dtype): 4, 2, 2 or 1 bytes per optimizer-shard parameter.")
        .bind(kTrain, &TrainSpec::exp_avg_sq_dtype);
  }
  Decl(r, "train.routing_imbalance", ParamType::real).def("1.0").min(1.0)
      .doc("Load imbalance of the routing: tokens received by the busiest EP rank over the mean (1 = "
           "balanced). > 1 splits the ranks into hot and cold rank classes.")
      .bind(kTrain, &TrainSpec::routing_imbalance);
  Decl(r, "train.grad_bucket_size", ParamType::real).def("40000000").min(1).max(1e15)
      .doc("Parameters per data-parallel gradient bucket (Megatron's DDP bucket_size).")
      .bind(kTrain, &TrainSpec::grad_bucket_size_params);

  // ---- [infer] ----
  r.add_table({"infer", "Inference options: a prefill step followed by decode steps.", false, false,
               [](Scenario& s) { s.infer.emplace(); }, {"train"},
               [](const Scenario& s) -> std::size_t { return s.infer ? 1 : 0; }});
  add_exec_options(r, "infer", [](auto& s, std::size_t) -> auto& { return s.infer->exec; });
  Decl(r, "infer.batch_size", ParamType::integer).required().min(1).max(kMaxSequences).doc("Sequences decoded together.")
      .bind(kInfer, &InferSpec::batch_size);
  Decl(r, "infer.prompt_length", ParamType::integer).required().min(1).max(kMaxSequenceTokens).doc("Prompt tokens per sequence.")
      .bind(kInfer, &InferSpec::prompt_length);
  Decl(r, "infer.generate_tokens", ParamType::integer).required().min(0).max(kMaxSequenceTokens)
      .doc("Tokens generated per sequence (decode steps after each prefill); 0 = every step is a prefill.")
      .bind(kInfer, &InferSpec::generate_tokens);
  {
    static const std::vector<std::string> kPrec = {"bf16", "fp8"};
    Decl(r, "infer.kv_cache_precision", ParamType::choice).def("\"bf16\"").choices(kPrec)
        .doc("Element type of the KV cache.")
        .bind(kInfer, &InferSpec::kv_cache_precision);
  }
  Decl(r, "infer.routing_skew", ParamType::real).def("0.0").min(0.0).max(100.0)
      .doc("Zipf exponent of expert popularity in the seeded routing model (0 = uniform).")
      .bind(kInfer, &InferSpec::routing_skew);
  Decl(r, "infer.routing_locality", ParamType::real).def("0.0").min(0.0).max(1.0)
      .doc("Probability that a sequence keeps the experts it used in the previous decode step.")
      .bind(kInfer, &InferSpec::routing_locality);

  r.add_table({"infer.expert_offload", "Where expert weights live and how they reach the GPU.", false, false,
               [](Scenario& s) { s.infer->expert_offload.enabled = true; }, {},
               [](const Scenario& s) -> std::size_t { return s.infer && s.infer->expert_offload.enabled ? 1 : 0; }});
  {
    static const std::vector<std::string> kTier = {"hbm", "host_pinned", "nvme"};
    Decl(r, "infer.expert_offload.tier", ParamType::choice).required().choices(kTier)
        .doc("Home of the expert weights: GPU memory, pinned host memory, or a file read into pinned buffers.")
        .bind(kOffload, &ExpertOffloadSpec::tier);
  }
  Decl(r, "infer.expert_offload.nvme_path", ParamType::string).def("\"\"")
      .doc("nvme tier: file holding the expert weights (created if missing).")
      .bind(kOffload, &ExpertOffloadSpec::nvme_path);
  Decl(r, "infer.expert_offload.cache_experts_per_layer", ParamType::integer).required().min(0).max(kMaxExperts)
      .doc("Experts of each layer kept in the GPU expert cache.")
      .bind(kOffload, &ExpertOffloadSpec::cache_experts_per_layer);
  {
    static const std::vector<std::string> kPolicy = {"lru", "lfu"};
    Decl(r, "infer.expert_offload.policy", ParamType::choice).def("\"lru\"").choices(kPolicy)
        .doc("Expert cache eviction policy.")
        .bind(kOffload, &ExpertOffloadSpec::policy);
    static const std::vector<std::string> kPrefetch = {"none", "next_layer", "all_predicted"};
    Decl(r, "infer.expert_offload.prefetch", ParamType::choice).def("\"none\"").choices(kPrefetch)
        .doc("Prefetch: none, the next layer's experts from router look-ahead, or all predicted experts.")
        .bind(kOffload, &ExpertOffloadSpec::prefetch);
    static const std::vector<std::string> kSync = {"barrier", "per_expert"};
    Decl(r, "infer.expert_offload.sync", ParamType::choice).def("\"barrier\"").choices(kSync)
        .doc("Compute waits for all of a layer's experts (barrier) or for each expert's own copy event.")
        .bind(kOffload, &ExpertOffloadSpec::sync);
  }
  Decl(r, "infer.expert_offload.copy_streams", ParamType::integer).def("1").min(1).max(16)
      .doc("Copy streams used for expert fetches.")
      .bind(kOffload, &ExpertOffloadSpec::copy_streams);

  // ---- [cluster] ----
  r.add_table({"cluster", "The machines: GPUs, NVLink domain per node, PCIe, one NIC per GPU into a fabric.",
               true, false, {}, {}, {}});
  {
    static const std::vector<std::string> kGpu = [] {
      std::vector<std::string> v;
      for (GpuKind g : kGpuKinds) v.emplace_back(to_string(g));
      return v;
    }();
    Decl(r, "cluster.gpu", ParamType::choice).required().choices(kGpu)
        .doc("GPU kind (SXM). b200 and gb200 have no measured profile: \"auto\" takes the synthetic "
             "default_<kind>.toml (datasheet ratios applied to H200 facts) and every summary says so; gb200's NVLink "
             "domain is an NVL72 rack (gpus_per_node up to 72).")
        .bind(kCluster, &ClusterSpec::gpu);
  }
  Decl(r, "cluster.gpus_per_node", ParamType::integer).required().min(1).max(72)
      .doc("GPUs per node (one NVLink domain).")
      .bind(kCluster, &ClusterSpec::gpus_per_node);
  Decl(r, "cluster.nodes", ParamType::integer).required().min(1).max(100000).doc("Number of nodes.")
      .bind(kCluster, &ClusterSpec::nodes);
  Decl(r, "cluster.gpu_memory", ParamType::bytes)
      .derived("by GPU kind: h100 \"79.6GiB\", h200 \"140.4GiB\", b200 \"167GiB\", gb200 \"172.6GiB\"")
      .min(kMinGpuMemoryBytes).max(kMaxGpuMemoryBytes)
      .doc("Usable device memory per GPU, for the OOM verdict.")
      .bind(kCluster, &ClusterSpec::gpu_memory);
  Decl(r, "cluster.nvlink_bandwidth", ParamType::bandwidth)
      .derived("by GPU kind: h100, h200 \"450GBps\" (NVLink4); b200, gb200 \"900GBps\" (NVLink5)")
      .min(kMinLinkBandwidth).max(kMaxLinkBandwidth)
      .doc("NVLink bandwidth per GPU and direction into the node's NVSwitch.")
      .bind(kCluster, &ClusterSpec::nvlink_bandwidth);
  Decl(r, "cluster.nvlink_latency", ParamType::duration).def("\"1us\"")
      .min(0).max(kMaxLatencySeconds).doc("NVLink hop latency.")
      .bind(kCluster, &ClusterSpec::nvlink_latency);
  Decl(r, "cluster.pcie_bandwidth", ParamType::bandwidth).def("\"64GBps\"")
      .min(kMinLinkBandwidth).max(kMaxLinkBandwidth)
      .doc("PCIe bandwidth per GPU and direction to its host (Gen5 x16).")
      .bind(kCluster, &ClusterSpec::pcie_bandwidth);
  Decl(r, "cluster.pcie_latency", ParamType::duration).def("\"1us\"")
      .min(0).max(kMaxLatencySeconds).doc("PCIe latency.")
      .bind(kCluster, &ClusterSpec::pcie_latency);
  Decl(r, "cluster.nic_bandwidth", ParamType::bandwidth).def("\"400Gbps\"")
      .min(kMinLinkBandwidth).max(kMaxLinkBandwidth)
      .doc("Bandwidth of each GPU's NIC per direction.")
      .bind(kCluster, &ClusterSpec::nic_bandwidth);
  Decl(r, "cluster.nic_latency", ParamType::duration).def("\"2us\"")
      .min(0).max(kMaxLatencySeconds).doc("NIC-to-leaf link latency.")
      .bind(kCluster, &ClusterSpec::nic_latency);
  {
    static const std::vector<std::string> kTopo = {"fat_tree", "rail_optimized"};
    Decl(r, "cluster.topology", ParamType::choice).def("\"rail_optimized\"").choices(kTopo)
        .doc("Fabric between nodes: a two-level fat tree, or a rail-optimised fat tree (NIC i of every node "
             "on leaf switch i).")
        .bind(kCluster, &ClusterSpec::topology);
  }
  Decl(r, "cluster.leaf_switch_ports", ParamType::integer).def("64").min(2).max(kMaxSwitchPorts)
      .doc("NIC-facing ports per leaf switch.")
      .bind(kCluster, &ClusterSpec::leaf_switch_ports);
  Decl(r, "cluster.oversubscription", ParamType::real).def("1.0").min(1.0).max(1000.0)
      .doc("Leaf downlink to uplink bandwidth ratio (1 = non-blocking).")
      .bind(kCluster, &ClusterSpec::oversubscription);
  Decl(r, "cluster.switch_latency", ParamType::duration).def("\"1us\"")
      .min(0).max(kMaxLatencySeconds).doc("Latency through one switch.")
      .bind(kCluster, &ClusterSpec::switch_latency);

  r.add_table({"cluster.slowdown", "A slow GPU or link, for what-if and straggler studies (simulator only).",
               false, true, [](Scenario& s) { s.cluster.slowdowns.emplace_back(); }, {},
               [](const Scenario& s) { return s.cluster.slowdowns.size(); }});
  Decl(r, "cluster.slowdown.rank", ParamType::integer).required().min(0).doc("The slow rank.")
      .bind(kSlowdown, &Slowdown::rank);
  Decl(r, "cluster.slowdown.factor", ParamType::real).required().min(1.0).max(1000.0)
      .doc("Durations on that GPU (or bandwidth-bound time on that link) are multiplied by this.")
      .bind(kSlowdown, &Slowdown::factor);
  {
    static const std::vector<std::string> kLink = {"none", "nvlink", "pcie", "nic"};
    Decl(r, "cluster.slowdown.link", ParamType::choice).def("\"none\"").choices(kLink)
        .doc("none: the GPU's kernels are slow; otherwise that rank's link of this kind is slow.")
        .bind(kSlowdown, &Slowdown::link);
  }
  Decl(r, "cluster.slowdown.from_step", ParamType::integer).def("0").min(0).max(kMaxSteps).doc("First affected step.")
      .bind(kSlowdown, &Slowdown::from_step);
  Decl(r, "cluster.slowdown.to_step", ParamType::integer).def("-1").min(-1).max(kMaxSteps)
      .doc("Last affected step (inclusive); -1 = until the end.")
      .bind(kSlowdown, &Slowdown::to_step);

  // ---- [calibration] ----
  r.add_table({"calibration", "Which calibration profile the simulator takes its costs from.", false, false, {}, {},
               {}});
  // The loader resolves a relative path against the scenario's folder; it is written absolute, so
  // the written file finds the same profile wherever it is put.
  Decl(r, "calibration.profile", ParamType::string).def("\"auto\"")
      .doc("Path of a calibration profile (relative to the scenario file), or \"auto\" for the shipped "
           "profile of cluster.gpu.")
      .bind(kTop, &Scenario::calibration_profile)
      .get([](const Scenario& s, std::size_t) -> std::optional<Value> {
        if (s.calibration_profile == "auto") return s.calibration_profile;
        return std::filesystem::absolute(s.calibration_profile).lexically_normal().string();
      });

  // ---- [run] ----
  r.add_table({"run", "Steps to execute and what the profiler records.", false, false, {}, {}, {}});
  {
    static const std::vector<std::string> kFramework = {"cpp", "pytorch_eager"};
    Decl(r, "run.framework", ParamType::choice).def("\"cpp\"").choices(kFramework)
        .doc("What drives the GPU: cpp (threewalls run's C++ executor) or pytorch_eager (a PyTorch eager "
             "program such as the reference runner: an op launched outside a CUDA graph pays the host time of "
             "its PyTorch body where the profile measured it, the pytorch_host.* families, else its launch plus "
             "host.framework_op, PyTorch's per-op dispatch, or for a backward op host.framework_backward_op, "
             "its autograd engine; a training step's per-expert loop over one EP rank's experts reads each "
             "expert's rows on the host, as Hugging Face's torch.where does: expert_rows_read, "
             "host.framework_sync; the memory-bound ops are priced by PyTorch's kernels, the pytorch.* families; "
             "a training step copies autograd's bf16 gradients into fp32 main gradients, main_grad_copy; an "
             "inference run's first sequence builds an attention plan per new shape, "
             "host.framework_attention_plan; docs/simulator.md). threewalls run refuses pytorch_eager: "
             "python3 -m threewalls.runner runs it.")
        .bind(kRun, &RunSpec::framework);
  }
  Decl(r, "run.steps", ParamType::integer).def("3").min(1).max(kMaxSteps).doc("Measured steps (after warm-up).")
      .bind(kRun, &RunSpec::steps);
  Decl(r, "run.warmup_steps", ParamType::integer).def("1").min(0).max(kMaxSteps).doc("Unrecorded steps before the measured ones.")
      .bind(kRun, &RunSpec::warmup_steps);
  Decl(r, "run.cuda_device_max_connections", ParamType::integer).def("8").min(1).max(32)
      .doc("CUDA_DEVICE_MAX_CONNECTIONS of the process: how many hardware work queues the GPU takes work "
           "through; streams map onto them round-robin in creation order and each queue dispatches in issue "
           "order, so a stream waiting for an event holds back the streams behind it on its queue "
           "(docs/simulator.md, \"Hardware work queues\"). CUDA's default is 8; Megatron-LM asks for 1 with "
           "tensor or context parallelism on Hopper (kernels then start in the order the host issues them, "
           "which its communication overlap relies on) and Megatron-Bridge's recipes set 1, 8 or 32. "
           "threewalls run and the reference runner set the variable before they create the CUDA context "
           "(an environment that already sets another value is an error); threewalls import megatron maps an "
           "exported CUDA_DEVICE_MAX_CONNECTIONS.")
      .bind(kRun, &RunSpec::cuda_device_max_connections);
  Decl(r, "run.seed", ParamType::integer).def("1234").min(0)
      .doc("Seed of every random choice (data, routing); recorded in the output header.")
      .bind(kRun, &RunSpec::seed);
  r.add_table({"run.profiler", "Profiler sampling (real runs; the simulator honours the same knobs).", false, false,
               {}, {}, {}});
  Decl(r, "run.profiler.enabled", ParamType::boolean).def("true")
      .doc("false: no phase files are written and nothing is timed.")
      .bind(kProfiler, &ProfilerSpec::enabled);
  Decl(r, "run.profiler.start_step", ParamType::integer).def("0").min(0).max(kMaxSteps).doc("First step that may be recorded.")
      .bind(kProfiler, &ProfilerSpec::start_step);
  Decl(r, "run.profiler.end_step", ParamType::integer).def("-1").min(-1).max(kMaxSteps)
      .doc("Last step that may be recorded (inclusive); -1 = the last step.")
      .bind(kProfiler, &ProfilerSpec::end_step);
  Decl(r, "run.profiler.record_every_n_steps", ParamType::integer).def("10").min(1).max(kMaxSteps)
      .doc("Record one step in n, counted from start_step.")
      .bind(kProfiler, &ProfilerSpec::record_every_n_steps);
  Decl(r, "run.profiler.flush_every_n_steps", ParamType::integer).def("10").min(1).max(kMaxSteps)
      .doc("Write buffered records to disk every n steps.")
      .bind(kProfiler, &ProfilerSpec::flush_every_n_steps);
  Decl(r, "run.profiler.ranks", ParamType::rank_list).def("\"auto\"")
      .doc("Ranks that record: auto (every rank while their run directory stays within 1 GiB, else one rank "
           "of each rank class, with a note), all, one representative of each rank class, or a non-empty list "
           "([] is an error).")
      .set([](Scenario& s, const Value& v, std::size_t) {
        auto& p = s.run.profiler;
        p.ranks.clear();
        if (const auto* l = std::get_if<std::vector<std::int64_t>>(&v)) {
          p.recorded = RecordedRanks::listed;
          p.ranks.assign(l->begin(), l->end());
          return;
        }
        const std::string& word = std::get<std::string>(v);
        const auto it = std::find(kRankListWords.begin(), kRankListWords.end(), word);
        if (it == kRankListWords.end()) throw std::logic_error("run.profiler.ranks: the loader let through " + word);
        p.recorded = static_cast<RecordedRanks>(it - kRankListWords.begin());
      })
      .get([](const Scenario& s, std::size_t) -> std::optional<Value> {
        const auto& p = s.run.profiler;
        if (p.recorded == RecordedRanks::listed) return std::vector<std::int64_t>(p.ranks.begin(), p.ranks.end());
        return std::string(kRankListWords[static_cast<std::size_t>(p.recorded)]);
      });
  {
    static const std::vector<std::string> kGran = {"layer", "coarse"};
    Decl(r, "run.profiler.granularity", ParamType::choice).def("\"layer\"").choices(kGran)
        .doc("layer: one record per op (phase, layer, micro-batch); coarse: host_to_device, training_step "
             "and training_metrics only.")
        .bind(kProfiler, &ProfilerSpec::granularity);
  }
}
// clang-format on

}  // namespace threewalls::scenarios
