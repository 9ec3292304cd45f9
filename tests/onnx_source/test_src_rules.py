"""The source rules through the real engine: build, cache, rerun only what changed."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
[mb]
rule = "onnx_model"
src = "mb.onnx"

[pre]
rule = "quant_preprocess"
model = ":mb"

[imgs]
rule = "image_dataset"
images = ["img/*.jpg"]
input = "input_1:0"
size = [128, 128]
resize = "crop"
scale = 0.00784313725490196
mean = [1.0]
count = 8
batch_size = 4
model = ":mb"

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":imgs"
method = "{method}"
"""


def _ws(ws, method="minmax"):
    ws.copy(ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx", "m/mb.onnx")
    for name in ("dog.jpg", "wolves.jpg"):
        ws.copy(ROOT / "testdata/images" / name, f"m/img/{name}")
    ws.write("m/BUILD.toml", BUILD.replace("{method}", method))


def test_pipeline_builds_caches_and_reruns_only_calibrate(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws)
    r = ws.build("//m:calib")
    assert r.ok, r.error
    assert set(r.ran) == {"//m:mb", "//m:pre", "//m:imgs", "//m:calib"}
    from qbuild_onnx_common.files import sha256_file
    from qbuild_onnx_common.providers import CalibrationInfo, OnnxModelInfo

    pre = ws.build("//m:pre")  # served from the cache, put in qbuild-out
    assert pre.ran == []
    assert r.provider("//m:mb", OnnxModelInfo).inputs[0]["name"] == "input_1:0"
    table = r.provider("//m:calib", CalibrationInfo).table
    info = json.loads(table.read_text())
    assert info["model_sha256"] == sha256_file(pre.provider("//m:pre", OnnxModelInfo).model)
    assert r.provider("//m:calib", CalibrationInfo).samples == 8
    assert ws.build("//m:calib").ran == []
    ws.write("m/BUILD.toml", BUILD.replace("{method}", "percentile"))
    r2 = ws.build("//m:calib")
    assert r2.ok, r2.error
    assert r2.ran == ["//m:calib"]
    assert {p.name for p in r2.outputs("//m:calib")} == {"calibration.json", "histograms.npz"}


def test_preprocess_output_is_byte_identical_across_builds(qbuild_workspace, tmp_path):
    from qbuild_onnx.quantization.preprocess import preprocess_model

    src = ROOT / "testdata/models/mobilenet_v2_128_0.5.onnx"
    a = preprocess_model(src, tmp_path / "a.onnx")
    b = preprocess_model(src, tmp_path / "b.onnx")
    assert a["model_sha256"] == b["model_sha256"]
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_synthetic_dataset_warns_and_mismatch_fails(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(ROOT / "testdata/models/mnist.onnx", "s/mnist.onnx")
    ws.write("s/BUILD.toml", """
[mnist]
rule = "onnx_model"
src = "mnist.onnx"

[rand]
rule = "synthetic_dataset"
model = ":mnist"
count = 3

[bad]
rule = "image_dataset"
images = ["*.png"]
input = "Input3"
size = [27, 28]
color = "GRAY"
model = ":mnist"
""")
    ws.copy(ROOT / "testdata/images/super_res_input.png", "s/x.png")
    cli = ws.cli("build", "//s:rand")
    assert cli.code == 0, cli.stderr
    assert "SYNTHETIC" in (cli.stdout + cli.stderr)
    r = ws.build("//s:bad")
    assert not r.ok and "Input3" in r.error and "27" in r.error


def test_bad_model_file_names_file(qbuild_workspace):
    ws = qbuild_workspace
    ws.write("b/broken.onnx", "not a model at all")
    ws.write("b/BUILD.toml", '[m]\nrule = "onnx_model"\nsrc = "broken.onnx"\n')
    r = ws.build("//b:m")
    assert not r.ok and "broken.onnx" in r.error
