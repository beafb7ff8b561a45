"""The profiler's cost inside a PyTorch MoE training loop: the same loop without the profiler, with
it recording every 10th step, and recording every step, in interleaved repeats.

    python3 -m threewalls.bench.overhead --out DIR [--experts grouped|eager] [--repeats 5] [--steps 20]

The loop is what a team writes: an embedding, L transformer layers (RMSNorm, attention through
scaled_dot_product_attention, an MoE block with a router, top-k, and its experts either as one grouped
product (torch._grouped_mm where PyTorch has it) or as an eager loop over the experts with a
boolean-mask gather per expert, as Hugging Face MoE blocks do), the output head and loss, backward,
AdamW, and the host's read of the loss. The profiler instruments it as a user would: module hooks
on every layer's attention and MoE blocks (forward and backward phases), phases around the input
copy, the head and loss, the optimizer, and the host read (coarse view).

Each repeat runs every mode once, in a rotated order, for --steps steps after --warmup steps; a
mode's step time is the wall time of its steps (one device synchronisation at the end) over their
count. The overhead of a mode is median(mode) / median(off) - 1 over the repeats; beside it the
paired figure, each repeat's mode over the same repeat's run without the profiler (median, 10th and
90th percentile over the repeats), which a drift between repeats does not move. Writes
DIR/overhead_<experts>.json and prints one line per mode.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from threewalls.bench.spread import p10_median_p90
from threewalls.profiler import Profiler, SamplingConfig

MODES = ("off", "every10", "every1")
# Ablations of a mode (every1/stream): stamps recorded on the timed stream itself instead of the timer
# stream; module hooks kept installed on unrecorded steps too.
VARIANTS = ("stream", "always")


class Attention(torch.nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.RMSNorm(h) if hasattr(torch.nn, "RMSNorm") else torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h, bias=False)
        self.proj = torch.nn.Linear(h, h, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = torch.softmax((q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5), -1)
            o = w @ v
        return x + self.proj(o.transpose(1, 2).reshape(b, s, h))


class MoE(torch.nn.Module):
    def __init__(self, h: int, experts: int, ffn: int, topk: int, kind: str):
        super().__init__()
        self.E, self.k, self.kind = experts, topk, kind
        self.norm = torch.nn.RMSNorm(h) if hasattr(torch.nn, "RMSNorm") else torch.nn.LayerNorm(h)
        self.router = torch.nn.Linear(h, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(experts, h, 2 * ffn) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(experts, ffn, h) * 0.02)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm(x).view(-1, h)
        probs = torch.softmax(self.router(y).float(), -1)
        w, idx = torch.topk(probs, self.k, -1)
        w = (w / w.sum(-1, keepdim=True)).to(y.dtype)
        out = torch.zeros_like(y)
        if self.kind == "grouped" and y.is_cuda and hasattr(torch, "_grouped_mm"):
            order = torch.argsort(idx.view(-1), stable=True)
            tok = order // self.k
            counts = torch.bincount(idx.view(-1), minlength=self.E)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            xs = y.index_select(0, tok)
            a = torch._grouped_mm(xs, self.w1, offs=offs)
            f = a.shape[-1] // 2
            o = torch._grouped_mm((F.silu(a[:, :f]) * a[:, f:]).contiguous(), self.w2, offs=offs)
            out = out.index_add(0, tok, o * w.view(-1).index_select(0, order).unsqueeze(1))
        else:
            for e in range(self.E):
                sel = (idx == e)
                rows, slot = torch.nonzero(sel, as_tuple=True)  # a device->host synchronisation per expert
                if rows.numel() == 0:
                    continue
                a = y.index_select(0, rows) @ self.w1[e]
                f = a.shape[-1] // 2
                o = (F.silu(a[:, :f]) * a[:, f:]) @ self.w2[e]
                out = out.index_add(0, rows, o * w[rows, slot].unsqueeze(1))
        return x + out.view(b, s, h)


class Model(torch.nn.Module):
    def __init__(self, vocab, h, heads, layers, experts, ffn, topk, kind):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.attn = torch.nn.ModuleList(Attention(h, heads) for _ in range(layers))
        self.moe = torch.nn.ModuleList(MoE(h, experts, ffn, topk, kind) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(h) if hasattr(torch.nn, "RMSNorm") else torch.nn.LayerNorm(h)
        self.head = torch.nn.Linear(h, vocab, bias=False)


def train_steps(model, opt, batches, prof: Optional[Profiler], first_step: int, device) -> None:
    """One training step per batch; with `prof`, every step is a profiler step."""
    for i, (ids_h, labels_h) in enumerate(batches):
        step = first_step + i
        if prof is not None:
            prof.begin_step(step)
            with prof.phase("host_to_device", wall="memory", bytes=ids_h.numel() * 16, coarse="host_to_device"):
                ids, labels = ids_h.to(device, non_blocking=True), labels_h.to(device, non_blocking=True)
        else:
            ids, labels = ids_h.to(device, non_blocking=True), labels_h.to(device, non_blocking=True)
        x = model.emb(ids)
        for attn, moe in zip(model.attn, model.moe):
            x = moe(attn(x))
        if prof is not None:
            with prof.phase("lm_head_and_loss"):
                loss = F.cross_entropy(model.head(model.norm(x)).float().view(-1, model.head.out_features),
                                       labels.view(-1))
        else:
            loss = F.cross_entropy(model.head(model.norm(x)).float().view(-1, model.head.out_features), labels.view(-1))
        loss.backward()
        if prof is not None:
            with prof.phase("optimizer_step", wall="memory"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            with prof.host_phase("training_metrics_read", coarse="training_metrics", waits_for_device=True):
                loss.item()
            prof.end_step()
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.bench.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for overhead.json (created)")
    ap.add_argument("--experts", choices=["grouped", "eager"], default="grouped")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per mode and repeat")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per mode and repeat")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--experts-n", type=int, default=64, dest="experts_n")
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated modes to run (off is always run: the reference)")
    ap.add_argument("--nvtx", choices=["sampled", "all", "off"], default="sampled",
                    help="the profiler's NVTX ranges (as Profiler(nvtx=...))")
    ap.add_argument("--backward-phases", choices=["on", "off"], default="on",
                    help="time the modules' backward too (hook_module(backward=...))")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Model(args.vocab, args.hidden, args.heads, args.layers, args.experts_n, args.ffn, args.topk,
                  args.experts).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(1)

    def batches(n):
        out = []
        for _ in range(n):
            ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
            lab = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
            if device.type == "cuda":
                ids, lab = ids.pin_memory(), lab.pin_memory()
            out.append((ids, lab))
        return out

    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="tw_overhead_")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    asked = [m for m in args.modes.split(",") if m]
    unknown = [m for m in asked if m.split("/")[0] not in MODES or not set(m.split("/")[1:]) <= set(VARIANTS)]
    if unknown:
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; allowed: {', '.join(MODES)}, each optionally "
                         f"followed by /VARIANT ({', '.join(VARIANTS)})")
    modes = ("off",) + tuple(m for m in dict.fromkeys(asked) if m != "off")
    times: Dict[str, List[float]] = {m: [] for m in modes}
    records: Dict[str, List[int]] = {m: [] for m in modes}
    data = batches(args.warmup + args.steps)
    for r in range(args.repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            prof = None
            run_dir = os.path.join(scratch, f"{mode}_{r}")
            if mode != "off":
                base, *variant = mode.split("/")
                prof = Profiler(run_dir, sampling=SamplingConfig(record_every_n_steps=10 if base == "every10" else 1,
                                                                 flush_every_n_steps=10),
                                use_cuda=device.type == "cuda", scenario={"name": "overhead_loop", "path": "",
                                                                          "hash": ""}, nvtx=args.nvtx,
                                stamps="stream" if "stream" in variant else "shadow",
                                hooks="always" if "always" in variant else "recorded")
            handles = []
            if prof is not None:
                for i, (attn, moe) in enumerate(zip(model.attn, model.moe)):
                    bwd = args.backward_phases == "on"
                    handles += prof.hook_module(attn, "attention", layer=i, backward=bwd)
                    handles += prof.hook_module(moe, "moe", layer=i, backward=bwd)
            train_steps(model, opt, data[:args.warmup], prof, 0, device)
            sync()
            t0 = time.perf_counter()
            train_steps(model, opt, data[args.warmup:], prof, args.warmup, device)
            sync()
            t1 = time.perf_counter()
            times[mode].append((t1 - t0) / args.steps)
            if prof is not None:
                prof.finish(summary=False)
                records[mode].append(prof.writer.phase_records_written if prof.writer else 0)
            for h in handles:
                h.remove()
    shutil.rmtree(scratch, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    # Paired: each repeat's mode against the same repeat's run without the profiler (adjacent in time,
    # so a drift of the GPU's clocks or the host's load between repeats cancels), median and spread.
    paired = {}
    for m in modes[1:]:
        ratios = sorted(100.0 * (a / b - 1.0) for a, b in zip(times[m], times["off"]))
        p10, mid, p90 = p10_median_p90(ratios)
        paired[m] = {"median_pct": mid, "p10_pct": p10, "p90_pct": p90, "pct": ratios}
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "config": vars(args),
        "step_time_s": times,
        "median_step_time_s": med,
        "overhead_pct": {m: 100.0 * (med[m] / med["off"] - 1.0) for m in modes if m != "off"},
        "overhead_paired": paired,
        "phase_records_per_run": records,
        "targets_pct": {"every10": 0.2, "every1": 1.0},
    }
    result["within_target"] = {m: result["overhead_pct"][m] <= t for m, t in result["targets_pct"].items()
                               if m in result["overhead_pct"]}
    with open(os.path.join(args.out, f"overhead_{args.experts}.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"profiler overhead ({args.experts} experts, {result['device']}, {args.repeats} x {args.steps} steps):")
    for m in modes:
        extra = "" if m == "off" else (f"  {result['overhead_pct'][m]:+.3f}% (target <= {result['targets_pct'][m.split('/')[0]]}%); "
                                       f"paired per repeat: median {paired[m]['median_pct']:+.3f}%, "
                                       f"p10 {paired[m]['p10_pct']:+.3f}%, p90 {paired[m]['p90_pct']:+.3f}%")
        print(f"  {m:22s} median step {med[m] * 1e3:9.3f} ms{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
