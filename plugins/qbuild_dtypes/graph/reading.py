"""Reading a ModelProto: every graph and node (subgraphs and local functions included),
constant tensors by value name (initializers and Constant nodes), and the element types and
static shapes onnx can infer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy.typing as npt
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto
from qbuild_onnx_common.graph import attr

from ..numerics.qtypes import is_qtype, qtensor_values


def walk_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    """The graph and every subgraph (If / Loop / Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from walk_graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from walk_graphs(g)


def walk_nodes(model: ModelProto) -> Iterator[NodeProto]:
    for g in walk_graphs(model.graph):
        yield from g.node
    for f in model.functions:
        yield from f.node


class Constants:
    """Constant tensors of the main graph by value name: initializers and Constant outputs."""

    def __init__(self, graph: GraphProto) -> None:
        self.graph = graph
        self.init: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.const_node: dict[str, NodeProto] = {}
        # Initializers listed as graph inputs (required before IR 4, common after) are
        # treated as weights too, as every quantization tool does.
        for n in graph.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                t = attr(n, "value")
                if isinstance(t, TensorProto):
                    self.const_node[n.output[0]] = n

    def tensor(self, name: str) -> TensorProto | None:
        if name in self.init:
            return self.init[name]
        n = self.const_node.get(name)
        if n is not None:
            value = attr(n, "value")
            copy: TensorProto = TensorProto.FromString(value.SerializeToString())
            copy.name = name
            return copy
        return None

    def __contains__(self, name: str) -> bool:
        return name in self.init or name in self.const_node

    def array(self, name: str) -> npt.NDArray[Any] | None:
        t = self.tensor(name)
        if t is None:
            return None
        return tensor_values(t)


def tensor_values(t: TensorProto) -> npt.NDArray[Any]:
    """A tensor's values: quantized types as :func:`qtensor_values` reads them, others as
    onnx's numpy_helper does."""
    if is_qtype(t.data_type):
        return qtensor_values(t)
    return onnx.numpy_helper.to_array(t)


Shape = tuple[int, ...]


class InferredTypes(NamedTuple):
    """Element type and static shape by value name (a value onnx cannot infer is absent)."""

    elem_types: dict[str, int]
    shapes: dict[str, Shape]


def inferred_types(model: ModelProto) -> InferredTypes:
    """Element type and static shape of every value onnx can infer."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is only a hint here; the checker runs later
        inferred = model
    g = inferred.graph
    types: dict[str, int] = {}
    shapes: dict[str, Shape] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    for t in g.initializer:
        types[t.name] = t.data_type
        shapes[t.name] = tuple(t.dims)
    for n in g.node:
        if n.op_type == "Constant":
            t = attr(n, "value")
            if isinstance(t, TensorProto):
                types[n.output[0]] = t.data_type
                shapes[n.output[0]] = tuple(t.dims)
    return InferredTypes(types, shapes)
