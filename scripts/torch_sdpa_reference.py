#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the attention shapes kernel_bench measures.

    kernel_bench --attention-shapes > shapes.json
    scripts/torch_sdpa_reference.py --shapes shapes.json --out torch_sdpa.json
    kernel_bench --only attention --reference torch_sdpa.json

For every shape and direction (forward; backward = torch.autograd.grad of the output for q, k, v)
it times the flash and the cuDNN backends (torch.nn.attention.sdpa_kernel, one backend at a time),
with CUDA events: warm-up, then the median of --reps (>= 20) samples. Grouped-query shapes run
with enable_gqa=True; a backend that refuses that also runs with K/V expanded to every query head
(reported as "<backend> (kv expanded)"). A backend that cannot run a shape gets an entry with
"error" instead of a time. The forward runs with autograd recording (as in training), so a backend
keeps what its backward needs, as the fused backend's forward does.

Causal masks follow kernel_bench's convention (bottom-right aligned): with seq_q == seq_kv that is
is_causal=True; a single decode query sees every key (is_causal=False); other seq_q != seq_kv
causal shapes are reported as not measured. So are shapes with a sliding window ("window" > 0):
neither backend takes a window through scaled_dot_product_attention (an explicit mask would run
neither the flash nor the cuDNN kernel), so there is nothing like-for-like to time.
"""
import argparse
import json
import statistics
import sys


def attention_flops(c, backward):
    """Model FLOPs, as kernel_bench counts them (backend/src/attention.cpp, attention_flops)."""
    sq, skv = c["seq_q"], c["seq_kv"]
    pairs = sq * skv
    if c["causal"]:
        off = skv - sq
        pairs = sq * off + sq * (sq + 1) / 2
    fwd = 2.0 * c["batch"] * c["heads"] * pairs * (c["head_dim_qk"] + c["head_dim_v"])
    return 2.5 * fwd if backward else fwd


def time_ms(torch, fn, warmup, reps, inner):
    """Each sample is `inner` back-to-back calls between two events, divided by `inner`: the GPU's time
    per call with Python's dispatch hidden behind the queued work (one call between events would add
    the host's launch latency to a kernel of a fraction of a millisecond)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / inner)
    return samples


def measure(torch, F, backend, c, direction, expand, args):
    b, sq, skv = c["batch"], c["seq_q"], c["seq_kv"]
    h, kv, dqk, dv = c["heads"], c["kv_heads"], c["head_dim_qk"], c["head_dim_v"]
    if c["causal"] and sq != skv and sq != 1:
        raise RuntimeError("bottom-right causal with seq_q != seq_kv is not measured")
    if c.get("window", 0) > 0:  # JSON from a kernel_bench without windows has no "window"
        raise RuntimeError(f"sliding window of {c['window']} keys is not measured (SDPA takes no window)")
    is_causal = c["causal"] and sq == skv
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(b, h, sq, dqk, device=dev, dtype=dt, generator=gen).requires_grad_(True)
    heads_kv = h if expand else kv
    k = torch.randn(b, heads_kv, skv, dqk, device=dev, dtype=dt, generator=gen).requires_grad_(True)
    v = torch.randn(b, heads_kv, skv, dv, device=dev, dtype=dt, generator=gen).requires_grad_(True)
    gqa = heads_kv != h
    from torch.nn.attention import sdpa_kernel

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)

    with sdpa_kernel([backend]):
        if direction == "fwd":
            samples = time_ms(torch, forward, args.warmup, args.reps, args.inner)
        else:
            out = forward()
            grad = torch.randn_like(out)
            samples = time_ms(
                torch, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), args.warmup, args.reps, args.inner)
    del q, k, v
    torch.cuda.empty_cache()
    return samples


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="JSON from kernel_bench --attention-shapes")
    p.add_argument("--out", required=True, help="where to write the results (JSON)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--inner", type=int, default=10, help="back-to-back calls per timed sample")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    if args.reps < 20:
        p.error("--reps must be at least 20 (the median of >= 20 samples is the convention)")
    try:
        with open(args.shapes) as f:
            cases = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"{args.shapes}: cannot read the shapes: {e}")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    if not torch.cuda.is_available():
        sys.exit("torch_sdpa_reference.py: no CUDA device")
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    results = []
    for c in cases:
        for direction in c["directions"]:
            for name, backend in backends:
                variants = [False] if c["kv_heads"] == c["heads"] else [False, True]
                for expand in variants:
                    label = name + (" (kv expanded)" if expand else "")
                    entry = {"key": c["key"], "name": c["name"], "direction": direction, "backend": label}
                    try:
                        samples = measure(torch, F, backend, c, direction, expand, args)
                    except Exception as e:  # a backend that cannot run the shape: recorded, not fatal
                        entry["error"] = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                        torch.cuda.empty_cache()
                        results.append(entry)
                        print(f"{c['name']:18} {direction} {label:22} not run: {entry['error']}", flush=True)
                        continue
                    med = statistics.median(samples)
                    entry.update({"median_ms": med, "min_ms": min(samples), "samples": len(samples)})
                    if c["seq_q"] == 1:
                        kv_bytes = 2.0 * c["batch"] * c["kv_heads"] * c["seq_kv"] * (c["head_dim_qk"] + c["head_dim_v"])
                        entry["gbps_kv"] = kv_bytes / (med * 1e-3) / 1e9
                        rate = f"{entry['gbps_kv']:8.1f} GB/s(KV)"
                    else:
                        entry["tflops"] = attention_flops(c, direction == "bwd") / (med * 1e-3) / 1e12
                        rate = f"{entry['tflops']:8.1f} TFLOP/s"
                    results.append(entry)
                    print(f"{c['name']:18} {direction} {label:22} {med:9.4f} ms {rate}", flush=True)
                    if not expand:
                        break  # the native GQA call ran: no need for the expanded one
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(0),
        "warmup": args.warmup,
        "inner": args.inner,
        "reps": args.reps,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
