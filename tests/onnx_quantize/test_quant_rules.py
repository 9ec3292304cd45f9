"""The quantize and quantize_dynamic rules through the real engine (qbuild_workspace)."""

from __future__ import annotations

import json

import onnx

BUILD = """
[model]
rule = "onnx_model"
src = "model.onnx"

[calib]
rule = "calibration_table"
src = "calibration.json"

[q]
rule = "quantize"
model = ":model"
calibration = ":calib"
per_channel = {per_channel}
{extra}

[dyn]
rule = "quantize_dynamic"
model = ":model"
per_channel = true
"""


def _workspace(ws, case, per_channel="true", extra=""):
    ws.copy(case.model, "pkg/model.onnx")
    ws.copy(case.calibration, "pkg/calibration.json")
    ws.write("pkg/BUILD.toml", BUILD.format(per_channel=per_channel, extra=extra))


def test_build_cache_and_attribute_change(qbuild_workspace, gemm_case):
    ws = qbuild_workspace
    _workspace(ws, gemm_case)
    r = ws.build("//pkg:q", "//pkg:dyn")
    assert r.ok, r.error
    assert set(r.ran) == {"//pkg:model", "//pkg:calib", "//pkg:q", "//pkg:dyn"}
    outputs = {p.name: p for p in r.outputs("//pkg:q")}
    assert set(outputs) == {"q.onnx", "report.json"}
    from qbuild_onnx_common.providers import OnnxModelInfo, QuantizedModelInfo

    model = r.provider("//pkg:q", OnnxModelInfo)
    settings = json.loads(outputs["report.json"].read_text())["settings"]
    assert model.opset == 13 and settings["format"] == "qdq" and settings["per_channel"] is True
    assert r.provider("//pkg:q", QuantizedModelInfo).format == "qdq"
    assert [o["name"] for o in model.outputs] == ["output", "hidden_output"]
    onnx.checker.check_model(onnx.load(str(outputs["q.onnx"])), full_check=True)
    assert r.provider("//pkg:dyn", QuantizedModelInfo).format == "dynamic"
    first = outputs["q.onnx"].read_bytes()

    again = ws.build("//pkg:q", "//pkg:dyn")
    assert again.ok and again.ran == []

    # A quantize-only attribute reruns the quantize target and nothing upstream.
    ws.write("pkg/BUILD.toml", BUILD.format(per_channel="false", extra=""))
    changed = ws.build("//pkg:q", "//pkg:dyn")
    assert changed.ok and changed.ran == ["//pkg:q"]
    report = {p.name: p for p in changed.outputs("//pkg:q")}["report.json"]
    assert json.loads(report.read_text())["settings"]["per_channel"] is False

    ws.write("pkg/BUILD.toml", BUILD.format(per_channel="true", extra=""))
    back = ws.build("//pkg:q")
    assert back.ok and back.ran == []  # the earlier result is still cached
    assert {p.name: p for p in back.outputs("//pkg:q")}["q.onnx"].read_bytes() == first


def test_calibration_of_another_model_fails_naming_the_attribute(qbuild_workspace, gemm_case,
                                                                conv_case):
    ws = qbuild_workspace
    _workspace(ws, gemm_case)
    ws.copy(conv_case.calibration, "pkg/calibration.json")
    r = ws.build("//pkg:q")
    assert not r.ok
    assert "sha256" in r.error and "calibration" in r.error


def test_bad_attribute_combination_is_a_configuration_error(qbuild_workspace, gemm_case):
    ws = qbuild_workspace
    _workspace(ws, gemm_case, extra='activation_type = "int4"')
    r = ws.build("//pkg:q")
    assert not r.ok and r.exit_code == 2 and r.ran == []
    assert "4-bit types are for weights only" in r.error and "activation_type" in r.error


def test_unknown_node_fails_the_action(qbuild_workspace, gemm_case):
    ws = qbuild_workspace
    _workspace(ws, gemm_case, extra='nodes_to_exclude = ["gemm9"]')
    r = ws.build("//pkg:q")
    assert not r.ok and "no node named 'gemm9'" in r.error and "nodes_to_exclude" in r.error


def test_cli_build(qbuild_workspace, gemm_case):
    ws = qbuild_workspace
    _workspace(ws, gemm_case)
    out = ws.cli("build", "//pkg:q")
    assert out.code == 0, out.stderr
