"""quantize's `overrides` label: a mixed_precision document merged into tensor_overrides and
nodes_to_exclude (inline values win), through the real engine."""

from __future__ import annotations

import json

import onnx
from qbuild_onnx.rules.quantize import merge_label_overrides

BUILD = """
[model]
rule = "onnx_model"
src = "model.onnx"

[calib]
rule = "calibration_table"
src = "calibration.json"

[mp]
rule = "precision_overrides"
src = "overrides.json"

[q]
rule = "quantize"
model = ":model"
calibration = ":calib"
overrides = ":mp"
{extra}
"""

U16 = {"quant_type": "uint16"}
DOC = {"tensors": {"hidden_output": U16, "hidden_output_1": U16},
       "nodes_to_exclude": ["conv4"], "promoted": ["hidden_output", "hidden_output_1"]}


def _qtypes(path):
    m = onnx.load(str(path))
    inits = {i.name: i.data_type for i in m.graph.initializer}
    return m, {n.name: inits[n.input[2]] for n in m.graph.node if n.op_type == "QuantizeLinear"}


def test_merge_label_overrides_inline_wins():
    attrs = {"tensor_overrides": {"hidden_output_1": {"quant_type": "uint8"}},
             "nodes_to_exclude": ["add"]}
    merged, shadowed = merge_label_overrides(attrs, DOC)
    assert shadowed == ["hidden_output_1"]
    assert merged["tensor_overrides"] == {"hidden_output": {"quant_type": "uint16"},
                                          "hidden_output_1": {"quant_type": "uint8"}}
    assert merged["nodes_to_exclude"] == ["add", "conv4"]
    assert attrs["nodes_to_exclude"] == ["add"]  # not mutated


def test_overrides_label_builds_and_reruns_only_quantize(qbuild_workspace, conv_case):
    ws = qbuild_workspace
    ws.copy(conv_case.model, "pkg/model.onnx")
    ws.copy(conv_case.calibration, "pkg/calibration.json")
    ws.write("pkg/overrides.json", json.dumps(DOC))
    ws.write("pkg/BUILD.toml", BUILD.format(extra=""))
    r = ws.build("//pkg:q")
    assert r.ok, r.error
    from qbuild_onnx_common.providers import OnnxModelInfo

    info = r.provider("//pkg:q", OnnxModelInfo)
    assert info.promoted == ("hidden_output", "hidden_output_1")
    out = next(p for p in r.outputs("//pkg:q") if p.suffix == ".onnx")
    m, types = _qtypes(out)
    assert types["hidden_output_QuantizeLinear"] == onnx.TensorProto.UINT16
    assert types["hidden_output_1_QuantizeLinear"] == onnx.TensorProto.UINT16
    assert [n for n in m.graph.node if n.name == "conv4"][0].input[1] == "w4"  # float

    # An inline table for the same tensor wins; only quantize reruns.
    ws.write("pkg/BUILD.toml", BUILD.format(
        extra='tensor_overrides = { hidden_output_1 = { quant_type = "uint8" } }'))
    r2 = ws.build("//pkg:q")
    assert r2.ok, r2.error
    assert r2.ran == ["//pkg:q"]
    _, types = _qtypes(next(p for p in r2.outputs("//pkg:q") if p.suffix == ".onnx"))
    assert types["hidden_output_1_QuantizeLinear"] == onnx.TensorProto.UINT8
    assert types["hidden_output_QuantizeLinear"] == onnx.TensorProto.UINT16

    # A changed document reruns quantize; a typo in it names the tensor.
    ws.write("pkg/BUILD.toml", BUILD.format(extra=""))
    ws.write("pkg/overrides.json", json.dumps({"tensors": {"nope": {"quant_type": "uint16"}},
                                               "nodes_to_exclude": []}))
    bad = ws.build("//pkg:q")
    assert not bad.ok and "nope" in bad.error and "tensor_overrides" in bad.error

    ws.write("pkg/overrides.json", json.dumps({"tensors": []}))
    bad = ws.build("//pkg:q")
    assert not bad.ok and "not a precision-override document" in bad.error
    assert "overrides" in bad.error
