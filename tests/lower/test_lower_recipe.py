"""The YOLO example's recipe shape on a small generated SiLU network, through the real
rules: percentile calibration, the stem kept in float by a selector, everything after it
uint8/int8, lowered in ort mode. The lowered model is bit-exact with its QDQ source, the
float/int8 border costs one QuantizeLinear, and every int8 SiLU runs as onnxruntime's
QLinearSigmoid + QLinearMul (no table, no 16-bit tensor, no float op left between)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from lower_paths import ROOT
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def silu_net() -> onnx.ModelProto:
    """A float stem (3x3 Conv + SiLU at full resolution), then a stride-2 Conv and a CSP
    block (two branches, SiLU after every Conv, a residual Add, a Concat) and a 1x1 head."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv_silu(x, cin, cout, name, stride=1, k=3):
        inits.append(nh.from_array((rng.standard_normal((cout, cin, k, k)) * 0.4)
                                   .astype(np.float32), f"{name}_w"))
        inits.append(nh.from_array((rng.standard_normal(cout) * 0.2).astype(np.float32),
                                   f"{name}_b"))
        p = k // 2
        nodes.extend([
            h.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"],
                        pads=[p] * 4, strides=[stride] * 2, name=f"{name}_conv"),
            h.make_node("Sigmoid", [f"{name}_c"], [f"{name}_s"], name=f"{name}_sig"),
            h.make_node("Mul", [f"{name}_c", f"{name}_s"], [name], name=f"{name}_mul")])
        return name

    stem = conv_silu("x", 3, 8, "stem")
    down = conv_silu(stem, 8, 16, "down", stride=2)
    a = conv_silu(down, 16, 8, "a", k=1)
    b = conv_silu(down, 16, 8, "b", k=1)
    a2 = conv_silu(a, 8, 8, "a2")
    nodes.append(h.make_node("Add", [a2, a], ["res"], name="res_add"))
    nodes.append(h.make_node("Concat", ["res", b], ["cat"], axis=1, name="cat"))
    out = conv_silu("cat", 16, 16, "head", k=1)
    g = h.make_graph(nodes, "silu_net", [h.make_tensor_value_info("x", T.FLOAT,
                                                                  [1, 3, 32, 32])],
                     [h.make_tensor_value_info(out, T.FLOAT, [1, 16, 16, 16])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


BUILD = """
[m]
rule = "onnx_model"
src = "m.onnx"

[images]
rule = "image_dataset"
images = ["images/*"]
input = "x"
size = [32, 32]
scale = 0.0078125
mean = [1.0]
count = 8
seed = 0

[calib]
rule = "calibrate"
model = ":m"
dataset = ":images"
method = "percentile"
percentile = 99.99

[q]
rule = "quantize"
model = ":m"
calibration = ":calib"
per_channel = true
activation_type = "uint8"
nodes_to_exclude = ["upto:stem"]

[low]
rule = "lower_integer"
model = ":q"
mode = "ort"
dataset = ":images"
max_samples = 4
"""


def test_recipe_shape_lowers_bit_exact(qbuild_workspace, tmp_path):
    ws = qbuild_workspace
    onnx.save(silu_net(), str(tmp_path / "m.onnx"))
    ws.copy(tmp_path / "m.onnx", "x/m.onnx")
    for image in ("dog.jpg", "wolves.jpg", "pineapple.jpg"):
        ws.copy(ROOT / "testdata" / "images" / image, f"x/images/{image}")
    ws.write("x/BUILD.toml", BUILD)
    r = ws.build("//x:low")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//x:low")}
    rep = json.loads(outs["report.json"].read_text())
    assert rep["check"]["exact"] == 1.0 and rep["check"]["max_error_lsb"] == 0.0
    assert rep["check"]["samples"] == 4

    low = onnx.load(str(outs["low.onnx"]))
    ops = [n.op_type for n in low.graph.node]
    # the stem stays float (its Conv and SiLU); one QuantizeLinear at the border, one
    # DequantizeLinear at the output, and nothing float in between
    assert ops.count("Conv") == 1 and ops.count("Sigmoid") == 1 and ops.count("Mul") == 1
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 1
    # the five SiLUs after the border (down, a, b, a2, head) run as onnxruntime's own
    # int8 kernels, not as tables
    assert ops.count("QLinearSigmoid") == 5 and ops.count("QLinearMul") == 5
    assert ops.count("QLinearConv") == 5 and "GatherElements" not in ops
    assert ops.count("QLinearAdd") == 1 and ops.count("QLinearConcat") == 1
    elem = {t.type.tensor_type.elem_type for t in low.graph.value_info}
    assert not elem & {T.UINT16, T.INT16}
    regions = rep["regions"]["by_form"]
    assert regions.get("table", 0) == 0
