"""The sampled profiler for PyTorch programs.

    prof = Profiler("runs/1", sampling=SamplingConfig(record_every_n_steps=10))
    for step in range(steps):
        with prof.step(step):
            with prof.phase("forward", layer=0, flops=f):
                loss = model(batch)
            ...
    prof.finish()

How a step is timed (the C++ CUDA profiler's scheme, docs/profiler.md "Device timing"):

* begin_step(step): when the sampling policy selects the step and the rank, an *epoch* stamp is
  taken on the current stream, and the module hooks (hook_module) are put on their modules; end_step
  takes them off. An unselected step records nothing: phases return a shared no-op context manager
  after one branch, and hooked modules run without hooks.
* A phase is a pair of stamps around its work on the stream current at the phase's start (or the
  stream passed), or, for host phases, two host-clock readings. A stamp is a CUDA timing event that
  completes when the stream reaches it: a marker event without timing on the stream, waited for by
  the device's timer stream, which records the timing event (stamps="shadow"; "stream" records the
  timing event on the stream itself, whose next kernel then waits for the stamp).
* end_step(): an end event on every stream the step's phases used; the step's `dur_us` is the latest
  of them (and of the phases' ends) after the epoch.
* Harvesting never waits and runs only where the host has time: a host phase that waits for the
  device (a read of a result) formats records of finished steps (all their end events done), oldest
  first, until the device gets there; in a loop without such reads, a phase() call formats two
  records when the device has not yet reached the previous phase boundary (the last event
  recorded; on unrecorded steps, when the main stream has queued work). begin_step formats, busy
  device or not, what is left of the steps before the last recorded one and of every step before a
  flush point reached (at most about one step's records wait; a flush window is written during the
  next step). A record
  is start_us = elapsed(epoch, a), dur_us = elapsed(a, b); its events go back to a pool, so steady
  state creates no events. finish() waits for the rest.
* epoch_us is on the run's host clock (time.time_ns() since the start of the second in run.json's
  start_time, which every rank of the run shares), through an *anchor*: an event recorded while the
  stream is idle at a known host time. epoch_us(k) = anchor_host + elapsed(anchor, epoch_k); epoch_k
  then becomes the anchor, so elapsed times stay short. A fresh host anchor is taken at a recorded
  step's start whenever the stream is idle then and the last one is older than 0.1 s, which bounds
  the drift of the GPU clock against the host clock.
* NVTX ranges (torch.cuda.nvtx) around every phase: nvtx="sampled" (default) on recorded steps only,
  "all" on every step (a timeline tool then sees every step, at the cost of two calls per phase), or
  "off".
* Without CUDA (or use_cuda=False) every phase is timed on the host clock: the same records, for CPU
  programs and tests.

Records go to a RunDirWriter (threewalls.profiler.writer): whole lines, written when the policy's
flush_every_n_steps says so, so a killed process loses at most one flush window.
"""
from __future__ import annotations

import calendar
import os
import sys
import threading
import time
import warnings
from collections import deque
from typing import Any, Dict, List, Optional, Sequence

from threewalls import __version__
from threewalls.errors import InputError
from threewalls.profiler import cuda_driver
from threewalls.profiler import records as rec
from threewalls.profiler.sampling import SamplingConfig, SamplingPolicy
from threewalls.profiler.summary import build_summary
from threewalls.profiler.writer import RunDirWriter

try:  # the profiler also runs without torch (host timing only)
    import torch
except ImportError:  # pragma: no cover - the CI image has torch
    torch = None

_WALLS = frozenset(rec.WALLS)
_COARSE = frozenset(rec.COARSE_VIEWS)
_REANCHOR_NS = 100_000_000  # a fresh host anchor at most every 0.1 s


# Event record and stream wait without torch.cuda.Event's Python wrappers (which look the current
# stream up first); the wrappers where PyTorch's _CudaEventBase lacks them (builds without CUDA).
_EVENT_BASE = getattr(torch._C, "_CudaEventBase", None) if torch is not None else None
if hasattr(_EVENT_BASE, "record") and hasattr(_EVENT_BASE, "wait"):
    _record = _EVENT_BASE.record
    _wait = _EVENT_BASE.wait
else:
    def _record(event, stream):
        event.record(stream)

    def _wait(event, stream):
        event.wait(stream)


def one_queue_warning(environ) -> Optional[str]:
    """The warning a recorded step's phases on more than one stream earn when the process has one
    hardware work queue (CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron-LM sets with tensor
    parallelism): every stamp is a CUDA event that holds the one queue until the work before it on its
    stream ends, so the other streams' work waits (docs/profiler.md, "One hardware queue"). None
    otherwise."""
    if (environ.get("CUDA_DEVICE_MAX_CONNECTIONS") or "").strip() != "1":
        return None
    return ("threewalls profiler: CUDA_DEVICE_MAX_CONNECTIONS=1 and phases on more than one stream: on a "
            "recorded step each stamp holds the one hardware queue until the op before it ends, so work on the "
            "other streams waits (a two-stream loop on an H200: +43% step time recorded, +1.5% with 8 queues); "
            "recorded steps then measure less overlap than the others have. Record fewer steps "
            "(record_every_n_steps) or leave CUDA_DEVICE_MAX_CONNECTIONS unset where the overlap matters.")


class _Null:
    """The context manager of a phase on an unrecorded step: nothing at all."""
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class _NvtxOnly:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        torch.cuda.nvtx.range_push(self.name)
        return self

    def __exit__(self, *exc):
        torch.cuda.nvtx.range_pop()
        return False


class PhaseInfo:
    """What a phase record carries besides its times. Build one per (phase, layer, ...) and reuse it
    (Profiler.info) to keep the hot path short; phase() builds one per call otherwise."""
    __slots__ = ("name", "prefix", "suffix", "wall", "bytes", "flops", "coarse", "host", "annotation")

    def __init__(self, prof: "Profiler", name: str, layer: Optional[int], microbatch: Optional[int], wall: str,
                 bytes: float, flops: float, expert: Optional[int], peer: Optional[int], group: Optional[str],
                 group_id: Optional[int], tokens: Optional[int], coarse: Optional[str], host: bool):
        if wall not in _WALLS:
            raise InputError(f"phase {name!r}: wall {wall!r}; allowed: {', '.join(rec.WALLS)}")
        if coarse is not None and coarse not in _COARSE:
            raise InputError(f"phase {name!r}: coarse {coarse!r}; allowed: {', '.join(rec.COARSE_VIEWS)} or None")
        if bytes < 0 or flops < 0:
            raise InputError(f"phase {name!r}: bytes and flops must be >= 0 (bytes {bytes}, flops {flops})")
        self.name = name
        self.wall = wall
        self.bytes = bytes
        self.flops = flops
        self.coarse = coarse
        self.host = host
        # The parts of the line around the stream and the times, formatted once.
        self.prefix = rec.phase_prefix(prof._json(name), layer, microbatch)
        self.suffix = rec.phase_suffix(wall, bytes, flops, expert, peer, None if group is None else prof._json(group),
                                       group_id, tokens, coarse)
        self.annotation = rec.annotation_name(name, {
            "layer": layer, "microbatch": microbatch, "wall": wall, "bytes": bytes, "flops": flops, "expert": expert,
            "peer": peer, "group": group, "group_id": group_id, "tokens": tokens, "coarse": coarse}) \
            if prof._annotate else None


class _Phase:
    """A phase on a recorded step (context manager); also the token of begin_phase/end_phase. A device
    phase has events a and b; a host phase has host times h0 and h1 and, when it waits for the
    device, event a where the device reaches its start."""
    __slots__ = ("prof", "info", "stream", "a", "b", "h0", "h1", "nvtx", "waits", "rf")

    def __init__(self, prof: "Profiler", info: PhaseInfo, stream, waits: bool = False):
        self.prof = prof
        self.info = info
        self.stream = stream
        self.a = self.b = None
        self.h0 = self.h1 = 0
        self.nvtx = False
        self.waits = waits
        self.rf = None

    def __enter__(self):
        self.prof._open(self)
        return self

    def __exit__(self, *exc):
        self.prof._close(self)
        return False


class _Step:
    __slots__ = ("step", "epoch", "epoch_host_ns", "phases", "ends", "end_host_ns", "ready", "cursor", "epoch_us",
                 "end_us")

    def __init__(self, step: int):
        self.step = step
        self.epoch = None
        self.epoch_host_ns = 0
        self.phases: List[_Phase] = []
        self.ends: List[Any] = []
        self.end_host_ns = 0
        self.ready = False   # its end events are done and epoch_us is known
        self.cursor = 0      # phases formatted so far
        self.epoch_us = 0.0
        self.end_us = 0.0


class _StepContext:
    __slots__ = ("prof", "step")

    def __init__(self, prof: "Profiler", step: int):
        self.prof = prof
        self.step = step

    def __enter__(self):
        self.prof.begin_step(self.step)
        return self.prof

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.prof.end_step()
        else:
            self.prof._abandon_step()
        return False


def _parse_start_time(s: str) -> int:
    """run.json's start_time ("2026-11-22T10:00:00Z") as ns since the Unix epoch."""
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) * 1_000_000_000


def _dist():
    if torch is None:
        return None
    d = getattr(torch, "distributed", None)
    if d is not None and d.is_available() and d.is_initialized():
        return d
    return None


class Profiler:
    """A sampled profiler writing one run directory (docs/python.md).

    out_dir: the run directory (refused when it exists and is not empty, unless overwrite=True).
    rank, world_size: default from torch.distributed when it is initialised, else 0 and 1.
    sampling: SamplingConfig (start_step, end_step, record_every_n_steps, flush_every_n_steps, ranks,
    granularity), with the meaning of the scenario keys run.profiler.*.
    scenario: {"name", "path", "hash"} of what runs (free text for a loop without a scenario).
    creator: whether this process creates the directory and run.json (default: rank 0). With
    torch.distributed initialised rank 0 creates it and broadcasts its start time (or its error) to
    the others; without it the others wait for run.json.
    nvtx: "sampled", "all" or "off". use_cuda: default torch.cuda.is_available().
    annotate: on recorded steps, also open a torch.profiler record_function range around each step
    and phase, named so that `python3 -m threewalls.importers kineto` rebuilds the records from a
    PyTorch profiler trace (records.annotation_name); off by default (a few microseconds a phase).
    stamps: "shadow" (default: timing events on a timer stream that waits for a marker on the timed
    stream) or "stream" (timing events on the timed stream). hooks: "recorded" (default: module hooks
    on their modules during recorded steps only) or "always" (from the first recorded step on). The
    non-defaults exist to measure what the defaults save (threewalls.bench.overhead's variants).
    Not thread-safe, except that phases may be opened and closed from autograd's backward threads
    while the thread that drives the steps waits in backward().
    """

    def __init__(self, out_dir: str, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                 sampling: Optional[SamplingConfig] = None, scenario: Optional[Dict[str, str]] = None,
                 device: Optional[str] = None, argv: Optional[Sequence[str]] = None, seed: int = 0,
                 settings: Optional[Dict[str, Any]] = None, rank_classes: Optional[List[Dict[str, Any]]] = None,
                 creator: Optional[bool] = None, overwrite: bool = False, nvtx: str = "sampled",
                 use_cuda: Optional[bool] = None, source: str = "real", git_sha: str = "unknown",
                 join_timeout_s: float = 120.0, annotate: bool = False, stamps: str = "shadow",
                 hooks: str = "recorded"):
        d = _dist()
        if rank is None:
            rank = d.get_rank() if d else 0
        if world_size is None:
            world_size = d.get_world_size() if d else 1
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.policy = SamplingPolicy(sampling, self.world_size)
        if nvtx not in ("sampled", "all", "off"):
            raise InputError(f"profiler nvtx {nvtx!r}; allowed: sampled, all, off")
        if use_cuda is None:
            use_cuda = torch is not None and torch.cuda.is_available()
        if use_cuda and (torch is None or not torch.cuda.is_available()):
            raise InputError("profiler use_cuda=True, but torch.cuda is not available")
        self.cuda = bool(use_cuda)
        if stamps not in ("shadow", "stream"):
            raise InputError(f"profiler stamps {stamps!r}; allowed: shadow, stream")
        self._shadow = stamps == "shadow"
        self._timers: Dict[int, tuple] = {}
        self._driver = None  # the CUDA driver's events (cuda_driver), once checked below
        self._hooks: List[Any] = []  # module hook sets, installed on recorded steps only
        self._hooks_on = False
        if hooks not in ("recorded", "always"):
            raise InputError(f"profiler hooks {hooks!r}; allowed: recorded, always")
        self._lazy_hooks = hooks == "recorded"
        self._nvtx_rec = self.cuda and nvtx != "off"
        self._nvtx_all = self.cuda and nvtx == "all"
        self._annotate = bool(annotate) and torch is not None
        self._step_rf = None
        self.out_dir = str(out_dir)
        self._names: Dict[str, str] = {}
        self._kw_infos: Dict[tuple, PhaseInfo] = {}
        self._drain_lock = threading.Lock()
        self._stream_names: Dict[int, str] = {}
        # Warned once, at the first record on a stream other than the main one (one_queue_warning).
        self._queue_warning = one_queue_warning(os.environ) if self.cuda else None
        self._pool: List[Any] = []
        self._streams: Dict[tuple, Any] = {}
        # PyTorch's raw current-stream query (an integer handle) where it has one.
        cuda_c = torch._C if torch is not None else None
        self._raw_stream = getattr(cuda_c, "_cuda_getCurrentRawStream", None)
        self._get_device = getattr(cuda_c, "_cuda_getDevice", None)
        if self._get_device is None:
            self._raw_stream = None
        self._pending: deque = deque()
        self._cur: Optional[_Step] = None
        self._rec = False
        self._step_no: Optional[int] = None
        self._last_step: Optional[int] = None
        self._anchor = None
        self._anchor_host_ns = 0
        self._last_event = None  # the event recorded last on this step (None on unrecorded steps)
        self._reads = False  # the loop has host reads that wait for the device: records are formatted there
        self._finished = False
        self._creator = False
        self._join_timeout_s = join_timeout_s
        self.header: Dict[str, Any] = {}
        self.writer: Optional[RunDirWriter] = None
        if not self.policy.enabled:
            return
        multi = d is not None and self.world_size > 1
        if multi:
            if creator not in (None, self.rank == 0):
                raise InputError("profiler creator: with torch.distributed initialised, rank 0 creates the run "
                                 "directory (leave creator unset)")
            creator = self.rank == 0
        elif creator is None:
            creator = self.rank == 0
        self._creator = bool(creator)
        if device is None:
            device = torch.cuda.get_device_name() if self.cuda else "host CPU"
        tool = f"{__version__} (python {sys.version.split()[0]}" + (f", torch {torch.__version__})" if torch else ")")
        header = rec.make_header(source=source, world_size=self.world_size, tool_version=tool, git_sha=git_sha,
                                 scenario=scenario, device=device, argv=list(argv if argv is not None else sys.argv),
                                 seed=seed, settings=settings, rank_classes=rank_classes)
        if creator:
            error = None
            try:
                self.writer = RunDirWriter(self.out_dir, header, self.policy, mode="create", overwrite=overwrite,
                                           local_ranks=[self.rank])
            except Exception as e:  # every rank learns of it, none waits forever
                error = e
            if multi:
                d.broadcast_object_list([header["start_time"], None if error is None else str(error)], src=0)
            if error is not None:
                raise error
        else:
            if multi:
                box = [None, None]
                d.broadcast_object_list(box, src=0)
                if box[1] is not None:
                    raise InputError(f"profiler: rank 0 could not create the run directory: {box[1]}")
                header["start_time"] = box[0]
            else:
                header["start_time"] = self._wait_for_run_json(join_timeout_s)
            self.writer = RunDirWriter(self.out_dir, header, self.policy, mode="join", overwrite=overwrite,
                                       local_ranks=[self.rank])
        self.header = self.writer.header
        self._t0_ns = _parse_start_time(self.header["start_time"])
        self._records_rank = self.policy.records_rank(self.rank)
        if self.cuda:
            self._main_stream = torch.cuda.current_stream()
            self._stream_names[self._main_stream.cuda_stream] = "compute"
            self._driver = cuda_driver.working(self._main_stream.cuda_stream)

    # ---- names ----

    def _json(self, name: str) -> str:
        j = self._names.get(name)
        if j is None:
            j = self._names[name] = rec.json_string(name)
        return j

    def name_stream(self, stream, name: str) -> None:
        """The name records of phases on `stream` carry ("compute", "expert_1", "dp_comm", ...). The
        stream current when the profiler was made is "compute"; an unnamed one is "stream_<n>"."""
        if self.cuda:
            self._stream_names[stream.cuda_stream] = name

    def _stream_json(self, stream) -> str:
        if stream is None:
            return self._json("host")
        key = stream.cuda_stream
        if self._queue_warning is not None and stream != self._main_stream:
            warnings.warn(self._queue_warning, RuntimeWarning, stacklevel=2)
            self._queue_warning = None
        name = self._stream_names.get(key)
        if name is None:
            name = self._stream_names[key] = f"stream_{len(self._stream_names)}"
        return self._json(name)

    # ---- events ----

    def _current_stream(self):
        """torch.cuda.current_stream(), without building a Stream object per call: the Stream of
        each (device, raw stream handle) is made once (PyTorch's streams come from fixed pools, so
        the cache stays small; it is emptied if it passes 1,024 entries)."""
        if self._raw_stream is None:
            return torch.cuda.current_stream()
        dev = self._get_device()
        key = (dev, self._raw_stream(dev))
        st = self._streams.get(key)
        if st is None:
            if len(self._streams) >= 1024:
                self._streams.clear()
            st = self._streams[key] = torch.cuda.current_stream()
        return st

    def _event(self):
        """A timing event from the pool, else a new one (the driver's where it is in use)."""
        if self._pool:
            return self._pool.pop()
        if self._driver is not None:
            return self._driver.event()
        return torch.cuda.Event(enable_timing=True)

    def _stamp(self, stream):
        """A timing event that completes when `stream` reaches this point of its queue.

        With stamps="shadow" (the default) the stream gets a marker event without timing, and the
        device's timer stream, which runs nothing else, waits for the marker and records the timing
        event: the stamp is taken once the work queued before the marker is done, as a timing event on
        the stream would be, without the timed stream's next kernel waiting for the stamp to be
        written. One marker per device serves every stamp: a wait takes the marker's state when it is
        enqueued, and recording the marker again does not move it. The events and calls are the CUDA
        driver's where it works (cuda_driver, checked when the profiler starts), PyTorch's otherwise.
        stamps="stream" records the timing event on the stream itself."""
        t = self._event()
        drv = self._driver
        if not self._shadow:
            if drv is None:
                _record(t, stream)
            elif not drv.record(t.h, stream.cuda_stream):
                raise cuda_driver.DriverError(f"profiler: cuEventRecord on stream {stream} failed")
            return t
        dev = stream.device_index
        timer = self._timers.get(dev)
        if timer is None:
            with torch.cuda.device(dev):
                marker = drv.event(timing=False) if drv is not None else torch.cuda.Event()
                timer = self._timers[dev] = (torch.cuda.Stream(), marker)
        timer_stream, marker = timer
        if drv is None:
            _record(marker, stream)
            _wait(marker, timer_stream)
            _record(t, timer_stream)
        elif not drv.stamp(marker.h, stream.cuda_stream, timer_stream.cuda_stream, t.h):
            raise cuda_driver.DriverError(f"profiler: a stamp on stream {stream} failed (cuEventRecord or "
                                          f"cuStreamWaitEvent)")
        return t

    # ---- steps ----

    @property
    def recording(self) -> bool:
        """Whether the current step is recorded on this rank."""
        return self._rec

    @property
    def phases_off(self) -> bool:
        """Whether phase() and begin_phase() of a fine-grained phase are no-ops now: the current step
        is not recorded on this rank (or records only the coarse view) and nvtx is not "all". Code
        that instruments itself more than with phases (autograd functions, markers) runs plain
        then, and calls tick() where it would have opened a phase."""
        return not (self._rec and self.policy.records_phase(None)) and not self._nvtx_all

    def tick(self) -> None:
        """What a phase on an unrecorded step does besides nothing: formats two waiting records of
        finished steps while the device is busy (harvesting hides behind device time)."""
        if self._pending:  # the common case stays one test
            self._format_at_phase_start()

    def _format_at_phase_start(self) -> None:
        """At a phase's start: two waiting records if the device is busy, unless the loop has host reads
        that wait for the device (records are formatted there, where it costs nothing)."""
        if not self._reads and self._device_busy():
            self._drain(2)

    def _format_while_busy(self, e) -> None:
        """Formats waiting records one at a time until `e` (an event or a stream) is done: the host is
        about to wait for it anyway."""
        while self._pending and not e.query():
            if not self._drain(1):
                break

    def _device_busy(self) -> bool:
        """Whether the device is behind the host, so host work now costs no device time: it has not
        reached the last event this step recorded (on a step that recorded none: the main stream has
        queued work). Without CUDA there is nothing to hide behind: always true."""
        if not self.cuda:
            return True
        e = self._last_event
        if e is not None:
            return not e.query()
        return not self._main_stream.query()

    def step(self, step: int) -> _StepContext:
        """`with prof.step(k):` is begin_step(k) ... end_step()."""
        return _StepContext(self, step)

    def begin_step(self, step: int) -> None:
        if self._cur is not None or self._step_no is not None:
            raise RuntimeError(f"profiler: begin_step({step}) before end_step() of step {self._step_no}")
        if self._last_step is not None and step <= self._last_step:
            raise InputError(f"profiler: step {step} after step {self._last_step}; steps must increase")
        self._step_no = step
        if self._pending:
            self._catch_up()
        self._rec = self._records_rank and self.policy.records(step) if self.writer else False
        self._last_event = None
        if not self._rec:
            return
        if self._hooks and not self._hooks_on:
            self._hooks_on = True
            for h in self._hooks:
                h.install()
        s = _Step(step)
        if self.cuda:
            stream = self._current_stream()
            now = time.time_ns()
            if self._anchor is None or (now - self._anchor_host_ns > _REANCHOR_NS and stream.query()):
                if self._anchor is not None:
                    self._pool.append(self._anchor)
                self._anchor = self._stamp(stream)
                self._anchor_host_ns = time.time_ns()
            s.epoch = self._stamp(stream)
            self._last_event = s.epoch
            s.ends.append(stream)
        s.epoch_host_ns = time.time_ns()
        if self._annotate:
            self._step_rf = torch.autograd.profiler.record_function(rec.step_annotation_name(step))
            self._step_rf.__enter__()
        self._cur = s

    def end_step(self) -> None:
        if self._step_no is None:
            raise RuntimeError("profiler: end_step() without begin_step()")
        step = self._step_no
        s = self._cur
        if s is not None:
            if self.cuda:
                streams = {}
                for st in s.ends:
                    streams[st.cuda_stream] = st
                for p in s.phases:
                    if p.stream is not None:
                        streams.setdefault(p.stream.cuda_stream, p.stream)
                ends = []
                for st in streams.values():
                    ends.append(self._stamp(st))
                s.ends = ends
                self._last_event = None
            s.end_host_ns = time.time_ns()
            if self._step_rf is not None:
                self._step_rf.__exit__(None, None, None)
                self._step_rf = None
            self._pending.append(s)
        if self.writer is not None and self.policy.flush_after(step):
            self._pending.append(step)  # a flush point, reached once every earlier step is harvested
        self._cur = None
        self._rec = False
        self._step_no = None
        self._last_step = step
        if self._hooks_on and self._lazy_hooks:
            self._unhook()

    def _abandon_step(self) -> None:
        """The step's body raised: its records are dropped (the step did not finish)."""
        s = self._cur
        if s is not None and self.cuda:
            for p in s.phases:
                for e in (p.a, p.b):
                    if e is not None:
                        self._pool.append(e)
        self._cur = None
        self._rec = False
        self._step_no = None
        if self._hooks_on and self._lazy_hooks:
            self._unhook()

    # ---- phases ----

    def info(self, name: str, *, layer: Optional[int] = None, microbatch: Optional[int] = None,
             wall: str = "compute", bytes: float = 0.0, flops: float = 0.0, expert: Optional[int] = None,
             peer: Optional[int] = None, group: Optional[str] = None, group_id: Optional[int] = None,
             tokens: Optional[int] = None, coarse: Optional[str] = None, host: bool = False) -> PhaseInfo:
        """A phase description to pass to phase()/begin_phase() again and again (cheaper than keywords)."""
        return PhaseInfo(self, name, layer, microbatch, wall, bytes, flops, expert, peer, group, group_id, tokens,
                         coarse, host)

    def _info_kw(self, name: str, kw: Dict[str, Any]) -> PhaseInfo:
        """PhaseInfo of a phase given by keywords, made once per distinct (name, keywords)."""
        key = (name, *sorted(kw.items()))
        info = self._kw_infos.get(key)
        if info is None:
            info = self._kw_infos[key] = self.info(name, **kw)
        return info

    def _skip(self, name):
        """Formats two waiting records if the device is busy (and the loop has no host reads that wait
        for it, where formatting costs nothing); then the context manager of a phase on an unrecorded
        step (a no-op, or an NVTX range with nvtx="all"), or None when the step is recorded."""
        if self._pending:  # the common case stays one test
            self._format_at_phase_start()
        if self._rec:
            return None
        if self._nvtx_all:
            return _NvtxOnly(name if isinstance(name, str) else name.name)
        return _NULL

    def phase(self, name, *, stream=None, **kw):
        """Context manager timing a phase on the device (CUDA events on `stream`, default the current
        stream). `name` is a phase name or a PhaseInfo. Keywords: layer, microbatch, wall ("compute",
        "memory", "communication", "host"), bytes, flops, expert, peer, group, group_id, tokens,
        coarse ("host_to_device", "training_metrics")."""
        skip = self._skip(name)
        if skip is not None:
            return skip
        info = name if isinstance(name, PhaseInfo) else self._info_kw(name, kw)
        if not self.policy.records_phase(info.coarse):
            return _NULL
        return _Phase(self, info, stream)

    def host_phase(self, name, *, waits_for_device: bool = False, **kw):
        """Context manager timing host work on the host clock (wall "host" unless given). With
        waits_for_device, for a host op that waits for the device work queued before it (a GPU->CPU
        read such as .item()): on recorded steps an event on the current stream marks where the
        device reaches the phase, and the record starts there (or at the host's entry, whichever is
        later), so it holds the op's own cost and the wait before it is a gap, as run_dir.md defines.
        The profiler adds no synchronisation; it formats waiting records until the device gets there,
        on every step, and once a loop has such reads it formats records only there (and where they
        are overdue), not at phase starts, where the device may be waiting for the host."""
        waits = waits_for_device and self.cuda
        if waits:
            self._reads = True
        skip = self._skip(name)
        if skip is not None:
            if waits and self._pending:
                self._format_while_busy(self._current_stream())
            return skip
        if isinstance(name, PhaseInfo):
            info = name
        else:
            kw.setdefault("wall", "host")
            kw["host"] = True
            info = self._info_kw(name, kw)
        if not self.policy.records_phase(info.coarse):
            return _NULL
        return _Phase(self, info, None, waits_for_device)

    def begin_phase(self, info: PhaseInfo, stream=None) -> Optional[_Phase]:
        """Starts a phase outside a `with` block (autograd hooks); returns a token for end_phase, or
        None on an unrecorded step."""
        if self._pending:  # the common case stays one test
            self._format_at_phase_start()
        if not self._rec or not self.policy.records_phase(info.coarse):
            return None
        p = _Phase(self, info, stream)
        self._open(p)
        return p

    def end_phase(self, token: Optional[_Phase]) -> None:
        if token is not None:
            self._close(token)

    def _open(self, p: _Phase) -> None:
        info = p.info
        if self._nvtx_rec:
            torch.cuda.nvtx.range_push(info.name)
            p.nvtx = True
        if info.annotation is not None:
            p.rf = torch.autograd.profiler.record_function(info.annotation)
            p.rf.__enter__()
        if info.host or not self.cuda:
            p.stream = None  # timed on the host clock
            if p.waits and self.cuda:
                p.a = a = self._stamp(self._current_stream())
                self._last_event = a
                self._format_while_busy(a)
            p.h0 = time.time_ns()
            return
        if p.stream is None:
            p.stream = self._current_stream()
        p.a = self._stamp(p.stream)
        self._last_event = p.a

    def _close(self, p: _Phase) -> None:
        if p.stream is not None:
            p.b = self._stamp(p.stream)
            self._last_event = p.b
        else:
            p.h1 = time.time_ns()
        if p.rf is not None:
            p.rf.__exit__(None, None, None)
            p.rf = None
        if p.nvtx:
            torch.cuda.nvtx.range_pop()
        s = self._cur
        if s is None:
            raise RuntimeError(f"profiler: phase {p.info.name!r} ended outside a step")
        s.phases.append(p)

    # ---- module hooks ----

    def hook_module(self, module, name: str, *, layer: Optional[int] = None, backward: bool = True,
                    fwd_name: Optional[str] = None, bwd_name: Optional[str] = None, **kw) -> List[Any]:
        """Times `module`'s forward as phase `<name>_fwd` and, with backward=True, its backward as
        `<name>_bwd` (autograd: from the gradient reaching the module's outputs to the gradient of its
        inputs; needs an input that requires grad). Keywords as for phase(); `microbatch` may also be
        a callable returning the current micro-batch, for a module that runs once per micro-batch.
        Returns the hook handles (call .remove() on each to undo)."""
        from threewalls.profiler.hooks import hook_module
        return hook_module(self, module, fwd_name or f"{name}_fwd", bwd_name or f"{name}_bwd", layer, backward, kw)

    def _add_hooks(self, hooks) -> None:
        self._hooks.append(hooks)
        if self._hooks_on:
            hooks.install()

    def _drop_hooks(self, hooks) -> None:
        if hooks in self._hooks:
            self._hooks.remove(hooks)

    def _unhook(self) -> None:
        """Removes the module hooks from their modules until the next recorded step."""
        self._hooks_on = False
        for h in self._hooks:
            h.uninstall()

    # ---- harvest ----

    def _host_us(self, ns: int) -> float:
        return (ns - self._t0_ns) / 1000.0

    def _catch_up(self) -> None:
        """At a step's start, busy device or not: format what is ready of the steps before the last
        recorded one and of every step before a flush point reached (so at most about one step's
        records wait, and a flush window reaches the disk during the next step)."""
        if self._overdue():
            self._drain(1 << 30, overdue_only=True)

    def _overdue(self) -> bool:
        """Whether the oldest waiting item is overdue: a flush point, or a step followed by a flush
        point or by another recorded step."""
        steps = 0
        for x in self._pending:
            if isinstance(x, int):
                return True
            steps += 1
            if steps > 1:
                return True
        return False

    def _drain(self, budget: int, block: bool = False, overdue_only: bool = False) -> int:
        """Formats up to `budget` phase records of finished steps, oldest first, and writes out flush
        points reached; returns how many records and flush points it handled. Never waits unless
        `block`: a step still running on the device stays. Called a few records at a time where the
        device is busy, so that the formatting happens while the device works."""
        if not self._drain_lock.acquire(blocking=False):
            return 0  # another thread is draining (autograd's backward thread while the loop waits)
        done = 0
        try:
            pend = self._pending
            while pend and budget > 0:
                if overdue_only and not self._overdue():
                    break
                head = pend[0]
                if isinstance(head, int):
                    pend.popleft()
                    self.writer.end_step(head)
                    done += 1
                    continue
                if not head.ready:
                    if self.cuda:
                        if block:
                            for e in head.ends:
                                e.synchronize()
                        else:
                            for e in head.ends:
                                if not e.query():
                                    return done
                    self._begin_emit(head)
                n = self._emit_some(head, budget)
                budget -= n
                done += n
                if head.cursor == len(head.phases):
                    self.writer.add_step(head.step, self.rank, head.epoch_us, head.end_us)
                    pend.popleft()
                    done += 1
        finally:
            self._drain_lock.release()
        return done

    def _begin_emit(self, s: _Step) -> None:
        if self.cuda:
            epoch = s.epoch
            s.epoch_us = self._host_us(self._anchor_host_ns) + self._anchor.elapsed_time(epoch) * 1000.0
            # The epoch becomes the anchor: elapsed times stay short.
            if self._anchor is not epoch:
                self._pool.append(self._anchor)
            self._anchor = epoch
            self._anchor_host_ns = self._t0_ns + int(s.epoch_us * 1000.0)
            end_us = 0.0
            for e in s.ends:
                end_us = max(end_us, epoch.elapsed_time(e) * 1000.0)
                self._pool.append(e)
            s.end_us = end_us
        else:
            s.epoch_us = self._host_us(s.epoch_host_ns)
            s.end_us = (s.end_host_ns - s.epoch_host_ns) / 1000.0
        s.ready = True

    def _emit_some(self, s: _Step, budget: int) -> int:
        """Formats up to `budget` of s's phases (from its cursor); returns how many."""
        i = s.cursor
        stop = min(len(s.phases), i + budget)
        if stop == i:
            return 0
        epoch = s.epoch
        epoch_us = s.epoch_us
        end_us = s.end_us
        step, rank = s.step, self.rank
        line = rec.phase_line_from
        lines = []
        pool = self._pool
        for p in s.phases[i:stop]:
            info = p.info
            if p.b is not None:
                start = epoch.elapsed_time(p.a) * 1000.0
                dur = p.a.elapsed_time(p.b) * 1000.0
                pool.append(p.a)
                pool.append(p.b)
                sj = self._stream_json(p.stream)
            else:
                start = self._host_us(p.h0) - epoch_us
                end = self._host_us(p.h1) - epoch_us
                if p.a is not None:  # waits for the device: starts no earlier than the device got there
                    start = max(start, epoch.elapsed_time(p.a) * 1000.0)
                    pool.append(p.a)
                if start < 0.0:  # began before the device reached the epoch (the host ran ahead)
                    start = 0.0
                dur = end - start
                sj = self._json("host") if (info.host or not self.cuda) else self._stream_json(p.stream)
                if not self.cuda and not info.host:
                    sj = self._json("compute")
            if dur < 0.0:
                dur = 0.0
            if start + dur > end_us:
                end_us = start + dur
            lines.append(line(step, rank, info.prefix, sj, start, dur, info.suffix))
        s.end_us = end_us
        s.cursor = stop
        self.writer.add_phase_lines(s.step, self.rank, lines)
        return stop - i

    # ---- the end ----

    def finish(self, *, model_flops_per_step: Optional[float] = None, tokens_per_step: Optional[float] = None,
               gpu: Optional[str] = None, gpu_peak_flops: Optional[float] = None,
               gpu_memory_bytes: Optional[int] = None, summary: bool = True,
               step_inputs: Optional[Dict[int, Dict[str, float]]] = None,
               model_flops_from_records: bool = False) -> None:
        """Waits for the recorded steps, writes the footers and (on the creating rank, after every rank
        has finished) summary.json with the measured peak memory of every rank. Collective when
        torch.distributed is initialised: every rank calls it."""
        if self._finished:
            return
        self._finished = True
        if self._step_no is not None:
            raise RuntimeError(f"profiler: finish() inside step {self._step_no} (call end_step() first)")
        if self.writer is None:
            return
        self._drain(1 << 30, block=True)
        self.writer.close()
        peak = {}
        if self.cuda:
            peak[self.rank] = int(torch.cuda.max_memory_allocated())
        d = _dist()
        if d is not None and self.world_size > 1:
            gathered: List[Any] = [None] * self.world_size
            d.all_gather_object(gathered, peak)  # also: every rank has closed its files
            peak = {}
            for g in gathered:
                peak.update(g)
        if not summary or not self._creator:
            return
        if d is None and self.world_size > 1:
            self._wait_for_footers(self._join_timeout_s)
        if gpu is None:
            gpu = _gpu_kind(self.header.get("device", ""))
        if gpu_memory_bytes is None and self.cuda:
            gpu_memory_bytes = int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        self.writer.write_summary(build_summary(
            self.out_dir, model_flops_per_step=model_flops_per_step, tokens_per_step=tokens_per_step, gpu=gpu,
            gpu_peak_flops=gpu_peak_flops, measured_peak_bytes_by_rank=peak, gpu_memory_bytes=gpu_memory_bytes,
            step_inputs=step_inputs, model_flops_from_records=model_flops_from_records))

    def abandon(self) -> None:
        """Writes what was harvested so far without footers (the loop died): readers report the run
        as cut short. Steps still running on the device are dropped."""
        if self._finished:
            return
        self._finished = True
        if self.writer is not None:
            self._drain(1 << 30)
            self.writer.abandon()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish()
        else:
            self.abandon()
        return False

    def _wait_for_footers(self, timeout_s: float) -> None:
        """Without torch.distributed: wait until every recording rank's file ends with its footer."""
        deadline = time.monotonic() + timeout_s
        for r in self.policy.recording_ranks:
            path = os.path.join(self.out_dir, f"phases_rank_{r}.jsonl")
            while True:
                try:
                    with open(path, "rb") as f:
                        f.seek(0, os.SEEK_END)
                        f.seek(max(0, f.tell() - 4096))
                        if b'"record":"footer"' in f.read().rstrip(b"\n").split(b"\n")[-1]:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise InputError(f"{path}: rank {r} did not finish within {timeout_s} s; summary.json not "
                                     "written")
                time.sleep(0.05)

    def _wait_for_run_json(self, timeout_s: float) -> str:
        import json
        path = os.path.join(self.out_dir, "run.json")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with open(path, encoding="utf-8") as f:
                    return json.load(f)["start_time"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        raise InputError(f"{path}: not written by the creating rank within {timeout_s} s (creator=True on "
                         "one process, or initialise torch.distributed)")


def _gpu_kind(device: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100", as summary.json's gpu field names the GPU kind."""
    d = device.lower()
    for kind in ("h200", "h100", "b200", "a100"):
        if kind in d:
            return kind
    return d

