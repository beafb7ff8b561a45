"""Writing an imported run: one RunDirWriter, every step and rank recorded, summary.json at the end."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

from threewalls import __version__
from threewalls.errors import InputError
from threewalls.profiler import records as rec
from threewalls.profiler.sampling import SamplingConfig, SamplingPolicy
from threewalls.profiler.summary import build_summary
from threewalls.profiler.writer import RunDirWriter, check_phase_fields
from threewalls.runner.scenario import identity


def scenario_of(path: Optional[str], name: Optional[str]) -> Dict[str, Any]:
    """The run header's scenario (name, path, hash) and its world size: from the scenario file the run
    executed (so `compare` lines it up with `threewalls sim` of that file), else a bare name."""
    if path:
        ident = identity(path)
        if name:
            ident["name"] = name
        return ident
    return {"name": name or "imported", "path": "", "hash": "", "world_size": None}


class ImportedRun:
    """Collects steps and phase records of an imported run, then writes the directory in step order."""

    def __init__(self, kind: str, source_files: List[str], world_size: int, scenario: Dict[str, Any],
                 device: str, settings: Dict[str, Any]):
        if world_size < 1:
            raise InputError(f"world size {world_size}; allowed: 1 or more")
        self.kind = kind
        self.world_size = world_size
        self.scenario = {k: scenario.get(k) or "" for k in ("name", "path", "hash")}
        self.device = device
        self.settings = dict(settings)
        self.settings["import"] = dict(self.settings.get("import", {}), format=kind, files=list(source_files))
        self.steps: Dict[tuple, tuple] = {}     # (step, rank) -> (epoch_us, dur_us)
        self.phases: Dict[tuple, List[Dict[str, Any]]] = {}  # (step, rank) -> phase fields
        self.peak_bytes: Dict[int, int] = {}
        self.tokens_per_step: Optional[float] = None

    def add_step(self, step: int, rank: int, epoch_us: float, dur_us: float) -> None:
        if (step, rank) in self.steps:
            raise InputError(f"step {step} of rank {rank} imported twice")
        self.steps[(step, rank)] = (epoch_us, dur_us)

    def add_phase(self, step: int, rank: int, **fields: Any) -> None:
        check_phase_fields(fields["wall"], fields.get("group"), fields.get("coarse"))
        self.phases.setdefault((step, rank), []).append(fields)

    def write(self, out_dir: str, overwrite: bool, argv: Optional[List[str]] = None) -> Dict[str, Any]:
        if not self.steps:
            raise InputError(f"{', '.join(self.settings['import']['files'])}: no step found to import")
        ranks = sorted({r for _, r in self.steps})
        policy = SamplingPolicy(SamplingConfig(record_every_n_steps=1, flush_every_n_steps=1 << 30, ranks=ranks),
                                self.world_size)
        header = rec.make_header(source="real", world_size=self.world_size,
                                 tool_version=f"{__version__} (python {sys.version.split()[0]}; import {self.kind})",
                                 scenario=self.scenario, device=self.device,
                                 argv=list(argv if argv is not None else sys.argv), settings=self.settings,
                                 rank_classes=[{"id": 0, "label": "all ranks", "ranks": list(range(self.world_size)),
                                                "pp_stage": 0}])
        w = RunDirWriter(out_dir, header, policy, overwrite=overwrite)
        try:
            for step in sorted({s for s, _ in self.steps}):
                for rank in ranks:
                    if (step, rank) not in self.steps:
                        continue
                    epoch, dur = self.steps[(step, rank)]
                    w.add_step(step, rank, epoch, dur)
                    for p in sorted(self.phases.get((step, rank), []), key=lambda p: p["start_us"]):
                        w.add_phase(step=step, rank=rank, **p)
                w.end_step(step)
            w.close()
        except BaseException:
            w.abandon()
            raise
        summary = build_summary(out_dir, measured_peak_bytes_by_rank=self.peak_bytes or None,
                                tokens_per_step=self.tokens_per_step)
        w.write_summary(summary)
        return summary
