"""The full pipeline through the engine with the real source rules: onnx_model ->
quant_preprocess -> image_dataset -> calibrate -> quantize, on MobileNetV2 and the test
images. Changing a quantize attribute reruns neither pre-processing nor calibration."""

from __future__ import annotations

import json

import numpy as np
import quant_testlib as lib

BUILD = """
[fp32]
rule = "onnx_model"
src = "mobilenet.onnx"

[pre]
rule = "quant_preprocess"
model = ":fp32"

[images]
rule = "image_dataset"
images = ["images/*"]
input = "input_1:0"
size = [128, 128]
scale = 0.00784313725490196
mean = [1.0]

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":images"

[int8]
rule = "quantize"
model = ":pre"
calibration = ":calib"
per_channel = {per_channel}
"""


def test_mobilenet_pipeline(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(lib.MOBILENET, "m/mobilenet.onnx")
    for image in sorted(p for p in lib.IMAGES.iterdir() if p.suffix in (".jpg", ".png")):
        ws.copy(image, f"m/images/{image.name}")
    ws.write("m/BUILD.toml", BUILD.format(per_channel="true"))
    r = ws.build("//m:int8")
    assert r.ok, r.error
    assert r.ran[-1] == "//m:int8" and {"//m:pre", "//m:calib"} <= set(r.ran)
    report = {p.name: p for p in r.outputs("//m:int8")}["report.json"]
    info = json.loads(report.read_text())["settings"]
    assert info["per_channel"] is True and info["calibration_method"] == "minmax"
    model = {p.name: p for p in r.outputs("//m:int8")}["int8.onnx"]
    for feed in lib.image_inputs():
        ref = lib.run(lib.MOBILENET, feed)["Identity:0"]
        got = lib.run(model, feed)["Identity:0"]
        assert np.argmax(ref) == np.argmax(got) and np.abs(ref - got).max() < 0.1

    ws.write("m/BUILD.toml", BUILD.format(per_channel="false"))
    again = ws.build("//m:int8")
    assert again.ok and again.ran == ["//m:int8"]
