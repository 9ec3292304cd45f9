"""Per-channel quantization where intermediate tensors are graph outputs consumed downstream
and where output names prefix each other (hidden_output, hidden_output_1, output)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import StaticOptions
from qbuild_onnx.quantization.quantize import quantize_static_model

# weight-bearing node -> (weight initializer, channel axis, channels)
CONV_WEIGHTS = {"conv1": ("w1", 0, 8), "conv2": ("w2", 0, 8), "conv3": ("w3", 0, 4),
                "conv4": ("w4", 0, 4)}
GEMM_WEIGHTS = {"gemm1": ("gw1", 0, 32), "matmul": ("mw", 1, 24), "gemm2": ("gw2", 1, 10)}


def _quantize(case, tmp_path, **options):
    out = tmp_path / "q.onnx"
    warnings: list[str] = []
    info = quantize_static_model(case.model, case.calibration, out, StaticOptions(**options),
                                 report_path=tmp_path / "report.json", warn=warnings.append)
    return onnx.load(str(out)), info, warnings


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _assert_qdq_per_channel(model: onnx.ModelProto, expected: dict) -> None:
    inits = lib.initializers(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    nodes = {n.name: n for n in model.graph.node}
    for name, (_weight, axis, channels) in expected.items():
        node = nodes[name]
        dq = producer[node.input[1]]
        assert dq.op_type == "DequantizeLinear", f"{name}: weight not fed by a DequantizeLinear"
        assert dq.input[0] in inits and inits[dq.input[0]].dtype == np.int8
        assert inits[dq.input[1]].shape == (channels,), f"{name}: scale is not per-channel"
        assert _attr(dq, "axis", 1) == axis, f"{name}: wrong channel axis"
        if len(dq.input) > 2:
            assert inits[dq.input[2]].shape == (channels,)


def _assert_outputs_kept(original: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    before = [(o.name, o.type.tensor_type.elem_type) for o in original.graph.output]
    after = [(o.name, o.type.tensor_type.elem_type) for o in quantized.graph.output]
    assert after == before


def _assert_close(case, quantized_path, min_db: float) -> None:
    feed = lib.random_inputs(case.model, 1, seed=99)[0]  # not a calibration input
    ref, got = lib.run(case.model, feed), lib.run(quantized_path, feed)
    assert set(ref) == set(got)
    for name in ref:
        assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape
        assert lib.sqnr_db(ref[name], got[name]) > min_db, name


def test_conv_chain_with_intermediate_outputs_is_per_channel_qdq(conv_case, tmp_path):
    model, info, warnings = _quantize(conv_case, tmp_path, per_channel=True)
    _assert_qdq_per_channel(model, CONV_WEIGHTS)
    _assert_outputs_kept(onnx.load(str(conv_case.model)), model)
    producer = {o: n for n in model.graph.node for o in n.output}
    nodes = {n.name: n for n in model.graph.node}
    # The exported intermediate tensors are DQ outputs, and every consumer reads that tensor.
    for name in ("hidden_output", "hidden_output_1", "output"):
        assert producer[name].op_type == "DequantizeLinear"
    assert nodes["conv2"].input[0] == "hidden_output" and nodes["conv4"].input[0] == "hidden_output"
    assert nodes["conv3"].input[0] == "hidden_output_1"
    assert [o["name"] for o in info["outputs"]] == ["output", "hidden_output", "hidden_output_1"]
    assert {o["dtype"] for o in info["outputs"]} == {"FLOAT"}
    assert not warnings
    _assert_close(conv_case, tmp_path / "q.onnx", min_db=25)


def test_conv_chain_per_channel_qoperator(conv_case, tmp_path):
    model, _info, _ = _quantize(conv_case, tmp_path, per_channel=True, quant_format="qoperator")
    inits = lib.initializers(model)
    qconvs = {n.name: n for n in model.graph.node if n.op_type == "QLinearConv"}
    assert len(qconvs) == 4
    for node in qconvs.values():
        w = inits[node.input[3]]
        assert inits[node.input[4]].shape == (w.shape[0],)  # w_scale per output channel
    _assert_outputs_kept(onnx.load(str(conv_case.model)), model)
    _assert_close(conv_case, tmp_path / "q.onnx", min_db=25)


def test_gemm_and_matmul_weights_are_per_channel(gemm_case, tmp_path):
    model, info, warnings = _quantize(gemm_case, tmp_path, per_channel=True)
    _assert_qdq_per_channel(model, GEMM_WEIGHTS)
    _assert_outputs_kept(onnx.load(str(gemm_case.model)), model)
    assert not warnings
    _assert_close(gemm_case, tmp_path / "q.onnx", min_db=25)
    report = __import__("json").loads((tmp_path / "report.json").read_text())
    assert report["weights"] == {"per_channel": 3, "per_tensor": 0, "per_tensor_nodes": []}


def test_gemm_and_matmul_per_channel_qoperator(gemm_case, tmp_path):
    model, _info, _ = _quantize(gemm_case, tmp_path, per_channel=True, quant_format="qoperator")
    report = __import__("json").loads((tmp_path / "report.json").read_text())
    assert report["weights"]["per_channel"] == 3 and report["weights"]["per_tensor"] == 0
    _assert_outputs_kept(onnx.load(str(gemm_case.model)), model)
    _assert_close(gemm_case, tmp_path / "q.onnx", min_db=25)


@pytest.mark.parametrize("quant_format", ["qdq", "qoperator"])
def test_opset11_model_is_upgraded_for_per_channel(conv11_case, tmp_path, quant_format):
    assert onnx.load(str(conv11_case.model)).opset_import[0].version == 11
    model, info, _ = _quantize(conv11_case, tmp_path, per_channel=True, quant_format=quant_format)
    assert info["opset"] == 13
    onnx.checker.check_model(model, full_check=True)
    if quant_format == "qdq":
        _assert_qdq_per_channel(model, CONV_WEIGHTS)
    _assert_outputs_kept(onnx.load(str(conv11_case.model)), model)
    _assert_close(conv11_case, tmp_path / "q.onnx", min_db=25)


def test_opset11_model_stays_at_11_without_per_channel(conv11_case, tmp_path):
    _model, info, _ = _quantize(conv11_case, tmp_path)
    assert info["opset"] == 11
    _assert_close(conv11_case, tmp_path / "q.onnx", min_db=20)


def test_single_channel_conv_counts_as_per_channel(tmp_path):
    # A detection-head style 1x1 Conv with one output channel gets a 1-D scale of length 1.
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["output"], "head")], "head",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(rng.normal(0, 1, (1, 8, 1, 1)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    model_path = lib.save(model, tmp_path / "head.onnx")
    feeds = lib.random_inputs(model_path, 4)
    calib = lib.write_calibration(model_path, feeds, tmp_path / "calibration.json")
    warnings: list[str] = []
    quantize_static_model(model_path, calib, tmp_path / "q.onnx", StaticOptions(per_channel=True),
                          report_path=tmp_path / "report.json", warn=warnings.append)
    report = __import__("json").loads((tmp_path / "report.json").read_text())
    assert report["weights"] == {"per_channel": 1, "per_tensor": 0, "per_tensor_nodes": []}
    assert not warnings
    quantize_static_model(model_path, calib, tmp_path / "q.onnx", StaticOptions(),
                          report_path=tmp_path / "report.json")
    report = __import__("json").loads((tmp_path / "report.json").read_text())
    assert report["weights"]["per_tensor_nodes"] == ["head"]
