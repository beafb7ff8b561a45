// The inference step's class (one per EP rank of an MoE model): embedding, attention with the KV-cache
// append, dense MLPs, MoE layers with the sampled routing, expert fetches for cache misses (disk,
// host-to-device, prefetching, barrier or per-expert waits), the output head and the sampled-token read.
#include "inference.hpp"

#include <algorithm>
#include <string>

#include "emit.hpp"
#include "program.hpp"

namespace threewalls::scenarios::detail {
namespace {

std::vector<int> activated(const std::vector<int>& counts, int first, int count) {
  std::vector<int> out;
  for (int e = first; e < first + count; ++e) {
    if (counts[static_cast<std::size_t>(e)] > 0) out.push_back(e);
  }
  return out;
}

void build_inference_class(const Ctx& c, int ep_rank, const RoutingSampler::StepChoices& choices,
                           const ExpertCache& cache, bool prefill, GraphTables& tables, RankClass& rc) {
  ClassBuilder b(rc);
  ClassInfo ci;
  Emitter em(c, ci, tables, b);
  const auto& m = c.s.model;
  const auto& inf = *c.s.infer;
  const auto& off = inf.expert_offload;
  const bool offload = off.enabled && off.tier != OffloadTier::hbm && m.is_moe();
  const double row_bytes = static_cast<double>(c.h) * kBf16Bytes;
  const std::uint8_t copy0 = tables.stream("copy", StreamKind::copy);
  const std::uint8_t host = tables.stream("host", StreamKind::host);
  const std::uint8_t compute = em.compute_stream();
  for (int l = 0; l < m.num_layers; ++l) rc.layers.push_back(l);

  auto host_step = [&](const std::string& phase, HostKind k, int layer, std::vector<std::uint32_t> deps) {
    Op op = host_op(k, host);
    op.layer = static_cast<std::int32_t>(layer);
    op.phase = tables.phase(phase);
    return b.emit(op, deps.data(), deps.data() + deps.size());
  };

  // Input tokens.
  Op in = copy_op(CopyKind::h2d_pinned, static_cast<double>(c.T) * 8);
  in.stream = copy0;
  in.phase = tables.phase("host_to_device");
  in.flags = kDataLoad;
  std::uint32_t input = b.emit(in, {});
  if (c.exec.sync_after_copy) host_step("host_to_device_sync", HostKind::stream_sync, -1, {input});
  input = em.forward(embedding_program(c), -1, -1, -1, input, false, nullptr, false).back();

  const int first_local = ep_rank * c.E_loc;
  // Expert fetches of one layer (for the experts that miss the cache). Returns fetch op per expert.
  const double expert_bytes = (c.swiglu ? 3.0 : 2.0) * static_cast<double>(c.h) * c.ffn_e * kBf16Bytes;
  int copy_rr = 0;
  auto fetch_layer = [&](int layer, const std::vector<int>& experts) {
    std::vector<std::pair<int, std::uint32_t>> out;
    for (int e : experts) {
      if (cache.contains(layer, e)) continue;
      std::uint32_t dep = kNoOp;
      if (off.tier == OffloadTier::nvme) {
        Op d = copy_op(CopyKind::disk_read, expert_bytes);
        d.stream = tables.stream("disk", StreamKind::copy);
        d.layer = static_cast<std::int32_t>(layer);
        d.expert = static_cast<std::int32_t>(e - first_local);  // local index, as the expert ops
        d.phase = tables.phase("expert_fetch_disk");
        dep = b.emit(d, {});
      }
      Op h2d = copy_op(CopyKind::h2d_pinned, expert_bytes);
      const int s = copy_rr++ % off.copy_streams;
      h2d.stream = s == 0 ? copy0 : tables.stream("copy_" + std::to_string(s), StreamKind::copy);
      h2d.layer = static_cast<std::int32_t>(layer);
      h2d.expert = static_cast<std::int32_t>(e - first_local);
      h2d.phase = tables.phase("expert_fetch_h2d");
      std::uint32_t id = b.emit(h2d, {dep});
      if (c.exec.sync_after_copy) {
        Op sy = host_op(HostKind::stream_sync, host);
        sy.layer = static_cast<std::int32_t>(layer);
        sy.expert = static_cast<std::int32_t>(e - first_local);
        sy.phase = tables.phase("expert_fetch_sync");
        b.emit(sy, {id});
      }
      out.emplace_back(e, id);
    }
    return out;
  };

  std::vector<std::vector<std::pair<int, std::uint32_t>>> fetched(static_cast<std::size_t>(m.num_layers));
  std::vector<bool> fetched_done(static_cast<std::size_t>(m.num_layers), false);
  auto layer_experts = [&](int layer) {
    return activated(choices.tokens_per_expert(layer, c.E), first_local, c.E_loc);
  };
  if (offload && off.prefetch == Prefetch::all_predicted) {
    for (int l = 0; l < m.num_layers; ++l) {
      if (!m.layer_is_moe(l)) continue;
      fetched[static_cast<std::size_t>(l)] = fetch_layer(l, layer_experts(l));
      fetched_done[static_cast<std::size_t>(l)] = true;
    }
  }

  for (int l = 0; l < m.num_layers; ++l) {
    Program attn;
    attention_block(c, attn, l);
    auto ids = em.forward(attn, l, -1, -1, input, false, nullptr, false);
    input = ids.back();
    if (!m.layer_is_moe(l)) {
      Program mlp;
      mlp.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {-1}));
      dense_mlp_block(c, mlp, "mlp", c.ffn, Module::mlp, -1, false);
      mlp.add(memory_op(OpKind::elementwise, "mlp_bda", {c.Tsp * c.h, 0, 0, 0, 0, 0}, 3.0 * c.Tsp * row_bytes,
                        3.0 * c.Tsp * row_bytes, Module::mlp));
      input = em.forward(mlp, l, -1, -1, input, false, nullptr, true).back();
      continue;
    }
    // MoE layer with the sampled routing.
    const auto counts = choices.tokens_per_expert(l, c.E);
    const auto act = activated(counts, first_local, c.E_loc);
    rc.experts_activated += static_cast<std::int64_t>(act.size());
    for (int e : act) rc.experts_cache_hits += (!offload || cache.contains(l, e)) ? 1 : 0;
    std::int64_t rows = 0;
    std::int64_t max_rows = 0;
    for (int e : act) {
      rows += counts[static_cast<std::size_t>(e)];
      max_rows = std::max<std::int64_t>(max_rows, counts[static_cast<std::size_t>(e)]);
    }
    Program pre;
    pre.add(norm_op("mlp_norm", c.Tsp, c.h, Module::mlp_norm, {-1}));
    Spec router = gemm(c, "router", c.T, c.E, c.h, Module::router);
    router.dtype = DType::bf16;
    router.tokens = static_cast<std::int32_t>(c.T);
    pre.add(router);
    Spec topk = memory_op(OpKind::softmax_topk, "router_topk", {c.T, c.E, c.topk, 0, 0, 0},
                          static_cast<double>(c.T) * c.E * (kFp32Bytes + kBf16Bytes), 0, Module::router);
    pre.add(topk);
    auto pre_ids = em.forward(pre, l, -1, -1, input, false, nullptr, false);
    const std::uint32_t normed = pre_ids.front();
    std::uint32_t routed = pre_ids.back();
    if (c.exec.sync_routing_stats) host_step("moe_routing_stats_read_fwd", HostKind::gpu_read, l, {routed});
    // Fetches: this layer's (unless prefetched), then the next layer's when prefetching one ahead.
    if (offload && !fetched_done[static_cast<std::size_t>(l)]) {
      fetched[static_cast<std::size_t>(l)] = fetch_layer(l, act);
      fetched_done[static_cast<std::size_t>(l)] = true;
    }
    if (offload && off.prefetch == Prefetch::next_layer) {
      for (int n = l + 1; n < m.num_layers; ++n) {
        if (!m.layer_is_moe(n)) continue;
        if (!fetched_done[static_cast<std::size_t>(n)]) {
          fetched[static_cast<std::size_t>(n)] = fetch_layer(n, layer_experts(n));
          fetched_done[static_cast<std::size_t>(n)] = true;
        }
        break;
      }
    }
    const auto& my_fetches = fetched[static_cast<std::size_t>(l)];
    std::uint32_t barrier = kNoOp;
    if (offload && off.sync == ExpertSync::barrier && !my_fetches.empty()) {
      std::vector<std::uint32_t> deps;
      for (const auto& [e, id] : my_fetches) deps.push_back(id);
      barrier = host_step("expert_wait", HostKind::barrier, l, deps);
    }
    // Permute, dispatch.
    Program moe;
    const bool grouped = c.exec.expert_execution.kind == ExpertExecutionKind::grouped;
    // Rows permuted into expert order before the experts and unpermuted, weighted by the router, after
    // them; else the per-expert loop gathers each expert's rows from the tokens and scatter-adds them
    // back weighted.
    const bool permutes = grouped || c.ep > 1;
    if (permutes) {
      moe.add(memory_op(OpKind::permute, "moe_permute", {c.T * c.topk, c.h, c.T, 0, 0, 0},
                        2.0 * c.T * c.topk * row_bytes, 0, Module::moe_pre, {-1}));
    }
    if (c.ep > 1) {
      Spec a2a = collective("moe_dispatch", Collective::all_to_all, Group::ep,
                            static_cast<double>(c.T) * c.topk * row_bytes, Role::compute, Module::moe_comm);
      a2a.shape = {static_cast<std::int64_t>(static_cast<double>(c.T) * c.topk * row_bytes), 0, 0, 0, 0, 0};
      moe.add(a2a);
    }
    auto moe_ids = em.forward(moe, l, -1, -1, routed, false, nullptr, false);
    std::uint32_t dispatched = moe_ids.empty() ? routed : moe_ids.back();
    // Experts.
    std::vector<std::uint32_t> outs;
    const std::int64_t fc1_out = c.swiglu ? 2 * c.ffn_e : c.ffn_e;
    auto fetch_of = [&](int e) {
      for (const auto& [x, id] : my_fetches) {
        if (x == e) return id;
      }
      return kNoOp;
    };
    if (grouped && !act.empty()) {
      Spec g1;
      g1.kind = OpKind::grouped_gemm;
      g1.name = "expert_fc1";
      g1.shape = {rows, fc1_out, c.h, static_cast<std::int64_t>(act.size()), max_rows, 0};
      g1.flops = 2.0 * rows * fc1_out * c.h;
      g1.bytes = static_cast<double>(act.size()) * c.h * fc1_out * c.gemm_elt + rows * (c.h + fc1_out) * kBf16Bytes;
      g1.dtype = c.gemm_dtype;
      g1.module = Module::moe_expert;
      g1.tokens = static_cast<std::int32_t>(rows);
      Program ex;
      ex.add([&] {
        Spec x = g1;
        x.after = {-1};
        return x;
      }());
      ex.add([&] {
        Spec a = memory_op(OpKind::elementwise, "expert_act", {rows * c.ffn_e, 0, 0, 0, 0, 0},
                           (static_cast<double>(fc1_out) + c.ffn_e) * rows * kBf16Bytes, 0, Module::moe_act);
        a.sub = activation_kind(c);
        return a;
      }());
      Spec g2 = g1;
      g2.name = "expert_fc2";
      g2.shape = {rows, c.h, c.ffn_e, static_cast<std::int64_t>(act.size()), max_rows, 0};
      g2.flops = 2.0 * rows * c.h * c.ffn_e;
      g2.bytes = static_cast<double>(act.size()) * c.h * c.ffn_e * c.gemm_elt + rows * (c.h + c.ffn_e) * kBf16Bytes;
      g2.after = {};
      ex.add(g2);
      auto ex_ids = em.forward(ex, l, -1, -1, dispatched, false, nullptr, false);
      b.add_dep(ex_ids.front(), barrier);
      for (const auto& [e, id] : my_fetches) b.add_dep(ex_ids.front(), id);
      outs.push_back(ex_ids.back());
    } else {
      const int nstreams =
          c.exec.expert_execution.kind == ExpertExecutionKind::streams ? c.exec.expert_execution.streams : 1;
      int k = 0;
      for (int e : act) {
        const std::int64_t r = counts[static_cast<std::size_t>(e)];
        Program ex;
        auto tag = [&](Spec sp) {
          sp.expert = e - first_local;
          sp.stream_slot = k % nstreams;
          sp.role = sp.stream_slot == 0 ? Role::compute : Role::expert;
          sp.tokens = static_cast<std::int32_t>(r);
          return sp;
        };
        ex.add(tag(memory_op(OpKind::permute, "expert_gather", {r, c.h, c.T, 0, 0, 0}, 2.0 * r * row_bytes, 0,
                             Module::moe_expert, {-1})));
        int up = -1;
        if (c.swiglu) {
          ex.add(tag(gemm(c, "expert_gate", r, c.ffn_e, c.h, Module::moe_expert, {0})));
          up = ex.add(tag(gemm(c, "expert_up", r, c.ffn_e, c.h, Module::moe_expert, {0})));
        } else {
          up = ex.add(tag(gemm(c, "expert_fc1", r, c.ffn_e, c.h, Module::moe_expert, {0})));
        }
        ex.add(tag([&] {
          Spec a = memory_op(OpKind::elementwise, "expert_act", {r * c.ffn_e, 0, 0, 0, 0, 0},
                             (static_cast<double>(fc1_out) + c.ffn_e) * r * kBf16Bytes, 0, Module::moe_act,
                             {up - (c.swiglu ? 1 : 0), up});
          a.sub = activation_kind(c);
          return a;
        }()));
        ex.add(tag(gemm(c, c.swiglu ? "expert_down" : "expert_fc2", r, c.h, c.ffn_e, Module::moe_expert)));
        Spec scatter = memory_op(OpKind::unpermute, "expert_scatter", {r, c.h, c.T, 0, 0, 0}, 3.0 * r * row_bytes, 0,
                                 Module::moe_expert);
        scatter.sub = static_cast<std::uint8_t>(permutes ? RowWeights::unweighted : RowWeights::weighted);
        ex.add(tag(std::move(scatter)));
        auto ex_ids = em.forward(ex, l, -1, -1, dispatched, false, nullptr, false);
        b.add_dep(ex_ids.front(), barrier);
        // The weights are needed by the first GEMM.
        b.add_dep(ex_ids[1], fetch_of(e));
        if (c.swiglu) b.add_dep(ex_ids[2], fetch_of(e));
        outs.push_back(ex_ids.back());
        ++k;
      }
    }
    // Combine, shared experts, residual.
    Program post;
    if (c.ep > 1) {
      Spec a2a = collective("moe_combine", Collective::all_to_all, Group::ep, static_cast<double>(rows) * row_bytes,
                            Role::compute, Module::moe_comm, {-1});
      a2a.shape = {static_cast<std::int64_t>(static_cast<double>(c.T) * c.topk * row_bytes), 0, 0, 0, 0, 0};
      post.add(a2a);
    }
    if (permutes) {
      post.add(memory_op(OpKind::unpermute, "moe_unpermute", {c.T * c.topk, c.h, c.T, 0, 0, 0},
                         3.0 * c.T * c.topk * row_bytes, 0, Module::moe_post, {post.specs.empty() ? -1 : 0}));
    }
    std::uint32_t moe_out = outs.empty() ? dispatched : outs.back();
    if (!post.specs.empty()) {
      auto post_ids = em.forward(post, l, -1, -1, moe_out, false, nullptr, false);
      for (auto o : outs) b.add_dep(post_ids.front(), o);
      moe_out = post_ids.back();
    }
    std::uint32_t shared_out = kNoOp;
    if (c.ffn_shared > 0) {
      Program sh;
      dense_mlp_block(c, sh, "shared_expert", c.ffn_shared, Module::shared, -1, false);
      shared_out = em.forward(sh, l, -1, -1, normed, false, nullptr, false).back();
    }
    Program bda;
    bda.add(memory_op(OpKind::elementwise, "mlp_bda", {c.T * c.h, 0, 0, 0, 0, 0}, 3.0 * c.T * row_bytes, 0,
                      Module::moe_post, {-1}));
    auto bda_ids = em.forward(bda, l, -1, -1, moe_out, false, nullptr, false);
    for (auto o : outs) b.add_dep(bda_ids.front(), o);
    b.add_dep(bda_ids.front(), shared_out);
    input = bda_ids.back();
  }
  // Output head on each sequence's newest token, sampling, and the host read of the sampled tokens.
  Ctx head_ctx(c.s, c.mbs, 1, 1, false);
  input = em.forward(head_program(head_ctx), -1, -1, -1, input, false, nullptr, false).back();
  host_step("sampled_token_read", HostKind::gpu_read, -1, {input});
  (void)compute;
  (void)prefill;

  mark_graph_runs(rc);
}

}  // namespace

void InferenceState::advance_to(const Scenario& s, int target) {
  const auto& inf = *s.infer;
  const int cycle = 1 + inf.generate_tokens;
  for (int k = step + 1; k <= target; ++k) {
    if (k > 0 && s.model.is_moe()) {
      for (int l = 0; l < s.model.num_layers; ++l) {
        if (!s.model.layer_is_moe(l)) continue;
        cache.use(l, activated(choices.tokens_per_expert(l, s.model.num_experts), 0, s.model.num_experts), clock++);
      }
    }
    const bool prefill = k % cycle == 0;
    const int tokens = prefill ? inf.batch_size * inf.prompt_length : inf.batch_size;
    choices = sampler.next_step(tokens, inf.batch_size, !prefill);
    step = k;
  }
}

StepGraph expand_inference(const Scenario& s, int step, const InferenceState& state) {
  const auto& inf = *s.infer;
  const int cycle = 1 + inf.generate_tokens;
  const RoutingSampler::StepChoices& choices = state.choices;
  const ExpertCache& cache = state.cache;
  const int pos = step % cycle;
  const bool prefill = pos == 0;
  const Ctx c(s, inf.batch_size, prefill ? inf.prompt_length : 1,
              prefill ? inf.prompt_length : static_cast<std::int64_t>(inf.prompt_length) + pos, false);
  StepGraph g;
  g.step = step;
  g.varies_per_step = true;
  g.step_kind = prefill ? "prefill" : "decode";
  g.layout = c.layout;
  g.tokens = static_cast<double>(c.T) * c.dp;
  GraphTables tables(g);
  tables.stream("compute", StreamKind::compute);
  const int world = s.world_size();
  g.class_of_rank.assign(static_cast<std::size_t>(world), 0);
  const int nclasses = s.model.is_moe() ? c.ep : 1;
  g.classes.resize(static_cast<std::size_t>(nclasses));
  for (int r = 0; r < world; ++r) {
    const int cls = s.model.is_moe() ? c.layout.coords(r).ep : 0;
    g.class_of_rank[static_cast<std::size_t>(r)] = cls;
    g.classes[static_cast<std::size_t>(cls)].ranks.push_back(r);
  }
  for (int i = 0; i < nclasses; ++i) {
    auto& rc = g.classes[static_cast<std::size_t>(i)];
    rc.id = i;
    rc.label = nclasses > 1 ? "EP rank " + std::to_string(i) : "all ranks";
    build_inference_class(c, i, choices, cache, prefill, tables, rc);
    // An eager framework's fused attention (PyTorch's cuDNN SDPA) builds a plan at each shape the
    // process has not run: in the first sequence every step's key length is new (the prompt, then one
    // more key per decode step), and the step's first attention of a shape builds it for the others.
    if (s.run.framework == Framework::pytorch_eager && step < cycle) {
      std::vector<OpShape> seen;
      for (Op& op : rc.ops) {
        if (op.kind != OpKind::attention || (op.flags & kBackward) != 0) continue;
        if (std::find(seen.begin(), seen.end(), op.shape) != seen.end()) continue;
        seen.push_back(op.shape);
        op.flags |= kNewShape;
      }
    }
  }
  double flops = 0;
  for (const auto& rc : g.classes) {
    for (const auto& op : rc.ops) flops += op.flops * static_cast<double>(rc.ranks.size());
  }
  g.model_flops = flops;
  return g;
}

}  // namespace threewalls::scenarios::detail
