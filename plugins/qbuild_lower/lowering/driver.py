"""The lowering pass: visit every compute node, lower the groups that can be lowered,
reassemble the graph and write the per-node report.

Groups are independent: a lowered node reads the quantized tensors its DequantizeLinear
inputs read and writes the tensor its QuantizeLinear consumer wrote, so each decision is
local. Afterwards QuantizeLinear/DequantizeLinear nodes that nothing reads any more are
dropped, which leaves one QuantizeLinear per float input and one DequantizeLinear per
float output wherever the whole path was lowered.
"""

from __future__ import annotations

from collections import Counter

import onnx
from qbuild_onnx_common.errors import OnnxError

from ..arithmetic.tables import build_tables
from ..emit.assemble import assemble, drop_dead_nodes, rename_inputs
from ..emit.builder import Builder
from ..patterns.focus import focus_space_to_depth
from ..patterns.fuse import count_forms, fuse_regions
from ..qdq.graph import Graph
from ..qdq.groups import UNSUPPORTED_OP, Unsupported, analyze, is_dq, is_q
from . import fixed_point, ort

MODES = ("ort", "fixed_point")
ROUNDINGS = ("half_up", "onnxruntime")


def lower_model(model: onnx.ModelProto, mode: str, rounding: str = "half_up",
                tables: str = "fastest") -> tuple[onnx.ModelProto, dict, list]:
    """Returns (lowered model, report, fixed-point parameter records). ``rounding``
    (fixed_point only): ``half_up`` or ``onnxruntime`` (see ``arithmetic.fixedpoint``). ``tables``
    (ort only): how element-wise regions are realized (``patterns.fuse.FORMS``)."""
    if mode not in MODES:
        raise OnnxError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if rounding not in ROUNDINGS:
        raise OnnxError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    handler = ort.handler if mode == "ort" else fixed_point.handler

    g = Graph.from_model(model)
    if not any(is_q(n) for n in g.nodes) or not any(is_dq(n) for n in g.nodes):
        raise OnnxError("the model has no QuantizeLinear/DequantizeLinear nodes: not a QDQ model")
    b = Builder(g, mode)
    b.rounding = rounding
    if mode == "fixed_point":
        fixed_point.prepare(g, b)
    entries, absorbed_q, aliases = [], set(), {}
    lowered = set()
    if mode == "ort":
        fused = fuse_regions(g, b, tables, integer_only=True)
    else:  # chains with float between their ops; the others lower node by node
        fused = fuse_regions(g, b, "table", integer_only=True, float_chains_only=True,
                             record=lambda *a: fixed_point.region_record(b, *a))
    absorbed_q |= fused["absorbed_q"]
    aliases.update(fused["aliases"])
    lowered |= fused["replaced"]
    region_of = {}
    for r in fused["regions"]:
        for name in r["nodes"]:
            region_of[name] = r
    for i, n in enumerate(g.nodes):
        if is_q(n) or is_dq(n):
            continue
        entry = {"node": g.node_name(i), "op_type": n.op_type}
        if i in fused["replaced"]:
            form = region_of[entry["node"]]["form"]
            entry.update(status="lowered", lowered_as=[f"region:{f}" for f in (
                form if isinstance(form, list) else [form])])
            entries.append(entry)
            continue
        h = handler(n.op_type)
        try:
            if h is None:
                raise Unsupported(
                    f"{n.op_type} has no integer lowering in mode {mode}", UNSUPPORTED_OP
                )
            optional = 1 if n.op_type == "MaxPool" else None
            grp = analyze(g, i, optional_outputs=optional)
            mark = (len(b.nodes), len(b.inits), len(b.luts), len(b.params), set(b.used))
            try:
                emitted = h(grp, b)
            except Unsupported:
                # roll back anything the handler emitted before giving up
                del b.nodes[mark[0]:], b.inits[mark[1]:], b.luts[mark[2]:], b.params[mark[3]:]
                b.used = mark[4]
                b._const_cache = {k: v for k, v in b._const_cache.items() if v in b.used}
                raise
        except Unsupported as e:
            entry.update(status="float", category=e.category, reason=str(e))
            entries.append(entry)
            continue
        lowered.add(i)
        for o in grp.outs:
            absorbed_q.update(o.q_nodes)
            for a in o.aliases:
                aliases[a] = o.q
        entry.update(status="lowered", lowered_as=emitted)
        entries.append(entry)

    if b.luts:
        from onnx import numpy_helper

        for name, table in sorted(build_tables(g, b.luts).items()):
            b.inits.append(numpy_helper.from_array(table, name))
            for rec in b.params:
                if rec.get("table_name") == name:
                    rec["table"] = [int(v) for v in table]
                    del rec["table_name"]

    keep = [n for i, n in enumerate(g.nodes) if i not in lowered and i not in absorbed_q]
    nodes = drop_dead_nodes(rename_inputs(keep + b.nodes, aliases), g.outputs)
    before = {id(n) for n in nodes}
    nodes, chain, chain_float = focus_space_to_depth(nodes, model, b.fresh, b.const,
                                                     g.outputs)
    b.nodes += [n for n in nodes if id(n) not in before]  # checked like the other emitted
    nodes = drop_dead_nodes(nodes, g.outputs)
    _chains_lowered(g, entries, chain, nodes)
    _chains_lowered(g, entries, chain_float, nodes, float_rewrite=True)
    out, nodes = assemble(model, nodes, b.inits, g.inputs)
    report = _report(g, entries, nodes, mode, b)
    if fused["regions"] or mode == "ort":
        report["regions"] = {"form": tables if mode == "ort" else "table",
                             "count": len(fused["regions"]),
                             "by_form": count_forms(fused["regions"]),
                             "per_region": [{k: v for k, v in r.items() if k != "tables"}
                                            for r in fused["regions"]]}
    # a table composed into another (SiLU) leaves its own layer unused: not a layer
    produced = {t for n in nodes for t in n.output}
    params = [p for p in b.params if p["output"]["tensor"] in produced]
    return out, report, params


def _chains_lowered(g: Graph, entries: list, chain: list, nodes: list,
                    float_rewrite: bool = False) -> None:
    """Report the float Slice nodes a chain rewrite made dead as lowered (or, for a chain
    left in float, as rewritten to SpaceToDepth + Gather: still float, said so)."""
    live = {id(n) for n in nodes}
    names = {g.node_name(i) for i, n in enumerate(g.nodes)
             if any(n is c for c in chain) and id(n) not in live}
    for e in entries:
        if e["node"] in names and e["status"] == "float":
            if float_rewrite:
                e["rewritten_as"] = ["SpaceToDepth", "Gather"]
                e["reason"] += "; the Focus slices run as SpaceToDepth + Gather (exact)"
                continue
            e.update(status="lowered", lowered_as=["QuantizeLinear", "SpaceToDepth", "Gather"])
            e.pop("category", None)
            e.pop("reason", None)


def _report(g: Graph, entries: list, nodes: list, mode: str, b: Builder) -> dict:
    compute = [e for e in entries]
    lowered = [e for e in compute if e["status"] == "lowered"]
    floats = [e for e in compute if e["status"] == "float"]
    produced_by = {t: n for n in nodes for t in n.output}
    new_names = {n.name for n in b.nodes}
    # Structural proof of "no float tensor between lowered ops": every input of an emitted
    # node is a constant, a graph input of integer type, a QuantizeLinear output or the
    # output of another emitted node -- never a DequantizeLinear output.
    float_edges = []
    for n in nodes:
        if n.name not in new_names:
            continue
        for t in n.input:
            p = produced_by.get(t)
            if p is not None and is_dq(p):
                float_edges.append(t)
    ops = Counter(n.op_type for n in nodes)
    domains = sorted({n.domain or "ai.onnx" for n in nodes})
    return {
        "mode": mode,
        "nodes": {
            "compute": len(compute),
            "lowered": len(lowered),
            "float": len(floats),
            "lowered_share": round(len(lowered) / len(compute), 6) if compute else 1.0,
        },
        "float_by_category": dict(sorted(Counter(e["category"] for e in floats).items())),
        "float_edges_between_lowered_ops": sorted(set(float_edges)),
        "quantize_nodes": ops.get("QuantizeLinear", 0),
        "dequantize_nodes": ops.get("DequantizeLinear", 0),
        "domains": domains,
        "op_counts": dict(sorted(ops.items())),
        "per_node": entries,
    }
