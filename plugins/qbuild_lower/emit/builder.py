"""``Builder``: collects the nodes and initializers a lowering pass emits and hands out
collision-free names for them (and caches equal constants under one name)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..qdq.graph import Graph


class Builder:
    """Collects the new nodes and initializers; hands out collision-free names."""

    def __init__(self, g: Graph, mode: str):
        self.g = g
        self.mode = mode
        self.nodes: list = []
        self.inits: list = []
        self.used = set(g.inits) | set(g.producer) | set(g.inputs) | set(g.outputs)
        self.used |= {n.name for n in g.nodes if n.name}
        self.luts: list = []  # (init name, group, kind) filled in by lut.py at the end
        self.rounding = "half_up"  # fixed_point: or "onnxruntime" (see fixedpoint.py)
        self.params: list = []  # fixed-point parameter records
        self._const_cache: dict = {}

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        value = np.ascontiguousarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key in self._const_cache:
            return self._const_cache[key]
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(value, name))
        self._const_cache[key] = name
        return name

    def node(self, op: str, inputs: list, outputs: list, base: str, domain: str = "",
             **attrs) -> onnx.NodeProto:
        n = helper.make_node(op, inputs, outputs, name=self.fresh(base), domain=domain,
                             **attrs)
        self.nodes.append(n)
        return n

    def tmp(self, base: str) -> str:
        return self.fresh(base)
