"""Assembling the output model: kept source nodes and emitted ones, readers pointed at
aliases, dead nodes dropped, sorted topologically, with only the initializers still used.
Both the lowering driver and the stand-alone region fusion finish this way."""

from __future__ import annotations

import onnx
from onnx import helper

from ..qdq.graph import toposort


def assemble(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
             new_inits: list[onnx.TensorProto], graph_inputs: set[str]
             ) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """A copy of ``model`` holding ``nodes`` (sorted topologically, which is also returned)
    and only the initializers they use, with com.microsoft imported when used."""
    nodes = toposort(nodes, graph_inputs)
    used = {t for n in nodes for t in n.input if t}
    inits = [t for t in list(model.graph.initializer) + new_inits if t.name in used]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.initializer[:]
    out.graph.initializer.extend(sorted(inits, key=lambda t: t.name))
    del out.graph.value_info[:]
    if any(n.domain == "com.microsoft" for n in nodes) and not any(
            o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out, nodes


def rename_inputs(nodes: list[onnx.NodeProto], aliases: dict[str, str]
                  ) -> list[onnx.NodeProto]:
    """Point readers of ``aliases`` keys at their values; nodes that change are copies,
    so the source model (whose node protos these may be) is never modified."""
    if not aliases:
        return nodes
    out = []
    for n in nodes:
        if any(t in aliases for t in n.input):
            c = onnx.NodeProto()
            c.CopyFrom(n)
            for k, t in enumerate(c.input):
                if t in aliases:
                    c.input[k] = aliases[t]
            n = c
        out.append(n)
    return out


def drop_dead_nodes(nodes: list[onnx.NodeProto], graph_outputs: set[str]
                    ) -> list[onnx.NodeProto]:
    """Drop nodes none of whose outputs is read or is a graph output, until stable."""
    while True:
        used = {t for n in nodes for t in n.input if t} | graph_outputs
        live = [n for n in nodes if any(t in used for t in n.output if t)]
        if len(live) == len(nodes):
            return nodes
        nodes = live
