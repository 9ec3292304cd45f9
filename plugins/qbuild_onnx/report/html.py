"""Static HTML reports (``report.html``) for ``evaluate`` and ``auto_quantize``: a table of
every variant (size, latency, accuracy), an accuracy-vs-cost chart with the Pareto front
and, when known, a per-site sensitivity chart and what was excluded or promoted and why.

Plain HTML with inline SVG and inline CSS: no script, no network, a few kilobytes. The
output depends only on the report dictionaries, so it is as deterministic as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

_CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}tr.chosen{background:#dfd}
tr.fail td{color:#a00}svg{border:1px solid #ccc;background:#fff}.note{color:#555}
.warn{color:#a00}"""


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if v in ("inf", "-inf", "nan"):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _fmt(v: Any, digits: int = 4) -> str:
    x = _num(v)
    if x is None:
        return "–" if v is None else escape(str(v))
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.0f}"


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (lower cost, higher accuracy)."""
    front = []
    for i, (c, a) in enumerate(points):
        if not any((c2 <= c and a2 >= a) and (c2 < c or a2 > a)
                   for j, (c2, a2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def scatter_svg(rows: Sequence[Mapping[str, Any]], x_key: str, y_key: str, x_label: str,
                y_label: str, chosen: str | None = None) -> str:
    """An accuracy (y) vs cost (x) chart of the rows that have both, front joined."""
    measured = [(str(r["name"]), _num(r.get(x_key)), _num(r.get(y_key))) for r in rows]
    pts = [(n, x, y) for n, x, y in measured if x is not None and y is not None
           and math.isfinite(x) and math.isfinite(y)]
    w, h, m = 560, 320, 50
    if not pts:
        return f'<p class="note">No variant has both {escape(x_label)} and {escape(y_label)}.</p>'
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    x1, y1 = (x1 + 1, y1 + 1) if x1 == x0 and y1 == y0 else (x1, y1)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def sx(x: float) -> float:
        return m + (x - x0) / (x1 - x0) * (w - 2 * m)

    def sy(y: float) -> float:
        return h - m - (y - y0) / (y1 - y0) * (h - 2 * m)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'role="img" aria-label="{escape(y_label)} vs {escape(x_label)}">',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="#333"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="#333"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">{escape(x_label)}</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" '
             f'text-anchor="middle">{escape(y_label)}</text>',
             f'<text x="{m}" y="{h - m + 16}" font-size="11">{_fmt(x0)}</text>',
             f'<text x="{w - m}" y="{h - m + 16}" font-size="11" text-anchor="end">'
             f'{_fmt(x1)}</text>',
             f'<text x="{m - 4}" y="{h - m}" font-size="11" text-anchor="end">{_fmt(y0)}</text>',
             f'<text x="{m - 4}" y="{m + 4}" font-size="11" text-anchor="end">{_fmt(y1)}</text>']
    front = pareto([(p[1], p[2]) for p in pts])
    if len(front) > 1:
        path = " ".join(f"{sx(pts[i][1]):.1f},{sy(pts[i][2]):.1f}" for i in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#393" '
                     f'stroke-dasharray="4 3"/>')
    for i, (name, x, y) in enumerate(pts):
        colour = "#1a7f1a" if name == chosen else ("#2a5db0" if i in front else "#888")
        parts.append(f'<circle class="variant" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5" '
                     f'fill="{colour}"><title>{escape(name)}: {_fmt(y)} at {_fmt(x)}</title>'
                     f'</circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def bars_svg(items: Sequence[tuple[str, float]], label: str) -> str:
    """A horizontal bar chart (sensitivity of the first sites)."""
    items = [(n, v) for n, v in items if math.isfinite(v)][:30]
    if not items:
        return ""
    w, row = 560, 16
    h = row * len(items) + 30
    lo = min(0.0, min(v for _, v in items))
    hi = max(v for _, v in items)
    hi = hi if hi > lo else lo + 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
             f'aria-label="{escape(label)}">',
             f'<text x="4" y="14" font-size="12">{escape(label)}</text>']
    for i, (name, v) in enumerate(items):
        y = 22 + i * row
        bw = (v - lo) / (hi - lo) * (w - 260)
        parts.append(f'<text x="4" y="{y + 11}" font-size="11">{escape(name[:36])}</text>')
        parts.append(f'<rect x="250" y="{y}" width="{max(bw, 1):.1f}" height="{row - 3}" '
                     f'fill="#c66"><title>{escape(name)}: {_fmt(v)}</title></rect>')
    parts.append("</svg>")
    return "\n".join(parts)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]],
           chosen: str | None) -> str:
    head = "".join(f"<th>{escape(t)}</th>" for _, t in columns)
    body = []
    for r in rows:
        cls = "chosen" if r["name"] == chosen else ("fail" if r.get("passes") is False else "")
        cells = "".join(f"<td>{escape(str(r.get(k, '')))}</td>" if k in ("name", "passes",
                        "note", "status") else f"<td>{_fmt(r.get(k))}</td>" for k, _ in columns)
        body.append(f'<tr class="{cls}">{cells}</tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1>\n" + "\n".join(sections) + "\n</body></html>\n")


def evaluate_html(report: Mapping[str, Any]) -> str:
    """report.html of an ``evaluate`` report."""
    rows = [{"name": report["reference"] + " (reference)", "bytes": report.get("reference_bytes"),
             "latency_ms": report.get("reference_latency_ms"), "score": None,
             "sqnr": "inf"}]
    for label, e in report["models"].items():
        sq = [x for m in e["outputs"].values() if (x := _num(m["sqnr_db"])) is not None]
        form = e["quantized"] or "float (nothing quantized)" if "quantized" in e else ""
        rows.append({"name": label, "bytes": e.get("bytes"), "latency_ms": e.get("latency_ms"),
                     "score": (e.get("task") or {}).get("score"),
                     "sqnr": min(sq) if sq else None, "note": _speed_note(report, e),
                     "status": form})
    y_key = "score" if report.get("task", "sqnr") != "sqnr" else "sqnr"
    x_key = "latency_ms" if any(r.get("latency_ms") is not None for r in rows) else "bytes"
    cols = [("name", "model"), ("status", "quantized as"), ("bytes", "size (bytes)"),
            ("latency_ms", "latency (ms)"),
            ("sqnr", "worst SQNR (dB)"), ("score", f"{report.get('task', 'sqnr')} score")]
    if any(r.get("note") for r in rows):
        cols.append(("note", "speed vs reference"))
    return page(f"evaluate: {len(report['models'])} model(s) vs {report['reference']}", [
        f"<p>{report['samples']} sample(s), task <b>{escape(str(report.get('task', 'sqnr')))}"
        "</b>.</p>",
        *_set_lines(report.get("evaluation_set"), "evaluation"),
        _table(rows, cols, None),
        scatter_svg(rows, x_key, y_key, x_key, y_key),
    ])


def _speed_note(report: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """'1.21x faster' / '0.85x: slower than the reference', on the basis the evaluation
    decided it (CPU time with one thread)."""
    lat, ref = entry.get("latency"), (report.get("latency") or {}).get("reference")
    if not lat or not ref:
        return ""
    cpu = lat.get("slower_basis") == "cpu" and lat.get("cpu") and ref.get("cpu")
    m, r = (lat["cpu"], ref["cpu"]) if cpu else (lat, ref)
    if not m.get("median_ms"):
        return ""
    x = r["median_ms"] / m["median_ms"]
    basis = "CPU" if cpu else "wall"
    if lat.get("slower_than_reference"):
        return f"{x:.2f}x ({basis} time): slower than the reference"
    return f"{x:.2f}x faster ({basis} time)"


def _set_lines(summary: Mapping[str, Any] | None, role: str) -> list[str]:
    """A dataset's counts and, when it is too small to decide, the warning
    (``accuracy.evidence.set_summary``)."""
    if not summary:
        return []
    lines = [f"<p id=\"{role}-set\">{role.capitalize()} set: {escape(summary['text'])}.</p>"]
    if summary.get("warning"):
        lines.insert(0, f"<p class=\"warn\" id=\"set-warning\"><b>Warning:</b> "
                        f"{escape(summary['warning'])}</p>")
    return lines


def _auto_warnings(result: Mapping[str, Any]) -> list[str]:
    """The lines that open an auto_quantize page: most trials failed, a task-blind bar on
    a detector, a selection set too small to decide, a latency margin inside the noise."""
    warnings: list[str] = []
    failures = result.get("failures") or {}
    if failures.get("most"):
        listed = "".join(f"<li>{r['count']}× {escape(r['reason'])} "
                        f"({escape(', '.join(r['trials']))})</li>"
                        for r in failures["reasons"])
        warnings.append(f"<p class=\"warn\" id=\"failures\"><b>Most trials failed: "
                        f"{failures['failed']} of {failures['trials']}.</b></p><ul>{listed}</ul>")
    if result.get("bar_warning"):
        warnings.append(f"<p class=\"warn\" id=\"bar-warning\"><b>Warning:</b> "
                        f"{escape(result['bar_warning'])}</p>")
    warnings += _set_lines(result.get("selection_set"), "selection")
    choice = result.get("latency_choice") or {}
    if choice.get("inside_noise") and choice.get("tied"):
        warnings.append(f"<p id=\"latency-tie\">The winner's latency margin was inside "
                        f"the timing noise (tied: {escape(', '.join(choice['tied']))}); "
                        f"chosen by {escape(choice['decided_by'])}.</p>")
    return warnings


def auto_html(label: str, result: Mapping[str, Any],
              sensitivity: Mapping[str, Any] | None = None) -> str:
    """report.html of an ``auto_quantize`` selection: every trial, the chart, the
    sensitivity ranking and what was kept float or promoted."""
    rows = [dict(result["float"]), *[dict(r) for r in result["trials"]]]
    for r in rows:
        if r.get("relative_latency") is not None and r.get("latency_noise") is not None:
            r["ratio_to_float"] = f"{r['relative_latency']} ± {r['latency_noise']}"
    bar_keys = list(result["bar"])
    cost_key = "latency_ms" if result["objective"] == "latency" else "bytes"
    acc_key = bar_keys[0] if bar_keys else "score"
    cols = [("name", "trial"), ("bytes", "size (bytes)"), ("latency_ms", "latency (ms)"),
            ("ratio_to_float", "time / float (± noise)"),
            *[(k, k) for k in bar_keys], ("worst_sqnr_db", "worst SQNR (dB)"),
            ("float_nodes", "float/promoted"), ("passes", "meets bar"), ("status", "status")]
    warnings = _auto_warnings(result)
    sections = [
        *warnings,
        f"<p>Objective: <b>{escape(result['objective'])}</b>; bar: "
        f"{escape(', '.join(f'{k} = {v}' for k, v in result['bar'].items()))}.</p>",
        f"<p>Chosen: <b id=\"chosen\">{escape(result['chosen'])}</b> — "
        f"{escape(result['note'])}</p>",
        _table(rows, cols, result["chosen"]),
        "<h2>Accuracy vs cost</h2>",
        scatter_svg(rows, cost_key, acc_key, cost_key, acc_key, result["chosen"]),
    ]
    notes = []
    if result.get("sensitivity_failed"):
        notes.append(f"<li>the sensitivity ranking failed: "
                     f"{escape(result['sensitivity_failed'])}</li>")
    for r in result["trials"]:
        if r.get("failed"):
            notes.append(f"<li>{escape(r['name'])}: <b>failed</b>, left out: "
                         f"{escape(r['failed'])}</li>")
        if r.get("excluded"):
            notes.append(f"<li>{escape(r['name'])}: left out: {escape(r['excluded'])}</li>")
        if r.get("misses"):
            notes.append(f"<li>{escape(r['name'])}: misses {escape('; '.join(r['misses']))}"
                         "</li>")
        if r.get("latency_verdict"):
            notes.append(f"<li>{escape(r['name'])}: latency: "
                         f"{escape(r['latency_verdict'])}</li>")
        if r.get("float_joins"):
            notes.append(f"<li>{escape(r['name'])}: joins kept float (very different input "
                         f"ranges): {escape(', '.join(r['float_joins']))}</li>")
    if notes:
        sections += ["<h2>Why</h2>", "<ul>" + "".join(notes) + "</ul>"]
    if sensitivity and sensitivity.get("ranking"):
        items = []
        for r in sensitivity["ranking"][:30]:
            v = _num(r.get("score"))
            if v is not None:
                items.append((r["site"], v))
        sections += ["<h2>Sensitivity (score with only this site quantized; low = "
                     "sensitive)</h2>", bars_svg(items, f"task: {sensitivity.get('task', '')}")]
    return page(f"auto_quantize {label}", sections)
