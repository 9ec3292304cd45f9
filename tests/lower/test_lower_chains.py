"""Slice -> Slice chains without QDQ between them (YOLOX's Focus) become one
QuantizeLinear + SpaceToDepth (+ Gather) on the codes, bit-exact."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from qbuild_lower.lowering.driver import lower_model
from qbuild_onnx_common.ort import session

BIG = 9223372036854775807


def _focus(scales=(0.02, 0.02, 0.02, 0.02), quantized_leaves=True):
    nodes, inits = [], [
        nh.from_array(np.array([0], np.int64), "s0"),
        nh.from_array(np.array([1], np.int64), "s1"),
        nh.from_array(np.array([BIG], np.int64), "end"),
        nh.from_array(np.array([2], np.int64), "ax2"),
        nh.from_array(np.array([3], np.int64), "ax3"),
        nh.from_array(np.array([2], np.int64), "two"),
        nh.from_array(np.array(0.02, np.float32), "cs"),
        nh.from_array(np.array(128, np.uint8), "cz"),
    ]
    for hs in ("s0", "s1"):
        nodes.append(h.make_node("Slice", ["x", hs, "end", "ax2", "two"], [f"h{hs}"]))
    leaves = []
    for ws in ("s0", "s1"):  # YOLOX order: (0,0), (1,0), (0,1), (1,1)
        for hs in ("s0", "s1"):
            t = f"h{hs}w{ws}"
            nodes.append(h.make_node("Slice", [f"h{hs}", ws, "end", "ax3", "two"], [t]))
            leaves.append(t)
    for t, s in zip(leaves, scales if quantized_leaves else ()):
        inits += [nh.from_array(np.array(s, np.float32), f"{t}_s"),
                  nh.from_array(np.array(128, np.uint8), f"{t}_z")]
        nodes += [h.make_node("QuantizeLinear", [t, f"{t}_s", f"{t}_z"], [f"{t}_q"]),
                  h.make_node("DequantizeLinear", [f"{t}_q", f"{t}_s", f"{t}_z"], [f"{t}_d"])]
    cat_in = [f"{t}_d" for t in leaves] if quantized_leaves else leaves
    nodes += [h.make_node("Concat", cat_in, ["cat"], axis=1),
              h.make_node("QuantizeLinear", ["cat", "cs", "cz"], ["cat_q"]),
              h.make_node("DequantizeLinear", ["cat_q", "cs", "cz"], ["y"])]
    g = h.make_graph(nodes, "focus", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 12, 4, 3])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


def test_focus_chain_becomes_space_to_depth():
    src = _focus()
    low, rep, _ = lower_model(src, "ort")
    ops = rep["op_counts"]
    assert ops.get("Slice", 0) == 0 and ops["SpaceToDepth"] == 1 and ops["Gather"] == 1
    assert rep["quantize_nodes"] == 1 and rep["nodes"]["float"] == 0
    assert rep["float_edges_between_lowered_ops"] == []
    x = np.random.default_rng(0).normal(0, 1, (1, 3, 8, 6)).astype(np.float32)
    a, b = session(src).run(None, {"x": x})[0], session(low).run(None, {"x": x})[0]
    assert np.array_equal(a, b)


def test_focus_chain_with_different_parameters_stays_float():
    low, rep, _ = lower_model(_focus((0.02, 0.02, 0.03, 0.02)), "ort")
    assert rep["op_counts"]["Slice"] == 6 and "SpaceToDepth" not in rep["op_counts"]
    onnx.checker.check_model(low)


def test_float_focus_becomes_space_to_depth():
    """The same Focus left in float (a recipe keeping its stem in float): SpaceToDepth +
    Gather on the float tensor, the same values bit for bit, still reported as float."""
    src = _focus(quantized_leaves=False)
    low, rep, _ = lower_model(src, "ort")
    ops = rep["op_counts"]
    assert ops.get("Slice", 0) == 0 and ops["SpaceToDepth"] == 1 and ops["Gather"] == 1
    assert "QuantizeLinear" in ops and rep["quantize_nodes"] == 1
    slices = [e for e in rep["per_node"] if e["op_type"] == "Slice"]
    assert len(slices) == 6 and all(e["status"] == "float" and e["rewritten_as"]
                                    for e in slices)
    x = np.random.default_rng(0).normal(0, 1, (1, 3, 8, 6)).astype(np.float32)
    a, b = session(src).run(None, {"x": x})[0], session(low).run(None, {"x": x})[0]
    assert np.array_equal(a, b)


def test_float_focus_with_a_slice_read_elsewhere_stays():
    src = _focus(quantized_leaves=False)
    src.graph.output.append(h.make_tensor_value_info("hs0", T.FLOAT, None))
    low, rep, _ = lower_model(src, "ort")
    assert rep["op_counts"]["Slice"] == 6 and "SpaceToDepth" not in rep["op_counts"]
