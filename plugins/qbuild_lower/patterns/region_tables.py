"""The tables of element-wise regions: every export of a region as a function of its root's
256 codes, computed by onnxruntime running the region's own nodes, and the tables of the
single onnxruntime lookup operators a region's table may equal."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from qbuild_onnx_common.ort import session

from ..arithmetic.tables import ONNX_CODE_TYPE, Codes, all_codes
from ..qdq.graph import Graph, onnx_opset
from .regions import Region

#: A single onnxruntime lookup operator and its ``alpha`` (None: it has none).
LookupOp = tuple[str, float | None]

#: Single onnxruntime lookup operators a region's table may equal: (op, alpha). Their
#: kernels index a 256-entry table they build themselves, which onnxruntime runs about
#: four times faster per element than a Gather/GatherElements on the codes.
LOOKUP_OPS: tuple[LookupOp, ...] = (("QLinearSigmoid", None), ("QLinearLeakyRelu", 0.0),
                                    ("QLinearLeakyRelu", 1.0))


def region_tables(g: Graph, regions: list[Region]
                  ) -> tuple[dict[str, Codes], dict[str, dict[LookupOp, Codes]]]:
    """Tables of every export of ``regions`` computed by onnxruntime
    running the regions' own nodes on all 256 codes of their root, and the tables of the
    single lookup operators (``LOOKUP_OPS`` plus each region's LeakyRelu alpha) from the
    root's to the export's parameters. Returns ({export: codes}, {export: {(op, alpha):
    codes}})."""
    if not regions:
        return {}, {}

    nodes: list[onnx.NodeProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    inits: list[onnx.TensorProto] = []
    feeds: dict[str, Codes] = {}
    seen: set[str] = set()
    probes: dict[str, dict[LookupOp, str]] = {}
    added: set[int] = set()

    def init(name: str) -> None:
        if name and name in g.inits and name not in seen:
            seen.add(name)
            inits.append(g.inits[name])

    for reg in regions:
        dq = reg.root_dequantize(g)
        xqp = g.qparams(dq)
        feeds[reg.root] = all_codes(xqp.dtype)
        inputs.append(helper.make_tensor_value_info(reg.root, ONNX_CODE_TYPE[xqp.dtype], [256]))
        for i in reg.members:
            if i in added:  # a constant's DequantizeLinear can sit in two regions
                continue
            added.add(i)
            n = g.nodes[i]
            for t in n.input:
                init(t)
            nodes.append(n)
        alphas = {float(a.f) for i in reg.members for a in g.nodes[i].attribute
                  if g.nodes[i].op_type == "LeakyRelu" and a.name == "alpha"}
        for y in reg.exports:
            q = g.producer_of(y)
            yqp = g.qparams(q)
            outputs.append(helper.make_tensor_value_info(y, ONNX_CODE_TYPE[yqp.dtype], None))
            xz = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
            yz = q.input[2] if len(q.input) > 2 and q.input[2] else None
            if xz is None or yz is None or xqp.dtype != yqp.dtype:
                continue  # the com.microsoft ops need both zero points, one 8-bit type
            for k, (op, alpha) in enumerate(
                    list(LOOKUP_OPS) + [("QLinearLeakyRelu", a) for a in sorted(alphas)]):
                out = f"{y}__probe{k}"
                extra: dict[str, Any] = {} if alpha is None else {"alpha": alpha}
                nodes.append(helper.make_node(op, [reg.root, dq.input[1], xz, q.input[1], yz],
                                              [out], domain="com.microsoft", **extra))
                outputs.append(helper.make_tensor_value_info(out, ONNX_CODE_TYPE[yqp.dtype], None))
                probes.setdefault(y, {})[(op, alpha)] = out
    model = helper.make_model(
        helper.make_graph(nodes, "region_tables", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", max(onnx_opset(g.model), 13)),
                       helper.make_opsetid("com.microsoft", 1)],
        ir_version=min(g.model.ir_version or 8, 10),
    )
    sess = session(model)
    names = [o.name for o in outputs]
    res = dict(zip(names, sess.run(names, feeds)))
    tables = {y: np.ascontiguousarray(res[y]).ravel() for reg in regions for y in reg.exports}
    cands = {y: {key: np.ascontiguousarray(res[out]).ravel() for key, out in p.items()}
             for y, p in probes.items()}
    return tables, cands
