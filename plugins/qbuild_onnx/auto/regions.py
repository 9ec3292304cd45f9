"""Whole-region exclusion from a sensitivity ranking: the stem or the head of a network.

Keeping single tensors float scatters float islands through the graph (each one costs a
DequantizeLinear/QuantizeLinear pair and breaks fusion). Keeping a contiguous region float
costs one boundary. Given the most sensitive activation, the region is every node from
the graph's start to that tensor's consumers when it sits in the first half of the graph
(the stem), else every node from its producer to the end (the head).

The region is written as an override document (``nodes_to_exclude``, computed from the
model being quantized, so names are always current) plus ``selectors``: the same region as
a stable string (``region:stem:<tensor>`` / ``region:head:<tensor>``) for the selector
support being added to ``quantize``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qbuild_onnx_common.errors import OnnxError

from ..accuracy.mixed_precision import ranked_tensors
from ..accuracy.stats import load_model


def region_for(model: Any, tensor: str) -> tuple[str, list[str]]:
    """('stem' | 'head', node names in graph order) kept float for ``tensor``."""
    m = load_model(model)
    nodes = list(m.graph.node)
    producer = next((i for i, n in enumerate(nodes) if tensor in n.output), None)
    users = [i for i, n in enumerate(nodes) if tensor in n.input]
    if producer is None and not users:
        raise OnnxError(f"no tensor named '{tensor}' in the model")
    if any(not n.name for n in nodes):
        raise OnnxError("the model has unnamed nodes; pre-process it (quant_preprocess "
                            "names every node) before excluding regions")
    first = producer if producer is not None else min(users)
    if first < len(nodes) / 2:
        last = max(users) if users else first
        chosen = nodes[: last + 1]
        where = "stem"
    else:
        chosen = nodes[first:]
        where = "head"
    return where, [n.name for n in chosen]


def region_overrides(model: Any, sensitivity: Mapping[str, Any], rank: int = 0,
                     count: int = 1, promote: int = 0) -> dict[str, Any]:
    """The override document keeping float the union of the regions of the ``count``
    activations ranked from ``rank`` on (most sensitive first), and, with ``promote``, the
    next ``promote`` ranked activations outside the region at uint16 (the float stem costs
    one boundary; a few 16-bit tensors past it recover what 8 bits lose there)."""
    ranked = ranked_tensors(sensitivity)
    if len(ranked) <= rank:
        raise OnnxError(f"the sensitivity report ranks {len(ranked)} activation(s); "
                            f"no rank {rank}")
    order = {n.name: i for i, n in enumerate(load_model(model).graph.node)}
    chosen: set[str] = set()
    selectors, wheres = [], []
    for tensor in ranked[rank: rank + max(1, count)]:
        where, nodes = region_for(model, tensor)
        chosen.update(nodes)
        selectors.append(f"region:{where}:{tensor}")
        wheres.append(where)
    nodes = sorted(chosen, key=order.__getitem__)
    graph = load_model(model).graph
    inside = {t for n in graph.node if n.name in chosen for t in n.output}
    producers = {t for n in graph.node for t in n.output}
    wide = [t for t in ranked[rank + max(1, count):] if t in producers and t not in inside]
    tensors = {t: {"quant_type": "uint16"} for t in wide[:promote]}
    return {"tensors": tensors, "nodes_to_exclude": nodes, "promoted": nodes + list(tensors),
            "region": {"where": "+".join(dict.fromkeys(wheres)), "tensor": ranked[rank],
                       "nodes": len(nodes)},
            "selectors": selectors}
