"""Timing sessions fairly, on any runtime: several sessions run in turn, round after
round (the order rotated each round; ``runtimes.timing``), after untimed warm-up rounds,
so load from other processes hits every model alike; summarised as median, quartiles
and spread.

Besides wall time, each run's CPU time on the calling thread is recorded (``cpu``). With
one thread onnxruntime and OpenVINO compute on the calling thread, so that is the run's
whole CPU cost, and it does not include the time the thread waited for a core: on a
shared machine (load above the core count) wall times spread by 30-60 % while CPU times
stay within a few per cent. With more threads it misses the pool's work (``cpu`` is then
only the caller's share, and callers should not report it as the run's cost)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from .runtimes.base import Session
from .runtimes.timing import Times, interleaved

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


def interleaved_latency_ms(sessions: Mapping[str, Session], feed: Mapping[str, Any],
                           runs: int = 20, warmup: int = 3,
                           reference: str | None = None) -> dict[str, dict[str, Any]]:
    """Per session name: the ``summary`` of its ``run`` wall times on ``feed``, all
    sessions timed in turn for ``warmup + runs`` rounds (the first ``warmup`` untimed).
    With ``reference`` (a session name), each summary also has ``ratio_to_reference``:
    the median of its per-round ratio to the reference's time in the same round, and
    that ratio's quartiles (``ratio_q1``, ``ratio_q3``)."""
    return summaries(interleaved(sessions, feed, runs, warmup), reference)


def summaries(times: Times, reference: str | None = None) -> dict[str, dict[str, Any]]:
    """``interleaved_latency_ms``'s result from the times ``runtimes.timing`` measured."""
    names = list(times.wall)
    out = {n: {**summary(times.wall[n]), "cpu": summary(times.cpu[n])} for n in names}
    if reference is not None:
        for n in names:
            out[n].update(_ratio_summary(times.wall[n], times.wall[reference]))
            out[n]["cpu"].update(_ratio_summary(times.cpu[n], times.cpu[reference]))
    return out


def slower_verdict(model: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """Is a model slower than its reference? Two ``interleaved_latency_ms`` entries are
    compared on their CPU-time medians when both have ``cpu`` (one intra-op thread: the
    run's whole cost, steady under load from other processes), else on wall time.
    Returns {"slower", "basis" ("cpu" or "wall"), "ms", "reference_ms"}."""
    basis = "cpu" if model.get("cpu") and reference.get("cpu") else "wall"
    m, r = (model["cpu"], reference["cpu"]) if basis == "cpu" else (model, reference)
    return {"slower": m["median_ms"] > r["median_ms"], "basis": basis,
            "ms": m["median_ms"], "reference_ms": r["median_ms"]}


def inside_noise(timing: Mapping[str, Any]) -> bool:
    """Whether one timing (a ``summaries`` entry, or its ``cpu`` part) is as fast as its
    reference within the noise: the speed the reports print, 1 / ``ratio_to_reference``
    ± half the width of [1 / (ratio + n), 1 / (ratio - n)] with n half the interquartile
    range of the per-round ratios, includes 1.0. False without per-round ratios."""
    r, q1, q3 = (timing.get(k) for k in ("ratio_to_reference", "ratio_q1", "ratio_q3"))
    if not isinstance(r, (int, float)) or not isinstance(q1, (int, float)) \
            or not isinstance(q3, (int, float)) or r <= 0:
        return False
    n = (q3 - q1) / 2.0
    if r <= n:
        return True
    half = (1.0 / (r - n) - 1.0 / (r + n)) / 2.0
    return abs(1.0 / r - 1.0) <= half


def _ratio_summary(times: list[float], ref: list[float]) -> dict[str, float | None]:
    """The median of the per-round ratios to the reference (``ratio_to_reference``) and
    their quartiles (``ratio_q1``, ``ratio_q3``: the spread a report shows)."""
    # a burst of load hits both sessions of a round alike, so the median per-round ratio
    # is steadier than the ratio of the medians
    ratios = [a / b for a, b in zip(times, ref) if b > 0]
    if not ratios:
        return {"ratio_to_reference": None}
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratio_to_reference": round(statistics.median(ratios), 4),
            "ratio_q1": round(q[0], 4), "ratio_q3": round(q[2], 4)}
