"""report.html renders in a real browser: headless Chromium (Debian's `chromium`, listed in
.ci/apt-packages) loads the page with no console errors and the rendered DOM shows every
variant, the chart with a visible label on every point (none overlapping another text
of the chart, as the browser lays them out), the speed column and the warnings box.

The pages have no script; the test measures the layout by loading a copy of the page
with a script appended that writes the rendered label boxes into the DOM."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from qbuild_onnx.report.html import auto_html, evaluate_html, pareto

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Appended to a copy of the page: every chart's text boxes as laid out by the browser,
# and the pairs of them that overlap, as JSON in <pre id="layout">.
MEASURE = """<script>
const out = [];
for (const svg of document.querySelectorAll("svg")) {
  const boxes = [...svg.querySelectorAll("text")].map(t => {
    const b = t.getBBox(); return {text: t.textContent, label: t.classList.contains(
      "point-label"), x0: b.x, y0: b.y, x1: b.x + b.width, y1: b.y + b.height}; });
  const overlaps = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 && (a.label || b.label))
      overlaps.push([a.text, b.text]);
  }
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  const outside = boxes.filter(b => b.x0 < 0 || b.y0 < 0 || b.x1 > w || b.y1 > h)
    .map(b => b.text);
  out.push({labels: boxes.filter(b => b.label).map(b => b.text), overlaps, outside});
}
const pre = document.createElement("pre"); pre.id = "layout";
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


def _auto_result():
    trials = [
        {"name": "u8", "order": 0, "relative_latency": 0.62, "latency_noise": 0.05,
         "cpu_ms": 8.4, "bytes": 68_400, "passes": False, "misses": ["min_f1: 0.9 < 0.95"],
         "min_f1": 0.9, "worst_sqnr_db": 12.0, "float_joins": ["/model.22/Concat_out"],
         "detections": {"reference": 40, "candidate": 41, "matched": 36, "missed": 4,
                        "extra": 5}, "status": "misses the bar"},
        {"name": "region_bc", "order": 1, "relative_latency": 0.70, "latency_noise": 0.05,
         "cpu_ms": 9.5, "bytes": 1_200_000, "passes": True, "misses": [], "min_f1": 0.96,
         "worst_sqnr_db": 18.0, "float_nodes": 42, "status": "chosen",
         "latency_verdict": "tied on latency (inside the noise)"},
        {"name": "region_bc_twin", "order": 2, "relative_latency": 0.71,
         "latency_noise": 0.05, "cpu_ms": 9.6, "bytes": 1_210_000, "passes": True,
         "misses": [], "min_f1": 0.96, "worst_sqnr_db": 18.0, "float_nodes": 42,
         "status": "meets the bar", "latency_verdict": "tied on latency (inside the noise)"},
        {"name": "u16_k8", "order": 3, "relative_latency": 0.95, "latency_noise": 0.06,
         "cpu_ms": 12.9, "bytes": 1_500_000, "passes": True, "misses": [], "min_f1": 0.97,
         "worst_sqnr_db": 25.0, "float_nodes": 8, "status": "meets the bar",
         "latency_verdict": "not clearly 1.05x faster than float (ratio 0.95 ± 0.06)"},
    ]
    return {"objective": "latency", "bar": {"min_f1": 0.95}, "chosen": "region_bc",
            "note": "region_bc meets the bar at 1.429x float's speed; ...",
            "min_speedup": 1.05, "samples": 8,
            "timing": {"basis": "cpu", "rounds": 20, "noise_floor": 0.04, "coverage": 0.9,
                       "float_median_ms": 13.5},
            "latency_choice": {"tied": ["region_bc", "region_bc_twin"],
                               "decided_by": "size", "inside_noise": True},
            "bar_warning": "the bar min_sqnr_db does not measure detections",
            "warnings": ["only 8 evaluation samples"],
            "float": {"name": "float", "order": -1, "relative_latency": 1.0, "cpu_ms": 13.5,
                      "bytes": 3_600_000, "passes": True, "misses": [], "status": "float",
                      "worst_sqnr_db": "inf", "min_f1": 1.0,
                      "detections": {"reference": 40, "candidate": 40, "matched": 40,
                                     "missed": 0, "extra": 0}},
            "trials": trials}


def _evaluate_report():
    def entry(i, form):
        return {"outputs": {"y": {"sqnr_db": 20.0 + i}}, "bytes": 68_000 + 1000 * i,
                "quantized": form, "latency_ms": 10.0 + i,
                "task": {"f1": 0.9 - 0.1 * i, "score": 0.9 - 0.1 * i,
                         "reference_detections": 40, "candidate_detections": 38,
                         "matched": 36 - i},
                "latency": {"median_ms": 10.0 + i, "ratio_to_reference": 0.8,
                            "slower_than_reference": False,
                            "cpu": {"median_ms": 9.0 + i, "ratio_to_reference": 0.7 + 0.05 * i,
                                    "ratio_q1": 0.68 + 0.05 * i,
                                    "ratio_q3": 0.72 + 0.05 * i}}}
    return {"reference": "//m:fp", "samples": 4, "task": "detection",
            "reference_bytes": 3600, "reference_latency_ms": 13.0,
            "latency": {"runs": 20, "noisy": False, "slower_than_reference": [],
                        "reference": {"median_ms": 13.0, "cpu": {"median_ms": 12.5}}},
            "models": {f"//m:{n}": entry(i, form)
                       for i, (n, form) in enumerate([("q_a", "QDQ"), ("q_b", None)])}}


def test_pareto_front():
    assert pareto([(1, 0.5), (2, 0.9), (3, 0.8), (1.5, 0.5)]) == [0, 1]


def test_pages_are_static_and_small():
    sens = {"task": "detection", "ranking": [{"site": "output0", "score": 0.0},
                                             {"site": "1177", "score": 0.4}]}
    html = auto_html("//m:auto", _auto_result(), sens)
    assert "<script" not in html and "http" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert len(html) < 50_000
    assert html == auto_html("//m:auto", _auto_result(), sens)  # deterministic


def _render(tmp_path, html: str) -> tuple[str, dict | list]:
    """The DOM Chromium renders from ``html`` (console errors fail the test) and the
    layout the measuring script found."""
    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    r = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    console_errors = [ln for ln in r.stderr.splitlines()
                      if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln]
    assert not console_errors, console_errors
    layout = re.search(r'<pre id="layout">(.*?)</pre>', r.stdout, re.S)
    assert layout, "the measuring script did not run"
    return r.stdout, json.loads(layout.group(1).replace("&quot;", '"').replace(
        "&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian "
                    "package `chromium`, listed in .ci/apt-packages)")
@pytest.mark.parametrize("kind", ["auto", "evaluate"])
def test_report_renders_in_headless_chromium(tmp_path, kind):
    if kind == "auto":
        html = auto_html("//m:auto", _auto_result(),
                         {"task": "detection", "ranking": [{"site": "output0", "score": 0.0}]})
        names = ["float", "u8", "region_bc", "region_bc_twin", "u16_k8"]
        labels = names  # float is plotted: its F1 is 1 by definition
        speed_head, speed_cell = "speed vs float (CPU time, 1 thread)", "1.43× ± 0.10"
    else:
        html = evaluate_html(_evaluate_report())
        names = ["//m:fp", "//m:q_a", "//m:q_b"]
        labels = ["q_a", "q_b"]  # the candidates, without their shared package
        speed_head, speed_cell = "speed vs reference (CPU time, 1 thread)", "1.43× ± 0.04"
    dom, layout = _render(tmp_path, html)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", dom, re.S)
    for name in names:
        assert any(f">{name}<" in row for row in rows), name
    heads = re.findall(r"<th[^>]*>(.*?)</th>", rows[0])
    assert [h for h in heads if "speed" in h] == [speed_head]
    assert any(speed_cell in row for row in rows[1:]), speed_cell
    assert not re.search(r"\de[+-]\d", dom)  # one number format: no exponent
    chart = layout[0]
    assert sorted(chart["labels"]) == sorted(labels)
    assert chart["overlaps"] == [] and chart["outside"] == []
    assert dom.count('class="variant"') == len(labels)
    if kind == "evaluate":  # how each model is quantized; q_b is the float model renamed
        assert any(">//m:q_a<" in row and ">QDQ<" in row for row in rows)
        assert any(">//m:q_b<" in row and ">float (nothing quantized)<" in row for row in rows)
        assert "the reference detects <b>40</b> object(s)" in dom
    if kind == "auto":
        assert 'id="chosen">region_bc<' in dom and "<rect" in dom
        box = re.search(r'<div class="warnings".*?</div>', dom, re.S).group(0)
        for text in ('id="bar-warning"', 'id="latency-tie"', "only 8 evaluation samples"):
            assert text in box, text
        assert "Measured on <b>8</b> sample(s)" in dom
