"""report.html renders in a real browser: headless Chromium (Debian's `chromium`, listed in
.ci/apt-packages) loads the page with no console errors and the rendered DOM shows every
variant, the chart and the chosen trial."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from qbuild_onnx.report.html import auto_html, evaluate_html, pareto

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _auto_result():
    trials = [
        {"name": "u8", "order": 0, "latency_ms": 10.0, "bytes": 900, "passes": False,
         "misses": ["min_f1: 0.9 < 0.95"], "min_f1": 0.9, "worst_sqnr_db": 12.0,
         "float_joins": ["/model.22/Concat_out"]},
        {"name": "region_bc", "order": 1, "latency_ms": 11.0, "bytes": 1200, "passes": True,
         "misses": [], "min_f1": 0.96, "worst_sqnr_db": 18.0, "float_nodes": 42},
        {"name": "u16_k8", "order": 2, "latency_ms": 20.0, "bytes": 1500, "passes": True,
         "misses": [], "min_f1": 0.97, "worst_sqnr_db": 25.0, "float_nodes": 8},
    ]
    return {"objective": "latency", "bar": {"min_f1": 0.95}, "chosen": "region_bc",
            "note": "region_bc meets the bar at the lowest latency",
            "float": {"name": "float", "order": -1, "latency_ms": 13.5, "bytes": 3600,
                      "passes": True, "misses": [], "worst_sqnr_db": "inf", "min_f1": 1.0},
            "trials": trials}


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


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian "
                    "package `chromium`, listed in .ci/apt-packages)")
@pytest.mark.parametrize("kind", ["auto", "evaluate"])
def test_report_renders_in_headless_chromium(tmp_path, kind):
    if kind == "auto":
        html = auto_html("//m:auto", _auto_result(),
                         {"task": "detection", "ranking": [{"site": "output0", "score": 0.0}]})
        names = ["float", "u8", "region_bc", "u16_k8"]
        plotted = 4
    else:
        report = {"reference": "//m:fp", "samples": 4, "task": "detection",
                  "reference_bytes": 3600, "reference_latency_ms": 13.0,
                  "models": {f"//m:{n}": {"outputs": {"y": {"sqnr_db": 20.0}}, "bytes": 900,
                                          "latency_ms": 10.0 + i, "task": {"score": 0.9},
                                          "quantized": form}
                             for i, (n, form) in enumerate([("q_a", "QDQ"), ("q_b", None)])}}
        html = evaluate_html(report)
        names = ["//m:fp", "//m:q_a", "//m:q_b"]
        plotted = 2  # the candidates; the reference is the table's first row
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    r = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    console_errors = [ln for ln in r.stderr.splitlines()
                      if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln]
    assert not console_errors, console_errors
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", dom, re.S)
    for name in names:
        assert any(f">{name}" in row for row in rows), name
    assert dom.count('class="variant"') == plotted
    if kind == "evaluate":  # how each model is quantized; q_b is the float model renamed
        assert any(">//m:q_a<" in row and ">QDQ<" in row for row in rows)
        assert any(">//m:q_b<" in row and ">float (nothing quantized)<" in row for row in rows)
    if kind == "auto":
        assert 'id="chosen">region_bc<' in dom and "<rect" in dom
