"""``Builder``: collects the nodes and initializers a lowering pass emits and hands out
collision-free names for them (and caches equal constants under one name); also the
types of what it collects besides nodes: table requests and fixed-point parameter
records (``fixed_point_params.json``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import onnx
from numpy.typing import ArrayLike
from onnx import helper, numpy_helper

from ..arithmetic.tables import TableRequest
from ..qdq.graph import Graph
from ..qdq.groups import Group


class TensorParams(TypedDict):
    """A tensor of a parameter record and its quantization."""

    tensor: str
    dtype: str
    zero_point: int
    scale: float


class RecordExtras(TypedDict, total=False):
    """What some layers' parameter records add (or, for ``rounding``, override)."""

    rounding: str
    rounding_note: str
    multiplier: list[int]
    shift: int | list[int]
    real_multiplier: list[float]
    bias: list[int]
    weight_zero_point: int
    window: int
    input_index: int
    table_name: str  # replaced by ``table`` once the tables are computed
    table_initializer: str
    table: list[int]
    composed_with: str
    composed_of: list[str]


class ParamRecord(RecordExtras):
    """One lowered layer's entry in ``fixed_point_params.json``."""

    node: str
    op_type: str
    kind: str
    inputs: list[TensorParams]
    output: TensorParams
    clamp: list[int]


@dataclass(frozen=True)
class Mark:
    """How much a ``Builder`` held at one moment (``Builder.roll_back`` returns to it)."""

    nodes: int
    inits: int
    luts: int
    params: int
    used: frozenset[str]


class Builder:
    """Collects the new nodes and initializers; hands out collision-free names."""

    def __init__(self, g: Graph, mode: str):
        self.g = g
        self.mode = mode
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.used = set(g.inits) | set(g.producer) | set(g.inputs) | set(g.outputs)
        self.used |= {n.name for n in g.nodes if n.name}
        self.luts: list[TableRequest] = []  # computed by arithmetic.tables at the end
        self.rounding = "half_up"  # fixed_point: or "onnxruntime" (arithmetic.fixedpoint)
        self.params: list[ParamRecord] = []  # fixed-point parameter records
        self._const_cache: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def const(self, base: str, value: ArrayLike) -> str:
        array = np.ascontiguousarray(value)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key in self._const_cache:
            return self._const_cache[key]
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(array, name))
        self._const_cache[key] = name
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], base: str, domain: str = "",
             **attrs: Any) -> onnx.NodeProto:
        n = helper.make_node(op, inputs, outputs, name=self.fresh(base), domain=domain,
                             **attrs)
        self.nodes.append(n)
        return n

    def tmp(self, base: str) -> str:
        return self.fresh(base)

    def mark(self) -> Mark:
        return Mark(len(self.nodes), len(self.inits), len(self.luts), len(self.params),
                    frozenset(self.used))

    def roll_back(self, mark: Mark) -> None:
        """Forget everything emitted since ``mark`` (a handler that gave up)."""
        del self.nodes[mark.nodes:], self.inits[mark.inits:], self.luts[mark.luts:]
        del self.params[mark.params:]
        self.used = set(mark.used)
        self._const_cache = {k: v for k, v in self._const_cache.items() if v in self.used}


#: Lowers one DQ -> op -> Q group into the builder: returns the op types emitted, or
#: raises ``groups.Unsupported`` (the node stays in float).
Handler = Callable[[Group, Builder], list[str]]
