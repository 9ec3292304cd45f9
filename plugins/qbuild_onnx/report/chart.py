"""The inline SVG charts of the report pages: an accuracy-vs-cost scatter with the Pareto
front and a visible label on every point, placed so that no two labels overlap, and a
horizontal bar chart (the sensitivity ranking).

Labels are placed greedily in the points' order: the first of a list of spots around its
point (right, left, above, below, then further out with a leader line) whose estimated
box overlaps no placed label, no point and stays inside the chart. A label that finds no
spot is listed under the chart instead; every point also carries its name, values and an
accessible label (``aria-label`` and ``<title>``). Deterministic: the output depends only
on the arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

W, H = 680, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50
FONT = 11
#: estimated width of a character of the 11 px sans-serif labels (generous: a wide font
#: must not make labels overlap)
CHAR_W = 0.62 * FONT
RADIUS = 5

Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (lower cost, higher accuracy)."""
    front = []
    for i, (c, a) in enumerate(points):
        if not any((c2 <= c and a2 >= a) and (c2 < c or a2 > a)
                   for j, (c2, a2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _spots(px: float, py: float) -> list[tuple[float, float, str]]:
    """Candidate label anchors (x, baseline y, text-anchor) around a point, nearest
    first."""
    near = [(px + 8, py + 4, "start"), (px - 8, py + 4, "end"),
            (px, py - 9, "middle"), (px, py + 17, "middle")]
    far = []
    for step in range(1, 6):
        dy = 13 * step
        far += [(px + 8, py + 4 - dy, "start"), (px + 8, py + 4 + dy, "start"),
                (px - 8, py + 4 - dy, "end"), (px - 8, py + 4 + dy, "end")]
    return near + far


def _box(x: float, y: float, anchor: str, width: float) -> Box:
    x0 = x if anchor == "start" else x - width if anchor == "end" else x - width / 2
    return (x0, y - FONT + 1, x0 + width, y + 3)


def place_labels(points: Sequence[tuple[float, float]], texts: Sequence[str],
                 bounds: Box = (0, 0, W, H)) -> list[tuple[float, float, str] | None]:
    """Per point, where its label goes (x, baseline y, text-anchor), or None: no spot
    free of the other labels and points."""
    placed: list[Box] = []
    dots = [(x - RADIUS, y - RADIUS, x + RADIUS, y + RADIUS) for x, y in points]
    out: list[tuple[float, float, str] | None] = []
    for (px, py), text in zip(points, texts, strict=True):
        width = len(text) * CHAR_W
        spot = None
        for x, y, anchor in _spots(px, py):
            b = _box(x, y, anchor, width)
            inside = (b[0] >= bounds[0] and b[1] >= bounds[1] and b[2] <= bounds[2]
                      and b[3] <= bounds[3])
            if inside and not any(_overlaps(b, o) for o in placed + dots):
                spot = (x, y, anchor)
                placed.append(b)
                break
        out.append(spot)
    return out


def _ticks(lo: float, hi: float) -> list[float]:
    return [lo, (lo + hi) / 2, hi]


def _axes(x_label: str, y_label: str, x_ticks: Sequence[tuple[float, str]],
          y_ticks: Sequence[tuple[float, str]]) -> list[str]:
    parts = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" '
             'stroke="#333"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#333"/>',
             f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 10}" text-anchor="middle">'
             f'{escape(x_label)}</text>',
             f'<text x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
             f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{escape(y_label)}</text>']
    for i, (x, text) in enumerate(x_ticks):
        anchor = "start" if i == 0 else "end" if i == len(x_ticks) - 1 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" font-size="{FONT}" '
                     f'text-anchor="{anchor}">{escape(text)}</text>')
    for y, text in y_ticks:
        parts.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" font-size="{FONT}" '
                     f'text-anchor="end">{escape(text)}</text>')
    return parts


def _scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    # 8 % padding on both ends: points (and their labels) clear of the axes
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad
    return lambda v: a + (v - lo) / (hi - lo) * (b - a)


def _why_not_plotted(name: str, x: float | None, y: float | None, x_label: str,
                     y_label: str, x_fmt: Callable[[float], str],
                     y_fmt: Callable[[float], str]) -> str:
    why = [f"no {label.split(' (')[0]}" if v is None else
           f"{label.split(' (')[0]} {f(v)}" for v, label, f in ((x, x_label, x_fmt),
                                                                (y, y_label, y_fmt))
           if v is None or not math.isfinite(v)]
    return f"{name} ({', '.join(why)})"


def scatter_svg(points: Sequence[tuple[str, float | None, float | None]], x_label: str,
                y_label: str, x_fmt: Callable[[float], str], y_fmt: Callable[[float], str],
                chosen: str | None = None, higher_x_better: bool = False,
                x_mark: float | None = None,
                labels: Mapping[str, str] | None = None) -> str:
    """A chart of accuracy (y, higher is better) against cost or speed (x; lower is better
    unless ``higher_x_better``) of the points that have both, the Pareto front joined,
    every point labelled (``labels``: a shorter text per name), a dashed vertical line
    at ``x_mark`` (the reference's speed) when it is in range."""
    pts = [(n, x, y) for n, x, y in points if x is not None and y is not None
           and math.isfinite(x) and math.isfinite(y)]
    if not pts:
        return (f'<p class="note">No variant has both {escape(x_label)} and '
                f'{escape(y_label)}.</p>')
    left_out = [_why_not_plotted(n, x, y, x_label, y_label, x_fmt, y_fmt)
                for n, x, y in points if (n, x, y) not in pts]
    xs, ys = [p[1] for p in pts], [p[2] for p in pts]
    x_lo, x_hi = min(xs), max(xs)
    if x_mark is not None and x_lo <= x_mark * 1.5 and x_hi >= x_mark / 1.5:
        x_lo, x_hi = min(x_lo, x_mark), max(x_hi, x_mark)
    sx = _scale(x_lo, x_hi, LEFT, W - RIGHT)
    sy = _scale(min(ys), max(ys), H - BOTTOM, TOP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'role="img" aria-label="{escape(y_label)} vs {escape(x_label)}">',
             *_axes(x_label, y_label, [(sx(v), x_fmt(v)) for v in _ticks(x_lo, x_hi)],
                    [(sy(v), y_fmt(v)) for v in _ticks(min(ys), max(ys))])]
    if x_mark is not None and x_lo <= x_mark <= x_hi:
        parts.append(f'<line x1="{sx(x_mark):.1f}" y1="{TOP}" x2="{sx(x_mark):.1f}" '
                     f'y2="{H - BOTTOM}" stroke="#999" stroke-dasharray="2 4"/>')
    front = pareto([(-p[1] if higher_x_better else p[1], p[2]) for p in pts])
    if len(front) > 1:
        path = " ".join(f"{sx(pts[i][1]):.1f},{sy(pts[i][2]):.1f}" for i in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#393" '
                     f'stroke-dasharray="4 3"/>')
    xy = [(sx(x), sy(y)) for _, x, y in pts]
    texts = [(labels or {}).get(n, n) for n, _, _ in pts]
    spots = place_labels(xy, texts, (LEFT + 1, TOP - 15, W, H - BOTTOM - 1))
    unplaced = []
    for i, ((name, x, y), (cx, cy), text, spot) in enumerate(zip(pts, xy, texts, spots,
                                                                 strict=True)):
        colour = "#1a7f1a" if name == chosen else ("#2a5db0" if i in front else "#888")
        desc = f"{name}: {y_label} {y_fmt(y)}, {x_label.split(' (')[0]} {x_fmt(x)}"
        parts.append(f'<g class="point" aria-label="{escape(desc)}">'
                     f'<circle class="variant" cx="{cx:.1f}" cy="{cy:.1f}" r="{RADIUS}" '
                     f'fill="{colour}"><title>{escape(desc)}</title></circle>')
        if spot is None:
            unplaced.append(desc)
        else:
            lx, ly, anchor = spot
            if abs(ly - 4 - cy) > 10:  # a label moved away from its point: a leader line
                parts.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{lx:.1f}" '
                             f'y2="{ly - 4:.1f}" stroke="#bbb"/>')
            parts.append(f'<text class="point-label" x="{lx:.1f}" y="{ly:.1f}" '
                         f'text-anchor="{anchor}">{escape(text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    notes = []
    if unplaced:
        notes.append("no room for the label of: " + "; ".join(unplaced))
    if left_out:
        notes.append("not plotted: " + "; ".join(left_out))
    return "\n".join(parts) + "".join(f'\n<p class="note">{escape(n)}</p>' for n in notes)


def bars_svg(items: Sequence[tuple[str, float]], label: str,
             value_fmt: Callable[[float], str] = str) -> str:
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
                     f'fill="#c66"><title>{escape(name)}: {escape(value_fmt(v))}</title></rect>')
    parts.append("</svg>")
    return "\n".join(parts)
