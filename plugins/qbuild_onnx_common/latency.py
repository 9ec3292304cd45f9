"""Timing onnxruntime sessions fairly: several sessions run in turn, round after round
(the order rotated each round), after untimed warm-up rounds, so load from other
processes hits every model alike; summarised as median, quartiles and spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

#: A measurement whose interquartile range exceeds this share of its median is "noisy".
NOISY_SPREAD = 0.10


def summary(times_ms: list[float]) -> dict[str, Any]:
    """Median, quartiles, minimum, run count and relative spread (IQR / median) of wall
    times in milliseconds; ``noisy`` when the spread exceeds ``NOISY_SPREAD``."""
    q = statistics.quantiles(times_ms, n=4) if len(times_ms) > 1 else [times_ms[0]] * 3
    med = statistics.median(times_ms)
    spread = (q[2] - q[0]) / med if med else 0.0
    return {"median_ms": round(med, 4), "q1_ms": round(q[0], 4), "q3_ms": round(q[2], 4),
            "min_ms": round(min(times_ms), 4), "runs": len(times_ms),
            "spread": round(spread, 4), "noisy": spread > NOISY_SPREAD}


def interleaved_latency_ms(sessions: Mapping[str, Any], feed: Mapping[str, Any],
                           runs: int = 20, warmup: int = 3,
                           reference: str | None = None) -> dict[str, dict[str, Any]]:
    """Per session name: the ``summary`` of its ``run`` wall times on ``feed``, all
    sessions timed in turn for ``warmup + runs`` rounds (the first ``warmup`` untimed).
    With ``reference`` (a session name), each summary also has ``ratio_to_reference``:
    the median of its per-round ratio to the reference's time in the same round."""
    names = list(sessions)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            sessions[name].run(None, dict(feed))
            if r >= warmup:
                times[name].append((time.perf_counter() - t0) * 1000.0)
    out = {n: summary(times[n]) for n in names}
    if reference is not None:
        for n in names:
            # a burst of load hits both sessions of a round alike, so the median per-round
            # ratio is steadier than the ratio of the medians
            ratios = [a / b for a, b in zip(times[n], times[reference]) if b > 0]
            out[n]["ratio_to_reference"] = round(statistics.median(ratios), 4) if ratios else None
    return out
