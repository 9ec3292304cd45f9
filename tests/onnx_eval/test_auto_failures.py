"""auto_quantize when trials fail or quantize nothing: on a one-Conv model every
sensitive region is the whole model, so the region trials keep every node float (their
lowered sibling used to fail the whole search: "not a QDQ model"). Such trials are listed
and never chosen; a trial that fails is reported with its reason and left out, the search
fails only when every trial does, and a failure is never cached as a result."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from qbuild_lower import rules as rules_lower
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.rules import quantize as rules_quantize
from qbuild_onnx.rules import source as rules_source

BUILD = """
[fp]
rule = "onnx_model"
src = "conv.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp"

[calib_data]
rule = "numpy_dataset"
files = ["calib.npy"]
mapping = {{ x = "calib.npy" }}

[eval_data]
rule = "numpy_dataset"
files = ["eval.npy"]
mapping = {{ x = "eval.npy" }}

[auto]
rule = "auto_quantize"
model = ":pre"
calibration_data = ":calib_data"
evaluation_data = ":eval_data"
bar = {{ min_sqnr_db = 15 }}
objective = "size"
latency_runs = 0
steps = ["region", "lower"]
sensitivity_samples = 2
sensitivity_shards = 1
{extra}
"""

# A user's signal-to-noise metric with the classic bug: the noise of a model identical
# to the float one is 0.0, and Python's float division raises.
METRIC = '''
import numpy as np

def snr(ref, cand, options):
    s = sum(float((r[k] ** 2).sum()) for r in ref for k in r)
    n = sum(float(((r[k] - c[k]) ** 2).sum()) for r, c in zip(ref, cand) for k in r)
    return {"score": 10 * np.log10(s / n){always}}
'''


def _conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(32, 16, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(32,)).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "one_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 16, 16])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from qbuild.testing import Workspace

    root = tmp_path_factory.mktemp("auto_failures")
    w = Workspace(root / "ws", root / "cache")
    for plugin in (rules_source, rules_quantize, rules_accuracy, rules_lower):
        w.register(plugin)
    w.path("m").mkdir(parents=True, exist_ok=True)
    onnx.save(_conv_model(), w.path("m/conv.onnx"))
    rng = np.random.default_rng(1)
    np.save(w.path("m/calib.npy"), rng.random((4, 1, 16, 16, 16), np.float32))
    np.save(w.path("m/eval.npy"), rng.random((4, 1, 16, 16, 16), np.float32))
    return w


def _report(r) -> dict:
    return json.loads(next(p for p in r.outputs("//m:auto")
                           if p.name == "report.json").read_text())


def test_trials_that_quantize_nothing_are_listed_never_chosen(ws):
    ws.write("m/BUILD.toml", BUILD.format(extra=""))
    r = ws.build("//m:auto")
    assert r.ok, r.error
    assert not r.tolerated  # nothing failed: the lowering copies a float source
    rep = _report(r)
    rows = {t["name"]: t for t in rep["trials"]}
    assert set(rows) == {"u8", "region", "region_bc", "region3", "region3_bc",
                         "region_bc_int"}
    for name in ("region", "region_bc", "region3", "region3_bc", "region_bc_int"):
        assert rows[name]["status"] == "quantizes nothing" and not rows[name]["passes"]
        assert "float model" in rows[name]["excluded"]
    assert rows["u8"]["passes"] and rep["chosen"] == "u8"
    # the lowered trial reports what its source kept float (lowering passes it on)
    assert rows["region_bc_int"]["float_nodes"] == rows["region_bc"]["float_nodes"] == 1
    html = next(p for p in r.outputs("//m:auto") if p.name == "report.html").read_text()
    assert "quantizes nothing" in html


def test_a_failing_trial_is_reported_and_left_out(ws):
    ws.write("m/snr.py", METRIC.replace("{always}", ""))
    ws.write("m/BUILD.toml", BUILD.format(
        extra='task = "custom"\ntask_options = { metric = "snr:snr" }\n'
              'metric_srcs = ["snr.py"]\nbar = { min_score = 15 }').replace(
        "bar = { min_sqnr_db = 15 }\n", ""))
    r = ws.build("//m:auto")
    assert r.ok, r.error
    rep = _report(r)
    rows = {t["name"]: t for t in rep["trials"]}
    # the metric raises on every float-identical trial: their evaluations fail
    failed = {n for n, t in rows.items() if t["status"] == "failed"}
    assert failed == {"region", "region_bc", "region3", "region3_bc", "region_bc_int"}
    assert all("ZeroDivisionError" in rows[n]["failed"] for n in failed)
    assert set(r.tolerated) == {f"//m:auto.ev_{n}" for n in failed}
    # most trials failed: said loudly, in the note, the report, the page and the console
    assert rep["chosen"] == "u8" and rep["note"].startswith("5 of 6 trials FAILED")
    summary = rep["failures"]
    assert summary["most"] and (summary["failed"], summary["trials"]) == (5, 6)
    [reason] = summary["reasons"]  # one distinct reason, with the trials behind it
    assert reason["count"] == 5 and "ZeroDivisionError" in reason["reason"]
    assert sorted(reason["trials"]) == sorted(failed)
    assert "most trials FAILED: 5 of 6" in r.log and "ZeroDivisionError" in r.log
    html = next(p for p in r.outputs("//m:auto") if p.name == "report.html").read_text()
    assert "failed</b>, left out" in html and "ZeroDivisionError" in html
    assert 'id="failures"' in html and "Most trials failed: 5 of 6" in html
    # trial-level findings: one console line, the details in the report (issue 26)
    assert r.log.count("5 of 6 trials failed and left out (each in the report's rows") == 1
    assert "trial region failed" not in r.log

    # a failure is never cached: the next build evaluates those trials again; they fail
    # the same way, so the selection made from those very reasons is reused
    again = ws.build("//m:auto")
    assert again.ok and set(again.tolerated) == set(r.tolerated)
    assert again.ran == [] and "//m:auto" in again.cached

    # every trial failing fails the search, with the first reason
    ws.write("m/snr.py", METRIC.replace("{always}", " + 1 / 0"))
    worst = ws.build("//m:auto")
    assert not worst.ok and "every trial failed (6)" in worst.failed["//m:auto"]
    assert "ZeroDivisionError" in worst.failed["//m:auto"]


# The same metric written with a bare assert: the exception carries no message at all.
ASSERTING = '''
import numpy as np

def snr(ref, cand, options):
    s = sum(float((r[k] ** 2).sum()) for r in ref for k in r)
    n = sum(float(((r[k] - c[k]) ** 2).sum()) for r, c in zip(ref, cand) for k in r)
    assert n > 0
    return {"score": 10 * np.log10(s / n)}
'''


def test_a_failure_without_a_message_reaches_the_report_with_its_reason(ws):
    ws.write("m/snr.py", ASSERTING)
    ws.write("m/BUILD.toml", BUILD.format(
        extra='task = "custom"\ntask_options = { metric = "snr:snr" }\n'
              'metric_srcs = ["snr.py"]\nbar = { min_score = 15 }').replace(
        "bar = { min_sqnr_db = 15 }\n", ""))
    r = ws.build("//m:auto")
    assert r.ok, r.error
    rows = {t["name"]: t for t in _report(r)["trials"]}
    failed = [t["failed"] for t in rows.values() if t["status"] == "failed"]
    assert len(failed) == 5
    # not a bare "AssertionError": where it failed and the failing line
    for why in failed:
        assert why.endswith("the evaluation task failed: AssertionError at snr.py:6 "
                            "(assert n > 0)"), why


def test_exception_reason_names_an_installed_module_by_its_import_path():
    from qbuild_onnx_common.errors import exception_reason

    try:
        json.loads("{")
    except ValueError as e:
        assert exception_reason(e).startswith("JSONDecodeError: Expecting")
    try:
        raise AssertionError  # as a bare assert raises it (pytest rewrites asserts here)
    except AssertionError as e:
        why = exception_reason(e)
    assert why.startswith("AssertionError at ") and "(raise AssertionError " in why
    assert " test_auto_failures.py:" in why


def _detector_like_model() -> onnx.ModelProto:
    """A Conv whose output is reshaped to [1, 256, 6]: 256 boxes of x, y, w, h,
    objectness and one class, as a decoded detector export looks."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.normal(size=(6, 16, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 6, 256], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["r"], ["dets"], name="boxes_last",
                              perm=[0, 2, 1])]
    graph = helper.make_graph(
        nodes, "detector_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                               [1, 16, 16, 16])],
        [helper.make_tensor_value_info("dets", TensorProto.FLOAT, [1, 256, 6])], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_sqnr_bar_on_a_detector_shaped_model_warns(ws):
    onnx.save(_detector_like_model(), ws.path("m/det.onnx"))
    ws.write("m/BUILD.toml", BUILD.format(extra="").replace('src = "conv.onnx"',
                                                             'src = "det.onnx"').replace(
        'steps = ["region", "lower"]', "steps = []"))
    r = ws.build("//m:auto")
    assert r.ok, r.error
    rep = _report(r)
    assert "does not measure detections" in rep["bar_warning"]
    assert "output 'dets' is shaped like detections [1, 256, 6]" in rep["bar_warning"]
    assert "min_sqnr_db does not measure detections" in r.log  # the console warning
    html = next(p for p in r.outputs("//m:auto") if p.name == "report.html").read_text()
    assert 'id="bar-warning"' in html
