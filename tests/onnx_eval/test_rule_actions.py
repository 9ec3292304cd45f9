"""The ONNX rules' separately cached actions: a dataset's check against its model and
evaluate's bars are actions of their own, so changing only the model a dataset is
checked against, or only a bar, reruns that light action and serves the rest (the
decoded samples, the models' runs) from the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
[m]
rule = "onnx_model"
src = "mnist.onnx"

[m2]
rule = "onnx_model"
src = "mnist_copy.onnx"

[d]
rule = "numpy_dataset"
files = ["x.npy"]
mapping = {{ Input3 = "x.npy" }}
model = "{checked}"

[ev]
rule = "evaluate"
models = [":m2"]
reference = ":m"
dataset = ":d"
task = "classification"
min_score = {min_score}
"""


def _ws(ws, checked=":m", min_score=0.5):
    ws.copy(ROOT / "testdata/models/mnist.onnx", "p/mnist.onnx")
    ws.copy(ROOT / "testdata/models/mnist.onnx", "p/mnist_copy.onnx")
    x = np.random.default_rng(0).random((3, 1, 1, 28, 28), dtype=np.float32)
    np.save(ws.path("p/x.npy"), x)
    ws.write("p/BUILD.toml", BUILD.format(checked=checked, min_score=min_score))


def test_dataset_checked_against_another_model_reruns_only_the_check(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws)
    first = ws.build("//p:d")
    assert first.ok, first.error
    assert first.actions["//p:d"] == {"Dataset": "ran", "CheckModel": "ran"}
    ws.write("p/BUILD.toml", BUILD.format(checked=":m2", min_score=0.5))
    again = ws.build("//p:d")
    assert again.ok, again.error
    assert set(again.ran) == {"//p:d", "//p:m2"}
    assert again.actions["//p:d"] == {"Dataset": "cached", "CheckModel": "ran"}


def test_dataset_that_does_not_fit_its_model_fails_in_the_check(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws)
    ws.copy(ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx", "p/other.onnx")
    ws.write("p/BUILD.toml", BUILD.format(checked=":o", min_score=0.5)
             + '\n[o]\nrule = "onnx_model"\nsrc = "other.onnx"\n')
    r = ws.build("//p:d")
    assert not r.ok
    assert "p/BUILD.toml" in r.error and "//p:d" in r.error
    assert "attribute 'model'" in r.error and "CheckModel" in r.error


def test_changing_only_a_bar_reruns_only_the_check(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws)
    first = ws.build("//p:ev")
    assert first.ok, first.error
    assert first.actions["//p:ev"] == {"Evaluate": "ran", "CheckBars": "ran"}
    report = next(p for p in first.outputs("//p:ev") if p.name == "report.json")
    entry = json.loads(report.read_text())["models"]["//p:m2"]
    assert entry["task"]["score"] == 1.0  # the same model: full agreement

    # A bar it cannot meet: the measurement is served from the cache, the check fails,
    # naming the file, the target and the bar.
    ws.write("p/BUILD.toml", BUILD.format(checked=":m", min_score=1.5))
    failed = ws.build("//p:ev")
    assert not failed.ok
    assert "p/BUILD.toml" in failed.error and "//p:ev" in failed.error
    assert "attribute 'min_score'" in failed.error and "//p:m2: min_score" in failed.error

    ws.write("p/BUILD.toml", BUILD.format(checked=":m", min_score=0.9))
    passed = ws.build("//p:ev")
    assert passed.ok, passed.error
    assert passed.ran == ["//p:ev"]
    assert passed.actions["//p:ev"] == {"Evaluate": "cached", "CheckBars": "ran"}
