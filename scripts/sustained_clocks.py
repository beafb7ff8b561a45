#!/usr/bin/env python3
"""Burst against sustained kernel speed on one GPU (docs/validation/sustained_clocks_h200_2026-11-29.md).

A GEMM timed the way a microbenchmark sample is (its first 30 runs after an idle pause), then in
one-second windows of continuous work, with the GPU's SM clock, power and temperature read by
nvidia-smi meanwhile (reading only: clocks and limits are left as they are). Workloads: bf16 and fp8
(e4m3, torch._scaled_mm) GEMMs, alone and each followed by memory-bound adds sized to about 40% of the
GEMM's burst time.

  python3 scripts/sustained_clocks.py OUT_DIR [SECONDS_PER_WORKLOAD] [SET]
  (PyTorch with CUDA; SET "large" (default, call S35) or "shapes" (call P36: the fidelity suite's and
  Mixtral's GEMM shapes, a small GEMM, a memory-bound add alone); writes OUT_DIR/sustained_SET.json)
"""
import json, subprocess, sys, time, os
import torch

dev = torch.device("cuda")
out = sys.argv[1]
dur_s = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}

def gemm_fn(kind, m, n, k):
    if kind == "add":
        x = torch.randn(64 * 1024 * 1024, device=dev, dtype=torch.bfloat16); y = torch.empty_like(x)
        return lambda: torch.add(x, x, out=y)
    if kind == "bf16":
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        return lambda: a @ b.t()
    a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

def timed(fn, iters):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in ev:
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]

def median(x):
    x = sorted(x); return x[len(x) // 2]

def run(name, kind, m, n, k, mixed):
    g = gemm_fn(kind, m, n, k)
    for _ in range(5): g()
    torch.cuda.synchronize()
    base = median(timed(g, 20))
    if mixed:
        # a memory-bound add whose time is about 40% of the GEMM's
        x = torch.randn(64 * 1024 * 1024, device=dev, dtype=torch.bfloat16); y = torch.empty_like(x)
        t_add = median(timed(lambda: torch.add(x, x, out=y), 10))
        reps = max(1, round(0.4 * base / t_add))
        fn = lambda: (g(), [torch.add(x, x, out=y) for _ in range(reps)])
    else:
        fn = g
    torch.cuda.synchronize(); time.sleep(8.0)  # idle: the GPU cools and its clocks return
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-i", "0", "-lms", "250"],
                           stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    windows = []
    # burst: the first 30 iterations after the pause (a microbenchmark's sample)
    burst = timed(g, 30)
    while time.time() - t0 < dur_s:
        w0 = time.time(); ts = []
        while time.time() - w0 < 1.0:
            ev = []
            for _ in range(20):
                s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
                s.record(); g(); e.record(); ev.append((s, e))
                if mixed:
                    for _ in range(reps): torch.add(x, x, out=y)
            torch.cuda.synchronize()
            ts += [s.elapsed_time(e) for s, e in ev]
        windows.append({"t_s": round(w0 - t0, 2), "gemm_ms_median": median(ts), "n": len(ts)})
    smi.terminate(); lines = smi.communicate()[0].strip().splitlines()
    tele = []
    for l in lines:
        p = [q.strip() for q in l.split(",")]
        try: tele.append({"sm_mhz": float(p[1]), "power_w": float(p[2]), "temp_c": float(p[3])})
        except (ValueError, IndexError): pass
    r = {"name": name, "kind": kind, "m": m, "n": n, "k": k, "mixed": mixed,
         "burst_first30_median_ms": median(burst), "burst_first5_ms": burst[:5],
         "windows": windows, "telemetry_first": tele[:4], "telemetry_last": tele[-4:],
         "tflops_burst": 2 * m * n * k / median(burst) / 1e9,
         "tflops_last5s": 2 * m * n * k / median([w["gemm_ms_median"] for w in windows[-5:]]) / 1e9,
         "power_w_median": median([t["power_w"] for t in tele[4:]]) if len(tele) > 5 else None}
    res["runs"].append(r)
    print(f"{name}: burst {r['burst_first30_median_ms']:.4f} ms ({r['tflops_burst']:.0f} TFLOP/s), last 5 s "
          f"{median([w['gemm_ms_median'] for w in windows[-5:]]):.4f} ms ({r['tflops_last5s']:.0f}); "
          f"clocks first {[t['sm_mhz'] for t in tele[:3]]} last {[t['sm_mhz'] for t in tele[-3:]]}; "
          f"power median {r['power_w_median']} last {[t['power_w'] for t in tele[-3:]]}; temp last {[t['temp_c'] for t in tele[-3:]]}", flush=True)

SETS = {
    "large": [("fp8_dsv3_expert_fc1", "fp8", 4096, 4096, 7168, False),
              ("fp8_8192", "fp8", 8192, 8192, 8192, False),
              ("bf16_8192", "bf16", 8192, 8192, 8192, False),
              ("fp8_8192_mixed", "fp8", 8192, 8192, 8192, True),
              ("bf16_8192_mixed", "bf16", 8192, 8192, 8192, True)],
    "shapes": [("bf16_f01_fc1", "bf16", 4096, 5632, 2048, False),
               ("bf16_mixtral_fc1", "bf16", 4096, 14336, 4096, False),
               ("bf16_2048", "bf16", 2048, 2048, 2048, False),
               ("add_only", "add", 0, 0, 0, False),
               ("bf16_8192_again", "bf16", 8192, 8192, 8192, False)],
}
which = sys.argv[3] if len(sys.argv) > 3 else "large"
for name, kind, m, n, k, mixed in SETS[which]:
    run(name, kind, m, n, k, mixed)
    with open(os.path.join(out, f"sustained_{which}.json"), "w") as f:
        json.dump(res, f, indent=1)
