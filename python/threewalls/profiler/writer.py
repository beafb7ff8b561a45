"""Writing one run directory (docs/formats/run_dir.md) from Python.

Semantics are those of the C++ RunDirWriter (profiler/include/threewalls/profiler/run_dir.hpp):
results are never overwritten unless asked; a disabled policy creates nothing; records the policy
does not select are not written (add_* returns False); buffered records reach the disk when the
policy says flush_after(step), when a rank's buffer passes 8 MiB, and at close(), which also writes
the footers.

Crash safety: lines are only ever written whole. Linux stops a write() to a file at a page boundary
when the process is killed (the copy into the page cache checks for a fatal signal page by page), so
one write of a whole flush window can be cut inside a line. The writer therefore never lets a line
cross a page boundary of the file: a line that would is moved to the next page, the rest of the
current page filled with a blank line (spaces, which readers skip), and a flush is issued as one
os.write() per file page, on an unbuffered descriptor. A write within one page is all or nothing
under SIGKILL. A process killed at any instant thus leaves complete lines on disk (only a line
longer than a page, written over several pages, could be cut), loses at most the records not yet
flushed (one flush window), and has no footer, so readers report the file as cut short and read it
with --allow-incomplete.
"""
from __future__ import annotations

import json
import mmap
import os
import re
from typing import Any, Dict, Iterable, List, Optional

from threewalls.errors import InputError
from threewalls.profiler import records as rec
from threewalls.profiler.sampling import SamplingPolicy

_MAX_BUFFER = 8 << 20
_RUN_DIR_FILE = re.compile(r"^(run\.json|summary\.json|phases_rank_[0-9]+\.jsonl)$")


def _is_run_dir(path: str) -> bool:
    """Whether `path` holds a run directory: a run.json whose "schema" is the run-directory schema."""
    try:
        with open(os.path.join(path, "run.json"), encoding="utf-8") as fh:
            j = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(j, dict) and j.get("schema") == rec.SCHEMA_NAME


def write_json_file(path: str, obj: Any) -> None:
    """A JSON file, written to a temporary name and renamed, so a reader never sees half of it."""
    import json
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


PAGE = mmap.PAGESIZE


def page_confined(lines: List[str], pos: int) -> bytes:
    """`lines` as the bytes to append at file offset `pos`, each line (newline included) within one
    page of the file: a line that would cross a page boundary starts on the next page, the rest of
    the current page holding a blank line. Lines longer than a page are left as they are."""
    out = bytearray()
    for line in lines:
        b = line.encode("utf-8") + b"\n"
        room = PAGE - pos % PAGE
        if room < len(b) <= PAGE:
            out += b" " * (room - 1) + b"\n"
            pos += room
        out += b
        pos += len(b)
    return bytes(out)


def _write_pages(fd: int, data: bytes, pos: int, path: str) -> None:
    """Writes `data` at the end of the file (offset `pos`) with one write() per file page."""
    view = memoryview(data)
    while view:
        n = min(len(view), PAGE - pos % PAGE)
        try:
            w = os.write(fd, view[:n])
        except OSError as e:
            raise OSError(f"{path}: write failed: {e.strerror}") from e
        view = view[w:]
        pos += w


class _RankFile:
    __slots__ = ("rank", "path", "fd", "pos", "lines", "size", "phase_records", "steps", "open_steps")

    def __init__(self, rank: int, path: str, fd: int):
        self.rank = rank
        self.path = path
        self.fd = fd
        self.pos = 0  # bytes written
        self.lines: List[str] = []
        self.size = 0
        self.phase_records = 0
        self.steps: List[int] = []
        self.open_steps: Dict[int, int] = {}  # steps without their step_end line yet: phase records


class RunDirWriter:
    """Writes one run directory.

    mode "create": create `out_dir` (refusing an existing non-empty one unless `overwrite`, which
    removes its run.json, summary.json and phases_rank_*.jsonl first) and write run.json.
    mode "join": `out_dir` was created by another process of the run; only add phases files.
    `local_ranks`: ranks whose phases files this writer owns (default: every recording rank).
    Not thread-safe: one thread adds records to one writer.
    """

    def __init__(self, out_dir: str, header: Dict[str, Any], policy: SamplingPolicy, *, mode: str = "create",
                 overwrite: bool = False, local_ranks: Optional[Iterable[int]] = None,
                 write_run_json: Optional[bool] = None):
        self.dir = str(out_dir)
        self.policy = policy
        self.header = dict(header)
        self._files: List[_RankFile] = []
        self._file_of_rank: Dict[int, _RankFile] = {}
        self._closed = False
        if mode not in ("create", "join"):
            raise ValueError(f"writer mode {mode!r}; allowed: create, join")
        if not policy.enabled:
            return  # disabled: no directory, no file
        if self.header["world_size"] != policy.world_size:
            raise InputError(f"run header: world_size {self.header['world_size']} differs from the sampling "
                             f"policy's {policy.world_size}")
        settings = dict(self.header.get("settings", {}))
        settings["profiler"] = policy.to_json()
        self.header["settings"] = settings
        self.header["ranks"] = policy.recording_ranks

        if mode == "create":
            if os.path.exists(self.dir):
                if not os.path.isdir(self.dir):
                    raise InputError(f"{self.dir}: exists and is not a directory")
                entries = os.listdir(self.dir)
                if entries and not overwrite:
                    raise InputError(f"{self.dir}: run directory exists and is not empty; results are never "
                                     "overwritten (choose another directory, or overwrite it explicitly)")
                if entries and not _is_run_dir(self.dir):
                    raise InputError(f"{self.dir}: is not empty and is not a run directory (it has no run.json with "
                                     f'"schema": "{rec.SCHEMA_NAME}"); overwriting replaces only run directories, so '
                                     "nothing was removed (choose another directory)")
                for name in entries:
                    p = os.path.join(self.dir, name)
                    if _RUN_DIR_FILE.match(name) and os.path.isfile(p):
                        os.remove(p)
            else:
                try:
                    os.makedirs(self.dir, exist_ok=True)
                except OSError as e:
                    raise OSError(f"{self.dir}: cannot create directory: {e.strerror}") from e
        elif not os.path.isdir(self.dir):
            raise InputError(f"{self.dir}: run directory to join does not exist (the creating process makes it "
                             "first)")
        else:
            # One run, one id: a joining process takes the creator's from run.json.
            try:
                with open(os.path.join(self.dir, "run.json"), encoding="utf-8") as fh:
                    self.header["run_id"] = json.load(fh)["run_id"]
            except (OSError, ValueError, KeyError) as e:
                raise InputError(f"{self.dir}/run.json: no run_id to join ({e})") from e
        self.header.setdefault("run_id", rec.new_run_id())
        if write_run_json if write_run_json is not None else mode == "create":
            write_json_file(os.path.join(self.dir, "run.json"), rec.run_json(self.header, policy.recording_ranks))

        local = list(local_ranks) if local_ranks is not None else policy.recording_ranks
        for r in local:
            if not 0 <= r < policy.world_size:
                raise InputError(f"writer: local rank {r} is outside the world (0..{policy.world_size - 1})")
            if not policy.records_rank(r) or r in self._file_of_rank:
                continue  # a local rank that does not record writes nothing
            path = os.path.join(self.dir, f"phases_rank_{r}.jsonl")
            if mode == "join" and os.path.exists(path) and not overwrite:
                raise InputError(f"{path}: exists; results are never overwritten")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                raise OSError(f"{path}: cannot open for writing: {e.strerror}") from e
            f = _RankFile(r, path, fd)
            self._files.append(f)
            self._file_of_rank[r] = f
            f.lines.append(rec.header_line(self.header, r))
            self._write_out(f)  # the header reaches the disk at once

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def records(self, step: int, rank: int) -> bool:
        """Whether this writer records step `step` on rank `rank` (policy, and the rank is local)."""
        return self.policy.records(step) and rank in self._file_of_rank

    def _file_for(self, step: int, rank: int) -> Optional[_RankFile]:
        """The file a record of (step, rank) goes to, or None when the policy does not select it."""
        if not self.policy.records(step):
            return None
        f = self._file_of_rank.get(rank)
        if f is not None and self._closed:
            raise OSError(f"{self.dir}: record added after close()")
        return f

    def add_step(self, step: int, rank: int, epoch_us: float, dur_us: float) -> bool:
        f = self._file_for(step, rank)
        if f is None:
            return False
        self._append(f, rec.step_line(step, rank, epoch_us, dur_us), step)
        return True

    def add_phase_line(self, step: int, rank: int, line: str, coarse: Optional[str] = None) -> bool:
        """Adds a phase line formatted by records.phase_line (the profiler formats lines itself, so a
        name is escaped once per run, not once per record)."""
        f = self._file_for(step, rank) if self.policy.records_phase(coarse) else None
        if f is None:
            return False
        f.phase_records += 1
        self._append(f, line, step)
        f.open_steps[step] = f.open_steps.get(step, 0) + 1
        return True

    def add_phase_lines(self, step: int, rank: int, lines: List[str]) -> None:
        """Adds phase lines of one step whose coarse-view membership the caller has already checked
        against the policy (the profiler does, when a phase starts)."""
        f = self._file_for(step, rank) if lines else None
        if f is None:
            return
        f.phase_records += len(lines)
        f.open_steps[step] = f.open_steps.get(step, 0) + len(lines)
        f.lines.extend(lines)
        f.size += sum(len(x) for x in lines) + len(lines)
        if not f.steps or f.steps[-1] != step:
            f.steps.append(step)
        if f.size > _MAX_BUFFER:
            self._write_out(f)

    def add_phase(self, *, step: int, rank: int, phase: str, stream: str, start_us: float, dur_us: float,
                  wall: str, bytes: float = 0.0, flops: float = 0.0, layer: Optional[int] = None,
                  microbatch: Optional[int] = None, expert: Optional[int] = None, peer: Optional[int] = None,
                  group: Optional[str] = None, group_id: Optional[int] = None, tokens: Optional[int] = None,
                  coarse: Optional[str] = None) -> bool:
        check_phase_fields(wall, group, coarse)
        line = rec.phase_line(step, rank, rec.json_string(phase), layer, microbatch, rec.json_string(stream),
                              start_us, dur_us, wall, bytes, flops, expert, peer,
                              None if group is None else rec.json_string(group), group_id, tokens, coarse)
        return self.add_phase_line(step, rank, line, coarse)

    def _append(self, f: _RankFile, line: str, step: int) -> None:
        f.open_steps.setdefault(step, 0)
        f.lines.append(line)
        f.size += len(line) + 1
        if not f.steps or f.steps[-1] != step:
            f.steps.append(step)
        if f.size > _MAX_BUFFER:
            self._write_out(f)

    def _write_out(self, f: _RankFile) -> None:
        if not f.lines:
            return
        data = page_confined(f.lines, f.pos)
        f.lines = []
        f.size = 0
        _write_pages(f.fd, data, f.pos, f.path)
        f.pos += len(data)

    def end_step(self, step: int) -> None:
        """Call after every step (recorded or not, in step order): writes buffered records out when the
        policy says flush_after(step). Every record of `step` must be added by then: each file that holds
        records of it gets the step's step_end line (docs/formats/run_dir.md)."""
        if self._closed:
            return
        self._end_step_lines(step)
        if not self.policy.flush_after(step):
            return
        for f in self._files:
            self._write_out(f)

    def _end_step_lines(self, step: int) -> None:
        for f in self._files:
            n = f.open_steps.pop(step, None)
            if n is not None:
                line = rec.step_end_line(step, n)
                f.lines.append(line)
                f.size += len(line) + 1

    def flush(self) -> None:
        for f in self._files:
            self._write_out(f)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        if not self.policy.enabled:
            return
        write_json_file(os.path.join(self.dir, "summary.json"), summary)

    def close(self) -> None:
        """Writes buffered records, a footer on every file, and closes them. Idempotent."""
        if self._closed:
            return
        for step in sorted({s for f in self._files for s in f.open_steps}):
            self._end_step_lines(step)
        self._closed = True
        for f in self._files:
            f.lines.append(rec.footer_line(self.header["run_id"], f.phase_records, f.steps))
            self._write_out(f)
            os.close(f.fd)
            f.fd = -1

    def abandon(self) -> None:
        """Writes buffered records without footers and closes the files: what a loop that dies by an
        exception leaves (readers report the files as cut short). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for f in self._files:
            try:
                self._write_out(f)
            finally:
                os.close(f.fd)
                f.fd = -1

    @property
    def phase_records_written(self) -> int:
        return sum(f.phase_records for f in self._files)


def check_phase_fields(wall: str, group: Optional[str], coarse: Optional[str]) -> None:
    """Values the reader would refuse, refused at the source with the allowed values."""
    if wall not in rec.WALLS:
        raise InputError(f"phase wall {wall!r}; allowed: {', '.join(rec.WALLS)}")
    if coarse is not None and coarse not in rec.COARSE_VIEWS:
        raise InputError(f"phase coarse {coarse!r}; allowed: {', '.join(rec.COARSE_VIEWS)} (or None)")
    if group is not None and not isinstance(group, str):
        raise InputError(f"phase group {group!r} must be a string such as {', '.join(rec.GROUPS)}")
