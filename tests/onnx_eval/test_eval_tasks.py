"""Evaluation tasks: classification agreement, PSNR, SSD / FastestDet decoding, AP50, a
plugin task through the hook and a custom metric keyed by its code."""

from __future__ import annotations

import json

import numpy as np
import pluggy
import pytest
from qbuild_onnx.accuracy import tasks as et
from qbuild_onnx.accuracy.detection import (
    average_precision,
    detection_metrics,
    f1_lower_bound,
)
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx_common.errors import OnnxError


def test_classification_agreement_counts_top1_and_top5():
    ref = [{"p": np.eye(10, dtype=np.float32)[[i]]} for i in range(10)]
    cand = []
    for i in range(10):
        logits = np.zeros((1, 10), np.float32)
        if i < 7:
            logits[0, i] = 1.0       # same class
        else:
            logits[0, (i + 1) % 10] = 1.0  # wrong top-1, right class second
            logits[0, i] = 0.5
        cand.append({"p": logits})
    r = et.task_classification(ref, cand, {})
    assert r["top1_agreement"] == pytest.approx(0.7)
    assert r["top5_agreement"] == 1.0
    assert r["top1_drop"] == pytest.approx(0.3)


def test_psnr_uses_reference_range():
    ref = [{"img": np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 1, 10, 10)}]
    cand = [{"img": ref[0]["img"] + 0.01}]
    r = et.task_psnr(ref, cand, {})
    assert r["score"] == pytest.approx(40.0, abs=0.01)


def _ssd(boxes, scores):
    return {"boxes": np.asarray(boxes, np.float32)[None], "scores":
            np.asarray(scores, np.float32)[None]}


def test_ssd_decoder_f1_and_ap50():
    boxes = [[0, 0, 10, 10], [20, 20, 40, 40], [50, 50, 60, 70]]
    ref = [_ssd(boxes, [[0.1, 0.9], [0.2, 0.8], [0.3, 0.7]])]
    # the candidate loses the third detection below the threshold and shifts the second
    cboxes = [[0, 0, 10, 10], [30, 30, 50, 50], [50, 50, 60, 70]]
    cand = [_ssd(cboxes, [[0.1, 0.9], [0.2, 0.8], [0.8, 0.2]])]
    opts = {"decoder": "ssd", "background_class": True, "score_threshold": 0.5}
    m = detection_metrics(ref, cand, opts)
    assert (m["reference_detections"], m["candidate_detections"], m["matched"]) == (3, 2, 1)
    assert m["f1"] == pytest.approx(2 * 1 / 5)
    assert m["ap50"] == pytest.approx(1 / 3)
    assert detection_metrics(ref, ref, opts)["ap50"] == 1.0


def test_f1_lower_bound_is_below_a_pooled_f1_that_hangs_on_one_sample():
    # 15 samples all matched, one sample with every detection lost: pooled F1 0.9375
    counts = [(2, 2, 2)] * 15 + [(0, 2, 0)]
    pooled = 2 * 30 / (32 + 30)
    low = f1_lower_bound(counts)
    assert low < pooled and low == f1_lower_bound(counts)  # seeded: deterministic
    assert f1_lower_bound([(2, 2, 2)] * 16) == 1.0  # nothing to lose
    # through the task: a candidate that misses on one of two images
    boxes = [[0, 0, 10, 10]]
    good, bad = _ssd(boxes, [[0.1, 0.9]]), _ssd(boxes, [[0.9, 0.1]])
    opts = {"decoder": "ssd", "background_class": True, "score_threshold": 0.5}
    m = detection_metrics([good, good], [good, bad], opts)
    assert m["f1"] == pytest.approx(2 / 3) and m["f1_lower"] < m["f1"]
    assert et.BAR_KEYS["min_f1_lower"] == ("f1_lower", True)


def test_average_precision_orders_by_score():
    assert average_precision([(0.9, True), (0.8, False), (0.7, True)], 2) == \
        pytest.approx(0.5 * 1 + 0.5 * (2 / 3))


def test_fastestdet_decoder_finds_the_cell():
    head = np.zeros((1, 5 + 3, 4, 4), np.float32)
    head[0, 0, 2, 1] = 0.9        # objectness at row 2, column 1
    head[0, 5 + 2, 2, 1] = 0.95   # class 2
    out = {"head": head}
    m = detection_metrics([out], [out], {"decoder": "fastestdet"})
    assert m["reference_detections"] == 1 and m["f1"] == 1.0
    empty = {"head": np.zeros_like(head)}
    assert detection_metrics([out], [empty], {"decoder": "fastestdet"})["f1"] == 0.0


def test_unknown_decoder_and_task_are_named():
    with pytest.raises(OnnxError, match="unknown detection decoder 'nope'"):
        detection_metrics([{}], [{}], {"decoder": "nope"})
    with pytest.raises(OnnxError, match="unknown evaluation task 'nope'"):
        et.get_task("nope", {})


class _Plugin:
    @staticmethod
    @pluggy.HookimplMarker("qbuild")
    def qbuild_eval_tasks():
        return {"always_half": lambda ref, cand, options: {"score": 0.5}}


def test_plugin_task_through_the_hook():
    pm = pluggy.PluginManager("qbuild")
    from qbuild_onnx import hookspecs

    pm.add_hookspecs(hookspecs)
    pm.register(_Plugin())
    tasks = et.available_tasks(pm)
    assert "always_half" in tasks and "classification" in tasks
    assert et.get_task("always_half", {}, pm=pm)([], [], {})["score"] == 0.5


METRIC = '''
import numpy as np

def mean_abs(ref, cand, options):
    d = [float(np.abs(r[k] - c[k]).mean()) for r, c in zip(ref, cand) for k in r]
    return {"score": {sign}sum(d) / len(d)}
'''

BUILD = """
[fp]
rule = "onnx_model"
src = "float/pre.onnx"

[ds]
rule = "saved_dataset"
srcs = ["ds/*"]

[report]
rule = "evaluate"
models = [":fp"]
reference = ":fp"
dataset = ":ds"
task = "custom"
task_options = { metric = "my_metric:mean_abs" }
metric_srcs = ["my_metric.py"]
min_score = -0.5
"""


def test_custom_metric_is_keyed_by_its_code(qbuild_workspace, tmp_path):
    from eval_paths import MODELS
    from qbuild_onnx.source.datasets import write_dataset

    ws = qbuild_workspace
    ws.register(rules_accuracy)
    ws.copy(MODELS / "mnist.onnx", "m/float/pre.onnx")
    write_dataset(tmp_path / "ds", {"Input3": np.random.default_rng(0).random(
        (3, 1, 1, 28, 28), np.float32)})
    for f in sorted((tmp_path / "ds").iterdir()):
        ws.copy(f, f"m/ds/{f.name}")
    ws.write("m/my_metric.py", METRIC.replace("{sign}", "-"))
    ws.write("m/BUILD.toml", BUILD)
    r = ws.build("//m:report")
    assert r.ok, r.error
    rep = json.loads(r.outputs("//m:report")[0].read_text())
    assert rep["models"]["//m:fp"]["task"]["score"] == 0.0
    assert ws.build("//m:report").ran == []
    ws.write("m/my_metric.py", METRIC.replace("{sign}", "-1 + "))  # the code changed
    r2 = ws.build("//m:report")
    assert not r2.ok and "attribute 'min_score'" in r2.error and "//m:report" in r2.failed
