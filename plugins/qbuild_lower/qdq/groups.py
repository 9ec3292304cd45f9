"""Finding DQ -> op -> Q groups: what a compute node reads and writes in quantized form.

``analyze`` looks at one compute node and returns a ``Group`` (its inputs classified as
quantized activations, quantized constants, float constants or other tensors, and its
outputs as the QuantizeLinear nodes that consume them) or raises ``Unsupported`` with the
reason the node must stay in float. The rules it enforces are the safety rules of the
lowering: a float tensor that is a graph output, feeds a float consumer, or feeds
QuantizeLinear nodes with different parameters is never folded away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from qbuild_onnx_common.arrays import Array
from qbuild_onnx_common.graph import attr

from .graph import FLOAT_TYPES, Graph, QParams


class Unsupported(Exception):
    """The node stays in float; ``str(e)`` is the reason shown in the report."""

    def __init__(self, reason: str, category: str = "unsupported"):
        super().__init__(reason)
        self.category = category


# Report categories (stable strings, documented in docs/integer-lowering.md).
UNSUPPORTED_OP = "unsupported_op"
SCALE_MISMATCH = "scale_mismatch"
GRAPH_OUTPUT = "graph_output"
MULTI_CONSUMER = "several_consumers"
DTYPE = "dtype"
FLOAT_INPUT = "float_input"
RANGE = "range"


@dataclass(frozen=True)
class Quantized:
    """An input read through a DequantizeLinear (kind ``act`` or ``qconst``)."""

    name: str  # the tensor the compute node reads
    kind: str  # act | qconst
    q: str  # the quantized tensor the DequantizeLinear reads
    qp: QParams

    def value(self, g: Graph) -> Array:
        return g.array(self.q if self.kind == "qconst" else self.name)


@dataclass
class In:
    """One input of a compute node, classified."""

    name: str  # the tensor the compute node reads
    kind: str  # act | qconst | fconst | raw | none | other
    q: str | None = None  # quantized tensor (DQ input) for act/qconst
    qp: QParams | None = None

    def value(self, g: Graph) -> Array:
        return self.quantized().value(g) if self.kind == "qconst" else g.array(self.name)

    def quantized(self) -> Quantized:
        """This input as ``Quantized`` (it must be an ``act`` or ``qconst``)."""
        if self.q is None or self.qp is None:
            raise ValueError(f"input {self.name!r} ({self.kind}) is not quantized")
        return Quantized(self.name, self.kind, self.q, self.qp)


@dataclass
class Out:
    """One output of a compute node and the QuantizeLinear nodes that read it."""

    name: str  # float output of the compute node
    q: str  # the QuantizeLinear output the lowered node will produce
    qp: QParams
    q_nodes: list[int] = field(default_factory=list)  # indices of the Q nodes absorbed
    aliases: list[str] = field(default_factory=list)  # other Q outputs renamed to ``q``


@dataclass
class Group:
    """A compute node (at ``index``) with its classified inputs and quantized outputs."""

    index: int
    node: onnx.NodeProto
    ins: list[In]
    outs: list[Out]

    def attr(self, name: str, default: Any = None) -> Any:
        return attr(self.node, name, default)


def is_q(node: onnx.NodeProto) -> bool:
    return node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx")


def is_dq(node: onnx.NodeProto) -> bool:
    return node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx")


def classify_input(g: Graph, t: str) -> In:
    if not t:
        return In(t, "none")
    if g.is_const(t):
        arr_type = g.inits[t].data_type
        return In(t, "fconst" if arr_type in FLOAT_TYPES else "raw")
    p = g.producer_node(t)
    if p is not None and is_dq(p):
        qp = g.qparams(p)
        kind = "qconst" if g.is_const(p.input[0]) else "act"
        return In(t, kind, p.input[0], qp)
    return In(t, "other")


def analyze(g: Graph, i: int, optional_outputs: int | None = None) -> Group:
    """Classify node ``i``. ``optional_outputs``: only the first k outputs must be
    quantized; later ones must be unused (e.g. MaxPool's Indices)."""
    node = g.nodes[i]
    ins = [classify_input(g, t) for t in node.input]
    outs = []
    for k, t in enumerate(node.output):
        if not t:
            continue
        if optional_outputs is not None and k >= optional_outputs:
            if g.consumers.get(t) or t in g.outputs:
                raise Unsupported(f"optional output {t!r} is used", UNSUPPORTED_OP)
            continue
        outs.append(_output(g, node, t))
    return Group(i, node, ins, outs)


def _output(g: Graph, node: onnx.NodeProto, t: str) -> Out:
    if t in g.outputs:
        raise Unsupported(
            f"output {t!r} is a graph output: folding its QuantizeLinear would change it",
            GRAPH_OUTPUT,
        )
    users = g.consumers.get(t, [])
    if not users:
        raise Unsupported(f"output {t!r} has no consumer", UNSUPPORTED_OP)
    q_users = [u for u in users if is_q(g.nodes[u])]
    if len(q_users) != len(users):
        others = sorted({g.nodes[u].op_type for u in users if u not in q_users})
        raise Unsupported(
            f"output {t!r} has several consumers and {', '.join(others)} reads it in float",
            MULTI_CONSUMER if len(users) > 1 else FLOAT_INPUT,
        )
    qps = [g.qparams(g.nodes[u]) for u in q_users]
    if len({qp.key() for qp in qps}) > 1:
        raise Unsupported(
            f"output {t!r} has several consumers quantizing it with different parameters",
            MULTI_CONSUMER,
        )
    if not qps[0].per_tensor:
        raise Unsupported(f"output {t!r} is quantized per axis", DTYPE)
    if not is_8bit(qps[0]):
        raise Unsupported(f"output {t!r} is quantized to {qps[0].dtype}, not 8-bit", DTYPE)
    first = g.nodes[q_users[0]].output[0]
    aliases = [g.nodes[u].output[0] for u in q_users[1:]]
    for a in aliases:
        if a in g.outputs:
            raise Unsupported(
                f"output {t!r}: its second QuantizeLinear output {a!r} is a graph output",
                GRAPH_OUTPUT,
            )
    return Out(t, first, qps[0], list(q_users), aliases)


def need_act(x: In, what: str, per_tensor: bool = True, const_ok: bool = True) -> Quantized:
    """The input must be quantized (activation or, if allowed, constant), 8-bit."""
    ok = x.kind == "act" or (const_ok and x.kind == "qconst")
    if not ok:
        why = {
            "fconst": "a float constant",
            "other": "a float tensor not produced by DequantizeLinear",
            "raw": "not a float tensor",
            "none": "missing",
        }.get(x.kind, x.kind)
        raise Unsupported(f"{what} {x.name!r} is {why}", FLOAT_INPUT)
    quantized = x.quantized()
    if not is_8bit(quantized.qp):
        raise Unsupported(f"{what} {x.name!r} is quantized to {quantized.qp.dtype}, not 8-bit",
                          DTYPE)
    if per_tensor and not quantized.qp.per_tensor:
        raise Unsupported(f"{what} {x.name!r} is quantized per axis", DTYPE)
    return quantized


def is_8bit(qp: QParams) -> bool:
    return qp.dtype in (np.dtype(np.uint8), np.dtype(np.int8))


def same_params(a: QParams, b: QParams, what: str) -> None:
    if not a.same_as(b):
        raise Unsupported(
            f"{what}: scale/zero point differ "
            f"({float(a.scale.ravel()[0]):.6g}/{int(a.zero_point.ravel()[0])} vs "
            f"{float(b.scale.ravel()[0]):.6g}/{int(b.zero_point.ravel()[0])})",
            SCALE_MISMATCH,
        )
