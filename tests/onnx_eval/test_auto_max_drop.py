"""``max_drop`` in auto_quantize: the selection passes a trial only when its labelled
metric is within the drop from the float model (unit, on report entries), and end to end
on MNIST: ground truth reaches every trial's evaluate, the rows carry the labelled figures
and drops, and changing max_drop reruns only the selection."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_paths import MODELS, digits
from qbuild_onnx.auto.select import detector_warning, select
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.rules import quantize as rules_quantize
from qbuild_onnx.rules import source as rules_source


def _entry(top1: float, drop: float, size: int) -> dict:
    return {"outputs": {"y": {"sqnr_db": 30.0}}, "task": {"score": 0.9},
            "labelled": {"top1": top1, "drop": {"top1": drop}}, "bytes": size}


def test_a_trial_passes_only_within_the_drop():
    reports = [{"reference_bytes": 400, "reference_labelled": {"top1": 0.8}}] * 3
    entries = [_entry(0.70, 0.10, 100), _entry(0.795, 0.005, 200), _entry(0.8, 0.0, 300)]
    rep = select(["a", "b", "c"], entries, reports, {}, "size", "//m:pre",
                 max_drop={"top1": 0.005})
    rows = {t["name"]: t for t in rep["trials"]}
    assert not rows["a"]["passes"] and rows["a"]["misses"] == ["max_drop top1: drops 0.1 > "
                                                               "0.005"]
    assert rows["b"]["passes"] and rows["b"]["top1"] == 0.795 and rows["b"]["top1_drop"] == \
        0.005
    assert rep["chosen"] == "b"  # the smallest trial within the drop
    assert rep["float"]["top1"] == 0.8 and rep["float"]["top1_drop"] == 0.0
    assert rep["max_drop"] == {"top1": 0.005}
    # with a bar too, a trial must meet both
    rep = select(["b"], [entries[1]], reports[:1], {"min_sqnr_db": 40}, "size", "//m:pre",
                 max_drop={"top1": 0.005})
    assert rep["chosen"] == "float" and rep["trials"][0]["misses"][0].startswith(
        "min_sqnr_db")
    # an entry without labelled figures cannot pass a max_drop
    bare = {"outputs": {"y": {"sqnr_db": 30.0}}, "bytes": 100}
    rep = select(["a"], [bare], reports[:1], {}, "size", "//m:pre", max_drop={"top1": 0.5})
    assert rep["trials"][0]["misses"] == ["max_drop top1: not measured (no ground truth for "
                                          "this task)"]


def test_a_map_drop_is_not_a_task_blind_bar():
    outputs = [{"name": "out", "shape": [1, 8400, 85]}]
    assert detector_warning({"min_sqnr_db": 30}, "sqnr", {}, outputs) is not None
    assert detector_warning({"min_sqnr_db": 30}, "detection", {}, outputs,
                            {"map": 0.01}) is None


BUILD = """
[fp]
rule = "onnx_model"
src = "mnist.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp"

[calib_data]
rule = "numpy_dataset"
files = ["calib.npy"]
mapping = {{ Input3 = "calib.npy" }}

[eval_data]
rule = "numpy_dataset"
files = ["eval.npy"]
mapping = {{ Input3 = "eval.npy" }}

[auto]
rule = "auto_quantize"
model = ":pre"
calibration_data = ":calib_data"
evaluation_data = ":eval_data"
task = "classification"
ground_truth = "labels.json"
max_drop = {{ {drop} }}
objective = "size"
latency_runs = 0
calibration_methods = ["minmax"]
steps = ["activation_type"]
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from qbuild.testing import Workspace

    root = tmp_path_factory.mktemp("auto_drop")
    w = Workspace(root / "ws", root / "cache")
    for plugin in (rules_source, rules_quantize, rules_accuracy):
        w.register(plugin)
    w.copy(MODELS / "mnist.onnx", "m/mnist.onnx")
    np.save(w.path("m/calib.npy"), digits(0, 8))
    np.save(w.path("m/eval.npy"), digits(1, 12))
    # labels by sample index (a numpy dataset has no file names): a JSON list
    w.write("m/labels.json", json.dumps([i % 10 for i in range(12)]))
    return w


def test_max_drop_in_the_search(ws):
    ws.write("m/BUILD.toml", BUILD.format(drop="top1 = 1.0"))
    r = ws.build("//m:auto")
    assert r.ok, r.error
    rep = json.loads(next(p for p in r.outputs("//m:auto")
                          if p.name == "report.json").read_text())
    assert [t["name"] for t in rep["trials"]] == ["u8", "i8"]
    for row in rep["trials"]:
        ev = json.loads(next(p for p in ws.build(f"//m:auto.ev_{row['name']}").outputs(
            f"//m:auto.ev_{row['name']}") if p.name == "report.json").read_text())
        found = ev["models"][f"//m:auto.{row['name']}"]["labelled"]
        assert ev["reference_labelled"]["labelled_samples"] == 12
        assert row["top1"] == found["top1"] and row["top1_drop"] == found["drop"]["top1"]
        assert row["passes"]  # a drop of at most 1.0 always passes
    assert rep["float"]["top1"] == ev["reference_labelled"]["top1"]
    assert rep["chosen"] in ("u8", "i8")
    html = next(p for p in r.outputs("//m:auto") if p.name == "report.html").read_text()
    assert "top1 drop" in html and "max_drop top1 = 1.0" in html

    # another drop reruns only the selection; no drop at all, when every trial loses
    # some top-1, keeps the float model
    best = min(row["top1_drop"] for row in rep["trials"])
    limit = 0.0 if best > 0 else 0.5
    ws.write("m/BUILD.toml", BUILD.format(drop=f"top1 = {limit}"))
    again = ws.build("//m:auto")
    assert again.ok and again.ran == ["//m:auto"]
    assert again.actions["//m:auto"]["Select"] == "ran"
    assert again.actions["//m:auto"]["Trials"] == again.actions["//m:auto"]["Time"] == "cached"
    rep2 = json.loads(next(p for p in again.outputs("//m:auto")
                           if p.name == "report.json").read_text())
    assert [t["passes"] for t in rep2["trials"]] == [t["top1_drop"] <= limit
                                                     for t in rep2["trials"]]
    if best > 0:
        assert rep2["chosen"] == "float"


def test_max_drop_alone_is_a_bar_and_needs_ground_truth(ws):
    ws.write("m/BUILD.toml", BUILD.format(drop="").replace('ground_truth = "labels.json"\n',
                                                           ""))
    r = ws.build("//m:auto")
    assert not r.ok and r.exit_code == 2 and "attribute 'bar'" in r.error
    assert "or max_drop = { map = 0.01 }" in r.error
    ws.write("m/BUILD.toml", BUILD.format(drop="top1 = 0.01").replace(
        'ground_truth = "labels.json"\n', ""))
    r = ws.build("//m:auto")
    assert not r.ok and r.exit_code == 2 and "attribute 'max_drop'" in r.error
    assert "max_drop needs ground_truth" in r.error
