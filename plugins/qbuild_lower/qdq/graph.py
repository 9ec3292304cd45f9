"""Tensor-level index of an ONNX graph: producers, consumers, graph outputs, constants.

Graph outputs are a property of a tensor, kept apart from its consumer edges (the lesson
of aimet#3399); names are matched exactly, never by substring. Also owns the quantization
parameters read from QuantizeLinear/DequantizeLinear nodes and the final topological sort.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import numpy_helper
from qbuild_onnx_common.arrays import Array
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import attr, opset

#: Tensor shapes as shape inference gives them: a dimension is a size, a symbolic name or
#: unknown (None).
Shape = list[int | str | None]

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


@dataclass
class QParams:
    """Affine quantization parameters of one quantized tensor."""

    scale: NDArray[np.float32]  # scalar or 1-D (per-axis)
    zero_point: NDArray[np.integer[Any]]  # int8/uint8/int32 with the same shape as scale
    axis: int | None  # None when per-tensor
    scale_name: str
    zp_name: str | None

    @property
    def dtype(self) -> np.dtype[np.integer[Any]]:
        return self.zero_point.dtype

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    def same_as(self, other: QParams) -> bool:
        return (
            self.per_tensor
            and other.per_tensor
            and self.dtype == other.dtype
            and float(self.scale.ravel()[0]) == float(other.scale.ravel()[0])
            and int(self.zero_point.ravel()[0]) == int(other.zero_point.ravel()[0])
        )

    def key(self) -> tuple[str, tuple[float, ...], tuple[int, ...]]:
        return (
            str(self.dtype),
            tuple(float(s) for s in self.scale.ravel()),
            tuple(int(z) for z in self.zero_point.ravel()),
        )


@dataclass
class Graph:
    """The source graph by node position: who produces and reads each tensor, graph
    inputs and outputs, initializers (their arrays read once, on demand) and, for the
    fixed-point mode, tensor shapes from shape inference."""

    model: onnx.ModelProto
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    producer: dict[str, int] = field(default_factory=dict)  # tensor -> node index
    consumers: defaultdict[str, list[int]] = field(
        default_factory=lambda: defaultdict(list))  # tensor -> [node index]
    outputs: set[str] = field(default_factory=set)
    inputs: set[str] = field(default_factory=set)
    inits: dict[str, onnx.TensorProto] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)  # filled by fixed_point.prepare
    _arrays: dict[str, Array] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> Graph:
        g = cls(model=model)
        gr = model.graph
        g.nodes = list(gr.node)
        g.inits = {t.name: t for t in gr.initializer}
        g.outputs = {o.name for o in gr.output}
        g.inputs = {i.name for i in gr.input if i.name not in g.inits}
        for i, n in enumerate(g.nodes):
            for t in n.output:
                if t:
                    if t in g.producer:
                        raise OnnxError(f"tensor {t!r} is produced by two nodes")
                    g.producer[t] = i
            for t in n.input:
                if t:
                    g.consumers[t].append(i)
        return g

    def array(self, name: str) -> Array:
        if name not in self._arrays:
            self._arrays[name] = np.asarray(numpy_helper.to_array(self.inits[name]))
        return self._arrays[name]

    def is_const(self, name: str) -> bool:
        return name in self.inits

    def node_name(self, i: int) -> str:
        n = self.nodes[i]
        return n.name or f"{n.op_type}_{i}"

    def producer_node(self, t: str) -> onnx.NodeProto | None:
        i = self.producer.get(t)
        return None if i is None else self.nodes[i]

    def producer_of(self, t: str) -> onnx.NodeProto:
        """The node producing ``t``, which must have one."""
        return self.nodes[self.producer[t]]

    def qparams(self, node: onnx.NodeProto) -> QParams:
        """Parameters of a QuantizeLinear or DequantizeLinear node (constants required)."""
        scale_name = node.input[1]
        zp_name: str | None = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if not self.is_const(scale_name) or (zp_name and not self.is_const(zp_name)):
            raise OnnxError(
                f"{node.op_type} {node.name!r}: scale/zero point must be initializers"
            )
        scale = self.array(scale_name).astype(np.float32)
        zp: NDArray[np.integer[Any]]
        if zp_name:
            zp = self.array(zp_name)
        else:
            to = attr(node, "output_dtype", 0)
            zp = np.zeros(scale.shape, _ONNX_TO_NP.get(to, np.uint8))
        axis = None
        if scale.size > 1:
            axis = attr(node, "axis", 1)
        if attr(node, "block_size", 0):
            raise OnnxError(f"{node.op_type} {node.name!r}: blocked quantization")
        return QParams(scale, zp, axis, scale_name, zp_name)


_ONNX_TO_NP: dict[int, type[np.integer[Any]]] = {onnx.TensorProto.UINT8: np.uint8,
                                                  onnx.TensorProto.INT8: np.int8}


def onnx_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset, 0 when it imports none."""
    return opset(model, default=0) or 0


def toposort(nodes: list[onnx.NodeProto], graph_inputs: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm over tensor edges, stable in the given order. Every node is kept;
    a cycle or a missing producer raises."""
    produced: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.output:
            if t:
                produced[t] = i
    indeg = [0] * len(nodes)
    users: defaultdict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        deps = {produced[t] for t in n.input if t and t in produced}
        indeg[i] = len(deps)
        for d in deps:
            users[d].append(i)
    ready = [i for i in range(len(nodes)) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise OnnxError("lowered graph has a cycle")
    return [nodes[i] for i in order]
