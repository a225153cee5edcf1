"""The timing loop the benchmarks share: wall-clock seconds of repeated runs, medians for comparisons."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def run_times(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> list[float]:
    """Seconds of `repeats` runs of `fn`, after one untimed run unless `warmup` is False (for work whose
    second run would be a cache lookup, such as a compile)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn: Callable[[], Any], repeats: int, warmup: bool = True) -> float:
    return statistics.median(run_times(fn, repeats, warmup))
