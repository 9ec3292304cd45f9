"""The qdq_retarget and requantize_weights rules through the real engine: outputs and info,
incremental rebuilds (a no-op second build, one changed attribute reruns one target) and
errors that name the attribute."""

from __future__ import annotations

import json

import dtypes_testlib as lib
import onnx
from qbuild_onnx_common.providers import OnnxModelInfo

BUILD = """
[qdq]
rule = "onnx_model"
src = "mb_u8.onnx"

[silero]
rule = "onnx_model"
src = "silero.onnx"

[mb_ref]
rule = "qdq_retarget"
model = ":qdq"
target = "onnx-reference"
form = "output_dtype"
run_check = false

[mb_ort]
rule = "qdq_retarget"
model = ":qdq"
target = "onnxruntime-cpu"

[silero_int4]
rule = "requantize_weights"
model = ":silero"
policy = {{ MatMul = {{ dtype = "int4", granularity = "blocked", block_size = {block} }} }}
input_dims = {{ sequence = 512 }}
"""


def test_rules_build_incrementally(qbuild_workspace, mobilenet_u8):
    ws = qbuild_workspace
    ws.copy(mobilenet_u8, "m/mb_u8.onnx")
    ws.copy(lib.MODELS / "silero_vad_v3.1_transformer.onnx", "m/silero.onnx")
    ws.write("m/BUILD.toml", BUILD.format(block=32))
    r = ws.build("//m:mb_ref", "//m:mb_ort", "//m:silero_int4")
    assert r.ok, r.error + r.log
    assert {"//m:mb_ref", "//m:mb_ort", "//m:silero_int4"} <= set(r.ran)
    info = r.provider("//m:mb_ref", OnnxModelInfo)
    assert info.opset == 21 and info.inputs[0]["name"] == "input_1:0"
    files = {p.name: p for p in r.outputs("//m:mb_ref")}
    assert set(files) == {"mb_ref.onnx", "report.json"} and info.model == files["mb_ref.onnx"]
    rep = json.loads(files["report.json"].read_text())
    assert rep["target"] == "onnx-reference" and rep["form"] == "output_dtype"
    assert rep["after"]["bytes"] == files["mb_ref.onnx"].stat().st_size
    assert rep["equivalence"]["dequantized_weights_identical"] > 0
    onnx.checker.check_model(str(files["mb_ref.onnx"]), full_check=True)
    assert r.provider("//m:mb_ort", OnnxModelInfo).ir_version <= 13
    silero = json.loads([p for p in r.outputs("//m:silero_int4")
                         if p.name == "report.json"][0].read_text())
    assert silero["after"]["initializers_by_dtype"]["INT4"] == 16

    again = ws.build("//m:mb_ref", "//m:mb_ort", "//m:silero_int4")
    assert again.ok and again.ran == []

    ws.write("m/BUILD.toml", BUILD.format(block=16))
    third = ws.build("//m:mb_ref", "//m:mb_ort", "//m:silero_int4")
    assert third.ok and third.ran == ["//m:silero_int4"]


def test_rule_errors_name_the_attribute(qbuild_workspace):
    ws = qbuild_workspace
    ws.copy(lib.MODELS / "mnist.onnx", "m/mnist.onnx")
    ws.write("m/BUILD.toml", """
        [mnist]
        rule = "onnx_model"
        src = "mnist.onnx"

        [bad_policy]
        rule = "requantize_weights"
        model = ":mnist"
        policy = { Conv = { dtype = "float8e5m2", symmetric = false } }

        [bad_target]
        rule = "qdq_retarget"
        model = ":mnist"
        target = "tpu-9000"
        """)
    r = ws.build("//m:bad_policy")
    assert not r.ok
    assert "policy" in r.error and "float8e5m2 cannot have a non-zero zero point" in r.error
    r = ws.build("//m:bad_target")
    assert not r.ok and "unknown dtype target 'tpu-9000'" in r.error
