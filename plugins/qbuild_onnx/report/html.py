"""Static HTML reports (``report.html``) for ``evaluate`` and ``auto_quantize``: a warnings
box (every warning the report carries), how many samples and reference detections the
figures rest on, a table of every variant, an accuracy-vs-speed (or size) chart with the
Pareto front and a label on every point, and for a search the sensitivity ranking and
why each trial was or was not chosen.

Speed has one column: the ratio to the float model (the reference) from one interleaved
timing run, with its spread ("1.23× ± 0.02"); absolute times are secondary and always of
one kind (CPU time of the one timing thread, or wall time when CPU time was not
recorded), never mixed in a row. Numbers are formatted by ``report.fmt`` only.

Plain HTML with inline SVG and inline CSS: no script, no network, a few kilobytes. The
output depends only on the report dictionaries, so it is as deterministic as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from ..auto.select import detections
from . import fmt
from .chart import bars_svg, pareto, scatter_svg

__all__ = ["auto_html", "bars_svg", "evaluate_html", "page", "pareto", "scatter_svg",
           "speed", "speed_text"]

_CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;
text-align:right}td{white-space:nowrap}td:first-child,th:first-child{text-align:left}tr.chosen{background:#dfd}
tr.fail td{color:#a00}th.secondary,td.secondary{color:#666;font-size:90%}
td.text,th.text{text-align:left}svg{border:1px solid #ccc;background:#fff}
.note{color:#555}.warn{color:#a00}
.warnings{border:2px solid #c60;background:#fff4e5;padding:.2em 1em;margin:1em 0}
.warnings h2{font-size:110%;margin:.4em 0;color:#a40}
svg text.point-label{font-size:11px;fill:#222}"""

Row = Mapping[str, Any]
#: a table column: header, the cell's text (or text and a tooltip), the cells' CSS class
Column = tuple[str, Callable[[Row], "str | tuple[str, str]"], str]

# bar keys: (column title, formatter, higher is better)
_BAR_COLUMNS: dict[str, tuple[str, Callable[[Any], str], bool]] = {
    "min_f1": ("F1", fmt.score, True),
    "min_f1_lower": ("F1 lower bound", fmt.score, True),
    "min_ap50": ("AP50", fmt.score, True),
    "max_top1_drop": ("top-1 drop", fmt.percent, False),
    "min_top1_agreement": ("top-1 agreement", fmt.percent, True),
    "min_sqnr_db": ("worst SQNR", fmt.db, True),
    "min_psnr_db": ("PSNR", fmt.db, True),
    "min_score": ("score", fmt.plain, True),
}
# an evaluate task result: (key, column title, formatter), in the order shown
_TASK_COLUMNS = (("f1", "F1", fmt.score), ("f1_lower", "F1 lower bound", fmt.score),
                 ("ap50", "AP50", fmt.score), ("top1_agreement", "top-1 agreement",
                                              fmt.percent),
                 ("top5_agreement", "top-5 agreement", fmt.percent))


def speed(rel: Any, noise: Any = None) -> tuple[float, float | None] | None:
    """(speed, its ± half-width) from a time ratio to float and that ratio's noise: the
    speed is float's time over the model's (1.23: 23 % faster), the half-width that of
    the interval [1 / (ratio + noise), 1 / (ratio - noise)]."""
    r, n = fmt.number(rel), fmt.number(noise)
    if r is None or not math.isfinite(r) or r <= 0:
        return None
    if n is None or not math.isfinite(n):
        return 1.0 / r, None
    half = (1.0 / (r - n) - 1.0 / (r + n)) / 2.0 if r > n else math.inf
    return 1.0 / r, half


def speed_text(rel: Any, noise: Any = None) -> str:
    """A time ratio and its noise as the speed the pages show: "1.23× ± 0.02"."""
    s = speed(rel, noise)
    return fmt.MISSING if s is None else fmt.ratio_pm(s[0], s[1])


def _inside_noise(rel: Any, noise: Any) -> bool:
    s = speed(rel, noise)
    return s is not None and s[1] is not None and abs(s[0] - 1.0) <= s[1]


def _cell(value: str | tuple[str, str], cls: str) -> str:
    text, tip = value if isinstance(value, tuple) else (value, "")
    title = f' title="{escape(tip)}"' if tip else ""
    return f'<td class="{cls}"{title}>{escape(text)}</td>'


def _table(rows: Sequence[Row], columns: Sequence[Column], chosen: str | None) -> str:
    head = "".join(f'<th class="{c}">{escape(t)}</th>' for t, _, c in columns)
    body = []
    for r in rows:
        cls = "chosen" if r["name"] == chosen else ("fail" if r.get("passes") is False else "")
        cells = "".join(_cell(get(r), c) for _, get, c in columns)
        body.append(f'<tr class="{cls}">{cells}</tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1>\n" + "\n".join(s for s in sections if s)
            + "\n</body></html>\n")


def warnings_box(items: Sequence[tuple[str, str]]) -> str:
    """The box every page opens with when it has warnings: (element id, HTML) items."""
    if not items:
        return ""
    listed = "".join(f'<li id="{escape(i)}">{h}</li>' if i else f"<li>{h}</li>"
                     for i, h in items)
    return (f'<div class="warnings" id="warnings" role="alert"><h2>Warnings '
            f'({len(items)})</h2><ul>{listed}</ul></div>')


_OWN_WARNINGS = ("bar_warning",)


def report_warnings(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Warnings a report carries that no page section knows by name: every entry of its
    ``warnings`` list (a string, or a mapping with ``message``) and every other top-level
    ``*_warning`` string or ``*_warnings`` list, so that a warning added to a report is
    never missing from its page."""
    found: list[Any] = list(report.get("warnings") or [])
    for key in sorted(report):
        if key in _OWN_WARNINGS or key == "warnings":
            continue
        if key.endswith("_warning") and report[key]:
            found.append(report[key])
        elif key.endswith("_warnings") and isinstance(report[key], list):
            found += report[key]
    items = []
    for w in found:
        text = w.get("message", w) if isinstance(w, Mapping) else w
        items.append(("", escape(str(text))))
    return items


def _detection_columns(key: Callable[[Row], Mapping[str, Any] | None]) -> list[Column]:
    def part(name: str) -> Callable[[Row], str]:
        return lambda r: fmt.count((key(r) or {}).get(name))
    return [("detections matched", part("matched"), ""), ("missed", part("missed"), ""),
            ("extra", part("extra"), "")]


def _task_cell(key: str, f: Callable[[Any], str]) -> Callable[[Row], str]:
    """A column's cell: a task result's ``key`` formatted (none on the reference row)."""
    return lambda r: fmt.MISSING if r.get("reference_row") else f(r["task"].get(key))


def _value_cell(key: str, f: Callable[[Any], str]) -> Callable[[Row], str]:
    return lambda r: f(r.get(key))


def _first_task(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for e in report["models"].values():
        task: Mapping[str, Any] | None = e.get("task")
        return task
    return None


def set_summaries(report: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """The lines describing the datasets a report was measured on (every top-level
    ``*_set`` summary with a ``text``: ``evaluation_set``, ``selection_set``) and their
    warnings when a set is too small to decide."""
    lines: list[str] = []
    warnings: list[tuple[str, str]] = []
    for key in sorted(report):
        summary = report[key]
        if not (key.endswith("_set") and isinstance(summary, Mapping) and "text" in summary):
            continue
        role = key[:-len("_set")]
        lines.append(f'<p id="{escape(role)}-set">{escape(role.capitalize())} set: '
                     f"{escape(str(summary['text']))}.</p>")
        if summary.get("warning"):
            wid = "set-warning" if not warnings else f"{role}-set-warning"
            warnings.append((wid, f"<b>Too small to decide:</b> "
                                  f"{escape(str(summary['warning']))}"))
    return lines, warnings


def _chart_label(name: str, names: Sequence[str]) -> str:
    """A point's label: the target name without the package shared by every point."""
    packages = {n.rsplit(":", 1)[0] for n in names if n.startswith("//") and ":" in n}
    return name.rsplit(":", 1)[1] if len(packages) == 1 and name.startswith("//") and \
        ":" in name else name


# ---- evaluate -------------------------------------------------------------------------

def _eval_basis(report: Mapping[str, Any]) -> str | None:
    """'cpu' when every timing has CPU time, 'wall' when some lacks it, None: untimed."""
    lat = report.get("latency")
    if not lat:
        return None
    timed = [e.get("latency") or {} for e in report["models"].values()]
    return "cpu" if lat["reference"].get("cpu") and all(t.get("cpu") for t in timed) \
        else "wall"


def _eval_timing(lat: Mapping[str, Any] | None, basis: str | None
                 ) -> tuple[float | None, float | None, float | None]:
    """(time ratio to the reference, its spread, the median ms) of one model's timing on
    the page's basis; the spread is half the interquartile range of the per-round
    ratios."""
    if not lat or basis is None:
        return None, None, None
    m = lat["cpu"] if basis == "cpu" else lat
    q1, q3 = fmt.number(m.get("ratio_q1")), fmt.number(m.get("ratio_q3"))
    spread = round((q3 - q1) / 2.0, 4) if q1 is not None and q3 is not None else None
    return fmt.number(m.get("ratio_to_reference")), spread, fmt.number(m.get("median_ms"))


def _eval_rows(report: Mapping[str, Any], basis: str | None) -> list[dict[str, Any]]:
    lat = report.get("latency") or {}
    ref_ms = _eval_timing(lat.get("reference"), basis)[2]
    ref_det = detections({"task": _first_task(report)})
    rows: list[dict[str, Any]] = [{
        "name": report["reference"], "role": "reference", "form": "float (reference)",
        "bytes": report.get("reference_bytes"), "ms": ref_ms, "rel": 1.0 if basis else None,
        "sqnr": math.inf, "task": {}, "reference_row": True,
        "labelled": dict(report.get("reference_labelled") or {}),
        "detections": ref_det and {"matched": ref_det["reference"], "missed": 0,
                                   "extra": 0}}]
    for label, e in report["models"].items():
        rel, spread, ms = _eval_timing(e.get("latency"), basis)
        sq = [x for m in e["outputs"].values() if (x := fmt.number(m["sqnr_db"])) is not None]
        form = (e["quantized"] or "float (nothing quantized)") if "quantized" in e else ""
        rows.append({"name": label, "form": form, "bytes": e.get("bytes"), "ms": ms,
                     "rel": rel, "noise": spread, "sqnr": min(sq) if sq else None,
                     "task": e.get("task") or {}, "detections": detections(e),
                     "labelled": dict(e.get("labelled") or {}),
                     "role": "baseline" if e.get("gated") is False else "candidate",
                     "slower": (e.get("latency") or {}).get("slower_than_reference")})
    return rows


def _eval_speed(r: Row) -> str | tuple[str, str]:
    if r.get("reference_row"):
        return "1.00× (reference)" if r.get("rel") else fmt.MISSING
    text = speed_text(r.get("rel"), r.get("noise"))
    if r.get("rel") is None:
        return text
    if _inside_noise(r.get("rel"), r.get("noise")):
        return text + " (inside the noise)", "the spread includes the reference's speed"
    if r.get("slower"):
        return text + " slower", "slower than the reference"
    return text


def _eval_columns(report: Mapping[str, Any], rows: Sequence[Row], basis: str | None
                  ) -> list[Column]:
    cols: list[Column] = [("model", lambda r: str(r["name"]), "text"),
                          ("quantized as", lambda r: str(r["form"]), "text")]
    if any(r["role"] == "baseline" for r in rows):
        cols.append(("role", lambda r: str(r["role"]), "text"))
    if basis:
        kind = "CPU" if basis == "cpu" else "wall"
        cols += [(f"speed vs reference ({kind} time, 1 thread)", _eval_speed, ""),
                 (f"{kind} time per run", lambda r: fmt.ms(r.get("ms")), "secondary")]
    cols += [("size", lambda r: fmt.size(r.get("bytes")), ""),
             ("worst SQNR", lambda r: fmt.db(r.get("sqnr")), "")]
    task = str(report.get("task", "sqnr"))
    shown = [(k, t, f) for k, t, f in _TASK_COLUMNS
             if any(k in r["task"] for r in rows)]
    cols += [(t, _task_cell(k, f), "") for k, t, f in shown]
    if task == "psnr":
        cols.append(("PSNR", _task_cell("score", fmt.db), ""))
    elif not shown and task != "sqnr":
        cols.append((f"{task} score", _task_cell("score", fmt.plain), ""))
    # labelled metrics (ground truth), with each model's drop from the reference
    for k in _LABELLED:
        if k in (report.get("reference_labelled") or {}):
            cols += [(f"{k} (labels)", _labelled_cell(k), ""),
                     (f"{k} drop", _labelled_cell(k, drop=True), "")]
    if any(r.get("detections") for r in rows):
        cols += _detection_columns(lambda r: r.get("detections"))
    return cols


_LABELLED = ("map", "map50", "map75", "top1", "top5")


def _labelled_cell(key: str, drop: bool = False) -> Callable[[Row], str]:
    def cell(r: Row) -> str:
        found = r.get("labelled") or {}
        value = (found.get("drop") or {}).get(key) if drop else found.get(key)
        return fmt.score(value)
    return cell


def _eval_warnings(report: Mapping[str, Any], rows: Sequence[Row],
                   basis: str | None) -> list[tuple[str, str]]:
    items = []
    lat = report.get("latency") or {}
    kind = "CPU" if basis == "cpu" else "wall"
    for r in rows:
        if r.get("slower"):
            items.append(("", f"<b>{escape(str(r['name']))}</b> is slower than the "
                              f"reference: it runs at "
                              f"{escape(speed_text(r.get('rel'), r.get('noise')))} the "
                              f"reference's speed ({kind} time, 1 thread)"))
    if lat.get("noisy"):
        items.append(("latency-noisy", "The timing is noisy: the interquartile range of "
                      "some model's times is above 10 % of its median (other load on the "
                      "machine?)."))
    return items + set_summaries(report)[1] + report_warnings(report)


def _counts_line(samples: Any, det: Mapping[str, Any] | None, who: str) -> str:
    line = f"Measured on <b>{fmt.count(samples)}</b> sample(s)"
    if det is not None:
        line += (f"; {escape(who)} detects <b>{fmt.count(det['reference'])}</b> object(s) "
                 "on them: each model's detections are matched against those "
                 "(missed: not found; extra: found but not by the reference)")
    return line + "."


def evaluate_html(report: Mapping[str, Any]) -> str:
    """report.html of an ``evaluate`` report."""
    basis = _eval_basis(report)
    rows = _eval_rows(report, basis)
    ref_det = detections({"task": _first_task(report)})
    sections = [warnings_box(_eval_warnings(report, rows, basis) + _runtime_failures(report)),
                runtime_line(report.get("runtime")),
                f"<p>{_counts_line(report.get('samples'), ref_det, 'the reference')} "
                f"Task <b>{escape(str(report.get('task', 'sqnr')))}</b>.</p>",
                *set_summaries(report)[0],
                _table(rows, _eval_columns(report, rows, basis), None)]
    if basis:
        lat = report["latency"]
        sections.append(
            f'<p class="note" id="speed-basis">Speed: the reference\'s '
            f'{"CPU" if basis == "cpu" else "wall"} time over the model\'s, median of '
            f"the per-round ratios of {fmt.count(lat.get('runs'))} rounds timing every model "
            "interleaved in one process (1 thread, after warm-up rounds); ± half their "
            "interquartile range. Above 1.00× is faster.</p>")
    sections.append(_eval_chart(report, rows, basis))
    return page(f"evaluate: {len(report['models'])} model(s) vs {report['reference']}",
                sections)


def _eval_chart(report: Mapping[str, Any], rows: Sequence[Row], basis: str | None) -> str:
    task = str(report.get("task", "sqnr"))
    y_title, y_key, y_fmt = "worst SQNR", "", fmt.db
    shown = [(k, t, f) for k, t, f in _TASK_COLUMNS if any(k in r["task"] for r in rows)]
    if shown:
        y_key, y_title, y_fmt = shown[0]
    elif task != "sqnr":
        y_key, y_title, y_fmt = "score", ("PSNR" if task == "psnr" else f"{task} score"), (
            fmt.db if task == "psnr" else fmt.plain)

    def y_get(r: Row) -> Any:
        return r["task"].get(y_key) if y_key else r.get("sqnr")

    models = [r for r in rows if not r.get("reference_row")]
    names = [str(r["name"]) for r in models]
    if basis:
        pts = [(str(r["name"]), _speed_value(r.get("rel")), fmt.number(y_get(r)))
               for r in models]
        x = ("speed vs reference (×, right is faster)", fmt.ratio, True)
    else:
        pts = [(str(r["name"]), fmt.number(r.get("bytes")), fmt.number(y_get(r)))
               for r in models]
        x = ("size", fmt.size, False)
    return "<h2>Accuracy vs " + ("speed" if basis else "size") + "</h2>\n" + scatter_svg(
        pts, x[0], y_title, x[1], y_fmt, higher_x_better=x[2],
        x_mark=1.0 if basis else None, labels={n: _chart_label(n, names) for n in names})


def _speed_value(rel: Any) -> float | None:
    s = speed(rel)
    return None if s is None else s[0]


# ---- auto_quantize --------------------------------------------------------------------

def _latency_warning(result: Mapping[str, Any]) -> tuple[str, str] | None:
    choice = result.get("latency_choice") or {}
    if not choice.get("inside_noise"):
        return None
    if choice.get("tied"):
        return ("latency-tie", (
            f"The winner's speed margin is <b>inside the timing noise</b>: "
            f"{escape(', '.join(choice['tied']))} are tied on speed, so "
            f"{escape(str(result['chosen']))} was chosen by "
            f"<b>{escape(choice['decided_by'])}</b>, not by speed."))
    return ("latency-tie", (
        "The fastest trial's margin over float is <b>inside the timing noise</b>: "
        "no trial is clearly faster, so the float model (the most accurate) is kept."))


def _auto_warnings(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The warnings box of a search: most trials failed, a task-blind bar on a detector, a
    speed margin inside the noise, and every other warning the result carries."""
    items: list[tuple[str, str]] = []
    failures = result.get("failures") or {}
    if failures.get("most"):
        listed = "".join(f"<li>{r['count']}× {escape(r['reason'])} "
                         f"({escape(', '.join(r['trials']))})</li>"
                         for r in failures["reasons"])
        items.append(("failures", f"<b>Most trials failed: {failures['failed']} of "
                                  f"{failures['trials']}.</b><ul>{listed}</ul>"))
    if result.get("bar_warning"):
        items.append(("bar-warning", f"<b>Task-blind bar:</b> "
                                     f"{escape(result['bar_warning'])}"))
    items += set_summaries(result)[1]
    tie = _latency_warning(result)
    if tie:
        items.append(tie)
    return items + report_warnings(result)


def _bar_text(bar: Mapping[str, Any], max_drop: Mapping[str, Any] | None = None) -> str:
    parts = []
    for k, v in bar.items():
        title, f, higher = _BAR_COLUMNS.get(k, (k, fmt.plain, True))
        parts.append(f"{title} {'≥' if higher else '≤'} {f(v)} ({k})")
    parts += [f"max_drop {k} = {v}" for k, v in (max_drop or {}).items()]
    return ", ".join(parts)


def _auto_speed(r: Row) -> str | tuple[str, str]:
    if r.get("status") == "float":
        return "1.00× (baseline)" if r.get("relative_latency") is not None else fmt.MISSING
    s = speed(r.get("relative_latency"), r.get("latency_noise"))
    if s is None:
        return fmt.MISSING
    text = fmt.ratio_pm(s[0], s[1])
    tip = ""
    if s[1] is not None:
        tip = (f"from {fmt.ratio(s[0] - s[1])} to {fmt.ratio(s[0] + s[1])}"
               + (" (includes float's speed)" if abs(s[0] - 1.0) <= s[1] else ""))
    return text, tip


def _auto_columns(result: Mapping[str, Any], rows: Sequence[Row]) -> list[Column]:
    cols: list[Column] = [("trial", lambda r: str(r["name"]), "text")]
    if any(r.get("relative_latency") is not None for r in rows):
        cols.append(("speed vs float (CPU time, 1 thread)", _auto_speed, ""))
    if any(r.get("cpu_ms") is not None for r in rows):
        cols.append(("CPU time per run", lambda r: fmt.ms(r.get("cpu_ms")), "secondary"))
    cols.append(("size", lambda r: fmt.size(r.get("bytes")), ""))
    for k in result["bar"]:
        title, f, _ = _BAR_COLUMNS.get(k, (k, fmt.plain, True))
        cols.append((title, _value_cell(k, f), ""))
    for k in result.get("max_drop") or {}:
        cols += [(f"{k} (labels)", _value_cell(k, fmt.score), ""),
                 (f"{k} drop", _value_cell(f"{k}_drop", fmt.score), "")]
    if "min_sqnr_db" not in result["bar"]:
        cols.append(("worst SQNR", lambda r: fmt.db(r.get("worst_sqnr_db")), ""))
    if any(r.get("detections") for r in rows):
        cols += _detection_columns(lambda r: r.get("detections"))
    cols += [("float / promoted nodes", lambda r: fmt.count(r.get("float_nodes")), ""),
             ("meets bar", _meets, "text"),
             ("status", lambda r: str(r.get("status", "")), "text")]
    return cols


def _meets(r: Row) -> str:
    passes = r.get("passes")
    return fmt.MISSING if passes is None else "yes" if passes else "no"


def _timing_note(result: Mapping[str, Any]) -> str:
    timing = result.get("timing")
    if not timing:
        return ""
    floor = speed(1.0, timing.get("noise_floor"))
    floor_text = f"± {fmt.fixed(floor[1] if floor else None, 2)}"
    need = result.get("min_speedup")
    return (f'<p class="note" id="speed-basis">Speed: float\'s CPU time over the trial\'s, '
            f"median of the per-round ratios of one run timing float and every trial "
            f"interleaved ({fmt.count(timing.get('rounds'))} rounds, 1 thread, after "
            f"warm-up rounds); ± half its {fmt.percent(timing.get('coverage'), 0)} "
            f"interval, at least the noise floor {escape(floor_text)} "
            f"(how far a second session of the float model strays from 1.00×). Above "
            f"1.00× is faster"
            + (f"; a trial replaces float only at {escape(fmt.ratio(need))} or more at the "
               "slow end of its interval" if need else "") + ".</p>")


def runtime_line(runtime: Mapping[str, Any] | None,
                 baseline: Mapping[str, Any] | None = None) -> str:
    """Where the models ran and were timed: the runtime, its version and default
    precision, and the float form the speeds are against ("" when not recorded)."""
    if not runtime or not runtime.get("name"):
        return ""
    text = f"Run and timed on <b>{escape(str(runtime['name']))}</b>"
    if runtime.get("version"):
        text += f" {escape(str(runtime['version']))}"
    if runtime.get("default_precision"):
        text += f" (default precision {escape(str(runtime['default_precision']))})"
    forms = (baseline or {}).get("forms_ms") or {}
    if baseline and baseline.get("form"):
        shown = ", ".join(f"{escape(str(k))} {fmt.ms(v)}" for k, v in forms.items())
        text += (f"; float baseline: the fastest float form, "
                 f"<b>{escape(str(baseline['form']))}</b>" + (f" ({shown})" if shown else ""))
    elif runtime.get("float_forms"):
        text += "; float forms: " + escape(", ".join(map(str, runtime["float_forms"])))
    return f'<p id="runtime">{text}.</p>'


def _runtime_failures(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A warning for each model the target runtime computes differently from
    onnxruntime (``runtime_check``)."""
    items: list[tuple[str, str]] = []
    for label, entry in (report.get("models") or {}).items():
        check = entry.get("runtime_check") if isinstance(entry, Mapping) else None
        if isinstance(check, Mapping) and check.get("ok") is False:
            items.append((f"runtime-check-{len(items)}", f"<b>{escape(str(label))}</b>: "
                                           f"{escape(str(check.get('reason', '')))}"))
    return items


def _summary(result: Mapping[str, Any]) -> str:
    det = (result["float"].get("detections") or None)
    counts = _counts_line(result.get("samples"), det, "the float model") \
        if result.get("samples") is not None else ""
    return (runtime_line(result.get("runtime"), result.get("float_baseline")) +
            f"<p>{counts} Objective: <b>{escape(result['objective'])}</b>; bar: "
            f"{escape(_bar_text(result['bar'], result.get('max_drop')))}.</p>" +
            "".join(set_summaries(result)[0]) +
            f"<p>Chosen: <b id=\"chosen\">{escape(result['chosen'])}</b> — "
            f"{escape(result['note'])}</p>")


def _misses(r: Row, bar: Mapping[str, Any]) -> list[str]:
    out = []
    for k, limit in bar.items():
        title, f, higher = _BAR_COLUMNS.get(k, (k, fmt.plain, True))
        v = fmt.number(r.get(k))
        if v is None:
            out.append(f"{title}: not measured by this task")
        elif (v < limit) if higher else (v > limit):
            out.append(f"{title} {f(v)} {'below' if higher else 'above'} {f(limit)}")
    return out


def _verdict(r: Row, min_speedup: Any) -> str:
    verdict = str(r["latency_verdict"])
    if verdict.startswith("not clearly"):
        return (f"not clearly {fmt.ratio(min_speedup)} faster than float (speed "
                f"{speed_text(r.get('relative_latency'), r.get('latency_noise'))})")
    return verdict


def _why(result: Mapping[str, Any]) -> list[str]:
    notes = []
    if result.get("sensitivity_failed"):
        notes.append(f"<li>the sensitivity ranking failed: "
                     f"{escape(result['sensitivity_failed'])}</li>")
    for r in result["trials"]:
        name = escape(r["name"])
        if r.get("failed"):
            notes.append(f"<li>{name}: <b>failed</b>, left out: {escape(r['failed'])}</li>")
        if r.get("excluded"):
            notes.append(f"<li>{name}: left out: {escape(r['excluded'])}</li>")
        if r.get("misses"):
            notes.append(f"<li>{name}: misses "
                         f"{escape('; '.join(_misses(r, result['bar']) or r['misses']))}</li>")
        if r.get("latency_verdict"):
            notes.append(f"<li>{name}: speed: "
                         f"{escape(_verdict(r, result.get('min_speedup')))}</li>")
        if r.get("float_joins"):
            notes.append(f"<li>{name}: joins kept float (very different input ranges): "
                         f"{escape(', '.join(r['float_joins']))}</li>")
    return ["<h2>Why</h2>", "<ul>" + "".join(notes) + "</ul>"] if notes else []


def _auto_chart(result: Mapping[str, Any], rows: Sequence[Row]) -> str:
    bar_keys = [*result["bar"], *(result.get("max_drop") or {})]
    key = bar_keys[0] if bar_keys else "worst_sqnr_db"
    y_title, y_fmt, _ = _BAR_COLUMNS.get(key, (key, fmt.plain, True))
    by_speed = result["objective"] == "latency"
    pts = [(str(r["name"]),
            _speed_value(r.get("relative_latency")) if by_speed else fmt.number(r.get("bytes")),
            fmt.number(r.get(key))) for r in rows]
    chart = scatter_svg(pts, "speed vs float (×, right is faster)" if by_speed else "size",
                        y_title, fmt.ratio if by_speed else fmt.size, y_fmt,
                        chosen=str(result["chosen"]), higher_x_better=by_speed,
                        x_mark=1.0 if by_speed else None)
    return f"<h2>{escape(y_title)} vs {'speed' if by_speed else 'size'}</h2>\n{chart}"


def auto_html(label: str, result: Mapping[str, Any],
              sensitivity: Mapping[str, Any] | None = None) -> str:
    """report.html of an ``auto_quantize`` selection: every trial, the chart, the
    sensitivity ranking and what was kept float or promoted."""
    rows = [dict(result["float"]), *[dict(r) for r in result["trials"]]]
    sections = [warnings_box(_auto_warnings(result)), _summary(result),
                _table(rows, _auto_columns(result, rows), result["chosen"]),
                _timing_note(result), _auto_chart(result, rows), *_why(result)]
    if sensitivity and sensitivity.get("ranking"):
        items = []
        for r in sensitivity["ranking"][:30]:
            v = fmt.number(r.get("score"))
            if v is not None:
                items.append((r["site"], v))
        sections += ["<h2>Sensitivity (score with only this site quantized; low = "
                     "sensitive)</h2>", bars_svg(items, f"task: {sensitivity.get('task', '')}",
                                                   fmt.plain)]
    return page(f"auto_quantize {label}", sections)
