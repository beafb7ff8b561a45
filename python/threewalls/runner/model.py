"""The scenario's model in PyTorch, run op by op with the StepGraph's phase names.

One rank's part of the model: the embedding, every layer (attention, then a dense MLP or an MoE
block with its local experts), the final norm, the output head and the loss. Each op is timed as the
StepGraph op of the same name (threewalls.runner.ops); ops are issued in the StepGraph's order
(docs/stepgraph.md, scenarios/src/programs.cpp), so `threewalls compare` lines a run of this model up
with `threewalls sim` of the same scenario record for record.

Implementation choices (each recorded in the run header's settings.runner):
* attention: torch.nn.functional.scaled_dot_product_attention (GQA through enable_gqa where PyTorch
  has it, else K/V repeated per query group inside attn_core); without SDPA (PyTorch < 2.0) the
  attention is computed from its definition (softmax(QK^T / sqrt(d)) V).
* MLA: queries (optionally through the q_lora down/up projections), keys and values from the
  compressed latent; the rotary part of the key is shared by the heads. No rotary rotation is applied
  (positions do not change the cost); the inference KV cache holds per-head keys and values.
* experts: "grouped": torch._grouped_mm for the three projections (bf16 on CUDA), one product per
  expert where PyTorch lacks it; "sequential": Hugging Face's eager loop over the local experts
  (one leaf weight per expert projection; per expert torch.where of a one-hot routing mask, the
  gather of its tokens, gate/up/down, index_add_ of the weighted output); "streams:N": the same loop
  with expert e on stream e mod N (stream 0 is the compute stream, the others expert_1..expert_N-1).
* routing: training routes every token to k distinct experts in rotation (token t, choice j ->
  expert (t k + j) mod E): every expert receives the same number of rows, as the StepGraph's
  balanced routing assumes (routing_imbalance = 1), and the host knows the counts without a device
  read; the router's scores still run (router_fwd, router_topk_fwd) and weight the experts' outputs.
  Inference routes with the router's own top-k (random weights), as a served model does. The loop
  over one rank's experts reads each expert's rows on the host in either case (torch.where, recorded
  as expert_rows_read_fwd); the other forms read the counts where the host needs them (a
  synchronisation, recorded as moe_routing_stats_read_fwd).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from threewalls.runner import kernels
from threewalls.runner.kernels import act as _act, norm as _norm
from threewalls.runner.ops import Ctx, Op, all_to_all, grouped, grouped_mm_impl, linear, scatter_add
from threewalls.runner.scenario import Scenario


def attention_impl() -> str:
    return kernels.attention_impl()


class Model:
    """One rank's parameters and ops. `ep_group`: the torch.distributed group of this rank's EP group
    (None when ep = 1)."""

    def __init__(self, s: Scenario, *, rank: int, device: torch.device, dtype: torch.dtype, ep_group=None,
                 seed: int = 1234):
        self.s = s
        self.m = m = s.model
        self.rank = rank
        self.device = device
        self.dtype = dtype
        self.ep = s.ep
        self.ep_rank = rank % s.ep
        self.ep_group = ep_group
        self.ep_group_id = (rank // s.ep) * s.ep
        self.h = m["hidden_size"]
        self.E = m["num_experts"]
        self.E_loc = self.E // s.ep if self.E else 0
        self.k = m["moe_router_topk"]
        self.swiglu = m["swiglu"]
        self.norm_kind = m["normalization"]
        self.expert_kind = s.expert_kind
        self.expert_streams = s.expert_streams
        self._streams: List = []
        self._shared_stream = None
        self._idx_cache: Dict[Tuple, Tuple] = {}
        self._dev_offs = None  # inference: cumulative rows per expert on the device (grouped product)
        # Random weights drawn on the device (fast for large models); dense parameters are identical on
        # every rank, experts differ by EP rank (each rank keeps its slice of one model's experts).
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)

        def randn(*shape, std=0.02):
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).mul_(std)

        def p(*shape, std=0.02, ones=False):
            t = torch.ones(*shape, device=device) if ones else randn(*shape, std=std)
            return t.to(dtype=dtype).requires_grad_(True)

        h = self.h
        V = s.padded_vocab
        self.params: Dict[str, torch.Tensor] = {}
        # Parameter groups for the gradient buckets: (name -> layer index, -1 embedding, L head).
        self.layer_of: Dict[str, int] = {}
        self.expert_params: set = set()

        def add(name, t, layer, expert=False):
            self.params[name] = t
            self.layer_of[name] = layer
            if expert:
                self.expert_params.add(name)
            return t

        L = m["num_layers"]
        add("embedding", p(V, h), -1)
        a = m["num_attention_heads"]
        self.layers = []
        for li in range(L):
            lp = {}
            lp["attn_norm"] = add(f"l{li}.attn_norm", p(h, ones=True), li)
            if m["attention"] == "mla":
                dqk = m["qk_head_dim"] + m["qk_pos_emb_head_dim"]
                kv_down = m["kv_lora_rank"] + m["qk_pos_emb_head_dim"]
                if m["q_lora_rank"] > 0:
                    lp["q_down"] = add(f"l{li}.q_down", p(m["q_lora_rank"], h), li)
                    lp["q_norm"] = add(f"l{li}.q_norm", p(m["q_lora_rank"], ones=True), li)
                    lp["q_up"] = add(f"l{li}.q_up", p(a * dqk, m["q_lora_rank"]), li)
                else:
                    lp["q_proj"] = add(f"l{li}.q_proj", p(a * dqk, h), li)
                lp["kv_down"] = add(f"l{li}.kv_down", p(kv_down, h), li)
                lp["kv_norm"] = add(f"l{li}.kv_norm", p(m["kv_lora_rank"], ones=True), li)
                lp["kv_up"] = add(f"l{li}.kv_up", p(a * (m["qk_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"]), li)
                lp["proj"] = add(f"l{li}.proj", p(h, a * m["v_head_dim"]), li)
            else:
                g, d = m["num_query_groups"], m["kv_channels"]
                lp["qkv"] = add(f"l{li}.qkv", p((a + 2 * g) * d, h), li)
                lp["proj"] = add(f"l{li}.proj", p(h, a * d), li)
            lp["mlp_norm"] = add(f"l{li}.mlp_norm", p(h, ones=True), li)
            mult = 2 if self.swiglu else 1
            if s.layer_is_moe(li):
                lp["moe"] = True
                lp["router"] = add(f"l{li}.router", p(self.E, h), li)
                fe = m["moe_ffn_hidden_size"]
                # Local experts: the generator steps over the other ranks' experts, so that EP ranks hold
                # disjoint slices of one model without drawing all of it.
                fc1 = fc2 = None
                for r in range(s.ep):
                    a1 = randn(self.E_loc, h, mult * fe)
                    if r == self.ep_rank:
                        fc1 = a1
                    else:
                        del a1
                for r in range(s.ep):
                    a2 = randn(self.E_loc, fe, h)
                    if r == self.ep_rank:
                        fc2 = a2
                    else:
                        del a2
                if self.expert_kind == "grouped":
                    lp["fc1"] = add(f"l{li}.experts.fc1", fc1.to(dtype=dtype).requires_grad_(True), li, expert=True)
                    lp["fc2"] = add(f"l{li}.experts.fc2", fc2.to(dtype=dtype).requires_grad_(True), li, expert=True)
                else:
                    # An eager loop's experts are modules of their own (Hugging Face's experts[e].gate_proj,
                    # up_proj, down_proj): each weight a leaf [out, in], so that the loop makes no slicing
                    # autograd nodes and no full-size gradient per expert (the same numbers as the stacked
                    # weights of the grouped form).
                    names = ("gate", "up", "down") if self.swiglu else ("fc1", "fc2")
                    experts = []
                    for e in range(self.E_loc):
                        w1, w2 = fc1[e], fc2[e]
                        ws = (w1[:, :fe].t(), w1[:, fe:].t(), w2.t()) if self.swiglu else (w1.t(), w2.t())
                        experts.append(tuple(
                            add(f"l{li}.experts.{e}.{nm}", w.contiguous().to(dtype=dtype).requires_grad_(True), li,
                                expert=True) for nm, w in zip(names, ws)))
                    lp["experts"] = experts
                del fc1, fc2
                fs = m["moe_shared_expert_intermediate_size"]
                if fs > 0:
                    lp["shared_fc1"] = add(f"l{li}.shared_fc1", p(mult * fs, h), li)
                    lp["shared_fc2"] = add(f"l{li}.shared_fc2", p(h, fs), li)
            else:
                lp["moe"] = False
                f = m["ffn_hidden_size"]
                lp["fc1"] = add(f"l{li}.fc1", p(mult * f, h), li)
                lp["fc2"] = add(f"l{li}.fc2", p(h, f), li)
            self.layers.append(lp)
        add("final_norm", p(h, ones=True), L)
        if m["untie_embeddings_and_output_weights"]:
            add("lm_head", p(V, h), L)
        if self.expert_kind == "streams" and device.type == "cuda":
            self._streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in
                                                             range(self.expert_streams - 1)]
        if s.step.get("moe_shared_expert_overlap") and device.type == "cuda":
            self._shared_stream = torch.cuda.Stream()
        # KV caches (inference): per layer (k, v) of [b, heads, s_max, d].
        self.kv: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * L
        self.kv_len = 0

    def name_streams(self, prof) -> None:
        for i, st in enumerate(self._streams[1:], start=1):
            prof.name_stream(st, f"expert_{i}")
        if self._shared_stream is not None:
            prof.name_stream(self._shared_stream, "shared_expert")

    def settings(self) -> Dict[str, object]:
        return {"attention": attention_impl(),
                "grouped_gemm": grouped_mm_impl() if self.expert_kind == "grouped" else None,
                "experts": self.expert_kind + (f":{self.expert_streams}" if self.expert_kind == "streams" else ""),
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "routing": "balanced rotation (training)" if self.s.training else "router top-k (inference)",
                "rotary": "none", "local_experts": self.E_loc, "ep_rank": self.ep_rank}

    # ------------------------------------------------------------------------------------------
    # Layers
    # ------------------------------------------------------------------------------------------

    def _norm_op(self, c: Ctx, name: str, x, w):
        t, h = x.shape[0], x.shape[-1]
        elt = x.element_size()
        with Op(c, name, [x], wall="memory", nbytes=2.0 * t * h * elt, bwd_nbytes=3.0 * t * h * elt) as op:
            (xi,) = op.inputs
            y = op.out(_norm(xi, w, self.norm_kind))
        return y

    def _bda(self, c: Ctx, name: str, residual, *ys):
        """Bias-dropout-add: the residual plus the block's output(s) (an MoE block's routed and shared
        experts are both read by mlp_bda)."""
        t, h = residual.shape
        nb = (2.0 + len(ys)) * t * h * residual.element_size()
        with Op(c, name, [residual, *ys], wall="memory", nbytes=nb) as op:
            out = op.out(kernels.residual_add(*op.inputs))
        return out

    def attention(self, c: Ctx, x, b: int, sq: int, decode: bool):
        """x [b*sq, h] -> x + attention(x). Training and prefill: causal over the sq tokens; decode:
        one new token per sequence attending to the KV cache."""
        m = self.m
        lp = self.layers[c.layer]
        a = m["num_attention_heads"]
        y = self._norm_op(c, "attn_norm", x, lp["attn_norm"])
        t = b * sq
        if m["attention"] == "mla":
            qk, rope, dv = m["qk_head_dim"], m["qk_pos_emb_head_dim"], m["v_head_dim"]
            dqk = qk + rope
            if m["q_lora_rank"] > 0:
                qd = linear(c, "attn_q_down", y, lp["q_down"])
                kvd = linear(c, "attn_kv_down", y, lp["kv_down"])
                lat_w = m["q_lora_rank"] + m["kv_lora_rank"]
                elt = y.element_size()
                with Op(c, "attn_latent_norm", [qd, kvd], wall="memory", nbytes=2.0 * t * lat_w * elt,
                        bwd_nbytes=3.0 * t * lat_w * elt) as op:
                    qdi, kvdi = op.inputs
                    qn = _norm(qdi, lp["q_norm"], self.norm_kind)
                    kv_lat = _norm(kvdi[:, :m["kv_lora_rank"]], lp["kv_norm"], self.norm_kind)
                    k_rope = kvdi[:, m["kv_lora_rank"]:]
                    qn, kv_lat, k_rope = op.out(qn), op.out(kv_lat), op.out(k_rope)
                q = linear(c, "attn_q_up", qn, lp["q_up"])
            else:
                q = linear(c, "attn_q_proj", y, lp["q_proj"])
                kvd = linear(c, "attn_kv_down", y, lp["kv_down"])
                elt = y.element_size()
                with Op(c, "attn_latent_norm", [kvd], wall="memory", nbytes=2.0 * t * m["kv_lora_rank"] * elt,
                        bwd_nbytes=3.0 * t * m["kv_lora_rank"] * elt) as op:
                    (kvdi,) = op.inputs
                    kv_lat = op.out(_norm(kvdi[:, :m["kv_lora_rank"]], lp["kv_norm"], self.norm_kind))
                    k_rope = op.out(kvdi[:, m["kv_lora_rank"]:])
            kvu = linear(c, "attn_kv_up", kv_lat, lp["kv_up"])
            qh = q.view(b, sq, a, dqk).transpose(1, 2)
            kvu = kvu.view(b, sq, a, qk + dv)
            kh = torch.cat([kvu[..., :qk], k_rope.view(b, sq, 1, rope).expand(b, sq, a, rope)], dim=-1).transpose(1, 2)
            vh = kvu[..., qk:].transpose(1, 2)
            g = a
        else:
            g, d = m["num_query_groups"], m["kv_channels"]
            dqk = dv = d
            qkv = linear(c, "attn_qkv", y, lp["qkv"])
            qkv = qkv.view(b, sq, a + 2 * g, d)
            qh = qkv[:, :, :a].transpose(1, 2)
            kh = qkv[:, :, a:a + g].transpose(1, 2)
            vh = qkv[:, :, a + g:].transpose(1, 2)
        if not self.s.training:
            kh, vh = self._kv_cache_write(c, kh, vh, b, sq, decode)
        skv = kh.shape[2]
        causal = not decode
        pairs = sq * skv * (0.5 if causal else 1.0)
        flops = 2.0 * b * a * pairs * (dqk + dv)
        elt = x.element_size()
        nbytes = float(elt * b * (sq * a * (dqk + dv) + skv * g * (dqk + dv)))
        with Op(c, "attn_core", [qh, kh, vh], wall="compute", flops=flops, nbytes=nbytes, bwd_flops=2 * flops,
                bwd_nbytes=2.5 * nbytes) as op:
            qi, ki, vi = op.inputs
            o = op.out(kernels.attention(qi, ki, vi, causal))
        out = linear(c, "attn_proj", o, lp["proj"])
        return self._bda(c, "attn_bda", x, out)

    def _kv_cache_write(self, c: Ctx, k, v, b: int, sq: int, decode: bool):
        """Appends this step's keys and values to the layer's cache (kv_cache_write_fwd) and returns
        the whole cache (keys and values of every position so far)."""
        li = c.layer
        if not decode or self.kv[li] is None:
            s_max = sq + self.s.step["generate_tokens"]
            kc = k.new_empty(b, k.shape[1], s_max, k.shape[3])
            vc = v.new_empty(b, v.shape[1], s_max, v.shape[3])
            self.kv[li] = (kc, vc)
            start = 0
        else:
            kc, vc = self.kv[li]
            start = self.kv_len
        nbytes = 2.0 * (k.numel() + v.numel()) * k.element_size()
        with c.prof.phase(c.info("kv_cache_write_fwd", wall="memory", nbytes=nbytes)):
            kc[:, :, start:start + sq].copy_(k)
            vc[:, :, start:start + sq].copy_(v)
        return kc[:, :, :start + sq], vc[:, :, :start + sq]

    def dense_mlp(self, c: Ctx, prefix: str, x, w1, w2):
        t = x.shape[0]
        a1 = linear(c, prefix + "_fc1", x, w1)
        f = w2.shape[1]
        elt = x.element_size()
        fc1_out = a1.shape[-1]
        with Op(c, prefix + "_act", [a1], wall="memory", nbytes=(fc1_out + f) * t * elt,
                bwd_nbytes=(2.0 * fc1_out + f) * t * elt) as op:
            (ai,) = op.inputs
            hmid = op.out(_act(ai, self.swiglu))
        return linear(c, prefix + "_fc2", hmid, w2)

    def mlp(self, c: Ctx, x):
        lp = self.layers[c.layer]
        y = self._norm_op(c, "mlp_norm", x, lp["mlp_norm"])
        if not lp["moe"]:
            out = self.dense_mlp(c, "mlp", y, lp["fc1"], lp["fc2"])
            return self._bda(c, "mlp_bda", x, out)
        return self.moe(c, x, y)

    # ------------------------------------------------------------------------------------------
    # MoE
    # ------------------------------------------------------------------------------------------

    def _balanced_routing(self, t: int):
        """Token i's j-th expert is (i k + j) mod E; cached index tensors for t tokens."""
        key = ("route", t)
        r = self._idx_cache.get(key)
        if r is None:
            idx = (torch.arange(t * self.k, device=self.device) % self.E).view(t, self.k)
            r = self._idx_cache[key] = (idx,)
        return r[0]

    def _shared(self, c: Ctx, y):
        lp = self.layers[c.layer]
        if "shared_fc1" not in lp:
            return None
        if self._shared_stream is None:
            return self.dense_mlp(c, "shared_expert", y, lp["shared_fc1"], lp["shared_fc2"])
        st = self._shared_stream
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            y.record_stream(st)
            out = self.dense_mlp(c, "shared_expert", y, lp["shared_fc1"], lp["shared_fc2"])
        return out

    def moe(self, c: Ctx, x, y):
        lp = self.layers[c.layer]
        t, h = y.shape
        E, k = self.E, self.k
        elt = y.element_size()
        # The per-expert loop (eager or streams, one EP rank) is Hugging Face's sparse MoE block: a
        # one-hot routing mask [E, k, t] made with the top-k, then per expert torch.where of its mask.
        per_expert_loop = not (self.expert_kind == "grouped" or self.ep > 1)
        logits = linear(c, "router", y, lp["router"], tokens=t)
        with Op(c, "router_topk", [logits], wall="memory", tokens=t, nbytes=t * E * (4.0 + elt),
                bwd_nbytes=t * E * 12.0) as op:
            (li,) = op.inputs
            weights, idx = kernels.route(li, k, self._balanced_routing(t) if self.s.training else None)
            weights = op.out(weights)
            mask = F.one_hot(idx, num_classes=E).permute(2, 1, 0) if per_expert_loop else None
        # Rows per expert: known on the host for the balanced training routing; for the router's own
        # top-k a device count, read on the host where the host needs it (the per-expert loop over EP
        # ranks' rows, a grouped product without torch._grouped_mm) or where the scenario says so
        # (sync_routing_stats). The loop of one EP rank reads each expert's rows itself (torch.where).
        counts = offs = None
        if self.s.training:
            counts = [t * k // E + (1 if e < (t * k) % E else 0) for e in range(E)]
        elif not per_expert_loop:
            dev_counts = torch.bincount(idx.reshape(-1), minlength=E)
            offs = torch.cumsum(dev_counts, 0).to(torch.int32)
        host_counts = not per_expert_loop and (self.expert_kind != "grouped" or not _grouped_on_device(y))
        if self.s.step["sync_routing_stats"] or (counts is None and host_counts):
            with c.prof.host_phase(c.info("moe_routing_stats_read_fwd", wall="host", nbytes=E * 8.0, host=True)):
                counts = torch.bincount(idx.reshape(-1), minlength=E).tolist()
        self._dev_offs = offs
        shared_out = self._shared(c, y) if self._shared_stream is not None else None
        if not per_expert_loop:
            combined = self._moe_permuted(c, y, idx, weights, counts)
        else:
            combined = self._moe_per_expert_local(c, y, mask, weights)
        if self._shared_stream is None:
            shared_out = self._shared(c, y)
        else:
            torch.cuda.current_stream().wait_stream(self._shared_stream)
        if shared_out is not None:
            return self._bda(c, "mlp_bda", x, combined, shared_out)
        return self._bda(c, "mlp_bda", x, combined)

    def _moe_permuted(self, c: Ctx, y, idx, weights, counts):
        """moe_permute -> [moe_dispatch -> moe_sort] -> experts -> [moe_unsort -> moe_combine] ->
        moe_unpermute: rows sorted by expert, exchanged over the EP group when ep > 1."""
        t, h = y.shape
        k = self.k
        elt = y.element_size()
        rows = t * k
        with Op(c, "moe_permute", [y, weights], wall="memory", tokens=rows, nbytes=2.0 * rows * h * elt) as op:
            yi, wi = op.inputs
            xs, w_sorted, token_of_row = kernels.permute(yi, idx, wi, k)
            xs, w_sorted = op.out(xs), op.out(w_sorted)
        ep, E_loc = self.ep, self.E_loc
        if ep > 1:
            send = [sum(counts[r * E_loc:(r + 1) * E_loc]) for r in range(ep)]
            # Balanced routing: every source rank sends each expert the same number of rows.
            per = [counts[self.ep_rank * E_loc + e] for e in range(E_loc)]
            recv = [sum(per)] * ep
            xs = all_to_all(c, "moe_dispatch", xs, send, recv, self.ep_group, self.ep_group_id)
            local_counts = [p * ep for p in per]
            if E_loc > 1:
                perm, inv = self._sort_perm(per, ep)
                r_rows = xs.shape[0]
                with Op(c, "moe_sort", [xs], wall="memory", tokens=r_rows, nbytes=2.0 * r_rows * h * elt) as op:
                    (xi,) = op.inputs
                    xs = op.out(xi.index_select(0, perm))
        else:
            local_counts = counts
        ys = self._experts_on_sorted(c, xs, local_counts)
        if ep > 1:
            if E_loc > 1:
                r_rows = ys.shape[0]
                with Op(c, "moe_unsort", [ys], wall="memory", nbytes=2.0 * r_rows * h * elt) as op:
                    (yi,) = op.inputs
                    ys = op.out(yi.index_select(0, inv))
            ys = all_to_all(c, "moe_combine", ys, recv, send, self.ep_group, self.ep_group_id)
        with Op(c, "moe_unpermute", [ys, w_sorted], wall="memory", tokens=rows, nbytes=3.0 * rows * h * elt,
                bwd_nbytes=2.0 * rows * h * elt) as op:
            yi, wi = op.inputs
            out = op.out(kernels.unpermute(yi, wi, token_of_row, t))
        return out

    def _sort_perm(self, per: List[int], ep: int):
        """Received rows are [source rank][local expert]; the experts want [local expert][source rank]."""
        key = ("sort", tuple(per), ep)
        r = self._idx_cache.get(key)
        if r is None:
            starts = []
            pos = 0
            for src in range(ep):
                for e, n in enumerate(per):
                    starts.append((e, src, pos, n))
                    pos += n
            perm = []
            for e in range(len(per)):
                for src in range(ep):
                    _, _, p0, n = starts[src * len(per) + e]
                    perm.extend(range(p0, p0 + n))
            perm_t = torch.tensor(perm, device=self.device, dtype=torch.long)
            inv = torch.empty_like(perm_t)
            inv[perm_t] = torch.arange(len(perm), device=self.device)
            r = self._idx_cache[key] = (perm_t, inv)
        return r

    def _experts_on_sorted(self, c: Ctx, xs, counts: List[int]):
        """The local experts on rows sorted by expert (counts[e] rows each)."""
        lp = self.layers[c.layer]
        r, h = xs.shape
        fe = self.m["moe_ffn_hidden_size"]
        elt = xs.element_size()
        if self.expert_kind == "grouped":
            offs = self._offs(counts) if counts is not None else self._dev_offs
            a1 = grouped(c, "expert_fc1", xs, lp["fc1"], offs, counts)
            fc1_out = a1.shape[1]
            with Op(c, "expert_act", [a1], wall="memory", tokens=r, nbytes=(fc1_out + fe) * r * elt,
                    bwd_nbytes=(2.0 * fc1_out + fe) * r * elt) as op:
                (ai,) = op.inputs
                hmid = op.out(_act(ai, self.swiglu).contiguous())
            return grouped(c, "expert_fc2", hmid, lp["fc2"], offs, counts)
        # Per-expert loop over contiguous rows (ep > 1: the counts are on the host), index tensors cached.
        key = ("rows", tuple(counts))
        rows_of = self._idx_cache.get(key)
        if rows_of is None:
            rows_of = self._idx_cache[key] = tuple(
                torch.arange(s0, s0 + n, device=self.device) for s0, n in zip(_starts(counts), counts))
        out = xs.new_zeros(r, h)
        return self._per_expert(c, xs, out, lambda e: (rows_of[e], None), None)

    def _offs(self, counts: List[int]):
        key = ("offs", tuple(counts))
        o = self._idx_cache.get(key)
        if o is None:
            o = self._idx_cache[key] = torch.tensor(list(_cumsum(counts)), device=self.device, dtype=torch.int32)
        return o

    def _moe_per_expert_local(self, c: Ctx, y, mask, weights):
        """ep = 1, sequential or streams, as Hugging Face's sparse MoE block: expert e's rows are
        torch.where(mask[e]) (a device-to-host read that waits for the stream: expert_rows_read), it
        gathers them from y (expert_gather) and adds its output, weighted by the router, back into the
        block's output (expert_scatter, index_add_)."""
        t, h = y.shape

        def rows_for(e: int):
            if c.plain:
                slot, rows = torch.where(mask[e])
            else:
                with c.prof.host_phase(c.info("expert_rows_read_fwd", wall="host", nbytes=8.0, host=True),
                                       waits_for_device=True):
                    slot, rows = torch.where(mask[e])
            return rows, slot

        out = y.new_zeros(t, h)
        return self._per_expert(c, y, out, rows_for, weights)

    def _per_expert(self, c: Ctx, src, out, rows_for, weights):
        """The loop over the local experts: rows_for(e) gives expert e's rows of src (and, with
        `weights` [t, k], each row's top-k slot); the expert gathers them, runs its MLP and scatter-adds
        into out (weighted by weights[rows, slot])."""
        lp = self.layers[c.layer]
        experts = lp["experts"]
        h = src.shape[1]
        elt = src.element_size()
        fe = self.m["moe_ffn_hidden_size"]
        swiglu = self.swiglu
        es = kernels.ExpertStreams(self._streams)
        es.fork()
        for e in range(len(experts)):
            c.expert = e
            with es.on(e):
                rows, slot = rows_for(e)
                n = rows.shape[0]
                if n == 0:
                    continue
                es.use(e, src, rows, out)
                with Op(c, "expert_gather", [src], wall="memory", tokens=n, nbytes=2.0 * n * h * elt) as op:
                    (si,) = op.inputs
                    xe = op.out(kernels.expert_gather(si, rows))
                if swiglu:
                    w_gate, w_up, w_down = experts[e]
                    gate = linear(c, "expert_gate", xe, w_gate, tokens=n)
                    up = linear(c, "expert_up", xe, w_up, tokens=n)
                    with Op(c, "expert_act", [gate, up], wall="memory", tokens=n, nbytes=3.0 * n * fe * elt,
                            bwd_nbytes=5.0 * n * fe * elt) as op:
                        gi, ui = op.inputs
                        hm = op.out(F.silu(gi) * ui)
                    ye = linear(c, "expert_down", hm, w_down, tokens=n)
                else:
                    w_fc1, w_fc2 = experts[e]
                    a1 = linear(c, "expert_fc1", xe, w_fc1, tokens=n)
                    with Op(c, "expert_act", [a1], wall="memory", tokens=n, nbytes=2.0 * n * fe * elt,
                            bwd_nbytes=3.0 * n * fe * elt) as op:
                        (ai,) = op.inputs
                        hm = op.out(F.gelu(ai))
                    ye = linear(c, "expert_fc2", hm, w_fc2, tokens=n)
                we = kernels.expert_weights(weights, rows, slot) if weights is not None else None
                out = scatter_add(c, out, rows, ye, we)
        c.expert = None
        es.join()
        return out

    # ------------------------------------------------------------------------------------------
    # Head
    # ------------------------------------------------------------------------------------------

    def head_logits(self, c: Ctx, x):
        y = self._norm_op(c, "final_norm", x, self.params["final_norm"])
        w = self.params.get("lm_head", self.params["embedding"])
        return linear(c, "lm_head", y, w)

    def loss(self, c: Ctx, logits, labels):
        t, v = logits.shape
        elt = logits.element_size()
        with Op(c, "loss", [logits], wall="memory", nbytes=t * v * (elt + 4.0)) as op:
            (li,) = op.inputs
            loss = op.out(kernels.cross_entropy(li, labels))
        return loss

    def sample(self, c: Ctx, logits):
        """Greedy sampling of the next token (the StepGraph's loss_fwd op of an inference step)."""
        t, v = logits.shape
        with c.prof.phase(c.info("loss_fwd", wall="memory", nbytes=t * v * (logits.element_size() + 4.0))):
            return torch.argmax(torch.log_softmax(logits.float(), dim=-1), dim=-1)


def _grouped_on_device(x) -> bool:
    """Whether the grouped expert product runs as torch._grouped_mm (which takes the rows per expert
    as device offsets) rather than one product per expert (which needs them on the host)."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")


def _starts(xs):
    s = 0
    for x in xs:
        yield s
        s += x


def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s
