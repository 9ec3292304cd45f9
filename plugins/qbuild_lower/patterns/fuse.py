"""Replacing element-wise regions (``regions``) by their tables, in the fastest form.

Every export of a region is a 256-entry table of its root's codes, computed by
onnxruntime running the region's own nodes (``region_tables``), so any realization of
that table is bit-exact with the source. The forms, fastest first (per element, one
thread, onnxruntime 1.31 on the project's machine; ``bench/bench_tables.py``):

* ``identity``: the table is the identity (a Relu or Clip the quantization already
  clamps): the export is the root itself, no node at all;
* ``lookup``: the table equals the one a single com.microsoft QLinearSigmoid or
  QLinearLeakyRelu builds (onnxruntime's own 256-entry lookup kernel, ~0.5 ns);
* ``table``: Cast + GatherElements on the codes (~1.9 ns);
* ``kept``: the region stays as it is, when what onnxruntime makes of it is cheaper than
  its tables (SiLU's QLinearSigmoid + QLinearMul, ~0.9 ns, beats a GatherElements
  table); ``COSTS`` holds the per-element estimates behind that choice.

``form = "table"`` forces tables for every region that can have them (integer-only
targets, tests); ``"fastest"`` chooses as above. ``fuse_model`` applies the pass to a QDQ
model on its own (the ``fuse_lut`` rule); ``lower_model`` calls ``fuse_regions`` first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import onnx
from numpy.typing import DTypeLike
from onnx import numpy_helper
from qbuild_onnx_common.errors import OnnxError

from ..arithmetic.tables import Codes
from ..emit.assemble import assemble, drop_dead_nodes, rename_inputs
from ..emit.builder import Builder
from ..emit.quantized import gather_codes
from ..qdq.graph import Graph, QParams
from ..qdq.groups import is_dq, is_q
from .region_tables import LookupOp, region_tables
from .regions import Region, find_regions

FORMS = ("fastest", "table")

#: Estimated ns per element of each form (one thread, onnxruntime 1.31, 52x52x64 uint8,
#: medians of interleaved runs; bench/bench_tables.py). Used only to choose a form.
COSTS = {"identity": 0.0, "lookup": 0.5, "table": 1.9, "qlinear_unary": 0.5,
         "qlinear_binary": 0.4, "float_op": 0.6, "qdq": 0.15}

#: Ops onnxruntime fuses with their DQ inputs and Q output into a QLinear kernel.
_QLINEAR_UNARY = {"Sigmoid", "LeakyRelu"}
_QLINEAR_BINARY = {"Add", "Mul"}


def cost_as_is(g: Graph, reg: Region) -> float:
    """Estimated per-element cost of the region as onnxruntime runs it (after its QDQ
    fusions)."""
    inside = set(reg.nodes)
    total = 0.0
    fused_io: set[int] = set()
    for i in reg.compute_nodes(g):
        n = g.nodes[i]
        ins = [g.producer_node(t) for t in n.input if t and not g.is_const(t)]
        outs = [g.nodes[u] for u in g.consumers.get(n.output[0], [])]
        fusable = (all(p is not None and is_dq(p) for p in ins) and outs
                   and all(is_q(u) for u in outs))
        if fusable and n.op_type in _QLINEAR_UNARY and len(ins) == 1:
            total += COSTS["qlinear_unary"]
        elif fusable and n.op_type in _QLINEAR_BINARY and len(ins) == 2:
            total += COSTS["qlinear_binary"]
        else:
            total += COSTS["float_op"]
            continue
        fused_io.update(id(p) for p in ins)
        fused_io.update(id(u) for u in outs)
    total += COSTS["qdq"] * sum(1 for i in inside if (is_q(g.nodes[i]) or is_dq(g.nodes[i]))
                                and id(g.nodes[i]) not in fused_io)
    return round(total, 3)


def _keepable_in_integer(g: Graph, reg: Region) -> bool:
    """Ort lowering keeps a region only when each of its compute nodes lowers on its own
    to a QLinear operator (no float left)."""
    for i in reg.compute_nodes(g):
        n = g.nodes[i]
        if n.op_type not in _QLINEAR_UNARY | _QLINEAR_BINARY:
            return False
        ins = [g.producer_node(t) for t in n.input if t and not g.is_const(t)]
        if not ins or any(p is None or not is_dq(p) for p in ins):
            return False
        if n.op_type in _QLINEAR_BINARY and len(ins) != 2:
            return False
        if not all(is_q(g.nodes[u]) for u in g.consumers.get(n.output[0], [])):
            return False
    return True


def _choose(y_table: Codes, x_dtype: DTypeLike, y_dtype: DTypeLike,
            cands: dict[LookupOp, Codes]) -> Choice:
    ident = np.arange(256) if np.dtype(x_dtype) == np.uint8 else np.arange(256) - 128
    if np.dtype(x_dtype) == np.dtype(y_dtype) and np.array_equal(y_table.astype(int), ident):
        return "identity", None
    for key, t in cands.items():
        if np.array_equal(t, y_table):
            return "lookup", key
    return "table", None


def _float_inside(g: Graph, reg: Region) -> bool:
    """A compute node of the region reads or writes a float tensor that is not a
    DequantizeLinear output / QuantizeLinear input (a chain per-node lowering cannot
    take: GELU written out, HardSwish as HardSigmoid -> Mul without Q between)."""
    for i in reg.compute_nodes(g):
        n = g.nodes[i]
        for t in n.input:
            if not t or g.is_const(t):
                continue
            p = g.producer_node(t)
            if p is None or not is_dq(p):
                return True
        if not all(is_q(g.nodes[u]) for u in g.consumers.get(n.output[0], [])):
            return True
    return False


class RegionRecord(TypedDict, total=False):
    """A region in the report: what it is, the form it got and, when kept, why."""

    root: str
    exports: list[str]
    nodes: list[str]
    op_types: list[str]
    form: str | list[str]
    reason: str
    cost_as_is: float
    cost_realized: float
    tables: dict[str, list[int]]  # left out of the reports


@dataclass
class FusedRegions:
    """What ``fuse_regions`` did."""

    replaced: set[int] = field(default_factory=set)  # nodes the emitted ones compute
    absorbed_q: set[int] = field(default_factory=set)  # Q nodes whose outputs they produce
    aliases: dict[str, str] = field(default_factory=dict)  # export -> root (identity)
    regions: list[RegionRecord] = field(default_factory=list)


#: How one export is realized: (form, the lookup operator when the form is "lookup").
Choice = tuple[str, LookupOp | None]
#: Called for every table emitted: (root parameters, root, export parameters, export,
#: table, op types, node names).
TableRecorder = Callable[[QParams, str, QParams, str, Codes, list[str], list[str]], None]


def fuse_regions(g: Graph, b: Builder, form: str = "fastest",
                 integer_only: bool = False, float_chains_only: bool = False,
                 record: TableRecorder | None = None) -> FusedRegions:
    """Emit the chosen form of every region into ``b``. ``float_chains_only``: only
    regions with float tensors between their ops (fixed-point mode lowers the others node
    by node); ``record`` is called for every table emitted."""
    if form not in FORMS:
        raise OnnxError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    regions = find_regions(g)
    if float_chains_only:
        regions = [r for r in regions if _float_inside(g, r)]
    usable = [r for r in regions if r.reason is None]
    tables, cands = region_tables(g, usable)
    out = FusedRegions()
    for reg in regions:
        compute = reg.compute_nodes(g)
        rec: RegionRecord = {"root": reg.root, "exports": list(reg.exports),
                             "nodes": [g.node_name(i) for i in compute],
                             "op_types": [g.nodes[i].op_type for i in compute]}
        out.regions.append(rec)
        if reg.reason is not None:
            rec["form"], rec["reason"] = "kept", reg.reason
            continue
        xqp = g.qparams(reg.root_dequantize(g))
        choice = _choices(g, reg, form, xqp, tables, cands)
        realized = sum(COSTS[c[0]] for c in choice.values())
        as_is = cost_as_is(g, reg)
        rec["cost_as_is"], rec["cost_realized"] = as_is, round(realized, 3)
        if form == "fastest" and as_is <= realized and (
                not integer_only or _keepable_in_integer(g, reg)):
            rec["form"] = "kept"
            rec["reason"] = (f"{'+'.join(rec['op_types'])} as onnxruntime runs it "
                             f"(~{as_is} ns/element) is cheaper than its tables "
                             f"(~{realized:.2f})")
            continue
        forms = [_emit_export(g, b, reg, y, choice[y], tables[y], rec, out, record)
                 for y in reg.exports]
        rec["form"] = forms[0] if len(set(forms)) == 1 else forms
        rec["tables"] = {y: [int(v) for v in tables[y]] for y in reg.exports}
        out.replaced.update(reg.nodes)
    return out


def _choices(g: Graph, reg: Region, form: str, xqp: QParams, tables: dict[str, Codes],
             cands: dict[str, dict[LookupOp, Codes]]) -> dict[str, Choice]:
    """The form of each export: always a table with ``form="table"``, else the fastest."""
    choice: dict[str, Choice] = {}
    for y in reg.exports:
        yqp = g.qparams(g.producer_of(y))
        if form == "table":
            choice[y] = ("table", None)
        else:
            choice[y] = _choose(tables[y], xqp.dtype, yqp.dtype, cands.get(y, {}))
    return choice


def _emit_export(g: Graph, b: Builder, reg: Region, y: str, choice: Choice, table: Codes,
                 rec: RegionRecord, out: FusedRegions, record: TableRecorder | None) -> str:
    """Realize export ``y`` of ``reg`` as ``choice`` says; returns the form's name."""
    kind, key = choice
    name = g.node_name(reg.compute_nodes(g)[-1])
    dq = reg.root_dequantize(g)
    if kind == "identity" and y not in g.outputs:
        out.aliases[y] = reg.root
    elif kind == "identity":
        b.node("Identity", [reg.root], [y], f"{name}_identity")
    elif kind == "lookup" and key is not None:
        op, alpha = key
        q = g.producer_of(y)
        attrs = {} if alpha is None else {"alpha": alpha}
        b.node(op, [reg.root, dq.input[1], dq.input[2], q.input[1], q.input[2]],
               [y], f"{name}_{op}", domain="com.microsoft", **attrs)
    else:
        xqp = g.qparams(dq)
        tname = b.fresh(f"{name}_table")
        b.inits.append(numpy_helper.from_array(table, tname))
        gather_codes(b, reg.root, xqp, tname, y, name)
        if record is not None:
            record(xqp, reg.root, g.qparams(g.producer_of(y)), y, table,
                   rec["op_types"], rec["nodes"])
    out.absorbed_q.add(g.producer[y])
    return kind if key is None else f"{kind}:{key[0]}"


class FuseReport(TypedDict):
    """report.json of ``fuse_lut`` (before the check)."""

    form: str
    regions: int
    by_form: dict[str, int]
    per_region: list[RegionRecord]


def fuse_model(model: onnx.ModelProto, form: str = "fastest"
               ) -> tuple[onnx.ModelProto, FuseReport]:
    """The pass on its own: a QDQ model with its element-wise regions in ``form``; the
    rest of the graph is untouched. Returns (model, report)."""
    g = Graph.from_model(model)
    b = Builder(g, "ort")
    res = fuse_regions(g, b, form)
    keep = [n for i, n in enumerate(g.nodes)
            if i not in res.absorbed_q and i not in res.replaced]
    # replaced DQ/compute nodes other regions' exports no longer need are dead code
    nodes = drop_dead_nodes(rename_inputs(keep + b.nodes, res.aliases), g.outputs)
    out, nodes = assemble(model, nodes, b.inits, g.inputs)
    regions = res.regions
    report: FuseReport = {
        "form": form,
        "regions": len(regions),
        "by_form": count_forms(regions),
        "per_region": [without_tables(r) for r in regions],
    }
    return out, report


def without_tables(rec: RegionRecord) -> RegionRecord:
    """A region's record as the reports give it (its tables left out)."""
    short = rec.copy()
    short.pop("tables", None)
    return short


def count_forms(regions: list[RegionRecord]) -> dict[str, int]:
    """How many exports got each form (``lookup:QLinearSigmoid`` counts as lookup)."""
    c: Counter[str] = Counter()
    for r in regions:
        f = r.get("form")
        for x in (f if isinstance(f, list) else [f]):
            c[str(x).split(":")[0]] += 1
    return dict(sorted(c.items()))
