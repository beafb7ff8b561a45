"""The record layout of a run directory (docs/formats/run_dir.md), as the Python writer emits it.

The C++ profiler (profiler/src/record.cpp, run_dir_writer.cpp) owns the format and its reader
(profiler/src/run_dir_reader.cpp) is the judge: tests write run directories with this module and read
them back with `threewalls analyze` and `compare` (python/tests/test_cli_reads.py), and check the
field lists below against the format's documentation (python/tests/test_records.py). Nothing in
this module decides what a field means; it only spells lines the way the C++ writer does: the same
key order, times rounded to the nanosecond, counts rounded to integers.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any, Dict, List, Optional, Sequence

SCHEMA_NAME = "threewalls.run_dir"
SCHEMA_MAJOR = 1
SCHEMA_MINOR = 2
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"

WALLS = ("compute", "memory", "communication", "host")
COARSE_VIEWS = ("host_to_device", "training_metrics")
GROUPS = ("tp", "cp", "dp", "dp_cp", "ep", "etp", "edp", "pp", "world", "embedding")
SOURCES = ("sim", "real")

# Phase-line keys in the order the C++ writer emits them (required keys always, optional ones only
# when they apply). Phase lines carry no "record" key.
PHASE_REQUIRED = ("step", "rank", "phase", "layer", "microbatch", "stream", "start_us", "dur_us", "wall",
                  "bytes", "flops")
PHASE_OPTIONAL = ("expert", "peer", "group", "group_id", "tokens", "launch_wait_us", "coarse")
STEP_KEYS = ("record", "step", "rank", "epoch_us", "dur_us")
STEP_END_KEYS = ("record", "step", "records")
FOOTER_KEYS = ("record", "run_id", "records", "steps")
# Header line of a phases file; run.json is the same object without record, rank and rank_class,
# plus ranks and rank_classes.
HEADER_KEYS = ("record", "schema", "schema_version", "run_id", "source", "tool_version", "git_sha", "scenario",
               "calibration_profile", "device", "world_size", "rank", "rank_class", "argv", "start_time",
               "seed", "settings")
RUN_JSON_KEYS = tuple(k for k in HEADER_KEYS if k not in ("record", "rank", "rank_class")) + ("ranks",
                                                                                              "rank_classes")

_TWO_53 = 9.007199254740992e15


def _llround(x: float) -> int:
    """C's llround: halves away from zero (Python's round() rounds halves to even)."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def format_time_us(us: float) -> str:
    """Microseconds rounded to the nanosecond, at most three decimals, trailing zeros dropped:
    "12.5", "0.001", "1000000000.125" (the C++ writer's LineWriter::time_us)."""
    if not math.isfinite(us):
        raise ValueError(f"time {us!r} us is not a finite number")
    if not abs(us) < 9e12:
        return f"{us:.15g}"
    ns = _llround(us * 1000.0)
    sign = ""
    if ns < 0:
        sign = "-"
        ns = -ns
    whole, frac = divmod(ns, 1000)
    if frac == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}." + f"{frac:03d}".rstrip("0")


def format_count(v: float) -> str:
    """Bytes and FLOPs: integers (exact below 2^53), nine significant digits beyond."""
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"count {v!r} is not a finite non-negative number")
    if v < _TWO_53:
        return str(_llround(v))
    return f"{v:.9g}"


def json_string(s: str) -> str:
    """A name as a JSON string literal (quotes included), as the writer appends it."""
    return json.dumps(s, ensure_ascii=False)


def dumps(obj: Any) -> str:
    """Compact JSON, as nlohmann::json::dump() writes it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def phase_prefix(phase_json: str, layer: Optional[int], microbatch: Optional[int]) -> str:
    """The part of a phase line after step and rank, up to the stream's value."""
    return (f'"phase":{phase_json},"layer":{"null" if layer is None else int(layer)},'
            f'"microbatch":{"null" if microbatch is None else int(microbatch)},"stream":')


def phase_suffix(wall: str, nbytes: float, flops: float, expert: Optional[int] = None, peer: Optional[int] = None,
                 group_json: Optional[str] = None, group_id: Optional[int] = None, tokens: Optional[int] = None,
                 coarse: Optional[str] = None) -> str:
    """The part of a phase line after the times: wall, bytes, flops and the optional fields that apply
    (launch_wait_us is never written by the Python writer), closing brace included."""
    s = f',"wall":"{wall}","bytes":{format_count(nbytes)},"flops":{format_count(flops)}'
    for key, v in (("expert", expert), ("peer", peer)):
        if v is not None:
            s += f',"{key}":{int(v)}'
    if group_json is not None:
        s += f',"group":{group_json}'
    for key, v in (("group_id", group_id), ("tokens", tokens)):
        if v is not None:
            s += f',"{key}":{int(v)}'
    if coarse is not None:
        s += f',"coarse":"{coarse}"'
    return s + "}"


def phase_line_from(step: int, rank: int, prefix: str, stream_json: str, start_us: float, dur_us: float,
                    suffix: str) -> str:
    """A whole phase line from phase_prefix and phase_suffix (what the profiler keeps per phase)."""
    return (f'{{"step":{step},"rank":{rank},' + prefix + stream_json + ',"start_us":' + format_time_us(start_us) +
            ',"dur_us":' + format_time_us(dur_us) + suffix)


def phase_line(step: int, rank: int, phase_json: str, layer: Optional[int], microbatch: Optional[int],
               stream_json: str, start_us: float, dur_us: float, wall: str, nbytes: float, flops: float,
               expert: Optional[int] = None, peer: Optional[int] = None, group_json: Optional[str] = None,
               group_id: Optional[int] = None, tokens: Optional[int] = None, coarse: Optional[str] = None) -> str:
    """One phase line (no newline). `phase_json`, `stream_json` and `group_json` are JSON string
    literals (json_string), so a name is escaped once, not once per record."""
    return phase_line_from(step, rank, phase_prefix(phase_json, layer, microbatch), stream_json, start_us, dur_us,
                           phase_suffix(wall, nbytes, flops, expert, peer, group_json, group_id, tokens, coarse))


ANNOTATION_PREFIX = "threewalls:"
# Characters a trace writer may not escape (PyTorch 1.13's Chrome trace writes names unescaped) or
# that separate the fields: percent-encoded in annotation names.
_ANNOTATION_QUOTE = {c: f"%{ord(c):02X}" for c in '%";=\\\n\t'}
_ANNOTATION_INT_FIELDS = ("layer", "microbatch", "expert", "peer", "group_id", "tokens")


def _quote(v: Any) -> str:
    return "".join(_ANNOTATION_QUOTE.get(c, c) for c in str(v))


def annotation_name(phase: str, fields: Dict[str, Any]) -> str:
    """The name of a phase's torch.profiler range (Profiler(annotate=True)):
    "threewalls:<phase>;layer=3;microbatch=0;wall=compute;bytes=...;flops=..." with the phase record's
    fields other than step, rank, stream and times (absent and None fields left out), so an importer
    of a profiler trace (threewalls.importers.kineto) reads back the record's fields with
    parse_annotation. No quotes: trace writers do not all escape names."""
    parts = [_quote(phase)]
    for k, v in fields.items():
        if v is not None:
            parts.append(f"{k}={_quote(format_count(v) if k in ('bytes', 'flops') else v)}")
    return ANNOTATION_PREFIX + ";".join(parts)


def step_annotation_name(step: int) -> str:
    """The name of a recorded step's torch.profiler range: "threewalls:step=<step>"."""
    return f"{ANNOTATION_PREFIX}step={int(step)}"


def parse_annotation(name: str) -> Optional[Dict[str, Any]]:
    """{"phase": ..., "layer": ..., "microbatch": ..., "wall": ... and the other fields given} of an
    annotation_name, {"step": k} of a step_annotation_name, None for a name without the prefix.
    Raises ValueError for a name that has the prefix but is neither."""
    if not name.startswith(ANNOTATION_PREFIX):
        return None
    from urllib.parse import unquote
    body = name[len(ANNOTATION_PREFIX):]
    if body.startswith("step="):
        try:
            return {"step": int(body[5:])}
        except ValueError:
            raise ValueError(f"annotation {name!r}: step is not an integer") from None
    parts = body.split(";")
    out: Dict[str, Any] = {"phase": unquote(parts[0]), "layer": None, "microbatch": None}
    for item in parts[1:]:
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"annotation {name!r}: field {item!r} is not key=value")
        v = unquote(v)
        try:
            out[k] = int(v) if k in _ANNOTATION_INT_FIELDS else float(v) if k in ("bytes", "flops") else v
        except ValueError:
            raise ValueError(f"annotation {name!r}: field {k} = {v!r} is not a number") from None
    if not out["phase"] or "wall" not in out:
        raise ValueError(f"annotation {name!r}: not a threewalls phase (no phase name or wall)")
    return out


def step_line(step: int, rank: int, epoch_us: float, dur_us: float) -> str:
    return (f'{{"record":"step","step":{step},"rank":{rank},"epoch_us":{format_time_us(epoch_us)},'
            f'"dur_us":{format_time_us(dur_us)}}}')


def step_end_line(step: int, records: int) -> str:
    """Closes step `step` in a phases file: its records precede this line, `records` of them phase records."""
    return f'{{"record":"step_end","step":{step},"records":{records}}}'


def footer_line(run_id: str, records: int, steps: Sequence[int]) -> str:
    return dumps({"record": "footer", "run_id": run_id, "records": records, "steps": sorted(set(steps))})


def new_run_id() -> str:
    """128 random bits as 32 lowercase hex digits: the id every file of one run directory carries."""
    return secrets.token_hex(16)


def iso8601_utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def fnv1a64_hex(data: bytes) -> str:
    """FNV-1a 64 of a file's bytes, hex: the scenario hash of the run header."""
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def make_header(*, source: str = "real", world_size: int, tool_version: str, git_sha: str = "unknown",
                scenario: Optional[Dict[str, str]] = None, device: str = "", argv: Optional[List[str]] = None,
                start_time: Optional[str] = None, seed: int = 0, settings: Optional[Dict[str, Any]] = None,
                rank_classes: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The run header (run.json without ranks, which the writer fills from the sampling policy)."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r}; allowed: {', '.join(SOURCES)}")
    sc = {"name": "", "path": "", "hash": ""}
    if scenario:
        unknown = set(scenario) - set(sc)
        if unknown:
            raise ValueError(f"scenario: unknown field(s) {sorted(unknown)}; allowed: name, path, hash")
        sc.update({k: str(v) for k, v in scenario.items()})
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "run_id": new_run_id(),
        "source": source,
        "tool_version": tool_version,
        "git_sha": git_sha,
        "scenario": sc,
        "calibration_profile": None,
        "device": device,
        "world_size": int(world_size),
        "argv": list(argv or []),
        "start_time": start_time or iso8601_utc(time.time()),
        "seed": int(seed),
        "settings": dict(settings or {}),
        "rank_classes": list(rank_classes or []),
    }


def _common(header: Dict[str, Any]) -> Dict[str, Any]:
    return {k: header[k] for k in ("schema", "schema_version", "run_id", "source", "tool_version", "git_sha",
                                   "scenario", "calibration_profile", "device", "world_size")}


def _tail(header: Dict[str, Any]) -> Dict[str, Any]:
    return {k: header[k] for k in ("argv", "start_time", "seed", "settings")}


def run_json(header: Dict[str, Any], ranks: Sequence[int]) -> Dict[str, Any]:
    j = _common(header)
    j.update(_tail(header))
    j["ranks"] = list(ranks)
    j["rank_classes"] = [{"id": c["id"], "label": c["label"], "ranks": list(c["ranks"]), "pp_stage": c["pp_stage"]}
                         for c in header.get("rank_classes", [])]
    return j


def rank_class_of(header: Dict[str, Any], rank: int) -> Optional[int]:
    for c in header.get("rank_classes", []):
        if rank in c["ranks"]:
            return c["id"]
    return None


def header_line(header: Dict[str, Any], rank: int) -> str:
    j = {"record": "header"}
    j.update(_common(header))
    j["rank"] = rank
    j["rank_class"] = rank_class_of(header, rank)
    j.update(_tail(header))
    return dumps(j)
