"""Sessions timed interleaved, whatever their runtime: round after round every session
runs once on the same feed, in an order rotated each round, after untimed warm-up rounds,
so load from other processes falls on every model alike. Each run's wall time and the
calling thread's CPU time are recorded (with one thread both onnxruntime and OpenVINO
compute on the calling thread, so that CPU time is the run's whole cost).

The one timing loop of the ONNX plugins: ``latency`` (evaluate, profile, quantize's
speed check) and ``auto_quantize``'s timing summarise what it measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import Session


@dataclass
class Times:
    """Milliseconds per session name: ``wall`` and ``cpu`` (calling thread), one entry
    per timed round."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)


def interleaved(sessions: Mapping[str, Session], feed: Mapping[str, Any], rounds: int,
                warmup: int = 3, progress: Callable[[int, int], None] | None = None
                ) -> Times:
    """Time ``sessions`` on ``feed`` for ``warmup + rounds`` interleaved rounds (the
    first ``warmup`` untimed). ``progress(done, total)`` is told the runs made so far
    (warm-up rounds included), after each run, outside the timed span."""
    names = list(sessions)
    times = Times({n: [] for n in names}, {n: [] for n in names})
    total, done = (warmup + rounds) * len(names), 0
    for r in range(warmup + rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            sessions[name].run(None, dict(feed))
            t1 = time.perf_counter()
            c1 = time.thread_time()
            if r >= warmup:
                times.wall[name].append((t1 - t0) * 1000.0)
                times.cpu[name].append((c1 - c0) * 1000.0)
            done += 1
            if progress is not None:
                progress(done, total)
    return times


def fastest(times: Times, names: list[str], basis: str = "cpu") -> str:
    """Of ``names``, the one with the lowest median time on ``basis`` ("cpu": one
    thread; "wall" otherwise); ties go to the first."""
    import statistics

    series = times.cpu if basis == "cpu" else times.wall
    return min(names, key=lambda n: (statistics.median(series[n]), names.index(n)))
