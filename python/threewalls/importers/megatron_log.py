"""Megatron-LM training log -> run directory.

What Megatron-LM prints and what becomes of it:

* `iteration N/ M | ... | elapsed time per iteration (ms): T | ...` (megatron/training/training.py,
  every --log-interval iterations): one **step** per such line, numbered 0, 1, ... in the order of
  the log, with `dur_us` = T (Megatron's average over the log interval); `epoch_us` is the sum of the
  earlier steps' times (the log has no clock finer than its timestamps). `--log-throughput` adds
  `throughput per GPU (TFLOP/s/GPU)`, kept per step in settings.import.throughput_tflops_per_gpu.
* The timer block printed after it (`--timing-log-level` 0 to 2, `--timing-log-option`):
  `(min, max) time across ranks (ms):` (minmax, the default), `max time across ranks (ms):` (max)
  with a line `    NAME ......: (MIN, MAX)` or `: MAX` per timer, or `times across ranks (ms):` (all)
  with `  NAME:` and one `     rank R: T` line per rank; the one-line form of older versions
  `time (ms) | NAME: T | NAME: T ...` too. Each timer becomes a **phase record** named as the timer
  (`forward-backward`, `forward-compute`, `backward-compute`, `all-grads-sync`, `optimizer`, ...),
  `layer` and `microbatch` null, `start_us` 0 (a timer is a duration; when it ran is not logged).
  minmax and max give the slowest rank's value, written as rank 0's record; all gives every rank.
  Values are Megatron's averages per iteration over the log interval.
* `[Rank R] (after N iterations) memory (MB) | ... | max allocated: X | ...`: the measured peak of
  rank R (MiB), the largest over the log, into summary.json.
* The argument dump (`  world_size ........ 8`, `seq_length`, `global_batch_size`): the world size
  and tokens per step when not given on the command line.

`threewalls compare` of this run and `threewalls sim` of the same scenario compares the step time,
and each timer with the simulation's records rolled up into the same timer (docs/compare_analyze_export.md,
"Megatron timers"). Lines of other kinds (warnings, evaluation, checkpoints) are skipped; setup timers
printed before the first iteration (`model-and-optimizer-setup`, ...) are not steps and are skipped.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from threewalls.errors import InputError
from threewalls.importers.output import ImportedRun

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
_THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+)")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\).*?\| max allocated: ([0-9.eE+-]+)")
_BLOCK = re.compile(r"^\s*(\(min, max\) time across ranks \(ms\):|max time across ranks \(ms\):|"
                    r"times across ranks \(ms\):)\s*(.*)$")
_TIMER_LINE = re.compile(r"^\s+([A-Za-z0-9_/+-][A-Za-z0-9_/+ -]*?) \.*: (?:\(([0-9.eE+-]+), ([0-9.eE+-]+)\)|([0-9.eE+-]+))\s*$")
_ALL_NAME = re.compile(r"^\s{2}([A-Za-z0-9_/+-][A-Za-z0-9_/+ -]*):\s*$")
_ALL_RANK = re.compile(r"^\s+rank\s+(\d+):\s*([0-9.eE+-]+)\s*$")
_ONE_LINE = re.compile(r"^\s*time \(ms\)\s*\|(.*)$")
_ARG = re.compile(r"^\s+([a-z_][a-z0-9_]*) \.+ (\S.*?)\s*$")


def wall_of_timer(name: str) -> str:
    """The wall a Megatron timer's time is spent on, for display: communication for reductions,
    gathers and pipeline transfers, host for the batch generator, memory for the optimizer's copies
    and updates, compute otherwise."""
    if re.search(r"all-reduce|all-gather|reduce-scatter|grads-sync|send|recv", name):
        return "communication"
    if name.startswith("batch-generator"):
        return "host"
    if name.startswith("optimizer"):
        return "memory"
    return "compute"


def parse(text: str, path: str) -> Dict[str, Any]:
    """The iterations, timers, memory lines and arguments of a Megatron-LM log. Raises InputError
    naming the file and line for a line that starts a known form but cannot be read."""
    iters: List[Dict[str, Any]] = []
    args: Dict[str, str] = {}
    peaks: Dict[int, float] = {}
    lines = text.splitlines()
    i = 0

    def bad(n: int, what: str) -> InputError:
        return InputError(f"{path}:{n + 1}: {what}: {lines[n].strip()[:120]!r}")

    def put(n: int, name: str, rank: Optional[int], ms: float) -> None:
        if not iters:
            return  # setup timers before the first iteration
        if ms < 0:
            raise bad(n, f"timer {name}: negative time")
        iters[-1]["timers"].setdefault(name, {})[rank] = ms

    while i < len(lines):
        line = lines[i]
        m = _ITER.search(line)
        if m:
            e = _ELAPSED.search(line)
            if e is None:
                raise bad(i, "an iteration line without 'elapsed time per iteration (ms)'")
            t = _THROUGHPUT.search(line)
            iters.append({"iteration": int(m.group(1)), "elapsed_ms": float(e.group(1)),
                          "throughput": float(t.group(1)) if t else None, "timers": {}, "line": i + 1})
            if iters[-1]["elapsed_ms"] <= 0:
                raise bad(i, "elapsed time per iteration must be > 0")
            i += 1
            continue
        m = _MEMORY.search(line)
        if m:
            r = int(m.group(1))
            peaks[r] = max(peaks.get(r, 0.0), float(m.group(3)))
            i += 1
            continue
        m = _BLOCK.match(line)
        if m:
            kind = m.group(1)
            rest = m.group(2)
            i += 1
            if kind.startswith("times"):  # all: "  NAME:" then "     rank R: T"
                name = None
                while i < len(lines):
                    nm = _ALL_NAME.match(lines[i])
                    rk = _ALL_RANK.match(lines[i])
                    if rk and name is not None:
                        put(i, name, int(rk.group(1)), float(rk.group(2)))
                    elif nm and not rk:
                        name = nm.group(1).strip()
                    else:
                        break
                    i += 1
            else:
                pending = [rest] if rest.strip() else []  # a one-line block (save-checkpoint ...: (a, b))
                for text_line in pending:
                    tm = _TIMER_LINE.match("    " + text_line)
                    if tm:
                        put(i - 1, tm.group(1).strip(), None, float(tm.group(3) or tm.group(4)))
                while i < len(lines):
                    tm = _TIMER_LINE.match(lines[i])
                    if not tm:
                        break
                    put(i, tm.group(1).strip(), None, float(tm.group(3) or tm.group(4)))
                    i += 1
            continue
        m = _ONE_LINE.match(line)
        if m:
            for item in m.group(1).split("|"):
                if not item.strip():
                    continue
                name, sep, value = item.rpartition(":")
                try:
                    ms = float(value)
                except ValueError:
                    raise bad(i, f"timer {item.strip()!r}: not NAME: MILLISECONDS") from None
                if not sep or not name.strip():
                    raise bad(i, f"timer {item.strip()!r}: not NAME: MILLISECONDS")
                put(i, name.strip(), None, ms)
            i += 1
            continue
        m = _ARG.match(line)
        if m and not iters:
            args.setdefault(m.group(1), m.group(2))
        i += 1
    return {"iterations": iters, "args": args, "peak_mib": peaks}


def _int_arg(args: Dict[str, str], key: str) -> Optional[int]:
    try:
        return int(args[key])
    except (KeyError, ValueError):
        return None


def import_log(path: str, *, scenario: Dict[str, Any], world_size: Optional[int] = None,
               skip: int = 0) -> ImportedRun:
    """An ImportedRun of Megatron-LM log `path`; `skip` logged iterations (warm-up) are left out."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    log = parse(text, path)
    iters = log["iterations"]
    if not iters:
        raise InputError(f"{path}: no Megatron-LM iteration line ('iteration N/ M | ... | elapsed time per "
                         "iteration (ms): T |'); is this a Megatron-LM training log?")
    if skip < 0 or skip >= len(iters):
        raise InputError(f"--skip {skip}: the log has {len(iters)} logged iteration(s); allowed: 0 to {len(iters) - 1}")
    world = world_size or scenario.get("world_size") or _int_arg(log["args"], "world_size")
    if world is None:
        raise InputError(f"{path}: the world size is not in the log's arguments; pass --world-size or --scenario")
    ranks_seen = {r for it in iters for t in it["timers"].values() for r in t if r is not None}
    bad_ranks = sorted(r for r in ranks_seen | set(log["peak_mib"]) if r >= world)
    if bad_ranks:
        raise InputError(f"{path}: rank {bad_ranks[0]} in the log is outside the world of {world} GPUs")
    run = ImportedRun("megatron-log", [path], world, scenario, device="", settings={
        "import": {"iterations": [it["iteration"] for it in iters[skip:]],
                   "log_lines": [it["line"] for it in iters[skip:]],
                   "throughput_tflops_per_gpu": [it["throughput"] for it in iters[skip:]],
                   "timer_values": "max across ranks as rank 0 (timing-log-option minmax or max); per rank (all)",
                   "averaged_over_log_interval": _int_arg(log["args"], "log_interval")}})
    gbs = _int_arg(log["args"], "global_batch_size")
    seq = _int_arg(log["args"], "seq_length")
    if gbs and seq:
        run.tokens_per_step = float(gbs * seq)
    epoch = 0.0
    for k, it in enumerate(iters[skip:]):
        dur = it["elapsed_ms"] * 1000.0
        per_rank: Dict[int, List[Tuple[str, float]]] = {}
        for name, values in it["timers"].items():
            for r, ms in values.items():
                per_rank.setdefault(0 if r is None else r, []).append((name, ms))
        for r in sorted(set(per_rank) | {0}):
            run.add_step(k, r, epoch, dur)
            for name, ms in per_rank.get(r, []):
                run.add_phase(k, r, phase=name, stream="host", start_us=0.0, dur_us=ms * 1000.0,
                              wall=wall_of_timer(name))
        epoch += dur
    for r, mib in log["peak_mib"].items():
        run.peak_bytes[r] = int(mib * 1024 * 1024)
    return run
