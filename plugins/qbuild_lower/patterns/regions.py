"""Element-wise regions: sub-graphs that compute quantized tensors from ONE 8-bit tensor.

Between two quantized tensors a QDQ model often runs a chain of element-wise ops on one
input: SiLU (``DQ -> Sigmoid -> Q -> DQ -> Mul(DQ(x), .) -> Q``), HardSwish, GELU written
out as Div/Erf/Add/Mul, Clip, LeakyRelu, and compositions of those. Whatever the chain,
each quantized output is a function of the input's 8-bit code alone: a 256-entry table.

``find_regions`` groups the nodes by the one quantized tensor (the *root*) they depend
on: a node belongs to root ``r`` when it is element-wise (a one-input op, a two-input op
whose other input is also derived from ``r`` or is a one-element constant, or a
per-tensor QuantizeLinear/DequantizeLinear) and every non-constant input derives from
``r``. A region's *exports* are its tensors read outside it or graph outputs; a region can
be replaced by tables only when every export is an 8-bit per-tensor QuantizeLinear
output (otherwise ``reason`` says which tensor leaves it in float).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from qbuild_onnx_common.arrays import Array

from ..emit.quantized import LUT_OPS
from ..qdq.graph import Graph
from ..qdq.groups import is_dq, is_q

#: Two-input element-wise ops (the other input derived from the root, or a scalar).
BINARY_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
#: One-input ops besides the lookup-table ops (no effect on values of the same type).
PASS_OPS = {"Identity"}


@dataclass
class Region:
    root: str  # the 8-bit tensor every node derives from
    nodes: list[int] = field(default_factory=list)  # node indices replaced, in graph order
    members: list[int] = field(default_factory=list)  # nodes the tables are computed from
    exports: list[str] = field(default_factory=list)  # tensors read outside / graph outputs
    reason: str | None = None  # why it cannot become tables (None: it can)

    def compute_nodes(self, g: Graph) -> list[int]:
        return [i for i in self.nodes if not (is_q(g.nodes[i]) or is_dq(g.nodes[i]))]

    def root_dequantize(self, g: Graph) -> onnx.NodeProto:
        """The region's DequantizeLinear of its root."""
        return next(g.nodes[i] for i in self.members
                    if is_dq(g.nodes[i]) and g.nodes[i].input[0] == self.root)


def _scalar_const(g: Graph, t: str) -> bool:
    """A one-element initializer, or the DequantizeLinear of one (a quantized constant)."""
    if g.is_const(t):
        return int(np.prod(g.array(t).shape)) == 1
    p = g.producer_node(t)
    return (p is not None and is_dq(p) and g.is_const(p.input[0])
            and int(np.prod(g.array(p.input[0]).shape)) == 1
            and all(not x or g.is_const(x) for x in p.input[1:]))


def _per_tensor(g: Graph, node: onnx.NodeProto) -> bool:
    try:
        qp = g.qparams(node)
    except ValueError:
        return False
    return qp.per_tensor


def _eligible(g: Graph, node: onnx.NodeProto) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    if is_q(node) or is_dq(node):
        return not g.is_const(node.input[0]) and _per_tensor(g, node)
    return node.op_type in LUT_OPS or node.op_type in BINARY_OPS or node.op_type in PASS_OPS


def find_regions(g: Graph) -> list[Region]:
    """Every element-wise region with at least one compute node, in graph order."""
    root: dict[str, str] = {}  # tensor -> root tensor
    members: dict[str, list[int]] = {}
    consts: dict[str, set[int]] = {}
    for i, n in enumerate(g.nodes):
        if not _eligible(g, n) or len([t for t in n.output if t]) != 1:
            continue
        data = [t for t in n.input if t]
        if is_q(n) or is_dq(n):
            data = data[:1]
        roots = set()
        ok = True
        for t in data:
            if t in root:
                roots.add(root[t])
            elif is_dq(n) and _is_8bit_dq(g, n):
                roots.add(t)  # a quantized tensor not derived from another root
            elif not (is_q(n) or is_dq(n)) and _scalar_const(g, t):
                continue
            else:
                ok = False
        if not ok or len(roots) != 1:
            continue
        if not (is_q(n) or is_dq(n)) and n.op_type in LUT_OPS:
            extra = [t for t in n.input[1:] if t]
            if any(not _scalar_const(g, t) for t in extra):
                continue  # e.g. PRelu with a per-channel slope
        r = roots.pop()
        root[n.output[0]] = r
        members.setdefault(r, []).append(i)
        for t in data:  # quantized scalar constants: their DQ joins the table model
            p = g.producer.get(t)
            if t not in root and p is not None and not g.is_const(t) and _scalar_const(g, t):
                consts.setdefault(r, set()).add(p)
    regions = []
    for r, idx in members.items():
        reg = _close(g, r, idx)
        if reg is not None:
            reg.members = sorted(set(reg.members) | consts.get(r, set()))
            regions.append(reg)
    return sorted(regions, key=lambda reg: reg.nodes[0])


def _is_8bit_dq(g: Graph, n: onnx.NodeProto) -> bool:
    try:
        qp = g.qparams(n)
    except ValueError:
        return False
    return qp.per_tensor and qp.dtype in (np.uint8, np.int8)


def _close(g: Graph, r: str, idx: list[int]) -> Region | None:
    """Drop DequantizeLinear nodes read outside the region (they stay in the graph and read
    an export), then find the exports."""
    inside = set(idx)
    while True:
        drop = set()
        for i in inside:
            n = g.nodes[i]
            if is_dq(n) and (n.output[0] in g.outputs
                             or any(u not in inside for u in g.consumers.get(n.output[0], []))):
                drop.add(i)
        if not drop:
            break
        inside -= drop
    if not any(not (is_q(g.nodes[i]) or is_dq(g.nodes[i])) for i in inside):
        return None
    exports: list[str] = []
    reason: str | None = None
    for i in sorted(inside):
        n = g.nodes[i]
        t = n.output[0]
        if t in g.outputs or any(u not in inside for u in g.consumers.get(t, [])):
            exports.append(t)
            if not is_q(n):
                reason = reason or f"{n.op_type} output {t!r} is read in float outside the chain"
            elif not _quantized_8bit(g, n):
                reason = reason or f"{t!r} is not 8-bit per-tensor"
            elif t in g.outputs:
                reason = reason or f"{t!r} is a graph output"
    if not exports:
        return None
    rank = _rank(g, r)
    for i in idx:
        for t in g.nodes[i].input[1:] if not (is_q(g.nodes[i]) or is_dq(g.nodes[i])) else ():
            c = _const_value(g, t)
            # a one-element constant of higher rank than the root would broadcast the
            # result to another shape than the table's Reshape gives back
            if c is not None and c.ndim > 1 and (rank is None or c.ndim > rank):
                reason = reason or (f"constant {t!r} of rank {c.ndim} may change the shape "
                                    f"of {r!r} (rank {rank})")
    return Region(r, sorted(inside), sorted(idx), exports, reason)


def _const_value(g: Graph, t: str) -> Array | None:
    if not t:
        return None
    if g.is_const(t):
        return g.array(t)
    p = g.producer_node(t)
    if p is not None and is_dq(p) and g.is_const(p.input[0]):
        return g.array(p.input[0])
    return None


def _rank(g: Graph, t: str) -> int | None:
    for vi in list(g.model.graph.value_info) + list(g.model.graph.input) + list(
            g.model.graph.output):
        if vi.name == t and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    p = g.producer_node(t)  # the root is usually a QuantizeLinear output: its input's rank
    if p is not None and is_q(p) and p.input[0] != t:
        return _rank(g, p.input[0])
    return None


def _quantized_8bit(g: Graph, q: onnx.NodeProto) -> bool:
    qp = g.qparams(q)
    return qp.per_tensor and qp.dtype in (np.uint8, np.int8)
