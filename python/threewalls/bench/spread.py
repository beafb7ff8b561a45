"""The spread every benchmark here reports: p10, median and p90 of its per-repeat figures."""
from __future__ import annotations

import statistics
from typing import Sequence, Tuple


def p10_median_p90(samples: Sequence[float]) -> Tuple[float, float, float]:
    """p10, median and p90 of `samples` (at least one). The deciles interpolate between samples and
    never leave [min, max] (statistics' "inclusive" method): a few repeats of a figure floored at a
    positive value never give a p10 at or below zero, as the default ("exclusive") extrapolation can."""
    s = sorted(samples)
    if not s:
        raise ValueError("p10_median_p90: no samples")
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return q[0], statistics.median(s), q[-1]
