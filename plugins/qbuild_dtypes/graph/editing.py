"""Editing a ModelProto in place: node attributes, fresh value names, pruning unused
initializers, and copying a model before a rewrite.
"""

from __future__ import annotations

import onnx
from onnx import ModelProto, NodeProto

from .reading import walk_graphs


def set_attr(node: NodeProto, name: str, value: int | float | str) -> None:
    del_attr(node, name)
    node.attribute.append(onnx.helper.make_attribute(name, value))
    node.attribute.sort(key=lambda a: a.name)


def del_attr(node: NodeProto, name: str) -> None:
    keep = [a for a in node.attribute if a.name != name]
    if len(keep) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(keep)


def taken_names(model: ModelProto) -> set[str]:
    g = model.graph
    names = {t.name for t in g.initializer} | {i.name for i in g.input}
    names |= {o.name for o in g.output} | {v.name for v in g.value_info}
    for n in g.node:
        names.update(n.output)
        names.update(n.input)
        names.add(n.name)
    return names


def unique_name(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name = f"{base}_{i}"
        i += 1
    taken.add(name)
    return name


def prune_initializers(model: ModelProto) -> int:
    """Drop initializers no node (or subgraph) reads and no graph output names."""
    used = {o.name for o in model.graph.output}
    for g in walk_graphs(model.graph):
        for n in g.node:
            used.update(n.input)
        used.update(o.name for o in g.output)
    keep = [t for t in model.graph.initializer if t.name in used]
    dropped = {t.name for t in model.graph.initializer if t.name not in used}
    if dropped:
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        inputs = [i for i in model.graph.input if i.name not in dropped]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
    return len(dropped)


def copy_model(model: ModelProto) -> ModelProto:
    m = ModelProto()
    m.CopyFrom(model)
    return m
