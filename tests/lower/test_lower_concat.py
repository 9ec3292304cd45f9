"""Concat in ``ort`` mode: a plain 8-bit Concat (a copy in onnxruntime) where every input
already has the output's scale and zero point, a requantizing QLinearConcat otherwise;
both bit-exact with their QDQ source (issue 16: Concats without requantization)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from qbuild_lower.checking.compare import compare
from qbuild_lower.checking.feeds import random_feeds
from qbuild_lower.lowering.driver import lower_model


def branches_into_concat(shared: bool) -> onnx.ModelProto:
    """x -> Q/DQ -> {Sigmoid, LeakyRelu}, each Q/DQ'd, -> Concat -> Q/DQ; with ``shared``
    both branch outputs are quantized with the Concat output's scale and zero point."""
    q = {"x": (0.05, 128), "y": (0.02, 20)}
    q["a"] = q["b"] = q["y"] if shared else None
    if not shared:
        q["a"], q["b"] = (1 / 255, 0), (0.04, 30)
    inits = []
    for k, (s, z) in q.items():
        inits += [nh.from_array(np.array(s, np.float32), f"{k}_s"),
                  nh.from_array(np.array(z, np.uint8), f"{k}_z")]

    def qdq(t, k):
        return [h.make_node("QuantizeLinear", [t, f"{k}_s", f"{k}_z"], [f"{t}_q"]),
                h.make_node("DequantizeLinear", [f"{t}_q", f"{k}_s", f"{k}_z"], [f"{t}_d"])]

    nodes = [*qdq("x", "x"),
             h.make_node("Sigmoid", ["x_d"], ["sa"]), *qdq("sa", "a"),
             h.make_node("LeakyRelu", ["x_d"], ["lb"], alpha=0.1), *qdq("lb", "b"),
             h.make_node("Concat", ["sa_d", "lb_d"], ["cat"], axis=1), *qdq("cat", "y")]
    g = h.make_graph(nodes, "cat", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
                     [h.make_tensor_value_info("cat_d", T.FLOAT, [1, 8, 8, 8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("shared", [True, False])
def test_concat_copies_only_when_scales_are_shared(shared):
    src = branches_into_concat(shared)
    low, _rep, _ = lower_model(src, "ort")
    ops = [n.op_type for n in low.graph.node]
    assert ops.count("QLinearSigmoid") == 1 and ops.count("QLinearLeakyRelu") == 1
    if shared:  # nothing to requantize: onnxruntime copies
        assert "QLinearConcat" not in ops and ops.count("Concat") == 1
    else:
        assert ops.count("QLinearConcat") == 1 and "Concat" not in ops
    feeds = [{"x": f["x"] * 4} for f in random_feeds(src, 3)]  # spread over the range
    result = compare(src, low, feeds)
    assert result["exact"] == 1.0 and result["max_error_lsb"] == 0.0
