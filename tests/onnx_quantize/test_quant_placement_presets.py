"""quantize's placement (where Q/DQ go, named for the runtime that fuses them) and presets
(NNCF's symmetric and mixed), on a Conv + SiLU + residual block and the conv chain with
graph outputs that feed Convs; every result is run by onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import StaticOptions, apply_preset
from qbuild_onnx.quantization.quantize import quantize_static_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session

WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


@pytest.fixture(scope="module")
def silu_case(qdir):
    m = lib.save(lib.conv_silu_model(), qdir / "conv_silu.onnx")
    feeds = lib.random_inputs(m, 8)
    return m, lib.write_calibration(m, feeds, qdir / "conv_silu.calibration.json")


def _quantize(model, calibration, out, **options):
    logs: list[str] = []
    info = quantize_static_model(model, calibration, out, StaticOptions(**options),
                                 report_path=out.with_suffix(".json"), log=logs.append)
    return onnx.load(str(out)), info


def _graph(model):
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    return producer, readers


def _sqnr(model_path, quantized_path):
    feed = lib.random_inputs(model_path, 1, seed=99)[0]
    ref, got = lib.run(model_path, feed), lib.run(quantized_path, feed)
    return min(lib.sqnr_db(ref[k], got[k]) for k in ref)


def _fused_op_types(path, tmp_path) -> set[str]:
    """Operator types after onnxruntime's full optimisation (what it actually runs)."""
    optimized = tmp_path / f"{path.stem}.ort.onnx"
    session(path, optimized_path=optimized)
    return {n.op_type for n in onnx.load(str(optimized)).graph.node}


def test_conv_inputs_quantizes_only_what_convolutions_read(silu_case, tmp_path):
    model, calibration = silu_case
    q, info = _quantize(model, calibration, tmp_path / "ci.onnx", per_channel=True,
                        placement="conv_inputs")
    producer, readers = _graph(q)
    dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
    # every DequantizeLinear feeds only weighted operators: weights, biases, activations
    for dq in dqs:
        assert {r.op_type for r in readers[dq.output[0]]} <= WEIGHTED, dq.name
    # SiLU's Sigmoid and Mul and the residual Add compute on float tensors made by float ops
    for node in q.graph.node:
        if node.op_type in ("Sigmoid", "Mul", "Add"):
            for t in node.input:
                assert producer[t].op_type in ("Conv", "Sigmoid", "Mul"), (node.name, t)
            for t in node.output:
                assert {r.op_type for r in readers.get(t, [])} <= {"Mul", "Add", "Conv",
                                                                   "QuantizeLinear"}
    # one activation Q per distinct Conv input (input, silu1, res): silu1 is shared by
    # conv2 and the Add, and only conv2 reads it quantized
    quantized = sorted(n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear")
    assert quantized == ["input", "res", "silu1"]
    add = next(n for n in q.graph.node if n.op_type == "Add")
    assert list(add.input) == ["silu1", "silu2"]
    assert info["placement"] == "conv_inputs"
    report = json.loads((tmp_path / "ci.json").read_text())
    assert report["settings"]["placement"] == "conv_inputs"
    assert report["weights"]["per_channel"] == 3
    assert _sqnr(model, tmp_path / "ci.onnx") > 25
    # onnxruntime cannot fuse a Conv without a Q after it: it runs float Convs on DQ inputs
    assert "QLinearConv" not in _fused_op_types(tmp_path / "ci.onnx", tmp_path)


def test_around_ops_puts_silu_between_qdq_so_onnxruntime_fuses_it(silu_case, tmp_path):
    model, calibration = silu_case
    q, info = _quantize(model, calibration, tmp_path / "ao.onnx", per_channel=True)
    producer, readers = _graph(q)
    assert info["placement"] == "around_ops"
    for node in q.graph.node:
        if node.op_type in ("Sigmoid", "Mul", "Add"):
            assert all(producer[t].op_type == "DequantizeLinear" for t in node.input), node.name
            assert all(r.op_type == "QuantizeLinear" for r in readers[node.output[0]])
    assert _sqnr(model, tmp_path / "ao.onnx") > 25
    fused = _fused_op_types(tmp_path / "ao.onnx", tmp_path)
    assert {"QLinearConv", "QLinearSigmoid", "QLinearMul", "QLinearAdd"} <= fused


def test_conv_inputs_keeps_graph_outputs_float(conv_case, tmp_path):
    # hidden_output is a graph output read by two Convs: they read it quantized, the graph
    # output stays the Relu's float value under its own name
    q, _ = _quantize(conv_case.model, conv_case.calibration, tmp_path / "q.onnx",
                     per_channel=True, placement="conv_inputs")
    producer, readers = _graph(q)
    for name in ("hidden_output", "hidden_output_1"):
        assert producer[name].op_type == "Relu"
        assert {r.op_type for r in readers[name]} == {"QuantizeLinear"}
    assert producer["output"].op_type == "Add"
    assert [o.name for o in q.graph.output] == ["output", "hidden_output", "hidden_output_1"]
    onnx.checker.check_model(q, full_check=True)
    feed = lib.random_inputs(conv_case.model, 1, seed=7)[0]
    ref, got = lib.run(conv_case.model, feed), lib.run(tmp_path / "q.onnx", feed)
    # conv1's input and weights are quantized, the Relu after it is float
    assert lib.sqnr_db(ref["hidden_output"], got["hidden_output"]) > 30
    assert lib.sqnr_db(ref["output"], got["output"]) > 20


def test_opset11_model_with_conv_inputs_gets_per_channel_weights(conv11_case, tmp_path):
    # onnxruntime's per-channel DequantizeLinear needs opset 13: the model is upgraded
    # (logged, recorded as the result's opset), never quantized per-tensor instead
    logs: list[str] = []
    warnings: list[str] = []
    quantize_static_model(conv11_case.model, conv11_case.calibration, tmp_path / "q.onnx",
                          StaticOptions(per_channel=True, placement="conv_inputs",
                                        preset="mixed", weight_symmetric=True),
                          report_path=tmp_path / "r.json", log=logs.append,
                          warn=warnings.append)
    q = onnx.load(str(tmp_path / "q.onnx"))
    assert q.opset_import[0].version == 13
    assert "upgrading the model from opset 11 to 13" in logs
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["weights"] == {"per_channel": 4, "per_tensor": 0, "per_tensor_nodes": []}
    assert not warnings
    onnx.checker.check_model(q, full_check=True)
    assert _sqnr(conv11_case.model, tmp_path / "q.onnx") > 20


def _zero_points(model) -> dict[str, np.ndarray]:
    """Zero point of each DequantizeLinear, keyed by the tensor it dequantizes."""
    inits = lib.initializers(model)
    return {n.input[0]: inits[n.input[2]] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and len(n.input) > 2}


def test_symmetric_preset_is_int8_with_zero_points_0(silu_case, tmp_path):
    model, calibration = silu_case
    q, info = _quantize(model, calibration, tmp_path / "s.onnx", per_channel=False,
                        **_preset("symmetric"))
    zps = _zero_points(q)
    acts = {k: v for k, v in zps.items() if k.endswith("_QuantizeLinear_Output")}
    weights = {k: v for k, v in zps.items() if k in ("w1_quantized", "w2_quantized",
                                                      "w3_quantized")}
    assert len(acts) >= 8 and len(weights) == 3
    for zp in [*acts.values(), *weights.values()]:
        assert zp.dtype == np.int8 and not zp.any()
    assert info["activation_type"] == "int8" and info["preset"] == "symmetric"
    assert _sqnr(model, tmp_path / "s.onnx") > 20


def test_mixed_preset_symmetric_weights_asymmetric_activations(silu_case, tmp_path):
    model, calibration = silu_case
    q, info = _quantize(model, calibration, tmp_path / "m.onnx", per_channel=False,
                        **_preset("mixed"))
    zps = _zero_points(q)
    weights = [zps[f"w{i}_quantized"] for i in (1, 2, 3)]
    assert all(zp.dtype == np.int8 and not zp.any() for zp in weights)
    acts = [v for k, v in zps.items() if k.endswith("_QuantizeLinear_Output")]
    assert all(zp.dtype == np.uint8 for zp in acts)
    assert any(int(zp) not in (0, 128) for zp in acts)  # fitted to each range
    assert info["activation_type"] == "uint8" and info["preset"] == "mixed"
    # signed weights are symmetric by default anyway; unsigned ones are not, unless the
    # preset says so: zero point 128 and the scale of the largest magnitude
    w1 = lib.initializers(onnx.load(str(model)))["w1"]
    for preset, symmetric in ((None, False), ("mixed", True)):
        extra = _preset(preset) if preset else {}
        q8, _ = _quantize(model, calibration, tmp_path / f"u8{preset}.onnx",
                          per_channel=False, weight_type="uint8", **extra)
        scale = lib.initializers(q8)["w1_scale"]
        assert (int(_zero_points(q8)["w1_quantized"]) == 128) or not symmetric
        wide = 2 * np.abs(w1).max() / 255
        assert (abs(float(scale) - wide) < 1e-6 * wide) == symmetric, preset
    assert _sqnr(model, tmp_path / "m.onnx") > 25


def _preset(name: str, **given) -> dict[str, object]:
    """StaticOptions fields for ``preset`` as the rule resolves them."""
    atype, asym, wsym = apply_preset(name, given.get("activation_type"),
                                     given.get("activation_symmetric"),
                                     given.get("weight_symmetric"))
    return {"preset": name, "activation_type": atype, "activation_symmetric": asym,
            "weight_symmetric": wsym}


def test_preset_fills_in_unset_attributes_and_refuses_contradictions():
    assert apply_preset(None, None, None, None) == ("uint8", False, None)
    assert apply_preset("symmetric", None, None, None) == ("int8", True, True)
    assert apply_preset("mixed", None, None, None) == ("uint8", False, True)
    assert apply_preset("symmetric", "int16", True, None) == ("int16", True, True)
    assert apply_preset("mixed", "int8", False, True) == ("int8", False, True)
    with pytest.raises(OnnxError, match="contradicts preset = 'mixed'") as err:
        apply_preset("mixed", None, True, None)
    assert err.value.attr == "activation_symmetric"
    with pytest.raises(OnnxError) as err:
        apply_preset("symmetric", None, None, False)
    assert err.value.attr == "weight_symmetric"


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
{extra}
"""


@pytest.mark.parametrize(("extra", "attr", "words"), [
    ('preset = "symmetric"\nactivation_symmetric = false', "activation_symmetric",
     "contradicts preset = 'symmetric'"),
    ('preset = "nncf"', "preset", "expected one of 'symmetric', 'mixed'"),
    ('placement = "conv_input"', "placement", "expected one of 'around_ops', 'conv_inputs'"),
    ('placement = "conv_inputs"\nformat = "qoperator"', "placement", "needs format = 'qdq'"),
    ('placement = "conv_inputs"\nop_types = ["Conv", "Sigmoid"]', "op_types",
     "never quantizes"),
])
def test_bad_preset_or_placement_is_one_line_naming_the_attribute(qbuild_workspace,
                                                                 silu_case, extra, attr,
                                                                 words):
    ws = qbuild_workspace
    model, calibration = silu_case
    ws.copy(model, "pkg/model.onnx")
    ws.copy(calibration, "pkg/calibration.json")
    ws.write("pkg/BUILD.toml", BUILD.format(extra=extra))
    r = ws.build("//pkg:q")
    assert not r.ok and r.exit_code == 2 and r.ran == []
    assert r.error.startswith(f"pkg/BUILD.toml, target //pkg:q, attribute '{attr}': ")
    assert words in r.error and "\n" not in r.error


def test_rule_records_preset_and_placement_and_keys_them(qbuild_workspace, silu_case):
    ws = qbuild_workspace
    model, calibration = silu_case
    ws.copy(model, "pkg/model.onnx")
    ws.copy(calibration, "pkg/calibration.json")
    ws.write("pkg/BUILD.toml", BUILD.format(extra='preset = "mixed"\nplacement = "conv_inputs"'))
    r = ws.build("//pkg:q")
    assert r.ok, r.error
    settings = json.loads(next(p for p in r.outputs("//pkg:q") if p.name == "report.json")
                          .read_text())["settings"]
    assert settings["preset"] == "mixed" and settings["placement"] == "conv_inputs"
    assert settings["weight_symmetric"] is True and settings["activation_type"] == "uint8"
    ws.write("pkg/BUILD.toml", BUILD.format(extra='preset = "mixed"'))
    again = ws.build("//pkg:q")
    assert again.ok and again.ran == ["//pkg:q"]  # placement is in the key
