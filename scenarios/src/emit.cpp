#include "emit.hpp"

#include <algorithm>
#include <atomic>
#include <tuple>

#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/graph_scopes.hpp"

namespace threewalls::scenarios {

std::size_t StepGraph::total_ops() const {
  std::size_t n = 0;
  for (const auto& c : classes) n += c.ops.size();
  return n;
}

namespace detail {

namespace {
bool is_tp_collective(const Spec& sp, Collective kind) {
  return sp.kind == OpKind::collective && sp.group == Group::tp && static_cast<Collective>(sp.sub) == kind;
}
}  // namespace

GraphTables::GraphTables(StepGraph& g) : graph_(g) {
  static std::atomic<std::uint64_t> next{1};
  serial_ = next.fetch_add(1, std::memory_order_relaxed);
}

std::uint16_t GraphTables::phase(std::string_view name) {
  auto it = phase_ids_.find(name);
  if (it != phase_ids_.end()) return it->second;
  if (graph_.phases.size() >= std::numeric_limits<std::uint16_t>::max()) {
    throw Error("StepGraph: too many distinct phase names");
  }
  auto id = static_cast<std::uint16_t>(graph_.phases.size());
  graph_.phases.emplace_back(name);
  phase_ids_.emplace(std::string(name), id);
  return id;
}

std::uint8_t GraphTables::stream(std::string_view name, StreamKind kind) {
  for (std::size_t i = 0; i < graph_.streams.size(); ++i) {
    if (graph_.streams[i].name == name) return static_cast<std::uint8_t>(i);
  }
  if (graph_.streams.size() >= 255) throw Error("StepGraph: too many streams");
  graph_.streams.push_back({std::string(name), kind});
  return static_cast<std::uint8_t>(graph_.streams.size() - 1);
}

std::uint8_t GraphTables::graph_scope(std::string_view name) {
  for (std::size_t i = 0; i < graph_.graphs.size(); ++i) {
    if (graph_.graphs[i] == name) return static_cast<std::uint8_t>(i + 1);
  }
  graph_.graphs.emplace_back(name);
  return static_cast<std::uint8_t>(graph_.graphs.size());
}

std::uint32_t ClassBuilder::emit(Op op, std::initializer_list<std::uint32_t> deps) {
  return emit(op, deps.begin(), deps.end());
}

std::uint32_t ClassBuilder::emit(Op op, const std::uint32_t* deps_begin, const std::uint32_t* deps_end) {
  op.deps_begin = static_cast<std::uint32_t>(rc_.deps.size());
  for (const auto* d = deps_begin; d != deps_end; ++d) {
    if (*d == kNoOp) continue;
    // Same-stream order is implied (FIFO); keep only cross-stream edges.
    if (rc_.ops[*d].stream == op.stream) continue;
    if (std::find(rc_.deps.begin() + op.deps_begin, rc_.deps.end(), *d) != rc_.deps.end()) continue;
    rc_.deps.push_back(*d);
  }
  op.deps_end = static_cast<std::uint32_t>(rc_.deps.size());
  rc_.ops.push_back(op);
  return static_cast<std::uint32_t>(rc_.ops.size() - 1);
}

void ClassBuilder::add_dep(std::uint32_t op_index, std::uint32_t dep) {
  if (dep == kNoOp) return;
  Op& op = rc_.ops[op_index];
  if (rc_.ops[dep].stream == op.stream) return;
  for (auto i = op.deps_begin; i < op.deps_end; ++i) {
    if (rc_.deps[i] == dep) return;
  }
  if (op.deps_end != rc_.deps.size()) {
    std::vector<std::uint32_t> copy(rc_.deps.begin() + op.deps_begin, rc_.deps.begin() + op.deps_end);
    op.deps_begin = static_cast<std::uint32_t>(rc_.deps.size());
    rc_.deps.insert(rc_.deps.end(), copy.begin(), copy.end());
  }
  rc_.deps.push_back(dep);
  op.deps_end = static_cast<std::uint32_t>(rc_.deps.size());
}

Op copy_op(CopyKind kind, double bytes) {
  Op op;
  op.kind = OpKind::copy;
  op.sub = static_cast<std::uint8_t>(kind);
  op.wall = Wall::memory;
  op.bytes = bytes;
  op.shape = {static_cast<std::int64_t>(bytes), 0, 0, 0, 0, 0};
  return op;
}

Op host_op(HostKind kind, std::uint8_t stream) {
  Op op;
  op.kind = OpKind::host;
  op.sub = static_cast<std::uint8_t>(kind);
  op.wall = Wall::host;
  op.stream = stream;
  return op;
}

void mark_graph_runs(RankClass& rc) {
  for (std::uint32_t i = 0; i < rc.ops.size();) {
    const std::uint8_t g = rc.ops[i].graph;
    std::uint32_t j = i + 1;
    while (j < rc.ops.size() && rc.ops[j].graph == g && g != 0) ++j;
    if (g != 0) rc.graph_runs.push_back({i, j, g});
    i = j;
  }
}

Emitter::Emitter(const Ctx& c, const ClassInfo& ci, GraphTables& tables, ClassBuilder& b)
    : c_(c), ci_(ci), t_(tables), b_(b) {
  compute_ = t_.stream("compute", StreamKind::compute);
}

std::uint8_t Emitter::stream_for(const Spec& sp) {
  switch (sp.role) {
    case Role::compute: return compute_;
    case Role::tp_comm: return t_.stream("tp_comm", StreamKind::communication);
    case Role::cp_comm: return t_.stream("cp_comm", StreamKind::communication);
    case Role::shared: return t_.stream("shared_expert", StreamKind::compute);
    case Role::expert: {
      // Interned on first use, in the order the slots first appear.
      if (sp.stream_slot < 0) return t_.stream("expert_" + std::to_string(sp.stream_slot), StreamKind::compute);
      const auto slot = static_cast<std::size_t>(sp.stream_slot);
      if (slot >= expert_streams_.size()) expert_streams_.resize(slot + 1, kNoStream);
      if (expert_streams_[slot] == kNoStream) {
        expert_streams_[slot] = t_.stream("expert_" + std::to_string(sp.stream_slot), StreamKind::compute);
      }
      return expert_streams_[slot];
    }
  }
  return compute_;
}

std::uint8_t Emitter::graph_of(const Spec& sp, bool dense_layer) {
  const auto& e = c_.exec;
  if (e.cuda_graph_scope.empty() || sp.kind == OpKind::host) return 0;
  if (e.graph_scope(graph_scopes::kFullIteration)) return t_.graph_scope(graph_scopes::kFullIteration);
  switch (sp.module) {
    case Module::attn_norm:
    case Module::attn_proj_in:
    case Module::mla_up:
    case Module::attn_core:
    case Module::attn_out: return e.graph_scope(graph_scopes::kAttn) ? t_.graph_scope(graph_scopes::kAttn) : 0;
    case Module::mlp_norm:
      if (dense_layer) return e.graph_scope(graph_scopes::kMlp) ? t_.graph_scope(graph_scopes::kMlp) : 0;
      return e.graph_scope(graph_scopes::kMoeRouter)       ? t_.graph_scope(graph_scopes::kMoeRouter)
             : e.graph_scope(graph_scopes::kMoePreprocess) ? t_.graph_scope(graph_scopes::kMoePreprocess)
                                                           : 0;
    case Module::mlp: return e.graph_scope(graph_scopes::kMlp) ? t_.graph_scope(graph_scopes::kMlp) : 0;
    case Module::router:
      if (e.graph_scope(graph_scopes::kMoeRouter)) return t_.graph_scope(graph_scopes::kMoeRouter);
      return e.graph_scope(graph_scopes::kMoePreprocess) ? t_.graph_scope(graph_scopes::kMoePreprocess) : 0;
    case Module::moe_pre:
      return e.graph_scope(graph_scopes::kMoePreprocess) ? t_.graph_scope(graph_scopes::kMoePreprocess) : 0;
    default: return 0;
  }
}

template <class Name>
std::uint16_t Emitter::interned_phase(const Program& p, std::size_t index, std::size_t slot, const Name& name) {
  if (p.phase_tables != t_.serial()) {
    p.phase_ids.clear();
    p.phase_tables = t_.serial();
  }
  if (p.phase_ids.size() != p.specs.size()) {
    std::array<std::uint16_t, Program::kSuffixSlots + Program::kQuantSlots> none{};
    none.fill(kNoPhase);
    p.phase_ids.resize(p.specs.size(), none);
  }
  std::uint16_t& id = p.phase_ids[index].at(slot);
  if (id == kNoPhase) {
    phase_name_.assign(p.specs[index].name);
    name(phase_name_);
    id = t_.phase(phase_name_);
  }
  return id;
}

std::uint16_t Emitter::phase_of(const Program& p, std::size_t index, Suffix suffix) {
  static_assert(Program::kSuffixSlots == kSuffixes);
  static constexpr std::array<std::string_view, kSuffixes> kText = {"_fwd", "_recompute", "_dgrad", "_wgrad", "_bwd"};
  const auto k = static_cast<std::size_t>(suffix);
  return interned_phase(p, index, k, [&](std::string& name) { name.append(kText[k]); });
}

Op Emitter::base_op(const Program& p, std::size_t index, Suffix suffix, int layer, int mb, int chunk,
                    std::uint8_t flags, bool dense_layer) {
  const Spec& sp = p.specs[index];
  Op op;
  op.kind = sp.kind;
  op.shape = sp.shape;
  op.flops = sp.flops;
  op.bytes = sp.bytes;
  op.phase = phase_of(p, index, suffix);
  op.layer = static_cast<std::int32_t>(layer);
  op.microbatch = static_cast<std::int32_t>(mb);
  op.expert = static_cast<std::int32_t>(sp.expert);
  op.chunk = static_cast<std::int32_t>(chunk);
  op.stream = stream_for(sp);
  op.wall = sp.wall;
  op.sub = sp.sub;
  op.group = sp.group;
  op.group_size = static_cast<std::int32_t>(c_.layout.group_size(sp.group));
  op.dtype = sp.dtype;
  op.tokens = sp.tokens;
  op.flags = static_cast<std::uint8_t>(sp.flags | flags);
  op.graph = graph_of(sp, dense_layer);
  if (sp.kind == OpKind::norm) {
    op.sub = static_cast<std::uint8_t>(c_.s.model.normalization == Normalization::layernorm ? NormKind::layernorm
                                                                                            : NormKind::rmsnorm);
  }
  if (stream_override_ != kDefaultStream) op.stream = stream_override_;
  if (sp.kind == OpKind::host) op.stream = t_.stream("host", StreamKind::host);
  return op;
}

bool Emitter::casts(const Spec& sp) const {
  return c_.quant.on && sp.dtype == DType::fp8 && (sp.kind == OpKind::gemm || sp.kind == OpKind::grouped_gemm);
}

std::uint16_t Emitter::quant_phase(const Program& p, std::size_t index, unsigned code, std::string_view what,
                                   std::string_view kind, std::string_view dir) {
  return interned_phase(p, index, Program::kSuffixSlots + code,
                        [&](std::string& name) { name.append(what).append(kind).append(dir); });
}

std::uint32_t Emitter::quantize(const Spec& sp, Operand operand, const Instance& in, bool recompute, bool tp_reduce) {
  const Fp8Quant& q = c_.quant;
  // The operand's rows x columns: a GEMM {m, n, k, batch} reads X[m, k], W[k, n] per batch entry and
  // its output gradient is dY[m, n]; a grouped GEMM {rows, n, k, groups} has one W[k, n] per group.
  const bool grouped = sp.kind == OpKind::grouped_gemm;
  const std::int64_t m = sp.shape[0], n = sp.shape[1], k = sp.shape[2];
  const std::int64_t copies = grouped ? 1 : std::max<std::int64_t>(sp.shape[3], 1);
  std::int64_t rows = m * copies;
  std::int64_t cols = k;
  if (operand == Operand::grad) cols = n;
  if (operand == Operand::weight) {
    rows = k * (grouped ? std::max<std::int64_t>(sp.shape[3], 1) : copies);
    cols = n;
  }
  const std::int64_t elements = rows * cols;
  const bool bwd = operand == Operand::grad;
  const std::string_view dir = bwd ? "_bwd" : recompute ? "_recompute" : "_fwd";
  const std::string_view what = operand == Operand::weight ? "_weight" : "";
  const std::uint8_t flags = bwd ? kBackward : recompute ? kRecompute : 0;
  // quant_phase's code: the operand, the direction and the kind of op; `sp` is a spec of in.p.
  const auto spec_index = static_cast<std::size_t>(&sp - in.p->specs.data());
  const unsigned named_code = static_cast<unsigned>(operand) * 9U + (bwd ? 2U : recompute ? 1U : 0U) * 3U;
  auto named = [&](std::string_view kind) {
    Op op;
    const unsigned kind_code = kind == "_amax" ? 0U : kind == "_cast" ? 1U : 2U;
    op.phase = quant_phase(*in.p, spec_index, named_code + kind_code, what, kind, dir);
    op.layer = static_cast<std::int32_t>(in.layer);
    op.microbatch = static_cast<std::int32_t>(in.mb);
    op.expert = static_cast<std::int32_t>(sp.expert);
    op.chunk = static_cast<std::int32_t>(in.chunk);
    op.stream = stream_override_ != kDefaultStream ? stream_override_ : stream_for(sp);
    op.tokens = sp.tokens;
    op.flags = flags;
    op.graph = graph_of(sp, in.dense_layer);
    return op;
  };
  auto elementwise = [&](std::string_view kind, ElementwiseKind sub, double bytes_per_element) {
    Op op = named(kind);
    op.kind = OpKind::elementwise;
    op.sub = static_cast<std::uint8_t>(sub);
    op.wall = Wall::memory;
    op.group = Group::none;
    op.group_size = 1;
    op.shape = {elements, 0, 0, 0, 0, 0, 0};
    op.bytes = bytes_per_element * static_cast<double>(elements);
    return op;
  };
  std::uint32_t last = kNoOp;
  auto emit = [&](const Op& op) {
    last = last == kNoOp ? b_.emit(op, deps_.data(), deps_.data() + deps_.size()) : b_.emit(op, {last});
  };
  const bool weight = operand == Operand::weight;
  if (weight ? q.weight_amax_pass : q.amax_pass) emit(elementwise("_amax", ElementwiseKind::amax, kBf16Bytes));
  if (tp_reduce) {
    Op ar = named("_amax_allreduce");
    ar.kind = OpKind::collective;
    ar.sub = static_cast<std::uint8_t>(Collective::all_reduce);
    ar.wall = Wall::communication;
    ar.group = Group::tp;
    ar.group_size = static_cast<std::int32_t>(c_.layout.group_size(Group::tp));
    ar.bytes = kFp32Bytes;  // one amax
    ar.shape = {static_cast<std::int64_t>(ar.bytes), 0, 0, 0, 0, 0, 0};
    emit(ar);
  }
  Op cast = elementwise("_cast", ElementwiseKind::quantize, weight ? q.weight_cast_bytes : q.cast_bytes);
  cast.shape = {elements, rows, cols, c_.training ? 1 : 0, 0, 0, 0};
  if (weight && q.fp8_weights) cast.dtype = DType::fp8;  // the source: a weight kept in fp8
  emit(cast);
  return last;
}

std::size_t Emitter::quantize_grad(const Spec& sp, const Instance& in, std::size_t index) {
  // The output gradient of a row-parallel GEMM under sequence parallelism arrives gathered over tp
  // (the backward of its reduce-scatter).
  bool gathered = false;
  for (int j : (*in.consumers)[index]) {
    gathered = gathered || is_tp_collective(in.p->specs[static_cast<std::size_t>(j)], Collective::reduce_scatter);
  }
  const bool reduce = gathered && c_.quant.tp_amax_reduce;
  const std::uint32_t cast = quantize(sp, Operand::grad, in, false, reduce);
  deps_.assign(1, cast);
  return 1 + (c_.quant.amax_pass ? 1 : 0) + (reduce ? 1 : 0);
}

namespace {
// An instance of program `p` at those indices, with nothing emitted yet.
Emitter::Instance instance_of(const Program& p, int layer, int mb, int chunk, bool dense_layer) {
  Emitter::Instance in;
  in.p = &p;
  in.layer = layer;
  in.mb = mb;
  in.chunk = chunk;
  in.dense_layer = dense_layer;
  return in;
}
}  // namespace

Emitter::Instance Emitter::begin_forward(const Program& p, int layer, int mb, int chunk, std::uint32_t input,
                                         bool dense_layer) const {
  Instance in = instance_of(p, layer, mb, chunk, dense_layer);
  in.input = input;
  in.ids.assign(p.specs.size(), kNoOp);
  return in;
}

Emitter::Instance Emitter::begin_backward(const Program& p, int layer, int mb, int chunk, std::uint32_t grad_in,
                                          std::vector<std::uint32_t> recomputed, bool dense_layer) {
  Instance in = instance_of(p, layer, mb, chunk, dense_layer);
  in.grad_in = grad_in;
  in.last = grad_in;
  in.recomputed = std::move(recomputed);
  const std::size_t n = p.specs.size();
  in.grad_of.assign(n, kNoOp);
  auto [it, fresh] = consumers_.try_emplace(&p);
  if (fresh) {
    it->second.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      for (int a : p.specs[j].after) {
        if (a >= 0) it->second[static_cast<std::size_t>(a)].push_back(static_cast<int>(j));
      }
    }
  }
  in.consumers = &it->second;
  return in;
}

std::vector<std::uint32_t> Emitter::forward(const Program& p, int layer, int mb, int chunk, std::uint32_t input,
                                            bool recompute, const std::vector<bool>* subset, bool dense_layer) {
  Instance in = begin_forward(p, layer, mb, chunk, input, dense_layer);
  forward_part(in, recompute, subset);
  return std::move(in.ids);
}

std::size_t Emitter::forward_part(Instance& in, bool recompute, const std::vector<bool>* part, std::uint8_t stream) {
  const Program& p = *in.p;
  const Suffix suffix = recompute ? Suffix::recompute : Suffix::fwd;
  stream_override_ = stream;
  std::size_t emitted = 0;
  for (std::size_t i = 0; i < p.specs.size(); ++i) {
    if (part && !(*part)[i]) continue;
    const Spec& sp = p.specs[i];
    if (recompute && sp.kind == OpKind::host) continue;
    deps_.clear();
    for (int a : sp.after) {
      if (a < 0)
        deps_.push_back(in.input);
      else
        deps_.push_back(in.ids[static_cast<std::size_t>(a)]);
    }
    if (casts(sp)) {
      // The weight is cast once per step, at the chunk's first micro-batch (Transformer Engine caches
      // it for the others: Megatron's is_first_microbatch), never again in a recompute.
      std::uint32_t weight = kNoOp;
      if (!recompute && in.mb == 0 && c_.quant.weight_cast_bytes > 0) {
        std::vector<std::uint32_t> producers;
        producers.swap(deps_);
        weight = quantize(sp, Operand::weight, in, false, false);
        deps_.swap(producers);
        emitted += 1 + (c_.quant.weight_amax_pass ? 1 : 0);
      }
      bool gathered = false;
      for (int a : sp.after) {
        if (a >= 0)
          gathered = gathered || is_tp_collective(p.specs[static_cast<std::size_t>(a)], Collective::all_gather);
      }
      const bool reduce = gathered && c_.quant.tp_amax_reduce;
      const std::uint32_t cast = quantize(sp, Operand::input, in, recompute, reduce);
      emitted += 1 + (c_.quant.amax_pass ? 1 : 0) + (reduce ? 1 : 0);
      deps_.assign({cast, weight});
    }
    Op op = base_op(p, i, suffix, in.layer, in.mb, in.chunk, recompute ? kRecompute : 0, in.dense_layer);
    in.ids[i] = b_.emit(op, deps_.data(), deps_.data() + deps_.size());
    ++emitted;
  }
  stream_override_ = kDefaultStream;
  return emitted;
}

std::uint32_t Emitter::backward(const Program& p, int layer, int mb, int chunk, std::uint32_t grad_in,
                                const std::vector<std::uint32_t>& recomputed, bool dense_layer) {
  Instance in = begin_backward(p, layer, mb, chunk, grad_in, recomputed, dense_layer);
  backward_part(in, nullptr);
  return in.backward_result();
}

std::size_t Emitter::backward_part(Instance& in, const std::vector<bool>* part, std::uint8_t stream,
                                   std::vector<DeferredWgrad>* deferred) {
  const Program& p = *in.p;
  const std::size_t n = p.specs.size();
  const int layer = in.layer;
  const int mb = in.mb;
  const int chunk = in.chunk;
  const bool dense_layer = in.dense_layer;
  stream_override_ = stream;
  std::size_t emitted = 0;
  auto emit_wgrad = [&](const Op& w, std::uint32_t dgrad) {
    if (deferred) {
      deferred->push_back({w, dgrad});
    } else {
      b_.emit(w, {dgrad});
      ++emitted;
    }
  };
  for (std::size_t ii = n; ii-- > 0;) {
    if (part && !(*part)[ii]) continue;
    const Spec& sp = p.specs[ii];
    if (sp.bwd == Bwd::none) continue;
    deps_.clear();
    const std::vector<int>& consumers = (*in.consumers)[ii];
    if (consumers.empty() || ii == n - 1) deps_.push_back(in.grad_in);
    for (int j : consumers) {
      if (in.grad_of[static_cast<std::size_t>(j)] != kNoOp) deps_.push_back(in.grad_of[static_cast<std::size_t>(j)]);
    }
    if (in.recomputed.size() == n && in.recomputed[ii] != kNoOp) deps_.push_back(in.recomputed[ii]);
    std::uint32_t id = kNoOp;
    const std::uint8_t fl = kBackward;
    switch (sp.bwd) {
      case Bwd::gemm: {
        if (casts(sp)) emitted += quantize_grad(sp, in, ii);
        Op d = base_op(p, ii, Suffix::dgrad, layer, mb, chunk, fl, dense_layer);
        d.shape = {sp.shape[0], sp.shape[2], sp.shape[1], sp.shape[3], 0, 0};
        d.bytes = gemm_bytes(sp.shape[0], sp.shape[2], sp.shape[1], sp.dtype == DType::fp8 ? 1.0 : 2.0);
        id = b_.emit(d, deps_.data(), deps_.data() + deps_.size());
        Op w = base_op(p, ii, Suffix::wgrad, layer, mb, chunk, fl | kWgrad, dense_layer);
        w.shape = {sp.shape[2], sp.shape[1], sp.shape[0], sp.shape[3], 0, 0};
        w.bytes = gemm_bytes(sp.shape[2], sp.shape[1], sp.shape[0], sp.dtype == DType::fp8 ? 1.0 : 2.0);
        emit_wgrad(w, id);
        break;
      }
      case Bwd::grouped: {
        if (casts(sp)) emitted += quantize_grad(sp, in, ii);
        Op d = base_op(p, ii, Suffix::dgrad, layer, mb, chunk, fl, dense_layer);
        d.shape = {sp.shape[0], sp.shape[2], sp.shape[1], sp.shape[3], sp.shape[4], 0};
        id = b_.emit(d, deps_.data(), deps_.data() + deps_.size());
        Op w = base_op(p, ii, Suffix::wgrad, layer, mb, chunk, fl | kWgrad, dense_layer);
        // dW_g [k x n] = X_g^T [k x r_g] dY_g [r_g x n]: the rows are the reduction dimension.
        w.shape = {sp.shape[0], sp.shape[1], sp.shape[2], sp.shape[3], sp.shape[4], 1};
        emit_wgrad(w, id);
        break;
      }
      case Bwd::attention: {
        Op a = base_op(p, ii, Suffix::bwd, layer, mb, chunk, fl, dense_layer);
        a.flops = 2.0 * sp.flops;
        a.bytes = sp.bwd_bytes;
        id = b_.emit(a, deps_.data(), deps_.data() + deps_.size());
        break;
      }
      case Bwd::same_kind: {
        Op e = base_op(p, ii, Suffix::bwd, layer, mb, chunk, fl, dense_layer);
        e.bytes = sp.bwd_bytes;
        e.flops = 0;
        if (sp.kind == OpKind::elementwise) {
          auto k = static_cast<ElementwiseKind>(sp.sub);
          if (k == ElementwiseKind::swiglu) e.sub = static_cast<std::uint8_t>(ElementwiseKind::swiglu_bwd);
          if (k == ElementwiseKind::gelu) e.sub = static_cast<std::uint8_t>(ElementwiseKind::gelu_bwd);
        }
        id = b_.emit(e, deps_.data(), deps_.data() + deps_.size());
        break;
      }
      case Bwd::collective: {
        Op cl = base_op(p, ii, Suffix::bwd, layer, mb, chunk, fl, dense_layer);
        auto kind = static_cast<Collective>(sp.sub);
        if (kind == Collective::all_gather) cl.sub = static_cast<std::uint8_t>(Collective::reduce_scatter);
        if (kind == Collective::reduce_scatter) cl.sub = static_cast<std::uint8_t>(Collective::all_gather);
        if (kind == Collective::all_to_all && sp.shape[1] != 0) {
          // The gradient of a dispatch travels like a combine and vice versa.
          const std::int64_t routed = sp.shape[1] == 1 ? 2 : 1;
          cl.shape[1] = routed;
          cl.bytes = static_cast<double>(sp.shape[0]) * (routed == 2 ? ci_.load : 1.0);
        }
        id = b_.emit(cl, deps_.data(), deps_.data() + deps_.size());
        break;
      }
      case Bwd::none: break;
    }
    in.grad_of[ii] = id;
    if (id != kNoOp) {
      in.last = id;
      ++emitted;
    }
    // The program input's gradient comes from the specs that read the input.
    for (int a : sp.after) {
      if (a < 0) in.input_grad = id;
    }
  }
  stream_override_ = kDefaultStream;
  return emitted;
}

}  // namespace detail
}  // namespace threewalls::scenarios
