"""Small graph helpers shared by the algorithms: consumers, initializers, attributes."""

from __future__ import annotations

from typing import Any


def consumers(graph) -> dict[str, list[Any]]:
    """Tensor name -> nodes that read it (in graph order)."""
    out: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                out.setdefault(name, []).append(node)
    return out


def initializers(graph) -> dict[str, Any]:
    return {i.name: i for i in graph.initializer}


def attr(node, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def graph_outputs(graph) -> set[str]:
    return {o.name for o in graph.output}


def use_counts(graph) -> dict[str, int]:
    """How many node inputs read each tensor (a weight shared by two nodes counts 2)."""
    counts: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                counts[name] = counts.get(name, 0) + 1
    return counts


def unique_name(graph, base: str) -> str:
    taken = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    taken |= {i.name for i in graph.input}
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name
