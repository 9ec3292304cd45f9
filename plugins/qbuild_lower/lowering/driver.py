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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypedDict

import onnx
from onnx import numpy_helper
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex

from ..arithmetic.tables import build_tables
from ..emit.assemble import assemble, drop_dead_nodes, rename_inputs
from ..emit.builder import Builder, Handler, ParamRecord
from ..patterns.focus import focus_space_to_depth
from ..patterns.fuse import FusedRegions, RegionRecord, count_forms, fuse_regions, without_tables
from ..qdq.graph import Graph
from ..qdq.groups import UNSUPPORTED_OP, Group, Unsupported, analyze, is_dq, is_q
from . import fixed_point, ort
from .records import region_record

MODES = ("ort", "fixed_point")
ROUNDINGS = ("half_up", "onnxruntime")


class NodeEntry(TypedDict, total=False):
    """One compute node in the report: lowered (as which ops) or float (and why)."""

    node: str
    op_type: str
    status: str  # lowered | float
    lowered_as: list[str]
    category: str
    reason: str
    rewritten_as: list[str]


class NodeCounts(TypedDict):
    compute: int
    lowered: int
    float: int
    lowered_share: float


class RegionsReport(TypedDict):
    """The element-wise regions of a lowering and the forms they got."""

    form: str
    count: int
    by_form: dict[str, int]
    per_region: list[RegionRecord]


class _ReportCore(TypedDict):
    mode: str
    nodes: NodeCounts
    float_by_category: dict[str, int]
    float_edges_between_lowered_ops: list[str]
    quantize_nodes: int
    dequantize_nodes: int
    domains: list[str]
    op_counts: dict[str, int]
    per_node: list[NodeEntry]


class LoweringReport(_ReportCore, total=False):
    """lowering.json: what became of every compute node, and the lowered graph's ops."""

    regions: RegionsReport


def lower_model(model: onnx.ModelProto, mode: str, rounding: str = "half_up",
                tables: str = "fastest"
                ) -> tuple[onnx.ModelProto, LoweringReport, list[ParamRecord]]:
    """Returns (lowered model, report, fixed-point parameter records). ``rounding``
    (fixed_point only): ``half_up`` or ``onnxruntime`` (see ``arithmetic.fixedpoint``).
    ``tables`` (ort only): how element-wise regions are realized
    (``patterns.fuse.FORMS``)."""
    if mode not in MODES:
        raise OnnxError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if rounding not in ROUNDINGS:
        raise OnnxError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    g = Graph.from_model(model)
    if not any(is_q(n) for n in g.nodes) or not any(is_dq(n) for n in g.nodes):
        raise OnnxError("the model has no QuantizeLinear/DequantizeLinear nodes: not a QDQ model")
    b = Builder(g, mode)
    b.rounding = rounding
    if mode == "fixed_point":
        fixed_point.prepare(g, b)
    fused = _fuse_regions(g, b, mode, tables)
    nodes = _NodeLowering(g, b, mode, fused)
    for i, n in enumerate(g.nodes):
        if not (is_q(n) or is_dq(n)):
            nodes.lower(i, n)
    _add_tables(g, b)
    out, kept = _output_model(model, g, b, nodes)
    report = _report(out, nodes.entries, mode, b)
    if fused.regions or mode == "ort":
        report["regions"] = {"form": tables if mode == "ort" else "table",
                             "count": len(fused.regions),
                             "by_form": count_forms(fused.regions),
                             "per_region": [without_tables(r) for r in fused.regions]}
    # a table composed into another (SiLU) leaves its own layer unused: not a layer
    produced = {t for n in kept for t in n.output}
    params = [p for p in b.params if p["output"]["tensor"] in produced]
    return out, report, params


def _fuse_regions(g: Graph, b: Builder, mode: str, tables: str) -> FusedRegions:
    if mode == "ort":
        return fuse_regions(g, b, tables, integer_only=True)
    # fixed_point: chains with float between their ops; the others lower node by node
    return fuse_regions(g, b, "table", integer_only=True, float_chains_only=True,
                        record=partial(region_record, b))


@dataclass
class _NodeLowering:
    """Lowers compute nodes one by one, recording what became of each."""

    g: Graph
    b: Builder
    mode: str
    fused: FusedRegions
    entries: list[NodeEntry] = field(default_factory=list)
    lowered: set[int] = field(default_factory=set)  # source nodes the emitted ones replace
    absorbed_q: set[int] = field(default_factory=set)  # Q nodes whose outputs they produce
    aliases: dict[str, str] = field(default_factory=dict)  # Q outputs renamed
    handler: Callable[[str], Handler | None] = field(init=False)  # the mode's handlers
    region_of: dict[str, RegionRecord] = field(init=False)  # fused node name -> region

    def __post_init__(self) -> None:
        self.handler = ort.handler if self.mode == "ort" else fixed_point.handler
        self.absorbed_q |= self.fused.absorbed_q
        self.aliases.update(self.fused.aliases)
        self.lowered |= self.fused.replaced
        self.region_of = {name: r for r in self.fused.regions for name in r["nodes"]}

    def lower(self, i: int, n: onnx.NodeProto) -> None:
        entry: NodeEntry = {"node": self.g.node_name(i), "op_type": n.op_type}
        self.entries.append(entry)
        if i in self.fused.replaced:
            form = self.region_of[entry["node"]]["form"]
            entry["status"] = "lowered"
            entry["lowered_as"] = [f"region:{f}" for f in (
                form if isinstance(form, list) else [form])]
            return
        try:
            grp, emitted = self._lower_group(i, n)
        except Unsupported as e:
            entry.update({"status": "float", "category": e.category, "reason": str(e)})
            return
        self.lowered.add(i)
        for o in grp.outs:
            self.absorbed_q.update(o.q_nodes)
            for a in o.aliases:
                self.aliases[a] = o.q
        entry.update({"status": "lowered", "lowered_as": emitted})

    def _lower_group(self, i: int, n: onnx.NodeProto) -> tuple[Group, list[str]]:
        """(the node's group, op types emitted), or raises Unsupported with nothing emitted."""
        h = self.handler(n.op_type)
        if h is None:
            raise Unsupported(
                f"{n.op_type} has no integer lowering in mode {self.mode}", UNSUPPORTED_OP
            )
        optional = 1 if n.op_type == "MaxPool" else None
        grp = analyze(self.g, i, optional_outputs=optional)
        mark = self.b.mark()
        try:
            return grp, h(grp, self.b)
        except Unsupported:
            self.b.roll_back(mark)  # anything the handler emitted before giving up
            raise


def _add_tables(g: Graph, b: Builder) -> None:
    """Compute the requested lookup tables, add them as initializers and into the
    parameter records that name them."""
    if not b.luts:
        return
    for name, table in sorted(build_tables(g, b.luts).items()):
        b.inits.append(numpy_helper.from_array(table, name))
        for rec in b.params:
            if rec.get("table_name") == name:
                rec["table"] = [int(v) for v in table]
                del rec["table_name"]


def _output_model(model: onnx.ModelProto, g: Graph, b: Builder, nodes: _NodeLowering
                  ) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """The lowered model (and its nodes, sorted): source nodes not replaced plus emitted
    ones, Focus chains rewritten, dead nodes dropped."""
    keep = [n for i, n in enumerate(g.nodes)
            if i not in nodes.lowered and i not in nodes.absorbed_q]
    kept = drop_dead_nodes(rename_inputs(keep + b.nodes, nodes.aliases), g.outputs)
    before = {id(n) for n in kept}
    kept, chain, chain_float = focus_space_to_depth(kept, model, b.fresh, b.const, g.outputs)
    b.nodes += [n for n in kept if id(n) not in before]  # checked like the other emitted
    kept = drop_dead_nodes(kept, g.outputs)
    _chains_lowered(g, nodes.entries, chain, kept)
    _chains_lowered(g, nodes.entries, chain_float, kept, float_rewrite=True)
    return assemble(model, kept, b.inits, g.inputs)


def _chains_lowered(g: Graph, entries: list[NodeEntry], chain: list[onnx.NodeProto],
                    nodes: list[onnx.NodeProto], float_rewrite: bool = False) -> None:
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
            e.update({"status": "lowered",
                      "lowered_as": ["QuantizeLinear", "SpaceToDepth", "Gather"]})
            e.pop("category", None)
            e.pop("reason", None)


def _float_edges(graph: onnx.GraphProto, b: Builder) -> list[str]:
    """Structural proof of "no float tensor between lowered ops": every input of an
    emitted node is a constant, a graph input of integer type, a QuantizeLinear output or
    the output of another emitted node -- never a DequantizeLinear output. Returns the
    inputs of emitted nodes that are DequantizeLinear outputs."""
    producers = GraphIndex(graph).producers
    new_names = {n.name for n in b.nodes}
    float_edges = []
    for n in graph.node:
        if n.name not in new_names:
            continue
        for t in n.input:
            p = producers.get(t)
            if p is not None and is_dq(p):
                float_edges.append(t)
    return sorted(set(float_edges))


def _report(lowered_model: onnx.ModelProto, entries: list[NodeEntry], mode: str,
            b: Builder) -> LoweringReport:
    nodes = lowered_model.graph.node
    lowered = [e for e in entries if e["status"] == "lowered"]
    floats = [e for e in entries if e["status"] == "float"]
    ops = Counter(n.op_type for n in nodes)
    domains = sorted({n.domain or "ai.onnx" for n in nodes})
    return {
        "mode": mode,
        "nodes": {
            "compute": len(entries),
            "lowered": len(lowered),
            "float": len(floats),
            "lowered_share": round(len(lowered) / len(entries), 6) if entries else 1.0,
        },
        "float_by_category": dict(sorted(Counter(e["category"] for e in floats).items())),
        "float_edges_between_lowered_ops": _float_edges(lowered_model.graph, b),
        "quantize_nodes": ops.get("QuantizeLinear", 0),
        "dequantize_nodes": ops.get("DequantizeLinear", 0),
        "domains": domains,
        "op_counts": dict(sorted(ops.items())),
        "per_node": entries,
    }
