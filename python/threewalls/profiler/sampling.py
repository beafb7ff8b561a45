"""Which steps and ranks the profiler records, and when it writes to disk.

The knobs and their meaning are those of the C++ profiler's SamplingConfig/SamplingPolicy
(profiler/include/threewalls/profiler/sampling.hpp) and of the scenario keys run.profiler.*:
the same arithmetic, the same validation, the same error messages, the same JSON written into the
run header's settings.profiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from threewalls.errors import InputError

GRANULARITIES = ("layer", "coarse")


@dataclass
class SamplingConfig:
    enabled: bool = True           # False: no files at all, nothing recorded
    start_step: int = 0            # first step that may be recorded (0 = first measured step)
    end_step: int = -1             # last step that may be recorded, inclusive; -1 = no end
    record_every_n_steps: int = 10  # record steps start_step, start_step + n, ...
    flush_every_n_steps: int = 10  # write buffered records after every n-th step counted from start_step
    ranks: List[int] = field(default_factory=list)  # recording ranks; empty = every rank
    granularity: str = "layer"     # "layer": every phase; "coarse": only phases of the coarse view


class SamplingPolicy:
    """Pure arithmetic on step and rank numbers, cheap enough for a training loop's hot path."""

    def __init__(self, config: Optional[SamplingConfig], world_size: int):
        config = config if config is not None else SamplingConfig()
        self.config = config
        self.world_size = world_size

        def bad(knob: str, what: str) -> InputError:
            return InputError(f"profiler.{knob}: {what}")

        if not isinstance(world_size, int) or world_size <= 0:
            raise bad("ranks", f"world size must be positive, not {world_size}")
        for knob in ("start_step", "end_step", "record_every_n_steps", "flush_every_n_steps"):
            v = getattr(config, knob)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(knob, f"{v!r} is not an integer")
        if config.start_step < 0:
            raise bad("start_step", f"{config.start_step} is negative; allowed: 0 or more")
        if config.end_step < -1:
            raise bad("end_step", f"{config.end_step} is not allowed; allowed: -1 (no end) or a step >= start_step")
        if config.end_step >= 0 and config.end_step < config.start_step:
            raise bad("end_step", f"{config.end_step} is before start_step {config.start_step}; "
                                  "allowed: -1 or a step >= start_step")
        if config.record_every_n_steps < 1:
            raise bad("record_every_n_steps", f"{config.record_every_n_steps}; allowed: 1 or more")
        if config.flush_every_n_steps < 1:
            raise bad("flush_every_n_steps", f"{config.flush_every_n_steps}; allowed: 1 or more")
        if config.granularity not in GRANULARITIES:
            raise bad("granularity", f"{config.granularity!r}; allowed: {', '.join(GRANULARITIES)}")
        mask = [False] * world_size
        ranks: List[int] = []
        if not config.ranks:
            ranks = list(range(world_size))
            mask = [True] * world_size
        else:
            for r in config.ranks:
                if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r >= world_size:
                    raise bad("ranks", f"rank {r} is outside the world; allowed: 0..{world_size - 1}")
                if mask[r]:
                    raise bad("ranks", f"rank {r} is listed twice")
                mask[r] = True
                ranks.append(r)
            ranks.sort()
        if not config.enabled:
            ranks = []
            mask = [False] * world_size
        self._ranks = ranks
        self._mask = mask
        # Hot-path copies of the knobs.
        self._enabled = bool(config.enabled)
        self._start = config.start_step
        self._end = config.end_step
        self._every = config.record_every_n_steps
        self._flush = config.flush_every_n_steps
        self._layer = config.granularity == "layer"

    @property
    def enabled(self) -> bool:
        return self._enabled

    def records(self, step: int) -> bool:
        """Whether step `step` is recorded: enabled, start_step <= step <= end_step (when end_step >= 0)
        and (step - start_step) % record_every_n_steps == 0."""
        if not self._enabled or step < self._start:
            return False
        if self._end >= 0 and step > self._end:
            return False
        return (step - self._start) % self._every == 0

    def records_rank(self, rank: int) -> bool:
        return self._enabled and 0 <= rank < len(self._mask) and self._mask[rank]

    def records_phase(self, coarse: Optional[str]) -> bool:
        """Whether a phase of coarse-view membership `coarse` (None, "host_to_device",
        "training_metrics") is recorded at this granularity."""
        return self._layer or coarse is not None

    def flush_after(self, step: int) -> bool:
        """Whether buffered records are written out after step `step`: enabled, step >= start_step and
        (step - start_step + 1) % flush_every_n_steps == 0, or step == end_step."""
        if not self._enabled or step < self._start:
            return False
        if step == self._end:
            return True
        return (step - self._start + 1) % self._flush == 0

    @property
    def recording_ranks(self) -> List[int]:
        return list(self._ranks)

    def to_json(self) -> dict:
        """The effective knobs as written into the run header's settings.profiler."""
        c = self.config
        return {
            "enabled": bool(c.enabled),
            "start_step": c.start_step,
            "end_step": c.end_step,
            "record_every_n_steps": c.record_every_n_steps,
            "flush_every_n_steps": c.flush_every_n_steps,
            "recorded_ranks": len(self._ranks),
            "granularity": c.granularity,
        }


def resolve_ranks(value, world_size: int, representatives: Optional[Sequence[int]] = None) -> List[int]:
    """The scenario key run.profiler.ranks ("auto", "all", "representatives" or a list) as a rank list
    (empty = every rank). `representatives` is one rank per rank class, when the caller knows them.
    "auto" is every rank: the PyTorch runner runs one host's GPUs, whose run directory stays far within
    the 1 GiB past which the C++ tools record representatives instead."""
    if value in ("auto", "all"):
        return []
    if value == "representatives":
        if representatives is None:
            raise InputError("profiler.ranks: \"representatives\" needs the rank classes; allowed here: "
                             "\"all\" or a list of ranks")
        return sorted(set(representatives))
    if isinstance(value, list):
        return list(value)
    raise InputError(f"profiler.ranks: {value!r}; allowed: \"auto\", \"all\", \"representatives\" or an array of ranks")
