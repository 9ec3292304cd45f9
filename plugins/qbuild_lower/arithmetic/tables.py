"""Lookup tables for elementwise ops on 8-bit codes.

A table holds, for every combination of input codes, the output code the QDQ source
produces: QuantizeLinear(op(DequantizeLinear(codes...))). Three shapes of request:

* ``unary`` -- one quantized input (Sigmoid, LeakyRelu, ...): 256 entries;
* ``pair`` -- two quantized activations of one shape (Add, Mul under rounding
  ``onnxruntime``): 65,536 entries, index ``a * 256 + b``;
* ``("concat", k)`` -- input ``k`` of a Concat requantized to the output's parameters:
  256 entries;
* ``("chain", j, unary group)`` -- a two-input op whose input ``j`` is a unary table of its
  other input (SiLU: ``x * Sigmoid(x)``): 256 entries, both groups run in sequence.

All tables of a model are computed in one onnxruntime session over a model made of exactly
those DQ -> op -> Q groups, so a table matches the source as onnxruntime runs it, code for
code. The float arithmetic happens here, at build time; the lowered graph only indexes the
table (Gather).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from qbuild_onnx_common.graph import attrs, opset
from qbuild_onnx_common.ort import session

from ..qdq.graph import Graph

#: The ONNX element type of 8-bit codes of each numpy type.
ONNX_CODE_TYPE = {np.dtype(np.uint8): onnx.TensorProto.UINT8,
                  np.dtype(np.int8): onnx.TensorProto.INT8}


def build_tables(g: Graph, requests: list) -> dict[str, np.ndarray]:
    """``requests``: [(table name, Group, kind)] -> {table name: output codes}."""
    if not requests:
        return {}

    nodes, inputs, outputs, inits, feeds, seen = [], [], [], [], {}, set()
    picks = {}

    def init(name, arr):
        if name not in seen:
            seen.add(name)
            inits.append(numpy_helper.from_array(np.asarray(arr), name))

    def dq(k, j, x, codes):
        xin, d = f"x{k}_{j}", f"dq{k}_{j}"
        feeds[xin] = codes
        inputs.append(helper.make_tensor_value_info(xin, ONNX_CODE_TYPE[x.qp.dtype], [codes.size]))
        init(f"xs{k}_{j}", x.qp.scale.reshape(()))
        init(f"xz{k}_{j}", x.qp.zero_point.reshape(()))
        nodes.append(helper.make_node("DequantizeLinear", [xin, f"xs{k}_{j}", f"xz{k}_{j}"], [d]))
        return d

    for k, (table, grp, kind) in enumerate(requests):
        out, n = grp.outs[0], grp.node
        y, yq = f"y{k}", f"q{k}"
        if kind == "pair":
            a, b = grp.ins[0], grp.ins[1]
            ca, cb = all_codes(a.qp.dtype), all_codes(b.qp.dtype)
            args = [dq(k, 0, a, np.repeat(ca, 256)), dq(k, 1, b, np.tile(cb, 256))]
            size = 65536
            picks[table] = (k, slice(None))
        elif kind == "unary":
            x = grp.ins[0]
            args = [dq(k, 0, x, all_codes(x.qp.dtype))]
            for e in grp.ins[1:]:
                if e.kind in ("fconst", "raw"):
                    init(e.name, g.array(e.name))
                args.append(e.name)
            size = 256
            picks[table] = (k, slice(None))
        elif kind[0] == "chain":  # op(x, f(x)): run f's group, then the op's group
            _, j, ugrp = kind
            x = grp.ins[1 - j]
            codes = all_codes(x.qp.dtype)
            ux = ugrp.ins[0]
            uargs = [dq(k, "u", ux, codes)]
            for e in ugrp.ins[1:]:
                if e.kind in ("fconst", "raw"):
                    init(e.name, g.array(e.name))
                uargs.append(e.name)
            un = ugrp.node
            nodes.append(helper.make_node(
                un.op_type, uargs, [f"uy{k}"], domain=un.domain,
                **attrs(un)))
            uo, fx = ugrp.outs[0], grp.ins[j]
            init(f"us{k}", uo.qp.scale.reshape(()))
            init(f"uz{k}", uo.qp.zero_point.reshape(()))
            init(f"fs{k}", fx.qp.scale.reshape(()))
            init(f"fz{k}", fx.qp.zero_point.reshape(()))
            nodes.append(helper.make_node("QuantizeLinear", [f"uy{k}", f"us{k}", f"uz{k}"],
                                          [f"uq{k}"]))
            nodes.append(helper.make_node("DequantizeLinear", [f"uq{k}", f"fs{k}", f"fz{k}"],
                                          [f"ud{k}"]))
            args = [None, None]
            args[1 - j], args[j] = dq(k, 0, x, codes), f"ud{k}"
            size = 256
            picks[table] = (k, slice(None))
        else:  # ("concat", index)
            args = [dq(k, j, x, all_codes(x.qp.dtype)) for j, x in enumerate(grp.ins)]
            size = 256 * len(args)
            j = kind[1]
            picks[table] = (k, slice(256 * j, 256 * (j + 1)))
        kept = {"axis": 0} if kind[0] == "concat" else attrs(n)
        nodes.append(helper.make_node(n.op_type, args, [y], domain=n.domain, **kept))
        init(f"ys{k}", out.qp.scale.reshape(()))
        init(f"yz{k}", out.qp.zero_point.reshape(()))
        nodes.append(helper.make_node("QuantizeLinear", [y, f"ys{k}", f"yz{k}"], [yq]))
        outputs.append(helper.make_tensor_value_info(yq, ONNX_CODE_TYPE[out.qp.dtype], [size]))
    model = helper.make_model(
        helper.make_graph(nodes, "lut", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", max(opset(g.model, default=0), 13))],
        ir_version=min(g.model.ir_version or 8, 10),
    )
    sess = session(model)  # the one core the rule is granted (Rule.cpu)
    res = sess.run(None, feeds)
    return {table: np.ascontiguousarray(res[k][sl]) for table, (k, sl) in picks.items()}


def all_codes(dtype) -> np.ndarray:
    """All 256 codes in table order: index = code (uint8) or code + 128 (int8)."""
    if np.dtype(dtype) == np.uint8:
        return np.arange(256, dtype=np.uint8)
    return (np.arange(256) - 128).astype(np.int8)


