"""Formats, types and options of static quantization, each run in onnxruntime and compared
with the float model."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import StaticOptions
from qbuild_onnx.quantization.quantize import quantize_static_model

_ONNX_TYPE = {"int8": "INT8", "uint8": "UINT8", "int16": "INT16", "uint16": "UINT16",
              "int4": "INT4", "uint4": "UINT4"}


def _quantize(case, tmp_path, **options):
    out = tmp_path / "q.onnx"
    info = quantize_static_model(case.model, case.calibration, out, StaticOptions(**options),
                                 report_path=tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    return onnx.load(str(out)), info, report


def _worst_sqnr(case, path) -> float:
    feed = lib.random_inputs(case.model, 1, seed=7)[0]
    ref, got = lib.run(case.model, feed), lib.run(path, feed)
    return min(lib.sqnr_db(ref[k], got[k]) for k in ref)


def _q_output_types(model: onnx.ModelProto) -> Counter:
    """Element types written by QuantizeLinear nodes (from their zero points)."""
    inits = {i.name: i for i in model.graph.initializer}
    return Counter(onnx.TensorProto.DataType.Name(inits[n.input[2]].data_type)
                   for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2)


def _weight_types(model: onnx.ModelProto) -> set[str]:
    """Element types of the quantized weights of Gemm/MatMul/Conv."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    return {onnx.TensorProto.DataType.Name(inits[producer[n.input[1]].input[0]].data_type)
            for n in model.graph.node
            if n.op_type in ("Gemm", "MatMul", "Conv") and n.input[1] in producer}


# (format, activation, weight, per_channel, min SQNR dB, expected opset)
MATRIX = [
    ("qdq", "uint8", "int8", False, 25, 13),
    ("qdq", "uint8", "int8", True, 25, 13),
    ("qdq", "int8", "int8", True, 25, 13),
    ("qdq", "uint8", "uint8", False, 20, 13),
    ("qdq", "int16", "int8", True, 35, 21),
    ("qdq", "uint16", "int16", False, 45, 21),
    ("qdq", "int16", "int16", True, 50, 21),
    ("qdq", "uint8", "int4", True, 8, 21),
    ("qdq", "uint16", "uint4", True, 8, 21),
    ("qoperator", "uint8", "int8", False, 25, 13),
    ("qoperator", "uint8", "int8", True, 25, 13),
    ("qoperator", "int8", "int8", False, 25, 13),
    ("qoperator", "uint8", "uint8", True, 20, 13),
]


@pytest.mark.parametrize("fmt,act,weight,per_channel,min_db,opset", MATRIX)
def test_format_and_type_matrix(gemm_case, tmp_path, fmt, act, weight, per_channel, min_db,
                                opset):
    model, info, report = _quantize(gemm_case, tmp_path, quant_format=fmt, activation_type=act,
                                    weight_type=weight, per_channel=per_channel)
    assert info["opset"] == opset
    assert (info["format"], info["activation_type"], info["weight_type"]) == (fmt, act, weight)
    onnx.checker.check_model(model, full_check=True)
    if fmt == "qdq":
        assert set(_q_output_types(model)) == {_ONNX_TYPE[act]}
        assert _weight_types(model) == {_ONNX_TYPE[weight]}
        assert report["quantize_nodes"] > 0 and report["dequantize_nodes"] > 0
    else:
        assert report["quantized_ops"].get("QLinearMatMul", 0) + \
            report["quantized_ops"].get("QGemm", 0) >= 2
    assert info["quantized_nodes"] == report["quantized_nodes"] > 0
    assert _worst_sqnr(gemm_case, tmp_path / "q.onnx") > min_db


def test_conv_chain_types_run_in_onnxruntime(conv_case, tmp_path):
    for act, weight, min_db in (("uint8", "int8", 25), ("int16", "int16", 45)):
        _quantize(conv_case, tmp_path, activation_type=act, weight_type=weight, per_channel=True)
        assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > min_db, (act, weight)


def test_symmetric_activations_give_zero_points_at_the_middle(conv_case, tmp_path):
    model, _, _ = _quantize(conv_case, tmp_path, activation_type="int8",
                            activation_symmetric=True)
    inits = lib.initializers(model)
    zps = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(int(z) == 0 for z in zps)
    asym, _, _ = _quantize(conv_case, tmp_path, activation_type="int8")
    inits = lib.initializers(asym)
    assert any(int(inits[n.input[2]]) != 0 for n in asym.graph.node
               if n.op_type == "QuantizeLinear")


def test_weight_symmetric_false_gives_nonzero_weight_zero_points(conv_case, tmp_path):
    def weight_zps(model):
        inits = lib.initializers(model)
        return np.concatenate([inits[n.input[2]].ravel() for n in model.graph.node
                               if n.op_type == "DequantizeLinear"
                               and inits.get(n.input[0]) is not None
                               and inits[n.input[0]].dtype == np.uint8
                               and len(n.input) > 2])

    asym, _, _ = _quantize(conv_case, tmp_path, weight_type="uint8", weight_symmetric=False)
    assert np.any(weight_zps(asym) != 128)
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 20
    sym, _, _ = _quantize(conv_case, tmp_path, weight_type="uint8", weight_symmetric=True)
    assert np.all(weight_zps(sym) == 128)


def test_reduce_range_uses_seven_bit_weights(conv_case, tmp_path):
    def max_abs_weight(model):
        inits = lib.initializers(model)
        return max(int(np.abs(inits[n.input[0]].astype(np.int32)).max())
                   for n in model.graph.node if n.op_type == "DequantizeLinear"
                   and n.input[0] in inits and inits[n.input[0]].dtype == np.int8)

    full, _, _ = _quantize(conv_case, tmp_path, per_channel=True)
    reduced, info, _ = _quantize(conv_case, tmp_path, per_channel=True, reduce_range=True)
    assert max_abs_weight(full) == 127 and max_abs_weight(reduced) <= 64
    assert info["reduce_range"] is True
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 20


def test_op_types_limit_what_is_quantized(conv_case, tmp_path):
    _, _, report = _quantize(conv_case, tmp_path, op_types=["Conv"])
    # The Relus sit in DQ -> Relu -> Q units (their outputs feed quantized Convs); Add does not.
    assert report["quantized_ops"]["Conv"] == 4 and "Add" not in report["quantized_ops"]
    _, _, everything = _quantize(conv_case, tmp_path)
    assert "Add" in everything["quantized_ops"]


def test_nodes_to_exclude_keep_float_weights(conv_case, tmp_path):
    model, _, report = _quantize(conv_case, tmp_path, per_channel=True,
                                 nodes_to_exclude=["conv3", "conv4"])
    nodes = {n.name: n for n in model.graph.node}
    inits = lib.initializers(model)
    assert inits["w3"].dtype == np.float32 and nodes["conv3"].input[1] == "w3"
    assert inits["w4"].dtype == np.float32 and nodes["conv4"].input[1] == "w4"
    assert "w1" not in inits and "w2" not in inits  # quantized: float weights gone
    assert report["weights"]["per_channel"] == 2
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 25


def test_nodes_to_quantize_quantize_only_those(conv_case, tmp_path):
    model, _, report = _quantize(conv_case, tmp_path, nodes_to_quantize=["conv2"])
    assert report["quantized_ops"] == {"Conv": 1}
    assert lib.initializers(model)["w1"].dtype == np.float32


def test_tensor_overrides_per_tensor_and_per_channel(conv_case, tmp_path):
    overrides = {
        "c3": {"quant_type": "int16", "symmetric": True},  # activation: 16-bit
        "w1": [{"axis": 0, "quant_type": "int8"}],  # weight: per-channel with per_channel off
        "hidden_output": {"rmin": 0.0, "rmax": 4.0},  # activation range replaced
    }
    model, info, report = _quantize(conv_case, tmp_path, tensor_overrides=overrides)
    assert info["opset"] == 21  # 16-bit override needs the opset-21 Q/DQ types
    inits = lib.initializers(model)
    qnodes = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert inits[qnodes["c3"].input[2]].dtype == np.int16
    assert int(inits[qnodes["c3"].input[2]]) == 0
    # rmin 0, rmax 4 over uint8: scale 4/255, zero point 0
    ho = next(q for name, q in qnodes.items() if name.startswith("hidden_output")
              and not name.startswith("hidden_output_1"))
    assert np.isclose(float(inits[ho.input[1]]), 4.0 / 255, rtol=1e-6)
    assert report["weights"]["per_channel"] == 1  # only w1
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 20


def test_node_overrides_apply_to_the_node_outputs(conv_case, tmp_path):
    model, _, _ = _quantize(conv_case, tmp_path, node_overrides={"conv4": {"quant_type": "uint16"}})
    inits = lib.initializers(model)
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c4")
    assert inits[q.input[2]].dtype == np.uint16
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 25


def test_extra_options_pass_through(conv_case, tmp_path):
    default_model, _, default = _quantize(conv_case, tmp_path)
    assert not any(n.op_type == "Relu" for n in default_model.graph.node)
    kept, _, report = _quantize(conv_case, tmp_path,
                                extra_options={"QDQKeepRemovableActivations": True})
    assert sum(1 for n in kept.graph.node if n.op_type == "Relu") == 2
    assert report["quantized_ops"]["Relu"] == 2 and report["nodes"] > default["nodes"]
    assert _worst_sqnr(conv_case, tmp_path / "q.onnx") > 25
    excluded, _, _ = _quantize(conv_case, tmp_path,
                               extra_options={"OpTypesToExcludeOutputQuantization": ["Add"]})
    producer = {o: n.op_type for n in excluded.graph.node for o in n.output}
    assert producer["output"] == "Add"


def test_dedicated_qdq_pairs_keep_clamped_graph_outputs(conv_case, tmp_path):
    # onnxruntime 1.31 alone removes relu1 and exports the unclamped Conv output as
    # hidden_output (SQNR < 0 dB here); the step keeps the Relu instead, and says so.
    warnings: list[str] = []
    out = tmp_path / "q.onnx"
    quantize_static_model(conv_case.model, conv_case.calibration, out,
                          StaticOptions(extra_options={"DedicatedQDQPair": True}),
                          warn=warnings.append)
    model = onnx.load(str(out))
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    assert producer["hidden_output"] == "Relu"
    assert any("DedicatedQDQPair" in w and "relu1" in w for w in warnings)
    assert sum(1 for n in model.graph.node if n.op_type == "QuantizeLinear"
               and n.input[0] == "hidden_output") == 2  # one pair per consumer
    assert _worst_sqnr(conv_case, out) > 25


def test_unclamped_graph_output_is_detected(conv_case, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static
    from qbuild_onnx.quantization.validate import check_clamped_outputs
    from qbuild_onnx_common.errors import OnnxError

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(conv_case.feeds)

        def get_next(self):
            return next(self.feeds, None)

    plain = tmp_path / "ort.onnx"
    quantize_static(str(conv_case.model), str(plain), Reader(),
                    activation_type=QuantType.QUInt8, extra_options={"DedicatedQDQPair": True})
    with pytest.raises(OnnxError, match="'hidden_output' was produced by Relu"):
        check_clamped_outputs(onnx.load(str(conv_case.model)), onnx.load(str(plain)))


def test_report_contents(conv_case, tmp_path):
    model, info, report = _quantize(conv_case, tmp_path, per_channel=True)
    ops = Counter(n.op_type for n in model.graph.node)
    assert report["quantize_nodes"] == ops["QuantizeLinear"]
    assert report["dequantize_nodes"] == ops["DequantizeLinear"]
    assert report["quantized_ops"]["Conv"] == 4
    weights = 8 * 3 * 9 + 8 * 8 * 9 + 4 * 8 * 9 + 4 * 8
    assert report["dtypes"]["initializers"]["INT8"] == {"count": 8, "elements": weights + 24}
    # int32 biases and their zero points
    assert report["dtypes"]["initializers"]["INT32"] == {"count": 8, "elements": 48}
    assert report["model_bytes"] == (tmp_path / "q.onnx").stat().st_size
    assert report["float_model_bytes"] == conv_case.model.stat().st_size
    assert report["settings"]["per_channel"] is True
    assert info["inputs"] == [{"name": "input", "dtype": "FLOAT", "shape": [1, 3, 16, 16]}]
    assert info["outputs"][0] == {"name": "output", "dtype": "FLOAT", "shape": [1, 4, 16, 16]}
    assert info["model_sha256"] == __import__("hashlib").sha256(
        (tmp_path / "q.onnx").read_bytes()).hexdigest()
