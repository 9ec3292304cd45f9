"""Dynamic quantization (onnxruntime's integer-ops quantizer) on small real models."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import DynamicOptions
from qbuild_onnx.quantization.quantize import quantize_dynamic_model


def _quantize(case, tmp_path, **options):
    out = tmp_path / "q.onnx"
    warnings: list[str] = []
    info = quantize_dynamic_model(case.model, out, DynamicOptions(**options),
                                  report_path=tmp_path / "report.json", warn=warnings.append)
    # The latency verdict ("slower than the float model") depends on the machine: the
    # assertions below are about the quantizer's own warnings.
    warnings = [w for w in warnings if "slower than the float model" not in w]
    return onnx.load(str(out)), info, json.loads((tmp_path / "report.json").read_text()), warnings


def _worst_sqnr(case, path) -> float:
    feed = lib.random_inputs(case.model, 1, seed=5)[0]
    ref, got = lib.run(case.model, feed), lib.run(path, feed)
    return min(lib.sqnr_db(ref[k], got[k]) for k in ref)


@pytest.mark.parametrize("weight_type", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_gemm_matmul_dynamic(gemm_case, tmp_path, weight_type, per_channel):
    model, info, report, warnings = _quantize(gemm_case, tmp_path, weight_type=weight_type,
                                              per_channel=per_channel)
    onnx.checker.check_model(model, full_check=True)
    # onnxruntime turns the Gemms into MatMul + Add, then every MatMul into MatMulInteger.
    assert report["quantized_ops"] == {"MatMulInteger": 3}
    assert report["dynamic_quantize_nodes"] == 3
    assert report["weights"]["per_channel"] == (3 if per_channel else 0)
    assert not warnings
    inits = lib.initializers(model)
    wdtype = {"int8": np.int8, "uint8": np.uint8}[weight_type]
    assert {inits[n.input[1]].dtype for n in model.graph.node
            if n.op_type == "MatMulInteger"} == {np.dtype(wdtype)}
    assert [o["name"] for o in info["outputs"]] == ["output", "hidden_output"]
    assert {o["dtype"] for o in info["outputs"]} == {"FLOAT"}
    assert _worst_sqnr(gemm_case, tmp_path / "q.onnx") > 30


def test_nodes_to_exclude_and_op_types(gemm_case, conv_case, tmp_path):
    model, _, report, _ = _quantize(gemm_case, tmp_path, nodes_to_exclude=["matmul"])
    assert report["quantized_ops"] == {"MatMulInteger": 2}
    assert any(n.op_type == "MatMul" and n.name == "matmul" for n in model.graph.node)
    _, _, report, _ = _quantize(conv_case, tmp_path, op_types=["MatMul"])
    assert report["quantized_ops"] == {}
    _, _, report, warnings = _quantize(conv_case, tmp_path, per_channel=True)
    assert report["quantized_ops"] == {"ConvInteger": 4}
    assert not warnings  # per-tensor ConvInteger weights are onnxruntime's design, not a loss
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 20


def test_extra_options_pass_through(mnist_case, tmp_path):
    # mnist's MatMul takes B from a Reshape, not a constant: skipped by default
    # (MatMulConstBOnly), quantized when the option is turned off.
    _, _, default, _ = _quantize(mnist_case, tmp_path)
    assert "MatMulInteger" not in default["quantized_ops"]
    _, _, report, _ = _quantize(mnist_case, tmp_path, extra_options={"MatMulConstBOnly": False})
    assert report["quantized_ops"]["MatMulInteger"] == 1
    feeds = mnist_case.feeds
    assert [int(np.argmax(lib.run(tmp_path / "q.onnx", f)["Plus214_Output_0"])) for f in feeds] \
        == [int(np.argmax(lib.run(mnist_case.model, f)["Plus214_Output_0"])) for f in feeds]


def test_dynamic_opset11_per_channel_is_valid(conv11_case, tmp_path):
    model, info, _, _ = _quantize(conv11_case, tmp_path, per_channel=True)
    assert info["opset"] == 13
    onnx.checker.check_model(model, full_check=True)
    assert _worst_sqnr(conv11_case, tmp_path / "q.onnx") > 20
