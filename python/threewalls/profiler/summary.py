"""summary.json for a run directory written from Python.

The fields follow docs/formats/run_dir.md, computed as the C++ SummaryBuilder computes them
(profiler/src/summary.cpp): per step the critical rank (the longest step record) and its step time,
throughput and MFU from the model FLOPs and tokens the caller passes, the coarse view, order
statistics of the step time, per-phase count, total, median and p95 (linear interpolation between
closest ranks, numpy's default), and the measured peak memory per rank.

The wall breakdown is not computed here: `walls_us` and `communication_us` are null, and
`settings.summary_walls` says so. The one wall function of the project is C++ (profiler/src/walls.cpp);
`threewalls compare` and `analyze` compute walls from the records themselves, so they show the
walls of a Python-written run like any other.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, List, Optional

from threewalls.profiler import records as rec


def quantile(sorted_values: List[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy.quantile's default)."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def read_records(run_dir: str) -> Dict[str, Any]:
    """Step and phase records of every phases file of `run_dir` (the lines as dicts; header and footer
    apart). A file cut short (no footer) is read up to its last complete line. For building the
    summary and for tests; the reader that checks a run directory is the C++ one (`threewalls`)."""
    out: Dict[str, Any] = {"steps": [], "phases": [], "headers": {}, "footers": {}}
    for path in sorted(glob.glob(os.path.join(run_dir, "phases_rank_*.jsonl"))):
        m = re.search(r"phases_rank_([0-9]+)\.jsonl$", path)
        rank = int(m.group(1))
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                j = json.loads(raw)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # a cut last line (no newline after it)
                raise
            kind = j.get("record")
            if kind == "header":
                out["headers"][rank] = j
            elif kind == "footer":
                out["footers"][rank] = j
            elif kind == "step":
                out["steps"].append(j)
            elif kind == "step_end":
                continue  # closes a step (its counts are the C++ reader's to check)
            else:
                out["phases"].append(j)
    return out


def build_summary(run_dir: str, *, model_flops_per_step: Optional[float] = None,
                  tokens_per_step: Optional[float] = None, gpu: str = "", gpu_peak_flops: Optional[float] = None,
                  measured_peak_bytes_by_rank: Optional[Dict[int, int]] = None,
                  gpu_memory_bytes: Optional[int] = None,
                  step_inputs: Optional[Dict[int, Dict[str, float]]] = None,
                  model_flops_from_records: bool = False) -> Dict[str, Any]:
    """The summary of the finished run directory `run_dir`. `step_inputs` gives, for steps whose
    tokens or model FLOPs differ from the per-step values (inference: prefill and decode),
    {"tokens": ..., "model_flops": ...}. With model_flops_from_records, a step's model FLOPs are the
    FLOPs of its phase records, scaled from the ranks that recorded it to the whole world (for runs
    whose records are every op of the model, as the reference runner's are; they hold no
    recomputation)."""
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        run = json.load(f)
    recs = read_records(run_dir)
    world = run["world_size"]
    critical: Dict[int, Dict[str, Any]] = {}
    for s in recs["steps"]:
        c = critical.get(s["step"])
        if c is None or s["dur_us"] > c["dur_us"] or (s["dur_us"] == c["dur_us"] and s["rank"] < c["rank"]):
            critical[s["step"]] = s
    coarse: Dict[tuple, List[float]] = {}
    phases: Dict[str, Dict[str, Any]] = {}
    step_flops: Dict[int, float] = {}
    step_ranks: Dict[int, set] = {}
    for s in recs["steps"]:
        step_ranks.setdefault(s["step"], set()).add(s["rank"])
    for p in recs["phases"]:
        step_flops[p["step"]] = step_flops.get(p["step"], 0.0) + p["flops"]
        entry = phases.get(p["phase"])
        if entry is None:
            entry = phases[p["phase"]] = {"wall": p["wall"], "durs": []}
        entry["durs"].append(p["dur_us"])
        view = p.get("coarse")
        if view is not None:
            c = coarse.setdefault((p["step"], p["rank"]), [0.0, 0.0])
            c[0 if view == "host_to_device" else 1] += p["dur_us"]

    steps_json = []
    step_times = []
    for step in sorted(critical):
        s = critical[step]
        t_us = s["dur_us"]
        step_times.append(t_us)
        ins = (step_inputs or {}).get(step, {})
        tokens = ins.get("tokens", tokens_per_step)
        flops = ins.get("model_flops", model_flops_per_step)
        if model_flops_from_records and step in step_flops:
            flops = step_flops[step] * world / len(step_ranks[step])
        tps = tokens / (t_us * 1e-6) if tokens is not None and t_us > 0 else 0.0
        per_gpu = flops / world / (t_us * 1e-6) if flops is not None and t_us > 0 else 0.0
        h2d = max((v[0] for (st, _), v in coarse.items() if st == step), default=0.0)
        metrics = max((v[1] for (st, _), v in coarse.items() if st == step), default=0.0)
        steps_json.append({
            "step": step, "step_time_us": t_us, "critical_rank": s["rank"], "tokens_per_s": tps,
            "tflops_per_gpu": per_gpu * 1e-12, "mfu": per_gpu / gpu_peak_flops if gpu_peak_flops else 0.0,
            "walls_us": None, "communication_us": None,
            "coarse": {"host_to_device": {"duration_ms": h2d * 1e-3},
                       "training_step": {"duration_ms": t_us * 1e-3},
                       "training_metrics": {"duration_ms": metrics * 1e-3}},
        })
    st = sorted(step_times)
    phases_json = []
    for name, e in phases.items():
        d = sorted(e["durs"])
        phases_json.append({"phase": name, "wall": e["wall"], "count": len(d), "total_us": sum(d),
                            "median_us": quantile(d, 0.5), "p95_us": quantile(d, 0.95)})
    return {
        "schema": rec.SCHEMA_NAME, "schema_version": rec.SCHEMA_VERSION, "run_id": run.get("run_id", ""),
        "source": run["source"],
        "scenario": run["scenario"], "world_size": world, "gpu": gpu,
        "gpu_peak_flops": gpu_peak_flops or 0.0,
        "model_flops_per_step": (model_flops_per_step or 0.0) if not model_flops_from_records or not steps_json
        else step_flops.get(steps_json[0]["step"], 0.0) * world / len(step_ranks[steps_json[0]["step"]]),
        "tokens_per_step": tokens_per_step or 0.0,
        "steps": steps_json,
        "step_time_us": {"median": quantile(st, 0.5), "p95": quantile(st, 0.95),
                         "mean": sum(st) / len(st) if st else 0.0, "min": st[0] if st else 0.0,
                         "max": st[-1] if st else 0.0},
        "walls_us": None, "communication_us": None,
        "phases": phases_json,
        "memory": {"gpu_memory_bytes": gpu_memory_bytes, "classes": [], "oom": False,
                   "measured_peak_bytes_by_rank": {str(r): int(b) for r, b in
                                                   sorted((measured_peak_bytes_by_rank or {}).items())}},
    }
