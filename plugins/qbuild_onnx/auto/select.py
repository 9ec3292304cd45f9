"""The selection of ``auto_quantize``: every trial's evaluate entry checked against the bar,
its cost measured (latency on this machine, or size in bytes), and the cheapest passing
trial chosen. The float model is always a candidate: when no passing trial is cheaper
than it, the float model is chosen and the report says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..accuracy.tasks import BAR_KEYS

OBJECTIVES = {"latency": "latency_ms", "size": "bytes"}
_PERFECT = {"min_f1": 1.0, "min_ap50": 1.0, "min_top1_agreement": 1.0, "max_top1_drop": 0.0}


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


def select(names: Sequence[str], entries: Sequence[Mapping[str, Any]],
           reports: Sequence[Mapping[str, Any]], bar: Mapping[str, float], objective: str,
           reference: str) -> dict[str, Any]:
    """The selection report: one row per trial (and the float model), and ``chosen``."""
    cost_key = OBJECTIVES[objective]
    rows = []
    for order, (name, entry) in enumerate(zip(names, entries, strict=True)):
        miss = misses(entry, bar)
        row = {"name": name, "order": order, "latency_ms": entry.get("latency_ms"),
               "bytes": entry.get("bytes"), "passes": not miss, "misses": miss,
               "score": (entry.get("task") or {}).get("score"),
               "worst_sqnr_db": measure(entry, "min_sqnr_db")}
        for key in bar:
            row[key] = measure(entry, key)
        rows.append(row)
    float_latency = [r["reference_latency_ms"] for r in reports if "reference_latency_ms" in r]
    float_row = {"name": "float", "order": -1, "passes": True, "misses": [],
                 "latency_ms": round(statistics.median(float_latency), 3) if float_latency
                 else None,
                 "bytes": next((r.get("reference_bytes") for r in reports), None),
                 "score": None, "worst_sqnr_db": math.inf, "model": reference}
    for key in bar:  # the float model measured against itself
        float_row[key] = _PERFECT.get(key, math.inf)

    def cost(r: Mapping[str, Any]) -> float:
        v = r.get(cost_key)
        return math.inf if v is None else float(v)

    passing = [r for r in rows if r["passes"]]
    best = min(passing, key=lambda r: (cost(r), r["order"])) if passing else None
    if best is None:
        chosen, note = float_row, "no quantized trial meets the bar: the float model is kept"
    elif cost(best) >= cost(float_row):
        chosen = float_row
        note = (f"no quantized trial that meets the bar is cheaper than float by {objective} "
                f"(best: {best['name']} at {best.get(cost_key)} vs float "
                f"{float_row.get(cost_key)}): the float model is kept")
    else:
        chosen, note = best, f"{best['name']} meets the bar at the lowest {objective}"
    return {"objective": objective, "bar": dict(bar), "chosen": chosen["name"], "note": note,
            "float": float_row, "trials": rows}
