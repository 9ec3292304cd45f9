"""End-to-end lowering of real QDQ models (MobileNetV2, YOLOX-Nano) in both modes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from lower_paths import MOBILENET, YOLOV8, YOLOX
from qbuild_lower.checking import reference
from qbuild_lower.checking.compare import compare
from qbuild_lower.lowering.driver import lower_model
from qbuild_onnx_common.ort import session

MN_IN = "input_1:0"


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_mobilenet_ort_mode_fully_lowered(qdq_models, image_feeds, act):
    src = onnx.load(str(qdq_models(MOBILENET, "mobilenet", 128, act)))
    low, rep, _ = lower_model(src, "ort")
    assert rep["nodes"]["lowered"] == rep["nodes"]["compute"] == 66
    assert rep["float_edges_between_lowered_ops"] == []
    assert rep["quantize_nodes"] == 1 and rep["dequantize_nodes"] == 1  # the float interface
    assert rep["op_counts"]["QLinearConv"] == 52 and rep["op_counts"]["QLinearAdd"] == 10
    res = compare(src, low, image_feeds(MN_IN, "mobilenet", 128))
    assert res["passed"] and res["within_1lsb"] == 1.0
    # deterministic: same input -> byte-identical model
    assert lower_model(src, "ort")[0].SerializeToString() == low.SerializeToString()


def _integer_tensors(model):
    """Outputs of every integer node feeding a DequantizeLinear (the last integer
    values before float), exposed as graph outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    prod = {t: n for n in model.graph.node for t in n.output}
    names = [n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"
             and n.input[0] in prod and prod[n.input[0]].op_type != "QuantizeLinear"]
    for t in names:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
    return m, names


def test_mobilenet_fixed_point(qdq_models, image_feeds):
    src = onnx.load(str(qdq_models(MOBILENET, "mobilenet", 128, "uint8")))
    low, rep, params = lower_model(src, "fixed_point")
    assert rep["domains"] == ["ai.onnx"]
    assert not {"QLinearConv", "Conv", "QLinearMatMul"} & set(rep["op_counts"])
    floats = [e for e in rep["per_node"] if e["status"] == "float"]
    assert [e["op_type"] for e in floats] == ["Softmax"]
    assert floats[0]["category"] == "unsupported_op"
    feeds = image_feeds(MN_IN, "mobilenet", 128, 3)
    assert compare(src, low, feeds)["passed"]
    # the numpy reference is bit-exact with onnxruntime on every integer tensor
    exposed, names = _integer_tensors(low)
    got = dict(zip([o.name for o in exposed.graph.output],
                   session(exposed).run(None, feeds[0])))
    ref_model = onnx.ModelProto()
    ref_model.CopyFrom(exposed)
    ref = reference.run(ref_model, feeds[0])
    assert len(names) >= 1
    for t in names:
        assert np.array_equal(got[t], ref[t]), t
    convs = [p for p in params if p["kind"] == "conv"]
    assert len(convs) == 52
    for p in convs:
        assert all(2**30 <= m < 2**31 for m in p["multiplier"]) and p["clamp"] == [0, 255]
    json.dumps(params)  # serialisable


def test_yolox_both_modes(qdq_models, image_feeds):
    """YOLOX-Nano (uint8 activations): ort mode is bit-exact with onnxruntime's own
    QDQ fusion; fixed_point agrees within +-1 LSB on >= 99 % of outputs."""
    src = onnx.load(str(qdq_models(YOLOX, "yolox", 416, "uint8")))
    feeds = image_feeds("images", "yolox", 416, 2)
    low, rep, _ = lower_model(src, "ort")
    assert rep["nodes"]["lowered"] >= rep["nodes"]["compute"] - 6  # Focus slice chains
    res = compare(src, low, feeds)
    assert res["exact"] == 1.0
    fx, rep_fx, _ = lower_model(src, "fixed_point")
    assert rep_fx["domains"] == ["ai.onnx"] and "Sigmoid" not in rep_fx["op_counts"]
    res = compare(src, fx, feeds[:1])
    assert res["within_1lsb"] >= 0.99
    # rounding=onnxruntime: the same standard integer ops, bit-exact with the QDQ source
    fx, rep_fx, params = lower_model(src, "fixed_point", "onnxruntime")
    assert rep_fx["domains"] == ["ai.onnx"]
    assert {p["rounding"] for p in params} == {"onnxruntime", "table"}
    res = compare(src, fx, feeds)
    assert res["exact"] == 1.0


def test_yolov8_style_head_lowers_bit_exact(qdq_models, image_feeds):
    """The YOLOv8-style box decoding shares constants between element-wise regions (the
    DequantizeLinear of a scalar sits in two regions): each node enters the table model
    once (it used to be added twice and onnxruntime refused the duplicate name)."""
    src = onnx.load(str(qdq_models(YOLOV8, "mobilenet", 640)))
    low, rep, _ = lower_model(src, "ort")
    res = compare(src, low, image_feeds("images", "mobilenet", 640, count=1))
    assert res["passed"] and res["exact"] == 1.0
