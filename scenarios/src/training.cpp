// The training class: the schedule's forward and backward items of every micro-batch on one pipeline
// stage (Megatron-Core's 1F1B and interleaved schedules, schedule.hpp), pipeline sends and receives,
// input copies, selective and full recomputation, data-parallel gradient buckets (overlapped
// reduction, the distributed optimizer's parameter all-gather), and the step's epilogue (gradient
// norm, optimizer, training metrics).
#include "training.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "emit.hpp"
#include "program.hpp"
#include "schedule.hpp"
#include "threewalls/scenarios/parameters.hpp"
#include "threewalls/scenarios/routing.hpp"

namespace threewalls::scenarios::detail {
namespace {

// A data-parallel gradient bucket (Megatron's DDP): consecutive layers in backward order.
struct Bucket {
  bool expert = false;
  double params = 0;
  int chunk = 0;
  int closing_layer = 0;  // the layer whose backward completes the bucket (lowest layer); -1 embedding
  std::vector<int> layers;
};

bool recompute_selected(const TrainSpec& t, const Spec& sp, bool moe_layer) {
  if (t.recompute_granularity != RecomputeGranularity::selective) return false;
  switch (sp.module) {
    case Module::attn_core: return t.recompute_module("core_attn") && sp.kind == OpKind::attention;
    case Module::attn_norm: return t.recompute_module("layernorm");
    case Module::mlp_norm: return t.recompute_module("layernorm") || (moe_layer && t.recompute_module("moe"));
    case Module::mla_up: return t.recompute_module("mla_up_proj");
    case Module::mlp: return t.recompute_module("mlp");
    case Module::moe_act: return t.recompute_module("moe_act") || t.recompute_module("moe");
    case Module::shared: return t.recompute_module("shared_experts") || t.recompute_module("moe");
    case Module::router:
    case Module::moe_pre:
    case Module::moe_comm:
    case Module::moe_expert:
    case Module::moe_post: return moe_layer && t.recompute_module("moe");
    default: return false;
  }
}

void build_class(const Ctx& c, const ClassInfo& ci, GraphTables& tables, RankClass& rc) {
  ClassBuilder b(rc);
  Emitter em(c, ci, tables, b);
  const int stage = ci.stage;
  const auto& t = *c.train;

  // Layers of each chunk on this stage, and parameters.
  std::vector<std::vector<int>> chunk_layers(static_cast<std::size_t>(c.vpp));
  for (int ch = 0; ch < c.vpp; ++ch) chunk_layers[static_cast<std::size_t>(ch)] = c.stages.chunk_layers(stage, ch);
  rc.layers = c.stages.stage_layers(stage);
  const bool has_embedding = c.stages.is_first_vstage(stage, 0);
  const bool has_head = c.stages.is_last_vstage(stage, c.vpp - 1);
  const double emb_params = embedding_parameters(c.s);
  const double head_params = head_parameters(c.s, has_embedding);
  const int head_unit = c.s.model.head_unit(true);
  // The MTP embedding copy's gradient joins the head's bucket (and the embedding group's all-reduce).
  const bool mtp_embedding_copy = holds_mtp_embedding_copy(c.s, rc.layers, has_embedding);
  const ParameterCount rank_params = rank_parameters(c.s, rc.layers, has_embedding, has_head);
  rc.dense_params = rank_params.dense;
  rc.expert_params = rank_params.expert;
  std::unordered_map<int, ParameterCount> params;
  for (int l : rc.layers) params[l] = layer_parameters(c.s, l);

  // Programs per layer (shapes only depend on the layer's kind).
  std::unordered_map<int, Program> programs;
  for (int l : rc.layers) programs.emplace(l, layer_program(c, ci, l));
  const Program emb = embedding_program(c);
  const Program head = head_program(c);

  // Gradient buckets, in backward order per chunk (dense and expert separately).
  std::vector<Bucket> buckets;
  const int dense_group = c.layout.group_size(Group::dp_cp);
  const int expert_group = c.layout.group_size(Group::edp);
  {
    for (int ch = c.vpp - 1; ch >= 0; --ch) {
      Bucket dense;
      dense.chunk = ch;
      Bucket expert;
      expert.chunk = ch;
      expert.expert = true;
      auto close = [&](Bucket& bk, int layer) {
        if (bk.params > 0) {
          bk.closing_layer = layer;
          buckets.push_back(bk);
        }
        bk.params = 0;
        bk.layers.clear();
      };
      const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
      const bool head_here = has_head && ch == c.vpp - 1;
      const bool emb_here = has_embedding && ch == 0;
      if (head_here) {
        dense.params += head_params + (mtp_embedding_copy ? emb_params : 0.0);
        dense.layers.push_back(head_unit);
      }
      for (auto it = ls.rbegin(); it != ls.rend(); ++it) {
        const auto& lp = params[*it];
        dense.params += lp.dense;
        dense.layers.push_back(*it);
        if (lp.expert > 0) {
          expert.params += lp.expert;
          expert.layers.push_back(*it);
        }
        if (dense.params >= t.grad_bucket_size_params) close(dense, *it);
        if (expert.params >= t.grad_bucket_size_params) close(expert, *it);
      }
      if (emb_here) {
        dense.params += emb_params;
        dense.layers.push_back(-1);
      }
      int lowest = ls.empty() ? (emb_here ? -1 : head_unit) : ls.front();
      close(dense, emb_here ? -1 : lowest);
      close(expert, lowest);
    }
  }

  const std::uint8_t dp_stream = tables.stream("dp_comm", StreamKind::communication);
  const ParameterBytes per_param = parameter_bytes(t);
  auto bucket_op = [&](const Bucket& bk, bool grad) {
    const int gsize = bk.expert ? expert_group : dense_group;
    Op op;
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.group = bk.expert ? Group::edp : Group::dp_cp;
    op.group_size = static_cast<std::int32_t>(gsize);
    op.stream = dp_stream;
    op.layer = static_cast<std::int32_t>(bk.closing_layer);
    op.chunk = static_cast<std::int32_t>(bk.chunk);
    const std::string pre = bk.expert ? "edp" : "dp";
    if (grad) {
      const bool rs = t.shards_optimizer_state();
      op.sub = static_cast<std::uint8_t>(rs ? Collective::reduce_scatter : Collective::all_reduce);
      op.bytes = bk.params * per_param.gradient;
      op.phase = tables.phase(pre + (rs ? "_grad_reduce_scatter" : "_grad_allreduce"));
    } else {
      op.sub = static_cast<std::uint8_t>(Collective::all_gather);
      op.bytes = bk.params * per_param.weight;
      op.phase = tables.phase(pre + "_param_allgather");
    }
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    return op;
  };
  auto bucket_needs_comm = [&](const Bucket& bk) { return (bk.expert ? expert_group : dense_group) > 1; };

  // ---- Megatron-FSDP: per-unit parameter all-gather and gradient reduce-scatter ----
  // An FSDP unit is one layer, the embedding (-1) or the head (head_unit). With sharded parameters
  // every forward and backward pass of a unit waits for the all-gather of its dense parameters over
  // dp x cp and of its experts over edp (parameter_bytes' weights), on their own stream. A chain of passes keeps two
  // units gathered (Megatron-FSDP's double buffer): a unit's all-gather waits for the end of the pass two units back in
  // its chain, so the next unit's gather overlaps the current unit's compute. With sharded gradients every backward
  // pass of a unit reduce-scatters its gradients on dp_comm. The combined 1F1B schedule runs two chains (its forward
  // and its backward).
  const bool fsdp_params = t.shards_parameters();
  const bool fsdp_grads = t.shards_gradients();
  const std::uint8_t fsdp_ag_stream =
      fsdp_params ? tables.stream("fsdp_param_gather", StreamKind::communication) : std::uint8_t{0};
  std::array<std::vector<std::uint32_t>, 2> fsdp_released;  // per chain: the last passes' end ops
  std::vector<std::uint32_t> fsdp_reductions;
  auto unit_params = [&](int unit) {
    if (unit < 0) return ParameterCount{emb_params, 0.0};
    if (unit >= head_unit) return ParameterCount{head_params, 0.0};
    return params.at(unit);
  };
  auto fsdp_op = [&](int unit, bool expert, bool grad, bool bwd, int mb, int ch) {
    const double n = expert ? unit_params(unit).expert : unit_params(unit).dense;
    Op op;
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.group = expert ? Group::edp : Group::dp_cp;
    op.group_size = static_cast<std::int32_t>(expert ? expert_group : dense_group);
    op.sub = static_cast<std::uint8_t>(grad ? Collective::reduce_scatter : Collective::all_gather);
    op.bytes = n * (grad ? per_param.gradient : per_param.weight);
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    op.stream = grad ? dp_stream : fsdp_ag_stream;
    op.layer = static_cast<std::int32_t>(unit);
    op.microbatch = static_cast<std::int32_t>(mb);
    op.chunk = static_cast<std::int32_t>(ch);
    const std::string pre = expert ? "edp" : "dp";
    op.phase = tables.phase(
        pre + (grad ? "_fsdp_grad_reduce_scatter" : (bwd ? "_fsdp_param_allgather_bwd" : "_fsdp_param_allgather_fwd")));
    return op;
  };
  auto fsdp_needs = [&](int unit, bool expert) {
    const ParameterCount pc = unit_params(unit);
    return (expert ? pc.expert : pc.dense) > 0 && (expert ? expert_group : dense_group) > 1;
  };
  // The all-gathers of a unit before a pass over it.
  auto fsdp_gather = [&](int unit, int mb, int ch, bool bwd, int chain) {
    std::vector<std::uint32_t> ags;
    if (!fsdp_params) return ags;
    const auto& released = fsdp_released[static_cast<std::size_t>(chain)];
    const std::uint32_t after = released.size() >= 2 ? released[released.size() - 2] : kNoOp;
    for (bool expert : {false, true}) {
      if (fsdp_needs(unit, expert)) ags.push_back(b.emit(fsdp_op(unit, expert, false, bwd, mb, ch), {after}));
    }
    return ags;
  };
  // The first op of each stream among the ops emitted since `first` waits for the gathers.
  auto fsdp_gate = [&](std::size_t first, const std::vector<std::uint32_t>& ags) {
    if (ags.empty()) return;
    std::array<bool, 256> seen{};
    for (std::size_t i = first; i < rc.ops.size(); ++i) {
      auto& done = seen[rc.ops[i].stream];
      if (done) continue;
      done = true;
      for (std::uint32_t ag : ags) b.add_dep(static_cast<std::uint32_t>(i), ag);
    }
  };
  // End of a pass of the chain (the last op emitted): its gathered buffer may be reused.
  auto fsdp_release = [&](int chain) {
    if (!fsdp_params) return;
    auto& released = fsdp_released[static_cast<std::size_t>(chain)];
    released.push_back(static_cast<std::uint32_t>(rc.ops.size() - 1));
    if (released.size() > 2) released.erase(released.begin());
  };
  // After the backward of a unit (the last op emitted): its gradients are reduce-scattered.
  auto fsdp_reduce = [&](int unit, int mb, int ch) {
    if (!fsdp_grads) return;
    const auto last = static_cast<std::uint32_t>(rc.ops.size() - 1);
    for (bool expert : {false, true}) {
      if (fsdp_needs(unit, expert))
        fsdp_reductions.push_back(b.emit(fsdp_op(unit, expert, true, true, mb, ch), {last}));
    }
  };
  // End of a pass over one unit; `bwd`: its gradients are reduce-scattered.
  auto fsdp_end = [&](int unit, int mb, int ch, bool bwd, int chain) {
    fsdp_release(chain);
    if (bwd) fsdp_reduce(unit, mb, ch);
  };
  int bwd_chain = 0;  // the chain of backward passes: 1 inside a combined 1F1B pair

  // Overlapped parameter all-gather of the distributed optimizer (this step's forward), dispatched as
  // Megatron-Core does without overlap_param_gather_with_optimizer_step. Interleaved pipelines
  // (pp > 1, vpp > 1: Megatron-LM and Megatron-Bridge then set align_param_gather) dispatch every
  // bucket of model chunks 0 and 1 when the schedule starts and those of chunk c + 1 as chunk c's
  // first forward begins (schedules.py, param_sync_func). Otherwise each chunk's dense and expert
  // buckets form a chain in forward order (param_and_grad_buffer.py, finish_param_sync): the forward
  // pre-hook of a bucket's first layer dispatches that bucket's gather if it has not been dispatched
  // (the chunk's first: exposed), waits for it, then dispatches the next bucket's, one ahead of its
  // use. Buckets that gate no layer (the head's) are issued when the chunk's first forward ends.
  // Sharded parameters (FSDP) are gathered per layer instead.
  std::unordered_map<int, std::uint32_t> param_ag_of_layer;  // layer -> all-gather op
  const bool bucket_param_gather = t.shards_optimizer_state() && !t.shards_parameters();
  struct GatherChain {
    std::vector<const Bucket*> order;  // forward order
    std::size_t issued = 0;            // order[0, issued) are emitted
  };
  std::vector<std::array<GatherChain, 2>> gather_chains(static_cast<std::size_t>(c.vpp));  // [chunk][expert]
  if (bucket_param_gather && t.overlap_param_gather) {
    for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
      if (!bucket_needs_comm(*it)) continue;
      gather_chains[static_cast<std::size_t>(it->chunk)][it->expert ? 1 : 0].order.push_back(&*it);
    }
  }
  auto issue_gather = [&](GatherChain& chain) {
    const Bucket& bk = *chain.order[chain.issued++];
    const std::uint32_t id = b.emit(bucket_op(bk, false), {});
    for (int l : bk.layers) param_ag_of_layer[l] = id;
  };

  // Last backward item of each chunk (when its gradient buckets become ready).
  const auto items = stage_schedule(c.pp, c.vpp, c.num_mb, stage, t.overlap_moe_expert_parallel_comm);
  std::vector<int> last_bwd_item(static_cast<std::size_t>(c.vpp), -1);
  std::vector<bool> first_fwd_done(static_cast<std::size_t>(c.vpp), false);
  // Before the first forward of layer l (-1: the embedding) in chunk ch: the pre-hook's gathers. A
  // bucket's first layer in forward order is its closing layer (the lowest).
  const bool aligned_gathers = c.pp > 1 && c.vpp > 1;
  auto param_prefetch = [&](int l, int ch) {
    if (aligned_gathers || first_fwd_done[static_cast<std::size_t>(ch)]) return;
    auto& chains = gather_chains[static_cast<std::size_t>(ch)];
    std::array<std::size_t, 2> opens{};  // per chain: the bucket l opens, + 1 (0: none)
    for (std::size_t k = 0; k < 2; ++k) {
      GatherChain& chain = chains[k];
      for (std::size_t j = 0; j < chain.order.size(); ++j) {
        if (chain.order[j]->closing_layer != l) continue;
        opens[k] = j + 1;
        while (chain.issued <= j) issue_gather(chain);  // not dispatched yet: now, and waited for
      }
    }
    for (std::size_t k = 0; k < 2; ++k) {
      GatherChain& chain = chains[k];
      if (opens[k] != 0 && chain.issued == opens[k] && chain.issued < chain.order.size()) issue_gather(chain);
    }
  };
  // The gathers of chunk ch no layer asked for (buckets of the head alone), at the end of its first forward.
  auto flush_gathers = [&](int ch) {
    for (GatherChain& chain : gather_chains[static_cast<std::size_t>(ch)]) {
      while (chain.issued < chain.order.size()) issue_gather(chain);
    }
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].forward) last_bwd_item[static_cast<std::size_t>(items[i].chunk)] = static_cast<int>(i);
  }
  if (aligned_gathers) {
    flush_gathers(0);
    flush_gathers(1);
  }

  const std::uint8_t copy_stream = tables.stream("copy", StreamKind::copy);
  // One stream per direction of travel and role, so that a strict FIFO per stream cannot deadlock
  // (the interleaved warm-up sends to the next stage before it receives from the previous one).
  const std::uint8_t pp_fwd_send = tables.stream("pp_fwd_send", StreamKind::communication);
  const std::uint8_t pp_fwd_recv = tables.stream("pp_fwd_recv", StreamKind::communication);
  const std::uint8_t pp_bwd_send = tables.stream("pp_bwd_send", StreamKind::communication);
  const std::uint8_t pp_bwd_recv = tables.stream("pp_bwd_recv", StreamKind::communication);
  const double p2p_bytes = static_cast<double>(c.Tsp) * c.h * kBf16Bytes;
  // Input of one micro-batch: tokens, labels, loss mask, position ids (int64 each).
  const double input_bytes = static_cast<double>(c.mbs) * c.seq / c.cp * 4 * 8;

  auto emit_copy = [&](int mb, std::uint32_t* out) {
    Op cp = copy_op(CopyKind::h2d_pinned, input_bytes);
    cp.stream = copy_stream;
    cp.microbatch = static_cast<std::int32_t>(mb);
    cp.phase = tables.phase("host_to_device");
    cp.flags = kDataLoad;
    *out = b.emit(cp, {});
    if (c.exec.sync_after_copy) {
      Op sy = host_op(HostKind::stream_sync, tables.stream("host", StreamKind::host));
      sy.microbatch = static_cast<std::int32_t>(mb);
      sy.phase = tables.phase("host_to_device_sync");
      sy.flags = kDataLoad;
      b.emit(sy, {*out});
    }
  };

  auto p2p = [&](bool send, bool fwd_dir, int mb, int recv_chunk, int layer, std::uint32_t dep) {
    Op op;
    op.kind = send ? OpKind::send : OpKind::recv;
    op.wall = Wall::communication;
    op.group = Group::pp;
    op.group_size = static_cast<std::int32_t>(c.pp);
    op.bytes = p2p_bytes;
    op.shape = {static_cast<std::int64_t>(p2p_bytes), 0, 0, 0, 0, 0};
    op.stream = fwd_dir ? (send ? pp_fwd_send : pp_fwd_recv) : (send ? pp_bwd_send : pp_bwd_recv);
    op.microbatch = static_cast<std::int32_t>(mb);
    op.layer = static_cast<std::int32_t>(layer);
    op.tag = mb * c.vpp + recv_chunk;
    // Forward activations travel to the next stage, gradients to the previous one.
    op.peer = static_cast<std::int8_t>((fwd_dir == send) ? +1 : -1);
    op.phase = tables.phase(std::string("pp_") + (send ? "send" : "recv") + (fwd_dir ? "_fwd" : "_bwd"));
    return b.emit(op, {dep});
  };

  // Full recompute groups.
  auto full_recompute = [&](int chunk, int idx_in_chunk) -> std::pair<int, int> {
    // returns [first, last] index range of the checkpoint group containing idx, or {-1,-1}
    if (t.recompute_granularity != RecomputeGranularity::full) return {-1, -1};
    const int n = t.recompute_num_layers;
    const int count = static_cast<int>(chunk_layers[static_cast<std::size_t>(chunk)].size());
    if (t.recompute_method == RecomputeMethod::block) {
      if (idx_in_chunk < n) return {idx_in_chunk, idx_in_chunk};
      return {-1, -1};
    }
    int first = (idx_in_chunk / n) * n;
    return {first, std::min(first + n, count) - 1};
  };

  std::vector<std::uint32_t> copy_of_mb(static_cast<std::size_t>(c.num_mb), kNoOp);

  // ---- one forward item: input, embedding, layers, head or send ----
  auto fwd_begin = [&](const SchedItem& item) {
    const int ch = item.chunk;
    const int mb = item.mb;
    if (aligned_gathers && !first_fwd_done[static_cast<std::size_t>(ch)] && ch + 1 < c.vpp) flush_gathers(ch + 1);
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    const bool first_v = c.stages.is_first_vstage(stage, ch);
    const bool last_v = c.stages.is_last_vstage(stage, ch);
    std::uint32_t input = kNoOp;
    if (first_v || last_v) {
      emit_copy(mb, &copy_of_mb[static_cast<std::size_t>(mb)]);
      if (first_v) input = copy_of_mb[static_cast<std::size_t>(mb)];
    }
    if (!first_v) input = p2p(false, true, mb, ch, ls.empty() ? -1 : ls.front(), kNoOp);
    if (first_v) {
      param_prefetch(-1, 0);
      std::uint32_t ag = kNoOp;
      if (auto f = param_ag_of_layer.find(-1); f != param_ag_of_layer.end() && !first_fwd_done[0]) ag = f->second;
      const auto gathers = fsdp_gather(-1, mb, ch, false, 0);
      const std::size_t first = rc.ops.size();
      auto ids = em.forward(emb, -1, mb, ch, input, false, nullptr, false);
      b.add_dep(ids.front(), ag);
      fsdp_gate(first, gathers);
      fsdp_end(-1, mb, ch, false, 0);
      input = ids.back();
    }
    return input;
  };
  // The layer's parameters gate the first op of its first micro-batch's forward.
  auto param_gate = [&](int l, int ch, std::uint32_t first_op) {
    auto f = param_ag_of_layer.find(l);
    if (f != param_ag_of_layer.end() && !first_fwd_done[static_cast<std::size_t>(ch)]) b.add_dep(first_op, f->second);
  };
  auto fwd_end = [&](const SchedItem& item, std::uint32_t input) {
    const int ch = item.chunk;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    if (c.stages.is_last_vstage(stage, ch)) {
      const int unit = head_unit;
      const auto gathers = fsdp_gather(unit, item.mb, ch, false, 0);
      const std::size_t first = rc.ops.size();
      auto ids = em.forward(head, -1, item.mb, ch, input, false, nullptr, false);
      fsdp_gate(first, gathers);
      fsdp_end(unit, item.mb, ch, false, 0);
      input = ids.back();
    } else {
      const int recv_chunk = (stage == c.pp - 1) ? ch + 1 : ch;
      p2p(true, true, item.mb, recv_chunk, ls.empty() ? -1 : ls.back(), input);
    }
    flush_gathers(ch);
    first_fwd_done[static_cast<std::size_t>(ch)] = true;
    return input;
  };

  // ---- one backward item: head or receive, layers in reverse, embedding or send ----
  auto bwd_begin = [&](const SchedItem& item, std::uint32_t head_grad_in) {
    const int ch = item.chunk;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    if (c.stages.is_last_vstage(stage, ch)) {
      const int unit = head_unit;
      const auto gathers = fsdp_gather(unit, item.mb, ch, true, bwd_chain);
      const std::size_t first = rc.ops.size();
      auto ids = std::vector<std::uint32_t>{};
      const std::uint32_t grad = em.backward(head, -1, item.mb, ch, head_grad_in, ids, false);
      fsdp_gate(first, gathers);
      fsdp_end(unit, item.mb, ch, true, bwd_chain);
      return grad;
    }
    return p2p(false, false, item.mb, ch, ls.empty() ? -1 : ls.back(), kNoOp);
  };
  // Overlapped gradient reduction: buckets close as the last micro-batch's backward passes.
  auto close_buckets = [&](std::size_t it, int ch, int closing_layer) {
    if (!t.overlap_grad_reduce || fsdp_grads || static_cast<int>(it) != last_bwd_item[static_cast<std::size_t>(ch)]) {
      return;
    }
    for (const auto& bk : buckets) {
      if (bk.chunk == ch && bk.closing_layer == closing_layer && bucket_needs_comm(bk)) {
        b.emit(bucket_op(bk, true), {static_cast<std::uint32_t>(rc.ops.size() - 1)});
      }
    }
  };
  // Selective recompute of layer l ahead of its backward (empty when nothing is recomputed).
  auto selective_recompute = [&](int l, int mb, int ch) {
    std::vector<std::uint32_t> rec;
    if (t.recompute_granularity != RecomputeGranularity::selective) return rec;
    const Program& p = programs.at(l);
    const bool moe = c.s.model.layer_is_moe(l);
    std::vector<bool> subset(p.specs.size(), false);
    bool any = false;
    for (std::size_t i = 0; i < p.specs.size(); ++i) {
      subset[i] = recompute_selected(t, p.specs[i], moe);
      any = any || subset[i];
    }
    if (any) rec = em.forward(p, l, mb, ch, kNoOp, true, &subset, !moe);
    return rec;
  };
  auto bwd_end = [&](std::size_t it, const SchedItem& item, std::uint32_t grad) {
    const int ch = item.chunk;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    if (c.stages.is_first_vstage(stage, ch)) {
      const auto gathers = fsdp_gather(-1, item.mb, ch, true, bwd_chain);
      const std::size_t first = rc.ops.size();
      std::vector<std::uint32_t> none;
      em.backward(emb, -1, item.mb, ch, grad, none, false);
      fsdp_gate(first, gathers);
      fsdp_end(-1, item.mb, ch, true, bwd_chain);
      close_buckets(it, ch, -1);
    } else {
      const int recv_chunk = (stage == 0) ? ch - 1 : ch;
      p2p(true, false, item.mb, recv_chunk, ls.empty() ? -1 : ls.front(), grad);
    }
  };

  // Delayed scaling: leaving a chunk's forward (Transformer Engine's fp8_autocast around the block) and
  // finishing its backward, the amaxes recorded in the pass are all-reduced over the amax group, one
  // buffer of one fp32 per tensor (forward: inputs and weights, backward: output gradients of the fp8
  // GEMMs). Megatron's group is tp x dp x cp; the StepGraph's nearest group is dp_cp.
  auto amax_reduce = [&](int mb, int ch, bool bwd, std::uint32_t after) {
    if (!c.quant.chunk_amax_reduce || c.layout.group_size(Group::dp_cp) <= 1) return after;
    double tensors = 0;
    for (int l : chunk_layers[static_cast<std::size_t>(ch)]) {
      for (const Spec& sp : programs.at(l).specs) {
        const bool fp8 = sp.dtype == DType::fp8 && (sp.kind == OpKind::gemm || sp.kind == OpKind::grouped_gemm);
        if (fp8) tensors += bwd ? 1.0 : 2.0;
      }
    }
    if (tensors == 0) return after;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    Op op;
    // The record key: the layer where the pass leaves the chunk (its last layer forward, its first backward).
    op.layer = bwd ? ls.front() : ls.back();
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.sub = static_cast<std::uint8_t>(Collective::all_reduce);
    op.group = Group::dp_cp;
    op.group_size = static_cast<std::int32_t>(c.layout.group_size(Group::dp_cp));
    op.bytes = tensors * kFp32Bytes;
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    op.stream = em.compute_stream();
    op.phase = tables.phase(bwd ? "fp8_amax_allreduce_bwd" : "fp8_amax_allreduce_fwd");
    op.microbatch = mb;
    op.chunk = ch;
    op.flags = bwd ? kBackward : 0;
    return b.emit(op, {after});
  };

  auto emit_forward = [&](const SchedItem& item) {
    std::uint32_t input = fwd_begin(item);
    for (int l : chunk_layers[static_cast<std::size_t>(item.chunk)]) {
      param_prefetch(l, item.chunk);
      const auto gathers = fsdp_gather(l, item.mb, item.chunk, false, 0);
      const std::size_t first = rc.ops.size();
      auto ids = em.forward(programs.at(l), l, item.mb, item.chunk, input, false, nullptr, !c.s.model.layer_is_moe(l));
      param_gate(l, item.chunk, ids.front());
      fsdp_gate(first, gathers);
      fsdp_end(l, item.mb, item.chunk, false, 0);
      input = ids.back();
    }
    amax_reduce(item.mb, item.chunk, false, input);
    return fwd_end(item, input);
  };
  auto emit_backward = [&](std::size_t it, const SchedItem& item) {
    const int ch = item.chunk;
    const int mb = item.mb;
    const auto& ls = chunk_layers[static_cast<std::size_t>(ch)];
    std::uint32_t grad = bwd_begin(item, static_cast<std::uint32_t>(rc.ops.size() - 1));
    const int count = static_cast<int>(ls.size());
    for (int idx = count - 1; idx >= 0; --idx) {
      const int l = ls[static_cast<std::size_t>(idx)];
      std::vector<std::uint32_t> rec;
      auto [g0, g1] = full_recompute(ch, idx);
      // A checkpoint group is one FSDP pass: its layers stay gathered from its recompute to the end of
      // the backward of its first layer.
      std::vector<std::uint32_t> gathers;
      if (g0 < 0 || idx == g1) {
        for (int j = (g0 < 0 ? idx : g0); j <= idx; ++j) {
          auto ag = fsdp_gather(ls[static_cast<std::size_t>(j)], mb, ch, true, bwd_chain);
          gathers.insert(gathers.end(), ag.begin(), ag.end());
        }
      }
      const std::size_t first = rc.ops.size();
      if (g0 >= 0 && idx == g1) {
        // Re-run the forward of the whole checkpoint group, then go backward through it.
        std::uint32_t in = kNoOp;
        for (int j = g0; j <= g1; ++j) {
          const int lj = ls[static_cast<std::size_t>(j)];
          auto ids = em.forward(programs.at(lj), lj, mb, ch, in, true, nullptr, !c.s.model.layer_is_moe(lj));
          in = ids.back();
        }
      } else {
        rec = selective_recompute(l, mb, ch);
      }
      grad = em.backward(programs.at(l), l, mb, ch, grad, rec, !c.s.model.layer_is_moe(l));
      fsdp_gate(first, gathers);
      if (g0 < 0 || idx == g0) fsdp_release(bwd_chain);
      fsdp_reduce(l, mb, ch);
      close_buckets(it, ch, l);
    }
    amax_reduce(mb, ch, true, grad);
    bwd_end(it, item, grad);
  };

  // ---- expert-parallel communication overlap (Megatron's combined 1F1B) ----
  // A forward item and an adjacent backward item of another micro-batch (or chunk) run together, layer
  // by layer: forward layers in order paired with backward layers in reverse. Each layer is cut into
  // nodes, attention (A: up to the permute before the dispatch), dispatch (D), experts (M: with the
  // shared experts), combine (C: the combine, unpermute and residual) and, in a multi-token-prediction
  // depth, post-process (P: its final norm, output head and loss); D and C run on the expert-parallel
  // communication stream. Per layer pair the issue order is
  //   B.P | B.C | F.A | F.D | B.M | B.D | [B.M weight gradients] | F.M | F.C | F.P | B.A
  // so that the combine backward overlaps the forward attention, the forward dispatch and the backward
  // dispatch the expert GEMMs, and the forward combine the backward attention. Without
  // delay_wgrad_compute a node waits for the whole node issued before it in its own chain.
  const bool ep_overlap = t.overlap_moe_expert_parallel_comm;
  std::unordered_map<int, std::array<std::vector<bool>, kFineGrainedNodes>> nodes;  // layer -> A, D, M, C, P masks
  std::unordered_map<int, std::uint32_t> head_fwd;                  // mb * vpp + chunk -> head output
  std::uint8_t ep_stream = 0;
  if (ep_overlap) {
    ep_stream = tables.stream("ep_comm", StreamKind::communication);
    for (int l : rc.layers) nodes.emplace(l, fine_grained_nodes(programs.at(l)));
  }
  auto emit_pair = [&](std::size_t it_f, const SchedItem& f, std::size_t it_b, const SchedItem& bw) {
    enum { kA = 0, kD = 1, kM = 2, kC = 3, kP = 4 };
    bwd_chain = 1;
    std::uint32_t f_in = fwd_begin(f);
    std::uint32_t b_grad = kNoOp;
    {
      auto h = head_fwd.find(bw.mb * c.vpp + bw.chunk);
      b_grad = bwd_begin(bw, h != head_fwd.end() ? h->second : static_cast<std::uint32_t>(rc.ops.size() - 1));
    }
    const auto& lf = chunk_layers[static_cast<std::size_t>(f.chunk)];
    const auto& lb = chunk_layers[static_cast<std::size_t>(bw.chunk)];
    const std::size_t nf = lf.size();
    const std::size_t nb = lb.size();
    std::uint32_t f_prev = f_in;    // last op of the forward's previous node
    std::uint32_t b_prev = b_grad;  // last op of the backward's previous node
    // Emits one node; a communication node waits for the chain's previous node unless weight
    // gradients are delayed.
    // The node's ops wait for the FSDP gathers of their layer.
    auto node = [&](auto&& emit_fn, std::uint32_t& prev, bool comm, const std::vector<std::uint32_t>& gathers) {
      const auto first = static_cast<std::uint32_t>(rc.ops.size());
      if (emit_fn() == 0) return kNoOp;
      if (comm && !t.delay_wgrad_compute) b.add_dep(first, prev);
      fsdp_gate(first, gathers);
      prev = static_cast<std::uint32_t>(rc.ops.size() - 1);
      return first;
    };
    std::vector<Emitter::DeferredWgrad> deferred;
    for (std::size_t i = 0; i < std::max(nf, nb); ++i) {
      const bool has_f = i < nf;
      const bool has_b = i < nb;
      Emitter::Instance fi;
      Emitter::Instance bi;
      const std::array<std::vector<bool>, kFineGrainedNodes>* fn = nullptr;
      const std::array<std::vector<bool>, kFineGrainedNodes>* bn = nullptr;
      int l_f = -1;
      int l_b = -1;
      std::vector<std::uint32_t> f_gathers;
      std::vector<std::uint32_t> b_gathers;
      if (has_b) {
        l_b = lb[nb - 1 - i];
        bn = &nodes.at(l_b);
        b_gathers = fsdp_gather(l_b, bw.mb, bw.chunk, true, 1);
        const std::size_t first = rc.ops.size();
        auto rec = selective_recompute(l_b, bw.mb, bw.chunk);
        fsdp_gate(first, b_gathers);
        bi = em.begin_backward(programs.at(l_b), l_b, bw.mb, bw.chunk, b_grad, std::move(rec),
                               !c.s.model.layer_is_moe(l_b));
      }
      if (has_f) {
        l_f = lf[i];
        fn = &nodes.at(l_f);
        f_gathers = fsdp_gather(l_f, f.mb, f.chunk, false, 0);
        fi = em.begin_forward(programs.at(l_f), l_f, f.mb, f.chunk, f_in, !c.s.model.layer_is_moe(l_f));
      }
      if (has_b) {
        node([&] { return em.backward_part(bi, &(*bn)[kP]); }, b_prev, false, b_gathers);
        node([&] { return em.backward_part(bi, &(*bn)[kC], ep_stream); }, b_prev, true, b_gathers);
      }
      if (has_f) {
        param_prefetch(l_f, f.chunk);
        const std::uint32_t first =
            node([&] { return em.forward_part(fi, false, &(*fn)[kA]); }, f_prev, false, f_gathers);
        if (first != kNoOp) param_gate(l_f, f.chunk, first);
        node([&] { return em.forward_part(fi, false, &(*fn)[kD], ep_stream); }, f_prev, true, f_gathers);
      }
      if (has_b) {
        deferred.clear();
        node(
            [&] {
              return em.backward_part(bi, &(*bn)[kM], Emitter::kDefaultStream,
                                      t.delay_wgrad_compute ? &deferred : nullptr);
            },
            b_prev, false, b_gathers);
        node([&] { return em.backward_part(bi, &(*bn)[kD], ep_stream); }, b_prev, true, b_gathers);
        for (const auto& w : deferred) b.emit(w.op, {w.after});
      }
      if (has_f) {
        node([&] { return em.forward_part(fi, false, &(*fn)[kM]); }, f_prev, false, f_gathers);
        node([&] { return em.forward_part(fi, false, &(*fn)[kC], ep_stream); }, f_prev, true, f_gathers);
        node([&] { return em.forward_part(fi, false, &(*fn)[kP]); }, f_prev, false, f_gathers);
        fsdp_release(0);
        f_in = fi.ids.back();
      }
      if (has_b) {
        node([&] { return em.backward_part(bi, &(*bn)[kA]); }, b_prev, false, b_gathers);
        fsdp_end(l_b, bw.mb, bw.chunk, true, 1);
        b_grad = bi.backward_result();
        close_buckets(it_b, bw.chunk, l_b);
      }
    }
    amax_reduce(f.mb, f.chunk, false, f_in);
    amax_reduce(bw.mb, bw.chunk, true, b_grad);
    head_fwd[f.mb * c.vpp + f.chunk] = fwd_end(f, f_in);
    bwd_end(it_b, bw, b_grad);
    bwd_chain = 0;
    (void)it_f;
  };

  for (const Issue& is : issue_order(items, ep_overlap)) {
    if (is.paired()) {
      emit_pair(is.item, items[is.item], is.bwd, items[is.bwd]);
      continue;
    }
    const std::size_t it = is.item;
    const SchedItem& item = items[it];
    if (item.forward) {
      const std::uint32_t out = emit_forward(item);
      if (ep_overlap) head_fwd[item.mb * c.vpp + item.chunk] = out;
    } else {
      emit_backward(it, item);
    }
  }

  // ---- epilogue: gradient reduction, optimizer, parameter all-gather, metrics ----
  std::uint32_t last_compute = static_cast<std::uint32_t>(rc.ops.size() - 1);
  std::vector<std::uint32_t> reductions;
  if (c.s.run.framework == Framework::pytorch_eager) {
    // A PyTorch program that keeps master weights apart from the model's bf16 weights copies
    // autograd's bf16 gradients into the main-gradient buffers once the backward is done
    // (Megatron-Core's wgrad GEMMs accumulate into them directly: no such copy).
    const double local = rc.dense_params + rc.expert_params;
    Op copy;
    copy.kind = OpKind::elementwise;
    copy.sub = static_cast<std::uint8_t>(ElementwiseKind::copy);
    copy.wall = Wall::memory;
    copy.bytes = local * (kBf16Bytes + per_param.gradient);
    copy.shape = {static_cast<std::int64_t>(local), 0, 0, 0, 0, 0};
    copy.stream = em.compute_stream();
    copy.phase = tables.phase("main_grad_copy");
    copy.flags = kParameterState;
    last_compute = b.emit(copy, {last_compute});
    reductions.push_back(last_compute);
  }
  if (fsdp_grads) {
    // dp_comm runs them in order: the last one ends after every other.
    if (!fsdp_reductions.empty()) reductions.push_back(fsdp_reductions.back());
  } else if (!t.overlap_grad_reduce) {
    for (const auto& bk : buckets) {
      if (bucket_needs_comm(bk)) reductions.push_back(b.emit(bucket_op(bk, true), {last_compute}));
    }
  } else {
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const auto& op = rc.ops[i];
      if (op.stream == dp_stream && op.sub != static_cast<std::uint8_t>(Collective::all_gather)) {
        reductions.push_back(static_cast<std::uint32_t>(i));
      }
    }
  }
  const bool embedding_group = !c.s.model.untie_embeddings_and_output_weights || c.s.model.mtp_num_layers > 0;
  if (embedding_group && c.pp > 1 && (has_embedding || has_head)) {
    Op op;
    op.kind = OpKind::collective;
    op.wall = Wall::communication;
    op.sub = static_cast<std::uint8_t>(Collective::all_reduce);
    op.group = Group::embedding;
    op.group_size = 2;
    op.bytes = emb_params * per_param.gradient;
    op.shape = {static_cast<std::int64_t>(op.bytes), 0, 0, 0, 0, 0};
    op.stream = dp_stream;
    op.phase = tables.phase("embedding_grad_allreduce");
    reductions.push_back(b.emit(op, {last_compute}));
  }
  const double dense_shard = t.shards_optimizer_state() ? rc.dense_params / dense_group : rc.dense_params;
  const double expert_shard = t.shards_optimizer_state() ? rc.expert_params / expert_group : rc.expert_params;
  const double shard = dense_shard + expert_shard;
  {
    // Gradient norm (clipping): read the local gradient shard, then one float reduced over all ranks.
    Op norm;
    norm.kind = OpKind::elementwise;
    norm.sub = static_cast<std::uint8_t>(ElementwiseKind::reduce);
    norm.wall = Wall::memory;
    norm.bytes = shard * per_param.gradient;
    norm.shape = {static_cast<std::int64_t>(shard), 0, 0, 0, 0, 0};
    norm.stream = em.compute_stream();
    norm.phase = tables.phase("optimizer_grad_norm");
    std::uint32_t n = b.emit(norm, reductions.data(), reductions.data() + reductions.size());
    std::uint32_t prev = n;
    if (c.layout.world() > 1) {
      Op ar;
      ar.kind = OpKind::collective;
      ar.wall = Wall::communication;
      ar.sub = static_cast<std::uint8_t>(Collective::all_reduce);
      ar.group = Group::world;
      ar.group_size = c.layout.world();
      ar.bytes = kFp32Bytes;
      ar.shape = {4, 0, 0, 0, 0, 0};
      ar.stream = em.compute_stream();
      ar.phase = tables.phase("optimizer_grad_norm_allreduce");
      prev = b.emit(ar, {n});
    }
    Op adam;
    adam.kind = OpKind::optimizer;
    adam.wall = Wall::memory;
    // Adam: reads master weight, gradient and moments, writes master weight, moments and model weight.
    adam.bytes = shard * per_param.adam_traffic();
    adam.shape = {static_cast<std::int64_t>(shard), 0, 0, 0, 0, 0};
    adam.stream = em.compute_stream();
    adam.phase = tables.phase("optimizer_step");
    prev = b.emit(adam, {prev});
    if (bucket_param_gather && !t.overlap_param_gather) {
      for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
        if (bucket_needs_comm(*it)) b.emit(bucket_op(*it, false), {prev});
      }
    }
  }
  if (has_head) {
    std::uint32_t dep = static_cast<std::uint32_t>(rc.ops.size() - 1);
    if (c.layout.group_size(Group::dp_cp) > 1) {
      Op ar;
      ar.kind = OpKind::collective;
      ar.wall = Wall::communication;
      ar.sub = static_cast<std::uint8_t>(Collective::all_reduce);
      ar.group = Group::dp_cp;
      ar.group_size = static_cast<std::int32_t>(c.layout.group_size(Group::dp_cp));
      ar.bytes = 2 * kFp32Bytes;
      ar.shape = {8, 0, 0, 0, 0, 0};
      ar.stream = em.compute_stream();
      ar.phase = tables.phase("training_metrics_allreduce");
      ar.flags = kMetrics;
      dep = b.emit(ar, {dep});
    }
    Op rd = host_op(HostKind::gpu_read, tables.stream("host", StreamKind::host));
    rd.bytes = 2 * kFp32Bytes;
    rd.phase = tables.phase("training_metrics_read");
    rd.flags = kMetrics;
    b.emit(rd, {dep});
  }

  mark_graph_runs(rc);
}

}  // namespace

StepGraph expand_training(const Scenario& s) {
  const Ctx c(s);
  StepGraph g;
  g.step = 0;
  g.step_kind = "train";
  g.layout = c.layout;
  g.tokens = static_cast<double>(s.train->global_batch_size) * s.train->seq_length;
  g.model_flops = megatron_flops_per_iteration(s);
  GraphTables tables(g);
  // Fixed stream order so stream ids are stable across classes.
  tables.stream("compute", StreamKind::compute);

  // Rank classes: pipeline stage x (hot / cold EP rank) x (a slow rank on its own).
  const int world = s.world_size();
  const RoutingModel routing(c.ep, s.train->routing_imbalance);
  std::vector<int> slow_ranks;
  for (const auto& sd : s.cluster.slowdowns) slow_ranks.push_back(sd.rank);
  std::sort(slow_ranks.begin(), slow_ranks.end());
  slow_ranks.erase(std::unique(slow_ranks.begin(), slow_ranks.end()), slow_ranks.end());

  struct Key {
    int stage;
    bool hot;
    int slow;  // rank or -1
    bool operator==(const Key& o) const { return stage == o.stage && hot == o.hot && slow == o.slow; }
  };
  std::vector<Key> keys;
  g.class_of_rank.assign(static_cast<std::size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    const Coords co = c.layout.coords(r);
    Key k{co.pp, !routing.balanced() && s.model.is_moe() && co.ep == 0,
          std::binary_search(slow_ranks.begin(), slow_ranks.end(), r) ? r : -1};
    auto it = std::find(keys.begin(), keys.end(), k);
    int id = static_cast<int>(it - keys.begin());
    if (it == keys.end()) keys.push_back(k);
    g.class_of_rank[static_cast<std::size_t>(r)] = id;
  }
  // A slow rank's class of its own leaves the ranks of its groups unlike the other ranks of their
  // classes (their collectives wait for it): those are split off too, until every class's members see
  // the same classes in their groups (refine_rank_classes), so every class's representative issues
  // collectives that the other member classes issue alike.
  std::vector<int> key_of_class(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) key_of_class[i] = static_cast<int>(i);
  std::vector<int> part_of_class(keys.size(), 0);
  if (!slow_ranks.empty()) {
    const std::vector<int> refined = refine_rank_classes(c.layout, g.class_of_rank);
    const int classes = *std::max_element(refined.begin(), refined.end()) + 1;
    key_of_class.assign(static_cast<std::size_t>(classes), -1);
    part_of_class.assign(static_cast<std::size_t>(classes), 0);
    std::vector<int> parts(keys.size(), 0);
    for (int r = 0; r < world; ++r) {
      const auto cls = static_cast<std::size_t>(refined[static_cast<std::size_t>(r)]);
      if (key_of_class[cls] >= 0) continue;
      key_of_class[cls] = g.class_of_rank[static_cast<std::size_t>(r)];
      part_of_class[cls] = parts[static_cast<std::size_t>(key_of_class[cls])]++;
    }
    g.class_of_rank = refined;
  }
  g.classes.resize(key_of_class.size());
  // The classes of a step run about as many ops each: a class's op and dependency lists start with the
  // capacity of the largest built before it rather than growing by reallocation.
  std::size_t ops_capacity = 0;
  std::size_t deps_capacity = 0;
  for (int r = 0; r < world; ++r)
    g.classes[static_cast<std::size_t>(g.class_of_rank[static_cast<std::size_t>(r)])].ranks.push_back(r);
  for (std::size_t cls = 0; cls < key_of_class.size(); ++cls) {
    const auto i = static_cast<std::size_t>(key_of_class[cls]);
    auto& rc = g.classes[cls];
    rc.id = static_cast<int>(cls);
    rc.pp_stage = keys[i].stage;
    rc.label = "stage " + std::to_string(keys[i].stage);
    ClassInfo ci;
    ci.stage = keys[i].stage;
    ci.load = 1.0;
    if (!routing.balanced() && s.model.is_moe()) {
      ci.load = routing.load(keys[i].hot ? 0 : 1);
      rc.label += keys[i].hot ? " / hot EP rank" : " / cold EP rank";
    }
    if (keys[i].slow >= 0) rc.label += " / slow rank " + std::to_string(keys[i].slow);
    if (part_of_class[cls] > 0) rc.label += " / beside a slow rank (" + std::to_string(part_of_class[cls]) + ")";
    rc.expert_load = ci.load;
    ci.expert_rows = static_cast<std::int64_t>(std::llround(static_cast<double>(c.Tsp) * c.topk * ci.load)) * c.etp;
    rc.ops.reserve(ops_capacity);
    rc.deps.reserve(deps_capacity);
    build_class(c, ci, tables, rc);
    ops_capacity = std::max(ops_capacity, rc.ops.size());
    deps_capacity = std::max(deps_capacity, rc.deps.size());
  }
  return g;
}

}  // namespace threewalls::scenarios::detail
