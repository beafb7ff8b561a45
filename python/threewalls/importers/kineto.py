"""PyTorch profiler (Kineto) Chrome trace -> run directory.

Reads what `torch.profiler.profile(...).export_chrome_trace(PATH)` writes (PATH.gz: gzip-compressed,
as PyTorch writes it for a name ending in .gz): a JSON object with
`traceEvents` (Kineto builds), or a bare list of events (builds without Kineto, such as Debian's
CPU-only PyTorch). Complete events (`"ph": "X"`) are used:

* **Steps.** A range `threewalls:step=K` (the threewalls profiler with `annotate=True`; the runner's
  `--torch-profile`) is step K. Without them, `ProfilerStep#N` ranges (torch.profiler's `schedule`
  and `prof.step()`) are steps 0, 1, ... in trace order; without those, the whole trace is step 0.
* **Phases.** A range named `threewalls:<phase>;layer=...;wall=...` (records.annotation_name) is
  one phase record with exactly those fields. A trace without such ranges imports its other
  top-level `record_function` ranges (the outermost user annotation in a step) as phases named as
  the range, `layer` and `microbatch` null, wall from what ran in it (NCCL kernels: communication;
  only copies and sets: memory; other kernels: compute; nothing on the device: host).
* **Times.** A phase's device time spans the kernels, copies and sets (`kernel`, `gpu_memcpy`,
  `gpu_memset`) launched inside it: the CUDA runtime call (`cuda_runtime`, `cuda_driver`) with the
  same `correlation` lies in the range on the same thread, the innermost range taking it. Its stream
  is `cuda_stream_<n>` of its first kernel. A phase that launched nothing keeps the range's host
  times, stream `host`; in a trace without device activity (a CPU run) every phase does, on stream
  `compute` unless its wall is `host` (the threewalls profiler's names on the CPU). A step starts at its first phase's start or first
  launched device activity (a trace with device activity) or at the step range's start (a CPU
  trace), and lasts to the end of its last one; `epoch_us` counts from the earliest event of all
  the files, on the trace clock (Kineto's clock is shared by the processes of one host).
* **Ranks.** `distributedInfo.rank` and `.world_size` of the trace (torch.distributed runs), else
  the files are ranks 0, 1, ... in the order given, of a world of `--world-size` (default: the
  scenario's, else the number of files).

Device activity that no phase launched is not dropped silently: its total per rank is in
settings.import.unattributed_device_us and printed.
"""
from __future__ import annotations

import bisect
import gzip
import json
import re
from typing import Any, Dict, List, Optional, Tuple

from threewalls.errors import InputError
from threewalls.importers.output import ImportedRun
from threewalls.profiler.records import ANNOTATION_PREFIX, parse_annotation

_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
_GPU_SIDE_CATS = _DEVICE_CATS | {"gpu_user_annotation", "ac2g"}
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _load(path: str) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")) as f:
            doc = json.load(f)
    except (OSError, EOFError) as e:
        raise InputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}:{e.colno}: not a JSON trace ({e.msg}); a PyTorch profiler Chrome "
                         "trace is a JSON object with traceEvents (or a list of events)") from e
    if isinstance(doc, list):
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"], doc
    raise InputError(f"{path}: not a Chrome trace: expected a JSON object with a traceEvents list, or a list of "
                     "events")


def _complete(events: List[Dict[str, Any]], path: str) -> List[Dict[str, Any]]:
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0 \
                or not isinstance(e.get("name"), str):
            raise InputError(f"{path}: traceEvents[{i}]: a complete event needs a name, a numeric ts and a dur >= 0 "
                             f"(got name {e.get('name')!r}, ts {ts!r}, dur {dur!r})")
        out.append(e)
    return out


class _Range:
    __slots__ = ("name", "start", "end", "thread", "fields", "dev_start", "dev_end", "stream", "kinds")

    def __init__(self, e: Dict[str, Any], fields: Optional[Dict[str, Any]]):
        self.name = e["name"]
        self.start = float(e["ts"])
        self.end = self.start + float(e.get("dur", 0))
        self.thread = (e.get("pid"), e.get("tid"))
        self.fields = fields
        self.dev_start = self.dev_end = None
        self.stream = None
        self.kinds = set()


def _device_kind(e: Dict[str, Any]) -> str:
    if e.get("cat") != "kernel":
        return "memory"
    return "communication" if "nccl" in e["name"].lower() else "compute"


def _read_trace(path: str) -> Dict[str, Any]:
    events, doc = _load(path)
    ev = _complete(events, path)
    steps: List[Tuple[int, _Range]] = []
    profiler_steps: List[_Range] = []
    phases: List[_Range] = []
    others: List[_Range] = []
    device: List[Dict[str, Any]] = []
    runtime: Dict[Any, Dict[str, Any]] = {}
    for e in ev:
        cat = e.get("cat")
        name = e["name"]
        if cat in _DEVICE_CATS:
            device.append(e)
            continue
        if cat in _GPU_SIDE_CATS:
            continue
        if cat in _RUNTIME_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime[corr] = e
            continue
        if name.startswith(ANNOTATION_PREFIX):
            try:
                fields = parse_annotation(name)
            except ValueError as err:
                raise InputError(f"{path}: {err}") from None
            if "step" in fields and "phase" not in fields:
                steps.append((fields["step"], _Range(e, None)))
            else:
                phases.append(_Range(e, fields))
            continue
        m = _PROFILER_STEP.match(name)
        if m:
            profiler_steps.append(_Range(e, None))
        elif cat in ("user_annotation",) or (cat is None and not name.startswith("aten::")):
            others.append(_Range(e, None))
    return {"path": path, "doc": doc, "steps": steps, "profiler_steps": profiler_steps, "phases": phases,
            "others": others, "device": device, "runtime": runtime, "events": ev}


def _attribute(ranges: List[_Range], device: List[Dict[str, Any]], runtime: Dict[Any, Dict[str, Any]]) -> float:
    """Gives each device activity to the innermost range whose host interval, on the launching
    thread, holds its runtime call. Returns the device time of activities no range launched (us)."""
    by_thread: Dict[Any, List[_Range]] = {}
    for r in ranges:
        by_thread.setdefault(r.thread, []).append(r)
    starts: Dict[Any, List[float]] = {}
    for t, rs in by_thread.items():
        rs.sort(key=lambda r: (r.start, -r.end))
        starts[t] = [r.start for r in rs]
    unattributed = 0.0
    for d in device:
        rt = runtime.get((d.get("args") or {}).get("correlation"))
        owner = None
        if rt is not None:
            t = (rt.get("pid"), rt.get("tid"))
            rs = by_thread.get(t, [])
            k = bisect.bisect_right(starts.get(t, []), float(rt["ts"])) - 1
            while k >= 0:  # the latest-starting range that still holds the call is the innermost
                if rs[k].end >= float(rt["ts"]):
                    owner = rs[k]
                    break
                k -= 1
        d0 = float(d["ts"])
        d1 = d0 + float(d.get("dur", 0))
        if owner is None:
            unattributed += d1 - d0
            continue
        owner.dev_start = d0 if owner.dev_start is None else min(owner.dev_start, d0)
        owner.dev_end = d1 if owner.dev_end is None else max(owner.dev_end, d1)
        if owner.stream is None:
            owner.stream = (d.get("args") or {}).get("stream", d.get("tid"))
        owner.kinds.add(_device_kind(d))
    return unattributed


def _top_level(ranges: List[_Range]) -> List[_Range]:
    """Ranges not inside another range of the list on the same thread."""
    out = []
    ends: Dict[Any, float] = {}
    for r in sorted(ranges, key=lambda r: (r.start, -r.end)):
        if r.start < ends.get(r.thread, float("-inf")):
            continue
        out.append(r)
        ends[r.thread] = r.end
    return out


def import_traces(paths: List[str], *, scenario: Dict[str, Any], world_size: Optional[int] = None) -> ImportedRun:
    if not paths:
        raise InputError("kineto: give at least one trace file")
    traces = [_read_trace(p) for p in paths]
    ranks: List[int] = []
    worlds = set()
    for k, t in enumerate(traces):
        info = t["doc"].get("distributedInfo") or {}
        rank = info.get("rank", k)
        if not isinstance(rank, int) or rank < 0:
            raise InputError(f"{t['path']}: distributedInfo.rank {rank!r} is not a rank")
        if "world_size" in info:
            worlds.add(info["world_size"])
        ranks.append(rank)
    if len(set(ranks)) != len(ranks):
        raise InputError(f"kineto: two traces are of the same rank ({', '.join(f'{p}: {r}' for p, r in zip(paths, ranks))})")
    if len(worlds) > 1:
        raise InputError(f"kineto: the traces disagree on the world size ({sorted(worlds)})")
    world = world_size or (worlds.pop() if worlds else None) or scenario.get("world_size") or len(paths)
    if max(ranks) >= world:
        raise InputError(f"kineto: rank {max(ranks)} is outside the world of {world}; pass --world-size")
    t0 = min((float(e["ts"]) for t in traces for e in t["events"]), default=0.0)
    devices = {p.get("name") for t in traces for p in (t["doc"].get("deviceProperties") or []) if isinstance(p, dict)}
    devices.discard(None)
    unattributed: Dict[str, float] = {}
    generic_names = set()
    run = ImportedRun("kineto", paths, world, scenario, device=", ".join(sorted(devices)) or "host CPU", settings={})
    for t, rank in zip(traces, ranks):
        phases = t["phases"]
        generic = not phases
        if generic:
            phases = _top_level(t["others"])
            generic_names.update(r.name for r in phases)
        unattributed[str(rank)] = _attribute(phases, t["device"], t["runtime"])
        if t["steps"]:
            steps = sorted(t["steps"], key=lambda s: s[1].start)
        elif t["profiler_steps"]:
            steps = list(enumerate(sorted(t["profiler_steps"], key=lambda r: r.start)))
        else:
            whole = _Range({"name": "trace", "ts": t0, "dur": 0}, None)
            whole.start = float("-inf")
            whole.end = float("inf")
            steps = [(0, whole)]
        has_device = bool(t["device"])
        starts = [s[1].start for s in steps]
        per_step: Dict[int, List[_Range]] = {}
        for r in phases:
            k = bisect.bisect_right(starts, r.start) - 1
            if k >= 0 and r.start <= steps[k][1].end:
                per_step.setdefault(k, []).append(r)
        for k, (step, srange) in enumerate(steps):
            rs = per_step.get(k, [])
            if not rs:
                continue
            times = [(r.dev_start, r.dev_end) if r.dev_start is not None else (r.start, r.end) for r in rs]
            epoch = min(a for a, _ in times) if has_device or srange.start == float("-inf") else srange.start
            end = max(b for _, b in times)
            if end - epoch <= 0:
                raise InputError(f"{t['path']}: step {step}: its phases take no time; nothing to import")
            run.add_step(step, rank, epoch - t0, end - epoch)
            for r, (a, b) in zip(rs, times):
                if r.fields is not None:
                    f = dict(r.fields)
                    name = f.pop("phase")
                else:
                    kinds = r.kinds
                    wall = "host" if not kinds else "communication" if "communication" in kinds else \
                        "compute" if "compute" in kinds else "memory"
                    name, f = r.name, {"layer": None, "microbatch": None, "wall": wall}
                if r.dev_start is not None:
                    stream = f"cuda_stream_{r.stream}"
                else:  # the threewalls profiler's names on the host clock
                    stream = "compute" if not has_device and f["wall"] != "host" else "host"
                run.add_phase(step, rank, phase=name, stream=stream, start_us=a - epoch, dur_us=b - a, **f)
    run.settings["import"]["unattributed_device_us"] = unattributed
    run.settings["import"]["phases_from"] = "record_function ranges named by the threewalls profiler" \
        if not generic_names else "top-level record_function ranges: " + ", ".join(sorted(generic_names)[:20])
    return run
