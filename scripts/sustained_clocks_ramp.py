#!/usr/bin/env python3
"""The power throttle's onset (docs/validation/sustained_clocks_h200_2026-11-29.md): every GEMM run
timed from an idle start for 2 s (fp8 and bf16 8192^3, every fourth run kept), and a memory-bound add
(bf16, 64 Mi elements) timed at burst and between sustained GEMMs. Reads nothing from and changes
nothing on the GPU beyond running the kernels.

  python3 scripts/sustained_clocks_ramp.py OUT_DIR   (PyTorch with CUDA; writes OUT_DIR/ramp.json)
"""
import json, sys, time, subprocess
import torch
dev = torch.device("cuda"); out = sys.argv[1]; res = {"device": torch.cuda.get_device_name(0), "runs": []}
def mk(kind, n):
    if kind == "bf16":
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16); b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        return lambda: a @ b.t()
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn); b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
x = torch.randn(64 * 1024 * 1024, device=dev, dtype=torch.bfloat16); y = torch.empty_like(x)
add = lambda: torch.add(x, x, out=y)
def times(fns, n):
    ev = []
    for i in range(n):
        for f in fns:
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); f(); e.record(); ev.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]
for kind in ("fp8", "bf16"):
    g = mk(kind, 8192)
    for _ in range(3): g(); add()
    torch.cuda.synchronize(); time.sleep(8.0)
    add_burst = times([add], 20)
    torch.cuda.synchronize(); time.sleep(8.0)
    # every run from the idle start, 2 s (GEMMs back to back, events around each; the first CUDA event's
    # start is the common origin)
    t0 = torch.cuda.Event(enable_timing=True); t0.record()
    n = int(2.0 / (0.75e-3 if kind == "fp8" else 1.4e-3))
    ev = []
    for i in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); g(); e.record(); ev.append((s, e))
    torch.cuda.synchronize()
    ramp = [(t0.elapsed_time(s), s.elapsed_time(e)) for s, e in ev]
    # adds between sustained GEMMs (the GPU already throttled)
    mixed = times([g, add], 200)
    res["runs"].append({"kind": kind, "add_burst_ms": sorted(add_burst)[10], "ramp": ramp[::4],
                        "add_sustained_ms": sorted(mixed[1::2])[100], "gemm_in_mix_ms": sorted(mixed[0::2])[100]})
    r = res["runs"][-1]
    def at(t):
        w = [d for (s, d) in ramp if t <= s < t + 20.0]
        return sorted(w)[len(w) // 2] if w else None
    print(kind, "add burst", round(r["add_burst_ms"], 4), "add between sustained GEMMs", round(r["add_sustained_ms"], 4),
          "gemm in mix", round(r["gemm_in_mix_ms"], 4), "| gemm ms at t(ms)=0,20,50,100,200,400,800,1600:",
          [None if at(t) is None else round(at(t), 4) for t in (0, 20, 50, 100, 200, 400, 800, 1600)], flush=True)
json.dump(res, open(out + "/ramp.json", "w"))
