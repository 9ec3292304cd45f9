"""Lookup tables for elementwise ops on 8-bit codes.

A table holds, for every combination of input codes, the output code the QDQ source
produces: QuantizeLinear(op(DequantizeLinear(codes...))). Four kinds of request:

* ``unary`` -- one quantized input (Sigmoid, LeakyRelu, ...): 256 entries;
* ``pair`` -- two quantized activations of one shape (Add, Mul under rounding
  ``onnxruntime``): 65,536 entries, index ``a * 256 + b``;
* ``ConcatInput(k)`` -- input ``k`` of a Concat requantized to the output's parameters:
  256 entries;
* ``Chained(j, unary group)`` -- a two-input op whose input ``j`` is a unary table of its
  other input (SiLU: ``x * Sigmoid(x)``): 256 entries, both groups run in sequence.

All tables of a model are computed in one onnxruntime session over a model made of exactly
those DQ -> op -> Q groups, so a table matches the source as onnxruntime runs it, code for
code. The float arithmetic happens here, at build time; the lowered graph only indexes the
table (Gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
from numpy.typing import DTypeLike, NDArray
from onnx import helper, numpy_helper
from qbuild_onnx_common.arrays import Array
from qbuild_onnx_common.graph import attrs
from qbuild_onnx_common.ort import session

from ..qdq.graph import Graph, onnx_opset
from ..qdq.groups import Group, In, Quantized

#: The ONNX element type of 8-bit codes of each numpy type.
ONNX_CODE_TYPE = {np.dtype(np.uint8): onnx.TensorProto.UINT8,
                  np.dtype(np.int8): onnx.TensorProto.INT8}

#: 8-bit codes (uint8 or int8).
Codes = NDArray[np.integer[Any]]


@dataclass(frozen=True)
class ConcatInput:
    """Input ``index`` of a Concat, requantized to the output's parameters."""

    index: int


@dataclass(frozen=True)
class Chained:
    """A two-input op whose input ``lut_input`` is the ``unary`` group's table of its other
    input."""

    lut_input: int
    unary: Group


TableKind = Literal["unary", "pair"] | ConcatInput | Chained


@dataclass(frozen=True)
class TableRequest:
    """The table initializer ``name`` a lowered ``group`` indexes."""

    name: str
    group: Group
    kind: TableKind


class _TableModel:
    """The one model every table is computed with: per request, the group's own
    DQ -> op -> Q fed every combination of input codes."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, Codes] = {}
        self._seen: set[str] = set()

    def init(self, name: str, arr: Array) -> None:
        if name not in self._seen:
            self._seen.add(name)
            self.inits.append(numpy_helper.from_array(np.asarray(arr), name))

    def dq(self, k: int, j: int | str, x: Quantized, codes: Codes) -> str:
        """Feed ``codes`` as input ``j`` of request ``k``, dequantized as ``x`` is."""
        xin, d = f"x{k}_{j}", f"dq{k}_{j}"
        self.feeds[xin] = codes
        self.inputs.append(helper.make_tensor_value_info(xin, ONNX_CODE_TYPE[x.qp.dtype],
                                                         [codes.size]))
        self.init(f"xs{k}_{j}", x.qp.scale.reshape(()))
        self.init(f"xz{k}_{j}", x.qp.zero_point.reshape(()))
        self.nodes.append(helper.make_node("DequantizeLinear",
                                           [xin, f"xs{k}_{j}", f"xz{k}_{j}"], [d]))
        return d

    def constants(self, ins: list[In]) -> list[str]:
        """The names of a group's other inputs, float or raw constants added as such."""
        names = []
        for e in ins:
            if e.kind in ("fconst", "raw"):
                self.init(e.name, self.g.array(e.name))
            names.append(e.name)
        return names

    def chained_inputs(self, k: int, grp: Group, chain: Chained) -> list[str]:
        """``op(x, f(x))``: run f's group on every code of x, then requantize its output
        to the parameters the op's DequantizeLinear reads it with."""
        j, ugrp = chain.lut_input, chain.unary
        x = grp.ins[1 - j].quantized()
        codes = all_codes(x.qp.dtype)
        uargs = [self.dq(k, "u", ugrp.ins[0].quantized(), codes),
                 *self.constants(ugrp.ins[1:])]
        un = ugrp.node
        self.nodes.append(helper.make_node(un.op_type, uargs, [f"uy{k}"], domain=un.domain,
                                           **attrs(un)))
        uo, fx = ugrp.outs[0], grp.ins[j].quantized()
        self.init(f"us{k}", uo.qp.scale.reshape(()))
        self.init(f"uz{k}", uo.qp.zero_point.reshape(()))
        self.init(f"fs{k}", fx.qp.scale.reshape(()))
        self.init(f"fz{k}", fx.qp.zero_point.reshape(()))
        self.nodes.append(helper.make_node("QuantizeLinear", [f"uy{k}", f"us{k}", f"uz{k}"],
                                           [f"uq{k}"]))
        self.nodes.append(helper.make_node("DequantizeLinear", [f"uq{k}", f"fs{k}", f"fz{k}"],
                                           [f"ud{k}"]))
        args = ["", ""]
        args[1 - j], args[j] = self.dq(k, 0, x, codes), f"ud{k}"
        return args

    def request(self, k: int, req: TableRequest) -> tuple[int, slice]:
        """Add request ``k``'s DQ -> op -> Q; returns the slice of output ``k`` that is
        its table."""
        grp, kind = req.group, req.kind
        out, n = grp.outs[0], grp.node
        y, yq = f"y{k}", f"q{k}"
        picked = slice(None)
        if kind == "pair":
            a, b = grp.ins[0].quantized(), grp.ins[1].quantized()
            ca, cb = all_codes(a.qp.dtype), all_codes(b.qp.dtype)
            args = [self.dq(k, 0, a, np.repeat(ca, 256)), self.dq(k, 1, b, np.tile(cb, 256))]
            size = 65536
        elif kind == "unary":
            x = grp.ins[0].quantized()
            args = [self.dq(k, 0, x, all_codes(x.qp.dtype)), *self.constants(grp.ins[1:])]
            size = 256
        elif isinstance(kind, Chained):
            args = self.chained_inputs(k, grp, kind)
            size = 256
        else:
            args = [self.dq(k, j, x.quantized(), all_codes(x.quantized().qp.dtype))
                    for j, x in enumerate(grp.ins)]
            size = 256 * len(args)
            picked = slice(256 * kind.index, 256 * (kind.index + 1))
        kept = {"axis": 0} if isinstance(kind, ConcatInput) else attrs(n)
        self.nodes.append(helper.make_node(n.op_type, args, [y], domain=n.domain, **kept))
        self.init(f"ys{k}", out.qp.scale.reshape(()))
        self.init(f"yz{k}", out.qp.zero_point.reshape(()))
        self.nodes.append(helper.make_node("QuantizeLinear", [y, f"ys{k}", f"yz{k}"], [yq]))
        self.outputs.append(helper.make_tensor_value_info(yq, ONNX_CODE_TYPE[out.qp.dtype],
                                                          [size]))
        return k, picked

    def model(self) -> onnx.ModelProto:
        g = self.g.model
        return helper.make_model(
            helper.make_graph(self.nodes, "lut", self.inputs, self.outputs, self.inits),
            opset_imports=[helper.make_opsetid("", max(onnx_opset(g), 13))],
            ir_version=min(g.ir_version or 8, 10),
        )


def build_tables(g: Graph, requests: list[TableRequest]) -> dict[str, Codes]:
    """The output codes of every requested table, by table name."""
    if not requests:
        return {}
    tables = _TableModel(g)
    picks = {req.name: tables.request(k, req) for k, req in enumerate(requests)}
    sess = session(tables.model())  # the one core the rule is granted (Rule.cpu)
    res = sess.run(None, tables.feeds)
    return {table: np.ascontiguousarray(res[k][sl]) for table, (k, sl) in picks.items()}


def all_codes(dtype: DTypeLike) -> Codes:
    """All 256 codes in table order: index = code (uint8) or code + 128 (int8)."""
    if np.dtype(dtype) == np.uint8:
        return np.arange(256, dtype=np.uint8)
    return (np.arange(256) - 128).astype(np.int8)


