"""Whole-region exclusion from a sensitivity ranking: the stem or the head of a network.

Keeping single tensors float scatters float islands through the graph (each one costs a
DequantizeLinear/QuantizeLinear pair and breaks fusion). Keeping a contiguous region float
costs one boundary. Given a sensitive activation, its region is the smaller of two: the
stem (every node the tensor's consumers depend on, back to the graph inputs: ``upto:<each
consumer output>``) and the head (its producer and every node that depends on it:
``after:<tensor>`` plus ``upto:<tensor> & after:<producer input>``); on a tie, the stem
when the tensor's producer sits in the first half of the node list. The tensor itself is
then never quantized. Smaller, not "in the first half of the node list": optimizers
reorder nodes (onnxruntime's pre-processing put a YOLOv8-style model's score Concat, two
nodes before the output, in the first half), and the stem of a tensor next to the
output is the whole model, which leaves nothing quantized.

The region is written as stable selectors (docs/selectors.md) in the override document's
``nodes_to_exclude``: ``quantize`` resolves them on the model it receives, so no node name
is ever written down. ``promoted`` lists the node names they resolve to here (a count for
the report, not an input to anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.models import ModelSource

from ..accuracy.mixed_precision import ranked_tensors
from ..accuracy.stats import load_model
from ..quantization.selectors import resolve_nodes


def region_selectors(model: ModelSource, tensor: str) -> tuple[str, list[str]]:
    """('stem' | 'head', the stable selectors of the region kept float for ``tensor``)."""
    m = load_model(model)
    nodes = list(m.graph.node)
    producer = next((i for i, n in enumerate(nodes) if tensor in n.output), None)
    users = [i for i, n in enumerate(nodes) if tensor in n.input]
    if producer is None and not users:
        raise OnnxError(f"no tensor named '{tensor}' in the model")
    if any(not n.name for n in nodes):
        raise OnnxError("the model has unnamed nodes; pre-process it (quant_preprocess "
                            "names every node) before excluding regions")
    if users:
        stem = [f"upto:{o}" for o in dict.fromkeys(o for i in users for o in nodes[i].output
                                                  if o)]
    else:  # a graph output: up to it
        stem = [f"upto:{tensor}"]
    if producer is None:  # a graph input has no head of its own
        return "stem", stem
    inits = {i.name for i in m.graph.initializer}
    feeds = [t for t in nodes[producer].input if t and t not in inits]
    head = ([f"after:{tensor}"] if users else []) + (
        [f"upto:{tensor} & after:{feeds[0]}"] if feeds else [f"upto:{tensor}"])
    stem_n = len(resolve_nodes(stem, m, "sensitivity"))
    head_n = len(resolve_nodes(head, m, "sensitivity"))
    if stem_n < head_n or (stem_n == head_n and producer < len(nodes) / 2):
        return "stem", stem
    return "head", head


def region_for(model: ModelSource, tensor: str) -> tuple[str, list[str]]:
    """('stem' | 'head', node names in graph order) kept float for ``tensor``."""
    where, selectors = region_selectors(model, tensor)
    return where, resolve_nodes(selectors, load_model(model), "sensitivity")


def region_overrides(model: ModelSource, sensitivity: Mapping[str, Any], rank: int = 0,
                     count: int = 1, promote: int = 0) -> dict[str, Any]:
    """The override document keeping float the union of the regions of the ``count``
    activations ranked from ``rank`` on (most sensitive first), and, with ``promote``, the
    next ``promote`` ranked activations outside the region at uint16 (the float stem costs
    one boundary; a few 16-bit tensors past it recover what 8 bits lose there)."""
    ranked = ranked_tensors(sensitivity)
    if len(ranked) <= rank:
        raise OnnxError(f"the sensitivity report ranks {len(ranked)} activation(s); "
                            f"no rank {rank}")
    m = load_model(model)
    selectors, wheres, tensors_ = [], [], []
    for tensor in ranked[rank: rank + max(1, count)]:
        where, sel = region_selectors(m, tensor)
        selectors += [x for x in sel if x not in selectors]
        wheres.append(where)
        tensors_.append(tensor)
    nodes = resolve_nodes(selectors, m, "sensitivity")
    chosen = set(nodes)
    graph = m.graph
    inside = {t for n in graph.node if n.name in chosen for t in n.output}
    producers = {t for n in graph.node for t in n.output}
    wide = [t for t in ranked[rank + max(1, count):] if t in producers and t not in inside]
    tensors = {t: {"quant_type": "uint16"} for t in wide[:promote]}
    return {"tensors": tensors, "nodes_to_exclude": selectors,
            "promoted": nodes + list(tensors),
            "region": {"where": "+".join(dict.fromkeys(wheres)), "tensor": ranked[rank],
                       "tensors": tensors_, "nodes": len(nodes)},
            "selectors": selectors}
