"""The selection of ``auto_quantize``: every trial's evaluate entry checked against the bar,
its cost measured (latency on this machine, or size in bytes), and the cheapest passing
trial chosen. The float model is always a candidate: when no passing trial is cheaper
than it, the float model is chosen and the report says so.

Latency is compared as a ratio to the float model timed in the same interleaved run
(``auto.timing``: every candidate and float in one run, latency.json; without it, each
trial's own evaluate run), with its measured noise, and never decides inside that noise:
a trial replaces float only when it reaches ``min_speedup`` at the slow end of its
noise, a candidate is left out only when it is clearly slower than another, and the
trials left are tied and ranked by accuracy (the task's score), then size, then name.
The report says when the winner's margin was inside the noise (``latency_choice``).

Trials that are not candidates are listed, never chosen: a trial that failed (its
one-line reason in ``failed``; the caller fails the search only when every trial did)
and a trial whose model quantizes nothing (its evaluate entry says ``quantized`` is
None: every node was kept float, so it is the float model under another name).
"""

from __future__ import annotations

import math
import re
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


def drop_misses(entry: Mapping[str, Any], max_drop: Mapping[str, float]) -> list[str]:
    """The ``max_drop`` bars an evaluate entry misses: its labelled metric's drop from
    the float model on the same labelled samples above the limit."""
    found = entry.get("labelled") or {}
    out = []
    for key, limit in max_drop.items():
        drop = (found.get("drop") or {}).get(key)
        if drop is None:
            out.append(f"max_drop {key}: not measured (no ground truth for this task)")
        elif _f(drop) > limit:
            out.append(f"max_drop {key}: drops {_f(drop):.4g} > {limit}")
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
           failed: Mapping[str, str] | None = None,
           timing: Mapping[str, Any] | None = None,
           max_drop: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The selection report: one row per trial (and the float model), and ``chosen``.
    ``max_drop``: labelled metric -> the largest drop from float a trial may have.
    ``failed``: trial name -> why it failed (its entry and report are then None).
    ``timing``: the search's own interleaved timing of every candidate (``auto.timing``,
    latency.json); without it each trial's ratio comes from its evaluate run and its
    noise from that run's spread."""
    failed, max_drop = failed or {}, max_drop or {}
    rows: list[dict[str, Any]] = []
    for order, (name, entry, rep) in enumerate(zip(names, entries, reports, strict=True)):
        if name in failed or entry is None or rep is None:
            rows.append({"name": name, "order": order, "status": "failed", "passes": False,
                         "misses": [], "failed": failed.get(name, "not evaluated")})
            continue
        timed = (timing or {}).get("candidates", {}).get(name) or {}
        rows.append(_row(name, order, entry, rep, bar, timed, max_drop))
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
    labelled: Mapping[str, Any] = next(
        (r["reference_labelled"] for r in measured if "reference_labelled" in r), {})
    for key in max_drop:
        float_row[key], float_row[f"{key}_drop"] = labelled.get(key), 0.0

    passing = [r for r in rows if r["passes"]]
    choice: dict[str, Any] | None = None
    if objective == "latency":
        chosen, note, choice = _by_latency(passing, float_row, min_speedup)
    else:
        chosen, note = _by_cost(passing, float_row, OBJECTIVES[objective], objective)
    if not passing:
        note = _nothing_passes(rows)
    if chosen is float_row and not passing and all(
            r["status"] in ("failed", "quantizes nothing") for r in rows):
        note = ("no trial quantized anything that could be evaluated (failed or kept "
                "every node float): the float model is kept")
    failures = failure_summary(rows)
    if failures["most"]:
        note = (f"{failures['failed']} of {failures['trials']} trials FAILED (see "
                f"'failures'); " + note)
    elif failed:
        note += f"; {len(failed)} trial(s) failed and were left out: see their rows"
    if chosen is not float_row:
        chosen["status"] = "chosen"
    out = {"objective": objective, "bar": dict(bar), "max_drop": dict(max_drop),
           "chosen": chosen["name"], "note": note,
           "min_speedup": min_speedup if objective == "latency" else None,
           "float": float_row, "trials": rows}
    out.update(_float_counts(float_row, rows, measured, timing))
    if failed:
        out["failures"] = failures
    if choice is not None:
        out["latency_choice"] = choice
    return out


def _nothing_passes(rows: Sequence[Mapping[str, Any]]) -> str:
    """Why the float model is kept when no trial meets the bar: the most accurate trial
    that was evaluated and what it misses, so the console line says how far off it was."""
    missed = [r for r in rows if r["status"] == "misses the bar"]
    if not missed:
        return "no quantized trial meets the bar: the float model is kept"
    near = min(missed, key=lambda r: (-_accuracy(r), r["order"]))
    return (f"no quantized trial meets the bar (closest: {near['name']}, "
            f"{'; '.join(near['misses'])}): the float model is kept")


_WHERE = re.compile(r"^(?:[^,\n]*, )?target //\S+?: ")


def _row(name: str, order: int, entry: Mapping[str, Any], rep: Mapping[str, Any],
         bar: Mapping[str, float], timed: Mapping[str, Any],
         max_drop: Mapping[str, float]) -> dict[str, Any]:
    """A trial's row: bar measures, labelled metrics and their drops, size, and its
    speed ratio to float with its noise (from the search's timing run ``timed`` when it
    has one, else from its evaluate)."""
    miss = [*misses(entry, bar), *drop_misses(entry, max_drop)]
    lat = entry.get("latency") or {}
    rel, basis = _relative_latency(entry, lat, rep.get("reference_latency_ms"))
    noise = None
    if rel is not None:
        spread = (lat.get("cpu") or {}).get("spread") if basis == "cpu" else None
        noise = round(rel * float(spread if spread is not None
                                  else lat.get("spread") or 0.0), 4)
    if timed.get("ratio") is not None:
        rel, noise, basis = timed["ratio"], timed["noise"], "cpu, one run"
    row: dict[str, Any] = {"name": name, "order": order, "latency_ms": entry.get("latency_ms"),
           "relative_latency": rel, "latency_noise": noise, "latency_basis": basis,
           "speedup": round(1.0 / rel, 3) if rel else None,
           "latency_spread": lat.get("spread"), "noisy": lat.get("noisy"),
           "bytes": entry.get("bytes"), "passes": not miss, "misses": miss,
           "score": (entry.get("task") or {}).get("score"),
           "worst_sqnr_db": measure(entry, "min_sqnr_db"),
           "status": "meets the bar" if not miss else "misses the bar"}
    if timed.get("ratio") is not None:  # the same run's CPU time, for the page
        row["cpu_ms"] = timed.get("median_ms")
    detected = detections(entry)
    if detected is not None:
        row["detections"] = detected
    if "quantized" in entry and entry["quantized"] is None:
        row.update(passes=False, status="quantizes nothing", excluded=NOTHING)
    for key in bar:
        row[key] = measure(entry, key)
    found = entry.get("labelled") or {}
    for key in max_drop:
        row[key], row[f"{key}_drop"] = found.get(key), (found.get("drop") or {}).get(key)
    return row


def detections(entry: Mapping[str, Any]) -> dict[str, int] | None:
    """A detection task's counts against the float model's own detections: reference,
    candidate, matched, missed (reference detections not found) and extra (found, not
    by the reference); None for other tasks."""
    task = entry.get("task") or {}
    if "reference_detections" not in task:
        return None
    ref, cand, hit = (int(task[k]) for k in ("reference_detections",
                                             "candidate_detections", "matched"))
    return {"reference": ref, "candidate": cand, "matched": hit, "missed": ref - hit,
            "extra": cand - hit}


def _float_counts(float_row: dict[str, Any], rows: Sequence[Mapping[str, Any]],
                  measured: Sequence[Mapping[str, Any]],
                  timing: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the page says the figures rest on: the float row's detections (all its own)
    and time in the search's timing run, and the result's ``samples`` and ``timing``."""
    ref = next((r["detections"]["reference"] for r in rows if r.get("detections")), None)
    if ref is not None:
        float_row["detections"] = {"reference": ref, "candidate": ref, "matched": ref,
                                   "missed": 0, "extra": 0}
    out: dict[str, Any] = {"samples": next((r["samples"] for r in measured
                                            if "samples" in r), None)}
    if timing:
        float_row["cpu_ms"] = timing.get("float_median_ms")
        out["timing"] = {k: timing.get(k) for k in ("basis", "threads", "rounds", "warmup",
                                                    "noise_floor", "coverage",
                                                    "float_median_ms")}
    return out


def _by_cost(passing: list[dict[str, Any]], float_row: dict[str, Any], cost_key: str,
             objective: str) -> tuple[dict[str, Any], str]:
    """(chosen row, note) for a deterministic cost (size): the cheapest passing trial,
    ties to the earlier one, if it is cheaper than float."""
    def cost(r: Mapping[str, Any]) -> float:
        v = r.get(cost_key)
        return math.inf if v is None else float(v)

    best = min(passing, key=lambda r: (cost(r), r["order"])) if passing else None
    if best is None:
        return float_row, "no quantized trial meets the bar: the float model is kept"
    if not cost(best) < cost(float_row):
        return float_row, (f"no quantized trial that meets the bar is smaller than float "
                           f"(best: {best['name']} at {best.get(cost_key)} vs float "
                           f"{float_row.get(cost_key)}): the float model is kept")
    return best, f"{best['name']} meets the bar at the lowest {objective}"


def failure_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many trials failed, whether that is most of them, and the trials behind each
    distinct reason (most frequent first, then by reason)."""
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] == "failed":
            # the same reason on different trials differs only by where ("BUILD.toml,
            # target //pkg:aq.ev_x: ..."): grouped without it
            why = _WHERE.sub("", str(r["failed"]), count=1)
            by_reason.setdefault(why, []).append(r["name"])
    count = sum(len(v) for v in by_reason.values())
    reasons = [{"reason": k, "trials": v, "count": len(v)}
               for k, v in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    return {"failed": count, "trials": len(rows), "most": count * 2 > len(rows),
            "reasons": reasons}


def _accuracy(r: Mapping[str, Any]) -> float:
    """The task's score, or the worst output SQNR for the task-blind sqnr task."""
    v = r.get("score")
    if v is None:
        v = r.get("worst_sqnr_db")
    return -math.inf if v is None else _f(v)


def _tie_key(r: Mapping[str, Any]) -> tuple[float, float, str]:
    # more accurate first, then smaller, then the trial's name: no measurement
    return (-_accuracy(r), math.inf if r.get("bytes") is None else float(r["bytes"]),
            str(r["name"]))


def _decided_by(tied: Sequence[Mapping[str, Any]]) -> str:
    if len(tied) < 2:
        return "latency"
    a, b = _tie_key(tied[0]), _tie_key(tied[1])
    return "accuracy" if a[0] != b[0] else "size" if a[1] != b[1] else "name"


def _by_latency(passing: list[dict[str, Any]], float_row: dict[str, Any],
                min_speedup: float) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """(chosen row, note, the latency decision) for ``objective = "latency"``.

    Each passing trial has a speed ratio to float and its noise. A trial stays a
    candidate only when it is faster than float by ``min_speedup`` even at the slow end
    of its noise (inside it, it ties with float, and float is the most accurate); a
    candidate is left out only when it is clearly slower than another (its fast end
    above the other's slow end). The rest are tied on latency and ranked by accuracy,
    then size, then name, so a difference inside the noise never decides."""
    measured = [r for r in passing if r.get("relative_latency") is not None]
    if passing and not measured:
        return float_row, ("latency was not measured (latency_runs = 0), so no trial can be "
                           "shown faster than float: the float model is kept"), None
    if not passing:
        return float_row, "no quantized trial meets the bar: the float model is kept", None
    limit = 1.0 / min_speedup
    fast = [r for r in measured if r["relative_latency"] + r["latency_noise"] <= limit]
    for r in measured:
        if r not in fast:
            r["latency_verdict"] = (f"not clearly {min_speedup}x faster than float "
                                    f"(ratio {r['relative_latency']} ± {r['latency_noise']})")
    if not fast:
        best = min(measured, key=lambda r: (r["relative_latency"], r["name"]))
        inside = best["relative_latency"] - best["latency_noise"] < limit
        return float_row, (
            f"no quantized trial that meets the bar is faster than float by "
            f"{min_speedup}x (best: {best['name']} at {best['speedup']}x, ratio "
            f"{best['relative_latency']} ± {best['latency_noise']}, measured interleaved "
            f"with float{'; inside the noise, so float, the most accurate, wins' if inside else ''}"
            f"): the float model is kept"), {"tied": [], "decided_by": "min_speedup",
                                             "inside_noise": inside}
    bound = min(r["relative_latency"] + r["latency_noise"] for r in fast)
    fastest = min(fast, key=lambda r: (r["relative_latency"] + r["latency_noise"], r["name"]))
    tied = sorted((r for r in fast if r["relative_latency"] - r["latency_noise"] <= bound),
                  key=_tie_key)
    for r in fast:
        r["latency_verdict"] = ("tied on latency (inside the noise)" if r in tied and
                                len(tied) > 1 else "fastest" if r in tied else
                                f"clearly slower than {fastest['name']}")
    chosen, by = tied[0], _decided_by(tied)
    choice = {"tied": [r["name"] for r in tied], "decided_by": by,
              "inside_noise": len(tied) > 1}
    if len(tied) == 1:
        note = (f"{chosen['name']} meets the bar at the lowest latency: {chosen['speedup']}x "
                f"float's speed (ratio {chosen['relative_latency']} ± "
                f"{chosen['latency_noise']}, every other trial clearly slower; measured "
                f"interleaved with float, 1 thread)")
    else:
        others = ", ".join(r["name"] for r in tied[1:])
        note = (f"{chosen['name']} meets the bar at {chosen['speedup']}x float's speed; its "
                f"margin over {others} is inside the timing noise, so it was chosen by "
                f"{by} (accuracy, then size, then name), not by latency")
    return chosen, note, choice


_DETECTION_BARS = ("min_f1", "min_f1_lower", "min_ap50")
_DETECTION_TASKS = ("detection", "yolo")


def _detection_shaped(shape: Sequence[Any]) -> bool:
    # decoded [N, boxes, 4+1+classes] (box fields last, boxes at least 4x as many) or
    # yolov8's [N, 4+classes, anchors] (a thousand anchors or more: a 320 input has 2100)
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
        return False
    boxes, fields = int(shape[1]), int(shape[2])
    if 5 <= fields <= 300 and boxes >= 4 * fields:
        return True
    return 5 <= boxes <= 300 and fields >= max(1000, 4 * boxes)


def detector_warning(bar: Mapping[str, Any], task: str, task_options: Mapping[str, Any],
                     outputs: Sequence[Mapping[str, Any]],
                     max_drop: Mapping[str, Any] | None = None) -> str | None:
    """A warning when ``min_sqnr_db`` (task-blind) is the only kind of bar on a model that
    looks like a detector: a detection task or decoder configured, or an output shaped
    like detections. SQNR can stay high while every detection is lost. A ``max_drop``
    on mAP measures detections."""
    if "min_sqnr_db" not in bar or any(k in bar for k in _DETECTION_BARS) or any(
            k.startswith("map") for k in max_drop or {}):
        return None
    why = None
    if task in _DETECTION_TASKS or "decoder" in task_options:
        why = f"task = {task!r}" + (f", decoder = {task_options['decoder']!r}"
                                    if "decoder" in task_options else "")
    else:
        shaped = [o for o in outputs if _detection_shaped(list(o.get("shape") or []))]
        if shaped:
            why = (f"output {shaped[0].get('name')!r} is shaped like detections "
                   f"{list(shaped[0].get('shape') or [])}")
    if why is None:
        return None
    return (f"the bar min_sqnr_db does not measure detections, and this model looks like a "
            f"detector ({why}): a trial can meet it and detect nothing; bar on "
            f"min_f1 or min_f1_lower with task = \"detection\" and its decoder")


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
