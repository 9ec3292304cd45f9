"""Calibration method mean_minmax (NNCF's MEAN_MINMAX): each tensor's range is the mean over
samples of each sample's own min and max, streamed one sample at a time; checked against
numpy on MobileNetV2 over the test images."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import quant_testlib as lib
from qbuild_onnx.calibration.calibrate import CalibrationOptions, calibrate
from qbuild_onnx.source.datasets import write_dataset
from qbuild_onnx_common.errors import OnnxError


@pytest.fixture(scope="module")
def mobilenet_images():
    feeds = lib.image_inputs()
    return np.concatenate([f["input_1:0"] for f in feeds])


def _dataset(tmp_path, images, batch_size):
    d = tmp_path / f"ds{batch_size}"
    write_dataset(d, {"input_1:0": images}, batch_size=batch_size)
    return d


def _per_sample_ranges(images) -> dict[str, tuple[float, float]]:
    """numpy: every float tensor's min and max per sample, then the mean over samples."""
    model = onnx.load(str(lib.MOBILENET))
    names = lib.float_tensor_names(model)
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    lows: dict[str, list[float]] = {n: [] for n in names}
    highs: dict[str, list[float]] = {n: [] for n in names}
    for x in images:
        values = dict(zip(names, sess.run(names, {"input_1:0": x[None]})))
        for n in names:
            lows[n].append(float(values[n].min()))
            highs[n].append(float(values[n].max()))
    return {n: (float(np.mean(lows[n])), float(np.mean(highs[n]))) for n in names}


def test_ranges_are_the_mean_of_per_sample_min_and_max(mobilenet_images, tmp_path):
    # the dataset says batch 3, but the mean is over samples: calibrate runs one at a time
    info = calibrate(lib.MOBILENET, _dataset(tmp_path, mobilenet_images, 3), tmp_path / "c",
                     CalibrationOptions(method="mean_minmax"))
    doc = json.loads((tmp_path / "c" / "calibration.json").read_text())
    assert info["num_samples"] == len(mobilenet_images) == 6
    assert doc["method"] == "mean_minmax" and doc["batch_size"] == 1
    expected = _per_sample_ranges(mobilenet_images)
    assert set(doc["tensors"]) == set(expected) and len(expected) > 100
    clipped = 0
    for name, (lo, hi) in expected.items():
        entry = doc["tensors"][name]
        assert entry["range"] == pytest.approx([lo, hi], rel=1e-6, abs=1e-6), name
        assert entry["min"] <= entry["range"][0] <= entry["range"][1] <= entry["max"], name
        clipped += entry["range"][1] < entry["max"] - 1e-6
    # the method differs from minmax where samples differ (most tensors here)
    assert clipped > len(expected) // 2


def test_ranges_do_not_depend_on_the_dataset_batch(mobilenet_images, tmp_path):
    docs = []
    for batch in (1, 6):
        calibrate(lib.MOBILENET, _dataset(tmp_path, mobilenet_images, batch),
                  tmp_path / f"c{batch}", CalibrationOptions(method="mean_minmax"))
        docs.append(json.loads((tmp_path / f"c{batch}" / "calibration.json").read_text()))
    assert docs[0]["tensors"] == docs[1]["tensors"]
    assert docs[0]["options"] == {} and docs[0]["symmetric"] is False


def test_symmetric_mean_minmax(mobilenet_images, tmp_path):
    ds = _dataset(tmp_path, mobilenet_images, 1)
    docs = {}
    for symmetric in (False, True):
        out = tmp_path / f"s{symmetric}"
        calibrate(lib.MOBILENET, ds, out,
                  CalibrationOptions(method="mean_minmax", symmetric=symmetric))
        docs[symmetric] = json.loads((out / "calibration.json").read_text())["tensors"]
    for name, entry in docs[True].items():
        lo, hi = docs[False][name]["range"]
        assert entry["range"] == [-max(abs(lo), abs(hi)), max(abs(lo), abs(hi))]


def test_batch_size_is_refused(tmp_path):
    with pytest.raises(OnnxError, match="one sample at a time") as err:
        CalibrationOptions(method="mean_minmax", batch_size=4).check()
    assert err.value.attr == "batch_size"
    CalibrationOptions(method="mean_minmax", batch_size=1).check()


def test_rule_takes_the_method_and_refuses_a_batch_in_one_line(qbuild_workspace,
                                                              mobilenet_images):
    ws = qbuild_workspace
    ws.copy(lib.MOBILENET, "pkg/model.onnx")
    np.save(ws.path("pkg/images.npy"), mobilenet_images[:2])
    build = """
[model]
rule = "onnx_model"
src = "model.onnx"

[data]
rule = "numpy_dataset"
files = ["images.npy"]
mapping = {{ "input_1:0" = "images.npy" }}

[cal]
rule = "calibrate"
model = ":model"
dataset = ":data"
method = "mean_minmax"
{extra}
"""
    ws.write("pkg/BUILD.toml", build.format(extra=""))
    r = ws.build("//pkg:cal")
    assert r.ok, r.error
    doc = json.loads(r.outputs("//pkg:cal")[0].read_text())
    assert doc["method"] == "mean_minmax" and doc["num_samples"] == 2
    ws.write("pkg/BUILD.toml", build.format(extra="batch_size = 2"))
    r = ws.build("//pkg:cal")
    assert not r.ok and r.exit_code == 2 and r.ran == []
    assert r.error.startswith("pkg/BUILD.toml, target //pkg:cal, attribute 'batch_size': ")
    assert "\n" not in r.error
