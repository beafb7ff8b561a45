"""FP8 grouped GEMM of the experts as PyTorch runs it, for the profile family grouped_gemm.fp8.

    python3 -m threewalls.bench.grouped_gemm --out DIR --profile PROFILE.toml [--device cuda|cpu]

threewalls' own backend has no FP8 grouped GEMM, so the shipped profiles carried a synthetic
grouped_gemm.fp8. This benchmark measures PyTorch's: `torch._scaled_grouped_mm` with float8_e4m3fn
operands and row-wise float32 scales (one per token row, one per expert output column), bf16 out,
the expert weights column-major as the kernel requires, fast accumulation (as Transformer Engine's
forward GEMM). Each expert's rows are padded to a multiple of 16, as FP8 expert GEMMs need
(Megatron-Core pads routed tokens for FP8); the recorded `total_rows` and `max_rows` are the padded
ones.

The shapes are the profile's grouped_gemm.bf16 points (the grid `threewalls calibrate` measured with
cuBLASLt): groups, total rows, the hottest group's rows (the other rows spread evenly, as the C++
benchmark spreads them), n, k. At each shape the bf16 `torch._grouped_mm` is timed too and printed
beside the profile's measured bf16 time: a check that this harness and the C++ calibration time the
same thing, not an input of any fit.

Timing: CUDA events around --iters calls after 3 warm-up calls, --repeats repeats; median, p10, p90
per call.

Writes DIR/grouped_gemm.json (every shape: rows per group, times, TFLOP/s) and, from --profile,
DIR/grouped_fp8_families.toml: a copy of that profile whose grouped_gemm.fp8 family holds the measured
points with a note saying how they were measured; `threewalls_merge_families PROFILE
DIR/grouped_fp8_families.toml OUT.toml grouped_gemm.fp8` refits it (its model and hardware stay
the profile's). On a CPU (--device cpu) every group is a float32 matmul with n and k divided by 16, and the note says so: a smoke
test of the plumbing, not a calibration.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tomllib
from typing import Dict, List

import torch

from threewalls.bench.profile_text import replace_family
from threewalls.bench.spread import p10_median_p90

FAMILY = "grouped_gemm.fp8"
SOURCE_FAMILY = "grouped_gemm.bf16"
ALIGN_ROWS = 16
CPU_SHRINK = 16


def group_rows(total: int, groups: int, max_rows: int) -> List[int]:
    """Rows per group: balanced (the remainder on the first groups) when max_rows is at most the
    balanced share, else max_rows in the first and the rest spread evenly; each padded to ALIGN_ROWS."""
    balanced = -(-total // groups)
    if max_rows <= balanced:
        rows = [total // groups + (1 if e < total % groups else 0) for e in range(groups)]
    elif groups == 1:
        rows = [total]
    else:
        rest = total - max_rows
        rows = [max_rows] + [rest // (groups - 1) + (1 if e < rest % (groups - 1) else 0) for e in range(groups - 1)]
    return [-(-r // ALIGN_ROWS) * ALIGN_ROWS for r in rows]


def _time_calls(fn, device: str, iters: int, repeats: int) -> Dict[str, float]:
    for _ in range(3):
        fn()
    per = []
    for _ in range(repeats):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            stop.record()
            stop.synchronize()
            per.append(start.elapsed_time(stop) * 1e-3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            per.append((time.perf_counter() - t0) / iters)
    p10, med, p90 = p10_median_p90(per)
    return {"median_s": med, "p10_s": p10, "p90_s": p90, "count": repeats}


def measure_shape(rows: List[int], n: int, k: int, device: str, iters: int, repeats: int) -> Dict[str, object]:
    groups, total = len(rows), sum(rows)
    offs = torch.tensor(rows, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    gen = torch.Generator(device=device).manual_seed(20261127)
    a = torch.randn(total, k, device=device, generator=gen) * 0.5
    w = torch.randn(groups, n, k, device=device, generator=gen) * 0.05  # one (n x k) weight per expert
    out: Dict[str, object] = {}
    if device == "cuda":
        a16, w16 = a.to(torch.bfloat16), w.to(torch.bfloat16)
        out["bf16"] = _time_calls(lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs,
                                                            out_dtype=torch.bfloat16), device, iters, repeats)
        f8 = torch.float8_e4m3fn
        a8, w8 = a.to(f8), w.to(f8)  # w8 row-major (groups, n, k): transposed, each expert column-major
        sa = torch.ones(total, device=device, dtype=torch.float32)
        sb = torch.ones(groups, n, device=device, dtype=torch.float32)
        out["fp8"] = _time_calls(lambda: torch._scaled_grouped_mm(a8, w8.transpose(-2, -1), sa, sb, offs=offs,
                                                                  out_dtype=torch.bfloat16, use_fast_accum=True),
                                 device, iters, repeats)
    else:
        bounds = [0] + offs.tolist()

        def loop():
            for e in range(groups):
                torch.matmul(a[bounds[e]:bounds[e + 1]], w[e].t())

        out["fp8"] = _time_calls(loop, device, iters, repeats)
        out["bf16"] = None
    flops = 2.0 * total * n * k
    for key in ("bf16", "fp8"):
        if out[key]:
            out[key]["tflops"] = flops / out[key]["median_s"] / 1e12
    return out


def source_points(profile_text: str, path: str) -> List[Dict[str, float]]:
    doc = tomllib.loads(profile_text)
    try:
        return list(doc["grouped_gemm"]["bf16"]["points"])
    except (KeyError, TypeError):
        raise SystemExit(f"{path}: no [{SOURCE_FAMILY}] points: not a threewalls calibration profile") from None


def families_toml(profile_text: str, path: str, measured: List[Dict[str, object]], note: str) -> str:
    """`profile_text` with [grouped_gemm.fp8]'s points and note replaced by the measured ones (its model
    and fit table kept; threewalls_merge_families refits)."""
    doc = tomllib.loads(profile_text)
    try:
        model = doc["grouped_gemm"]["fp8"]["model"]
        fit = doc["grouped_gemm"]["fp8"]["fit"]
    except (KeyError, TypeError):
        raise SystemExit(f"{path}: no single [{FAMILY}] family to replace") from None
    pts = []
    for m in measured:
        t = m["fp8"]
        pts.append(f"  {{ groups = {m['groups']}, total_rows = {m['total_rows']}, max_rows = {m['max_rows']}, "
                   f"n = {m['n']}, k = {m['k']}, median_s = {t['median_s']!r}, p10_s = {t['p10_s']!r}, "
                   f"p90_s = {t['p90_s']!r}, count = {t['count']} }},")
    fit_lines = "\n".join(f"{key} = {json.dumps(v) if isinstance(v, str) else repr(v)}" for key, v in fit.items())
    block = (f"[{FAMILY}]\nmodel = {json.dumps(model)}\nnote = {json.dumps(note)}\npoints = [\n" + "\n".join(pts) +
             f"\n]\n\n[{FAMILY}.fit]\n{fit_lines}\n")
    return replace_family(profile_text, path, FAMILY, block)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m threewalls.bench.grouped_gemm", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", required=True,
                    help="calibration profile whose grouped_gemm.bf16 points give the shapes; "
                         "grouped_fp8_families.toml is a copy of it")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-points", type=int, default=0, help="only the first N shapes (0: all)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda is not available", file=sys.stderr)
        return 2
    if device == "cuda" and not hasattr(torch, "_scaled_grouped_mm"):
        print(f"torch {torch.__version__} has no torch._scaled_grouped_mm (PyTorch 2.8 or later)", file=sys.stderr)
        return 2
    if args.iters < 1 or args.repeats < 1:
        print("--iters and --repeats must be >= 1", file=sys.stderr)
        return 2
    with open(args.profile, encoding="utf-8") as f:
        text = f.read()
    shapes = source_points(text, args.profile)
    if args.max_points > 0:
        shapes = shapes[:args.max_points]
    os.makedirs(args.out, exist_ok=True)
    measured = []
    name = torch.cuda.get_device_name() if device == "cuda" else "host CPU"
    print(f"{'groups':>6} {'rows':>7} {'max':>6} {'n':>5} {'k':>5} {'ours bf16 us':>12} {'torch bf16 us':>13} "
          f"{'ratio':>6} {'torch fp8 us':>12} {'fp8 TFLOP/s':>11}")
    for p in shapes:
        groups, total, max_rows, n, k = (int(p[key]) for key in ("groups", "total_rows", "max_rows", "n", "k"))
        if device == "cpu":  # the smoke test: widths cut by CPU_SHRINK so the grid runs in seconds
            n, k = max(16, n // CPU_SHRINK), max(16, k // CPU_SHRINK)
        rows = group_rows(total, groups, max_rows)
        r = measure_shape(rows, n, k, device, args.iters, args.repeats)
        m = {"groups": groups, "total_rows": sum(rows), "max_rows": max(rows), "n": n, "k": k,
             "profile_total_rows": total, "profile_max_rows": max_rows, "rows": rows,
             "ours_bf16_s": float(p["median_s"]), **r}
        measured.append(m)
        t16 = r["bf16"]["median_s"] * 1e6 if r["bf16"] else float("nan")
        print(f"{groups:6d} {total:7d} {max_rows:6d} {n:5d} {k:5d} {m['ours_bf16_s'] * 1e6:12.1f} {t16:13.1f} "
              f"{t16 / (m['ours_bf16_s'] * 1e6):6.2f} {r['fp8']['median_s'] * 1e6:12.1f} {r['fp8']['tflops']:11.1f}")
    smoke = f" (a CPU, float32 matmul per group, n and k / {CPU_SHRINK}: a smoke test of the plumbing, not a calibration)" if device == "cpu" else ""
    note = (f"measured: python3 -m threewalls.bench.grouped_gemm on {name}{smoke} (torch {torch.__version__}): "
            f"torch._scaled_grouped_mm, float8_e4m3fn with row-wise scales, bf16 out, fast accumulation, rows padded "
            f"to {ALIGN_ROWS} per group; {len(measured)} shapes of this profile's {SOURCE_FAMILY} grid, median of "
            f"{args.repeats} x {args.iters} calls (PyTorch's kernel: threewalls run has no FP8 grouped GEMM)")
    path = os.path.join(args.out, "grouped_fp8_families.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(families_toml(text, args.profile, measured, note))
    ratios = [m["bf16"]["median_s"] / m["ours_bf16_s"] for m in measured if m["bf16"]]
    report = {"device": name, "torch": torch.__version__, "python": sys.version.split()[0], "iters": args.iters,
              "repeats": args.repeats, "profile": args.profile, "families": path, "note": note, "points": measured,
              "torch_bf16_over_ours_median": statistics.median(ratios) if ratios else None}
    with open(os.path.join(args.out, "grouped_gemm.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    if ratios:
        print(f"torch bf16 / ours bf16: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, "
              f"max {max(ratios):.2f}")
    print(f"{FAMILY}: {len(measured)} points -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
