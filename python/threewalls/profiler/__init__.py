"""The threewalls profiler for PyTorch programs (docs/python.md).

    from threewalls.profiler import Profiler, SamplingConfig
"""
from threewalls.profiler.profiler import PhaseInfo, Profiler
from threewalls.profiler.sampling import SamplingConfig, SamplingPolicy
from threewalls.profiler.summary import build_summary, read_records
from threewalls.profiler.writer import RunDirWriter

__all__ = ["Profiler", "PhaseInfo", "SamplingConfig", "SamplingPolicy", "RunDirWriter", "build_summary",
           "read_records"]
