"""One timing run for every candidate of an ``auto_quantize`` search, and the noise of
each candidate's speed ratio against the float model.

The float model and every candidate are timed on the search's runtime in one process,
interleaved round by round (F A B C, then A B C F, ...: the order rotated each round,
after untimed warm-up rounds; ``qbuild_onnx_common.runtimes.timing``), on one thread, by
the CPU time of the timing thread. The float model is timed in every float form the
runtime offers on this CPU (fp32, and OpenVINO's bf16 where it picks it) and the fastest
is the baseline: a candidate's ratio is the median over rounds of its time divided by
the baseline's time in the same round. Its noise is the half-width of a seeded
bootstrap interval of that median (the rounds resampled), but never less than what
separates two identical models: the float model is loaded twice (in each form), and how
far the baseline's twin's ratio strays from 1 (its median and its interval) is a floor
on every candidate's noise. That floor is what within-run
spread misses and what made trials a few per cent apart swap places between builds:
two sessions of one model in one process already differ by it.

Each candidate is loaded twice as well (``twin_of``), and so is the baseline: a ratio
is the per-round mean of the candidate's two sessions over the mean of the baseline's
two, so the session a build happens to get moves it half as much, and a candidate's
noise is at least how far its own two sessions' ratios lie apart (about the 90 %
half-width of their mean). With one session each, the walkthrough's MobileNetV2 search
measured its fastest trial at 0.913 ± 0.026 in one cold build and 0.945 ± 0.023 in the
next: 1.05x clearly faster than float in one, not in the other, and the choice flipped.

Pure statistics apart from ``time_candidates`` (which runs the sessions it is given, of
any runtime); the selection reads the result as JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qbuild_onnx_common.runtimes.base import Session

#: the name of the float model's second session in the timing result
TWIN = "float (twin)"
FLOAT = "float"
#: the float model's first form (fp32): its sessions are FLOAT and TWIN
FP32 = "fp32"
#: bootstrap resamplings of a median ratio, and the interval's coverage
RESAMPLES = 1000
COVERAGE = 0.90


def twin_of(name: str) -> str:
    """The name of a candidate's second session in the timing run."""
    return f"{name} (twin)"


def _mean(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [(x + y) / 2.0 for x, y in zip(a, b, strict=True)]


def float_sessions(form: str) -> tuple[str, str]:
    """The names of the float model's two sessions in float form ``form`` ("fp32":
    ``FLOAT`` and ``TWIN``)."""
    if form == FP32:
        return FLOAT, TWIN
    return f"{FLOAT} [{form}]", f"{FLOAT} [{form}] (twin)"


def time_candidates(sessions: Mapping[str, Session], feed: Mapping[str, Any], rounds: int,
                    warmup: int = 3, progress: Callable[[int, int], None] | None = None
                    ) -> dict[str, list[float]]:
    """Per session name, its CPU times (ms, timing thread) over ``rounds`` interleaved
    rounds, each round running every session once in a rotated order. ``progress(done,
    total)`` is told the runs made so far (warm-up rounds included), after each run."""
    from qbuild_onnx_common.runtimes.timing import interleaved

    return interleaved(sessions, feed, rounds, warmup, progress).cpu


def _bootstrap_median(ratios: Sequence[float], seed: int) -> tuple[float, float]:
    """The ``COVERAGE`` interval of the median of ``ratios`` by a seeded bootstrap."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arr = np.asarray(ratios, dtype=np.float64)
    idx = rng.integers(0, len(arr), size=(RESAMPLES, len(arr)))
    medians = np.median(arr[idx], axis=1)
    tail = (1.0 - COVERAGE) / 2.0
    return float(np.quantile(medians, tail)), float(np.quantile(medians, 1.0 - tail))


def ratio_stats(times: Sequence[float], reference: Sequence[float]) -> dict[str, Any]:
    """A candidate's per-round ratios to the reference summarised: median, quartiles,
    the bootstrap interval of the median and its half-width (``ci_half``)."""
    ratios = [a / b for a, b in zip(times, reference, strict=True) if b > 0]
    if not ratios:
        return {"ratio": None}
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    lo, hi = _bootstrap_median(ratios, seed=len(ratios))
    return {"ratio": round(statistics.median(ratios), 4), "q1": round(q[0], 4),
            "q3": round(q[2], 4), "ci": [round(lo, 4), round(hi, 4)],
            "ci_half": round((hi - lo) / 2.0, 4), "rounds": len(ratios),
            "median_ms": round(statistics.median(times), 4)}


def summarise(cpu: Mapping[str, Sequence[float]], warmup: int,
              forms: Sequence[str] = (FP32,)) -> dict[str, Any]:
    """The timing document (latency.json): each float form's median, the baseline (the
    fastest form), its twin's deviation (the noise floor) and, per candidate, its ratio
    to the baseline and ``noise``: the larger of its bootstrap half-width and the
    floor."""
    medians = {f: statistics.median(cpu[float_sessions(f)[0]]) for f in forms
               if cpu.get(float_sessions(f)[0])}
    baseline = min(medians, key=lambda f: (medians[f], list(forms).index(f))) if medians \
        else FP32
    base, base_twin = float_sessions(baseline)
    ref = cpu.get(base, [])
    twin: dict[str, Any] = (ratio_stats(cpu[base_twin], ref) if base_twin in cpu
                            else {"ratio": None})
    floor = 0.0
    if twin["ratio"] is not None:
        floor = max(abs(twin["ci"][0] - 1.0), abs(twin["ci"][1] - 1.0))
    skip = {n for f in forms for n in float_sessions(f)}
    both = _mean(ref, cpu[base_twin]) if base_twin in cpu else ref  # the baseline's sessions
    out: dict[str, Any] = {}
    for name, times in cpu.items():
        if name in skip or (name.endswith(" (twin)") and name[:-7] in cpu):
            continue
        second = cpu.get(twin_of(name))
        s = ratio_stats(times if second is None else _mean(times, second), both)
        if s["ratio"] is not None:
            noise = max(s["ci_half"], floor)
            if second is not None:  # the candidate's own session-to-session spread
                one = ratio_stats(times, both)["ratio"]
                two = ratio_stats(second, both)["ratio"]
                s["sessions"] = [one, two]
                noise = max(noise, abs(one - two))
            s["noise"] = round(noise, 4)
        out[name] = s
    return {"basis": "cpu", "threads": 1, "order": "interleaved, rotated each round",
            "rounds": len(ref), "warmup": warmup,
            "float_median_ms": round(statistics.median(ref), 4) if ref else None,
            "float_forms": {f: round(m, 4) for f, m in medians.items()},
            "baseline": baseline,
            "twin": twin, "noise_floor": round(floor, 4), "coverage": COVERAGE,
            "candidates": out}
