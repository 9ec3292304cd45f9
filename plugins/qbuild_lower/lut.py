"""Lookup tables for elementwise ops on 8-bit codes.

A table holds, for each of the 256 input codes, the output code the QDQ source produces:
QuantizeLinear(op(DequantizeLinear(code))). All tables of a model are computed in one
onnxruntime session over a model that is exactly those DQ -> op -> Q groups, so a table
matches the source as onnxruntime runs it, code for code. The float arithmetic happens
here, at build time; the lowered graph only indexes the table.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Graph, opset_of

_NP_TO_ONNX = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8}


def build_tables(g: Graph, requests: list) -> dict[str, np.ndarray]:
    """``requests``: [(table name, Group)] -> {table name: 256 output codes}."""
    if not requests:
        return {}
    import onnxruntime as ort

    nodes, inputs, outputs, inits, feeds, seen = [], [], [], [], {}, set()

    def init(name, arr):
        if name not in seen:
            seen.add(name)
            inits.append(numpy_helper.from_array(np.asarray(arr), name))

    for k, (_table, grp) in enumerate(requests):
        x, out = grp.ins[0], grp.outs[0]
        codes = _codes(x.qp.dtype)
        xin, dq, y, yq = f"x{k}", f"dq{k}", f"y{k}", f"q{k}"
        feeds[xin] = codes
        inputs.append(helper.make_tensor_value_info(xin, _NP_TO_ONNX[x.qp.dtype], [256]))
        outputs.append(helper.make_tensor_value_info(yq, _NP_TO_ONNX[out.qp.dtype], [256]))
        init(f"xs{k}", x.qp.scale.reshape(()))
        init(f"xz{k}", x.qp.zero_point.reshape(()))
        init(f"ys{k}", out.qp.scale.reshape(()))
        init(f"yz{k}", out.qp.zero_point.reshape(()))
        nodes.append(helper.make_node("DequantizeLinear", [xin, f"xs{k}", f"xz{k}"], [dq]))
        extra = []
        for e in grp.ins[1:]:
            if e.kind in ("fconst", "raw"):
                init(e.name, g.array(e.name))
            extra.append(e.name)
        n = grp.node
        nodes.append(helper.make_node(n.op_type, [dq, *extra], [y], domain=n.domain,
                                      **{a.name: helper.get_attribute_value(a)
                                         for a in n.attribute}))
        nodes.append(helper.make_node("QuantizeLinear", [y, f"ys{k}", f"yz{k}"], [yq]))
    model = helper.make_model(
        helper.make_graph(nodes, "lut", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", max(opset_of(g.model), 13))],
        ir_version=min(g.model.ir_version or 8, 10),
    )
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    res = sess.run(None, feeds)
    return {table: r for (table, _), r in zip(requests, res)}


def _codes(dtype) -> np.ndarray:
    """All 256 codes in table order: index = code (uint8) or code + 128 (int8)."""
    if np.dtype(dtype) == np.uint8:
        return np.arange(256, dtype=np.uint8)
    return (np.arange(256) - 128).astype(np.int8)
