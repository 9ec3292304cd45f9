"""Issue 26, everyday use through the real ONNX rules: task options typed at analysis,
search findings in the search's report, progress inside long actions."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "testdata/models/mnist.onnx"

EVAL = """
[fp]
rule = "onnx_model"
src = "mnist.onnx"

[data]
rule = "synthetic_dataset"
model = ":fp"
count = 2

[ev]
rule = "evaluate"
models = [":fp"]
reference = ":fp"
dataset = ":data"
task = "detection"
task_options = {{ {options} }}
"""


def test_a_number_where_a_task_option_is_boolean_is_refused_in_one_line(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.write("m/BUILD.toml", EVAL.format(options='decoder = "ssd", background_class = 0'))
    r = ws.build("//m:ev")
    assert r.exit_code == 2
    assert r.error.count("\n") == 0
    assert "m/BUILD.toml, target //m:ev, attribute 'task_options'" in r.error
    assert "background_class: expected true or false, got 0 (write false)" in r.error
    ws.write("m/BUILD.toml", EVAL.format(options='score_threshold = "high"'))
    r = ws.build("//m:ev")
    assert r.exit_code == 2 and "score_threshold: expected a number" in r.error


def test_a_search_gathers_its_trials_findings_in_one_line():
    from qbuild_onnx.auto.plan import expand
    from qbuild_onnx.auto.select import findings_line

    tables, _own = expand("aq", {"rule": "auto_quantize", "model": ":pre",
                                 "calibration_data": ":c", "evaluation_data": ":e",
                                 "bar": {"min_sqnr_db": 20}, "steps": ["per_channel"]})
    evaluations = [t for name, t in tables.items() if ".ev_" in name]
    assert evaluations and all(t["latency_warnings"] is False for t in evaluations)
    rows = [{"name": "a", "slower_than_float": True, "noisy": True},
            {"name": "b", "slower_than_float": True}, {"name": "c", "status": "failed"},
            {"name": "d"}]
    assert findings_line(rows, 4) == ("2 of 4 trials slower than float; 1 of 4 trials timed "
                                      "with noisy latency; 1 of 4 trials failed and left out "
                                      "(each in the report's rows: report.html)")
    assert findings_line([{"name": "d"}], 1) is None


def _timed(median: float, ratio: float, q1: float, q3: float) -> dict[str, object]:
    return {"median_ms": median, "cpu": {"median_ms": median, "ratio_to_reference": ratio,
                                         "ratio_q1": q1, "ratio_q3": q3}}


def test_slower_than_the_reference_means_beyond_the_noise_in_one_line():
    from qbuild_onnx.rules.accuracy import slower_line
    from qbuild_onnx_common.latency import inside_noise

    # the walkthrough's float model timed against itself: median 2 % above, spread 9 %
    assert inside_noise(_timed(1.60, 1.0275, 0.9268, 1.103)["cpu"])
    # the unprocessed float model: 10 % slower, every round in [1.05, 1.13]
    assert not inside_noise(_timed(1.73, 1.0969, 1.0467, 1.1344)["cpu"])
    assert not inside_noise({"median_ms": 1.0})  # no per-round ratios: no noise to hide in
    ref = _timed(1.57, 1.0, 1.0, 1.0)
    report = {"latency": {"reference": ref, "slower_than_reference": ["//p:a", "//p:b"]},
              "models": {"//p:a": {"latency": _timed(1.73, 1.1, 1.05, 1.13)},
                         "//p:b": {"latency": _timed(1.80, 1.15, 1.1, 1.2)}}}
    assert slower_line(report) == (
        "//p:a (1.73 vs 1.57 ms), //p:b (1.8 vs 1.57 ms) are slower than the reference "
        "beyond the timing noise (CPU time, median, 1 thread)")
    report["latency"]["slower_than_reference"] = []
    assert slower_line(report) is None


def test_the_reference_itself_is_never_slower_than_the_reference(qbuild_workspace):
    """A search that keeps float hands on a byte-identical copy of the float model; an
    evaluate of it used to warn it was "slower than the reference" whenever its median
    came out a hair above float's (half the time: noise)."""
    ws = qbuild_workspace
    ws.copy(MNIST, "m/mnist.onnx")
    ws.copy(MNIST, "m/copy.onnx")
    ws.write("m/BUILD.toml", EVAL.replace('task = "detection"\ntask_options = {{ {options} }}',
                                          "latency_runs = 5").replace(
        'models = [":fp"]', 'models = [":copy"]') + '\n[copy]\nrule = "onnx_model"\n'
        'src = "copy.onnx"\n')
    r = ws.build("//m:ev")
    assert r.ok, r.error
    report = json.loads(next(p for p in r.outputs("//m:ev")
                             if p.name == "report.json").read_text())
    entry = report["models"]["//m:copy"]
    assert entry["same_as_reference"] is True
    assert entry["latency"]["slower_than_reference"] is False
    assert report["latency"]["slower_than_reference"] == []
    assert "slower than the reference" not in r.log
