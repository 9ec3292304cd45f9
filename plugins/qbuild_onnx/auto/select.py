"""The selection of ``auto_quantize``: every trial's evaluate entry checked against the bar,
its cost measured (latency on this machine, or size in bytes), and the cheapest passing
trial chosen. The float model is always a candidate: when no passing trial is cheaper
than it, the float model is chosen and the report says so.

Latency is compared as a ratio, never across processes: each trial's evaluate times the
trial and the float model interleaved in one process, so ``relative_latency`` (the median
over rounds of trial time / float time in the same round, or failing that the ratio of
the two medians) holds up under load that makes absolute milliseconds of two runs
incomparable. The times compared are the CPU times of the one timing thread where
recorded (``latency_basis = "cpu"``): with one intra-op thread that is the whole run, and
unlike wall time it does not count the time another process held the core. A trial
replaces the float model only when its speed-up reaches ``min_speedup`` (a margin against
timing noise: a quantized model that is not clearly faster is not recommended).

Trials that are not candidates are listed, never chosen: a trial that failed (its
one-line reason in ``failed``; the caller fails the search only when every trial did)
and a trial whose model quantizes nothing (its evaluate entry says ``quantized`` is
None: every node was kept float, so it is the float model under another name).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..accuracy.tasks import BAR_KEYS

OBJECTIVES = {"latency": "latency_ms", "size": "bytes"}
_PERFECT = {"min_f1": 1.0, "min_f1_lower": 1.0, "min_ap50": 1.0, "min_top1_agreement": 1.0,
            "max_top1_drop": 0.0}


def _f(v: Any) -> float:
    return float(v) if v not in ("inf", "-inf", "nan") else float(v)


def check_bar(bar: Mapping[str, Any]) -> list[str]:
    """Problems with a bar table (unknown keys, non-numbers)."""
    problems = []
    for k, v in bar.items():
        if k not in BAR_KEYS:
            problems.append(f"unknown bar '{k}' (known: {', '.join(sorted(BAR_KEYS))})")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            problems.append(f"bar '{k}' must be a number")
    return problems


def measure(entry: Mapping[str, Any], key: str) -> float | None:
    """A bar's quantity in an evaluate entry (worst output SQNR for min_sqnr_db)."""
    if key == "min_sqnr_db":
        values = [_f(m["sqnr_db"]) for m in entry["outputs"].values()]
        return min(values) if values else None
    field, _ = BAR_KEYS[key]
    task = entry.get("task") or {}
    if field in task:
        return _f(task[field])
    return None


def misses(entry: Mapping[str, Any], bar: Mapping[str, float]) -> list[str]:
    out = []
    for key, limit in bar.items():
        value = measure(entry, key)
        _, higher = BAR_KEYS[key]
        if value is None:
            out.append(f"{key}: not measured by this task")
        elif (value < limit) if higher else (value > limit):
            out.append(f"{key}: {value:.4g} {'<' if higher else '>'} {limit}")
    return out


def _relative_latency(entry: Mapping[str, Any], lat: Mapping[str, Any],
                      ref_ms: float | None) -> tuple[float | None, str | None]:
    """Trial time / float time and what it was measured on: the per-round ratio of CPU
    times on the one timing thread when recorded (steady when other processes take the
    cores), else of wall times, else the ratio of the two medians."""
    cpu = (lat.get("cpu") or {}).get("ratio_to_reference")
    if cpu:
        return cpu, "cpu"
    if lat.get("ratio_to_reference"):
        return lat["ratio_to_reference"], "wall"
    if entry.get("latency_ms") and ref_ms:
        return round(entry["latency_ms"] / ref_ms, 4), "wall medians"
    return None, None


NOTHING = "quantizes nothing (every node kept float): it is the float model, not a candidate"


def select(names: Sequence[str], entries: Sequence[Mapping[str, Any] | None],
           reports: Sequence[Mapping[str, Any] | None], bar: Mapping[str, float],
           objective: str, reference: str, min_speedup: float = 1.0,
           failed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The selection report: one row per trial (and the float model), and ``chosen``.
    ``failed``: trial name -> why it failed (its entry and report are then None)."""
    cost_key = "relative_latency" if objective == "latency" else OBJECTIVES[objective]
    failed = failed or {}
    rows: list[dict[str, Any]] = []
    for order, (name, entry, rep) in enumerate(zip(names, entries, reports, strict=True)):
        if name in failed or entry is None or rep is None:
            rows.append({"name": name, "order": order, "status": "failed", "passes": False,
                         "misses": [], "failed": failed.get(name, "not evaluated")})
            continue
        miss = misses(entry, bar)
        ref_ms = rep.get("reference_latency_ms")
        lat = entry.get("latency") or {}
        rel, basis = _relative_latency(entry, lat, ref_ms)
        row = {"name": name, "order": order, "latency_ms": entry.get("latency_ms"),
               "relative_latency": rel, "latency_basis": basis,
               "speedup": round(1.0 / rel, 3) if rel else None,
               "latency_spread": lat.get("spread"), "noisy": lat.get("noisy"),
               "bytes": entry.get("bytes"), "passes": not miss, "misses": miss,
               "score": (entry.get("task") or {}).get("score"),
               "worst_sqnr_db": measure(entry, "min_sqnr_db"),
               "status": "meets the bar" if not miss else "misses the bar"}
        if "quantized" in entry and entry["quantized"] is None:
            row.update(passes=False, status="quantizes nothing", excluded=NOTHING)
        for key in bar:
            row[key] = measure(entry, key)
        rows.append(row)
    measured = [r for r in reports if r is not None]
    float_latency = [r["reference_latency_ms"] for r in measured if "reference_latency_ms" in r]
    float_row: dict[str, Any] = {
        "name": "float", "order": -1, "passes": True, "misses": [], "status": "float",
        "latency_ms": round(statistics.median(float_latency), 3) if float_latency
        else None, "relative_latency": 1.0 if float_latency else None,
        "speedup": 1.0 if float_latency else None,
        "bytes": next((r.get("reference_bytes") for r in measured), None),
        "score": None, "worst_sqnr_db": math.inf, "model": reference}
    for key in bar:  # the float model measured against itself
        float_row[key] = _PERFECT.get(key, math.inf)

    def cost(r: Mapping[str, Any]) -> float:
        v = r.get(cost_key)
        return math.inf if v is None else float(v)

    passing = [r for r in rows if r["passes"]]
    best = min(passing, key=lambda r: (cost(r), r["order"])) if passing else None
    # the float model's own cost; for latency a trial must be faster by the margin
    limit = (1.0 / min_speedup if objective == "latency" else cost(float_row))
    if best is None:
        chosen, note = float_row, "no quantized trial meets the bar: the float model is kept"
        if all(r["status"] in ("failed", "quantizes nothing") for r in rows):
            note = ("no trial quantized anything that could be evaluated (failed or kept "
                    "every node float): the float model is kept")
    elif not cost(best) < limit:
        chosen = float_row
        if objective == "latency" and best["speedup"] is None:
            note = ("latency was not measured (latency_runs = 0), so no trial can be shown "
                    "faster than float: the float model is kept")
        elif objective == "latency":
            note = (f"no quantized trial that meets the bar is faster than float by "
                    f"{min_speedup}x (best: {best['name']} at {best['speedup']}x, measured "
                    f"interleaved with float): the float model is kept")
        else:
            note = (f"no quantized trial that meets the bar is smaller than float "
                    f"(best: {best['name']} at {best.get(cost_key)} vs float "
                    f"{float_row.get(cost_key)}): the float model is kept")
    elif objective == "latency":
        chosen = best
        note = (f"{best['name']} meets the bar at the lowest latency: {best['speedup']}x "
                f"float's speed (measured interleaved with float, 1 thread)")
    else:
        chosen, note = best, f"{best['name']} meets the bar at the lowest {objective}"
    if failed:
        note += f"; {len(failed)} trial(s) failed and were left out: see their rows"
    if chosen is not float_row:
        chosen["status"] = "chosen"
    return {"objective": objective, "bar": dict(bar), "chosen": chosen["name"], "note": note,
            "min_speedup": min_speedup if objective == "latency" else None,
            "float": float_row, "trials": rows}


def findings_line(rows: Sequence[Mapping[str, Any]], total: int) -> str | None:
    """The search's trial-level findings as one console line (None: nothing to say):
    how many trials were slower than float, had noisy timings or failed; each is in the
    report's rows."""
    slower = sum(1 for r in rows if r.get("slower_than_float"))
    noisy = sum(1 for r in rows if r.get("noisy"))
    failed = sum(1 for r in rows if r.get("status") == "failed")
    parts = [f"{n} of {total} trials {what}" for n, what in (
        (slower, "slower than float"), (noisy, "timed with noisy latency"),
        (failed, "failed and left out")) if n]
    if not parts:
        return None
    return "; ".join(parts) + " (each in the report's rows: report.html)"
