"""Reading QDQ models: every ai.onnx QuantizeLinear / DequantizeLinear of the main graph with
its effective quantized type, scale, zero point, axis and block size; validation of each node
against the spec (conflicting output_dtype, float8 zero points, block_size); and the
"effective parameters" used to prove that a form conversion changed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt
from onnx import ModelProto, NodeProto, TensorProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import attr
from qbuild_onnx_common.summary import onnx_type_name

from ..numerics import arithmetic
from ..numerics.qtypes import is_qtype, qtype
from .reading import Constants, InferredTypes, Shape, inferred_types

Q_OPS = ("QuantizeLinear", "DequantizeLinear")

# What a Q/DQ node computes (see _param_key): quantized type, axis (None per tensor), block
# size, saturate, scale (dtype, shape, bytes), zero point ("dynamic", None or its bytes as
# float64) and the input's name.
ParamKey = tuple[int | None, int | None, int, int, tuple[str, Shape, bytes] | None,
                 str | bytes | None, str]


class EquivalenceProof(TypedDict):
    """What :func:`check_equivalent` compared and found identical."""

    dequantized_weights_identical: int
    qdq_nodes_identical: int


@dataclass
class QdqNode:
    """One Q or DQ node and what it means."""

    index: int
    node: NodeProto
    qelem: int | None  # TensorProto enum of the quantized side (None if unknown)
    scale: npt.NDArray[Any] | None  # constant scale, or None if computed at run time
    scale_elem: int | None
    zp_name: str | None  # None when the zero point input is absent
    zp: npt.NDArray[Any] | None  # constant zero point values (None if absent or dynamic)
    zp_elem: int | None  # the zero point's element type, if present and known
    x_shape: Shape | None  # static shape of the (float or quantized) input, if known
    x_const: bool  # DequantizeLinear of a constant: a weight

    @property
    def is_q(self) -> bool:
        return self.node.op_type == "QuantizeLinear"

    @property
    def label(self) -> str:
        return f"{self.node.op_type} {self.node.name or self.node.output[0]!r}"

    @property
    def axis(self) -> int:
        return int(attr(self.node, "axis", 1))

    @property
    def block_size(self) -> int:
        return int(attr(self.node, "block_size", 0))

    @property
    def output_dtype(self) -> int:
        return int(attr(self.node, "output_dtype", 0)) if self.is_q else 0

    @property
    def zp_dynamic(self) -> bool:
        return self.zp_name is not None and self.zp is None

    @property
    def zp_all_zero(self) -> bool:
        return self.zp is not None and not np.any(self.zp)

    @property
    def is_activation(self) -> bool:
        return not self.x_const


def _input(node: NodeProto, i: int) -> str | None:
    return node.input[i] if len(node.input) > i and node.input[i] else None


def find_qdq(model: ModelProto, types: InferredTypes | None = None) -> list[QdqNode]:
    """All ai.onnx Q/DQ nodes of the main graph, in node order."""
    consts = Constants(model.graph)
    if types is None:
        types = inferred_types(model)
    elem, shapes = types
    out: list[QdqNode] = []
    for i, n in enumerate(model.graph.node):
        if n.op_type not in Q_OPS or n.domain not in ("", "ai.onnx"):
            continue
        x, s, z = _input(n, 0), _input(n, 1), _input(n, 2)
        zt = consts.tensor(z) if z else None
        scale = consts.array(s) if s else None
        st = consts.tensor(s) if s else None
        scale_elem = st.data_type if st is not None else (elem.get(s) if s else None)
        zp = consts.array(z) if z and zt is not None else None
        zp_elem = zt.data_type if zt is not None else (elem.get(z) if z else None)
        qelem: int | None
        if n.op_type == "QuantizeLinear":
            od = int(attr(n, "output_dtype", 0))
            qelem = od or zp_elem or (TensorProto.UINT8 if not z else None)
        else:
            xt = consts.tensor(x) if x else None
            qelem = xt.data_type if xt is not None else (elem.get(x) if x else None)
        out.append(QdqNode(i, n, qelem, scale, scale_elem, z, zp, zp_elem,
                           shapes.get(x) if x else None, x is not None and x in consts))
    return out


def validate(qn: QdqNode) -> None:
    """Raise OnnxError for a node the spec makes invalid (or that runtimes reject)."""
    n = qn.node
    if qn.is_q and qn.output_dtype and qn.zp_name:
        zelem = qn.zp_elem
        if zelem is not None and zelem != qn.output_dtype:
            raise OnnxError(f"{qn.label}: output_dtype {onnx_type_name(qn.output_dtype)} "
                             f"conflicts with zero point {qn.zp_name!r} of type "
                             f"{onnx_type_name(zelem)}")
    if qn.qelem is not None and qn.qelem != TensorProto.INT32 and not is_qtype(qn.qelem):
        raise OnnxError(f"{qn.label}: {onnx_type_name(qn.qelem)} is not a quantized type")
    if qn.qelem is not None and is_qtype(qn.qelem):
        q = qtype(qn.qelem)
        if q.kind == "float" and qn.zp is not None and np.any(qn.zp != 0):
            raise OnnxError(f"{qn.label}: {q.name} zero point {qn.zp_name!r} is not zero "
                             f"(float8/float4 take no zero point)")
    if qn.block_size:
        if qn.scale is None or qn.x_shape is None:
            return
        rank = len(qn.x_shape)
        ax = arithmetic.normalize_axis(qn.axis, rank, qn.label)
        if qn.scale.ndim != rank:
            raise OnnxError(f"{qn.label}: blocked scale must have rank {rank}, "
                             f"has shape {list(qn.scale.shape)}")
        arithmetic.validate_block_size(qn.x_shape[ax], qn.scale.shape[ax], qn.block_size,
                                  f"{qn.label} (attribute block_size)")
    if n.op_type == "DequantizeLinear" and qn.qelem == TensorProto.INT32 and qn.zp is not None:
        if np.any(qn.zp != 0):
            raise OnnxError(f"{qn.label}: int32 input with a non-zero zero point")


def analyze(model: ModelProto) -> list[QdqNode]:
    """find_qdq + validate every node."""
    nodes = find_qdq(model)
    for qn in nodes:
        validate(qn)
    return nodes


def _param_key(qn: QdqNode) -> ParamKey:
    """Everything that determines what a Q/DQ node computes, with an absent zero point
    materialized as zeros of its type."""
    per_tensor = qn.scale is not None and qn.scale.size == 1 and qn.block_size == 0
    zp = qn.zp
    if zp is None and qn.scale is not None and not qn.zp_dynamic:
        zp = np.zeros(qn.scale.shape, np.int32)
    saturate = int(attr(qn.node, "saturate", 1))
    if qn.qelem is None or not is_qtype(qn.qelem) or qtype(qn.qelem).kind != "float":
        saturate = 1
    return (
        qn.qelem,
        None if per_tensor else qn.axis,
        qn.block_size,
        saturate,
        None if qn.scale is None else (str(qn.scale.dtype), qn.scale.shape, qn.scale.tobytes()),
        "dynamic" if qn.zp_dynamic else (None if zp is None else
                                         np.asarray(zp, np.float64).reshape(-1).tobytes()),
        qn.node.input[0],
    )


def effective_params(model: ModelProto) -> dict[str, ParamKey]:
    """Map 'op:output' -> the node's effective parameters."""
    return {f"{qn.node.op_type}:{qn.node.output[0]}": _param_key(qn) for qn in find_qdq(model)}


def dequantized_weights(model: ModelProto) -> dict[str, npt.NDArray[np.floating[Any]]]:
    """Float value of every DequantizeLinear whose input is a constant, by output name."""
    out: dict[str, npt.NDArray[np.floating[Any]]] = {}
    for qn in find_qdq(model):
        if qn.is_q or not qn.x_const or qn.scale is None:
            continue
        x = Constants(model.graph).array(qn.node.input[0])
        if x is None:  # x_const: the input is a constant
            continue
        out[qn.node.output[0]] = arithmetic.dequantize(
            x, qn.scale, qn.zp, qn.axis, qn.block_size, where=qn.label)
    return out


def check_equivalent(before: ModelProto, after: ModelProto) -> EquivalenceProof:
    """Prove a form conversion changed no computation: every dequantized initializer is
    bit-identical and every Q/DQ node has the same effective parameters. Raises otherwise."""
    wa, wb = dequantized_weights(before), dequantized_weights(after)
    if sorted(wa) != sorted(wb):
        missing = sorted(set(wa) ^ set(wb))
        raise OnnxError(f"equivalence check: dequantized initializers differ in set: "
                         f"{missing[:5]}")
    for name in sorted(wa):
        a, b = wa[name], wb[name]
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            raise OnnxError(f"equivalence check: dequantized weight {name!r} changed")
    pa, pb = effective_params(before), effective_params(after)
    if sorted(pa) != sorted(pb):
        raise OnnxError("equivalence check: the set of Q/DQ nodes changed")
    for key in sorted(pa):
        if pa[key] != pb[key]:
            raise OnnxError(f"equivalence check: {key} changed its effective parameters")
    return {"dequantized_weights_identical": len(wa), "qdq_nodes_identical": len(pa)}
