"""Replacing element-wise regions (``regions.py``) by their tables, in the fastest form.

Every export of a region is a 256-entry table of its root's codes, computed by
onnxruntime running the region's own nodes (``lut.region_tables``), so any realization of
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

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from qbuild_onnx_common.errors import OnnxError

from ..emit.assemble import assemble, drop_dead_nodes, rename_inputs
from ..emit.builder import Builder
from ..emit.quantized import gather_codes
from ..qdq.graph import Graph
from ..qdq.groups import is_dq, is_q
from .region_tables import region_tables
from .regions import Region, find_regions

FORMS = ("fastest", "table")

#: Estimated ns per element of each form (one thread, onnxruntime 1.31, 52x52x64 uint8,
#: medians of interleaved runs; bench/bench_tables.py). Used only to choose a form.
COSTS = {"identity": 0.0, "lookup": 0.5, "table": 1.9, "qlinear_unary": 0.5,
         "qlinear_binary": 0.4, "float_op": 0.6, "qdq": 0.15}

#: Ops onnxruntime fuses with their DQ inputs and Q output into a QLinear kernel.
_QLINEAR_UNARY = {"Sigmoid", "LeakyRelu"}
_QLINEAR_BINARY = {"Add", "Mul"}


@dataclass
class _Codes:
    """What ``gather_codes`` needs of the tensor it indexes."""

    q: str
    qp: object


def cost_as_is(g: Graph, reg: Region) -> float:
    """Estimated per-element cost of the region as onnxruntime runs it (after its QDQ
    fusions)."""
    inside = set(reg.nodes)
    total = 0.0
    fused_io = set()
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


def _choose(y_table, x_dtype, y_dtype, cands: dict) -> tuple[str, tuple | None]:
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


def fuse_regions(g: Graph, b: Builder, form: str = "fastest",
                 integer_only: bool = False, float_chains_only: bool = False,
                 record=None) -> dict:
    """Emit the chosen form of every region into ``b``. Returns {"replaced": node indices
    now computed by the emitted nodes (compute, Q and DQ), "absorbed_q": Q nodes whose
    outputs the emitted nodes produce, "aliases": {export: root}, "regions": report
    records}. ``float_chains_only``: only regions with float tensors between their ops
    (fixed-point mode lowers the others node by node); ``record(x_qparams, export,
    y_qparams, table initializer name, op types)`` is called for every table emitted."""
    if form not in FORMS:
        raise OnnxError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    regions = find_regions(g)
    if float_chains_only:
        regions = [r for r in regions if _float_inside(g, r)]
    usable = [r for r in regions if r.reason is None]
    tables, cands = region_tables(g, usable)
    out = {"replaced": set(), "absorbed_q": set(), "aliases": {}, "regions": []}
    for reg in regions:
        rec = {"root": reg.root, "exports": list(reg.exports),
               "nodes": [g.node_name(i) for i in reg.compute_nodes(g)],
               "op_types": [g.nodes[i].op_type for i in reg.compute_nodes(g)]}
        out["regions"].append(rec)
        if reg.reason is not None:
            rec.update(form="kept", reason=reg.reason)
            continue
        dq = next(g.nodes[i] for i in reg.members
                  if is_dq(g.nodes[i]) and g.nodes[i].input[0] == reg.root)
        xqp = g.qparams(dq)
        choice = {}
        for y in reg.exports:
            yqp = g.qparams(g.producer_node(y))
            if form == "table":
                choice[y] = ("table", None)
            else:
                choice[y] = _choose(tables[y], xqp.dtype, yqp.dtype, cands.get(y, {}))
        realized = sum(COSTS[c[0]] for c in choice.values())
        as_is = cost_as_is(g, reg)
        rec.update(cost_as_is=as_is, cost_realized=round(realized, 3))
        if form == "fastest" and as_is <= realized and (
                not integer_only or _keepable_in_integer(g, reg)):
            rec.update(form="kept", reason=f"{'+'.join(rec['op_types'])} as onnxruntime "
                       f"runs it (~{as_is} ns/element) is cheaper than its tables "
                       f"(~{realized:.2f})")
            continue
        forms = []
        for y in reg.exports:
            kind, key = choice[y]
            name = g.node_name(reg.compute_nodes(g)[-1])
            if kind == "identity" and y not in g.outputs:
                out["aliases"][y] = reg.root
            elif kind in ("identity", "lookup"):
                if kind == "identity":
                    b.node("Identity", [reg.root], [y], f"{name}_identity")
                else:
                    op, alpha = key
                    q = g.producer_node(y)
                    attrs = {} if alpha is None else {"alpha": alpha}
                    b.node(op, [reg.root, dq.input[1], dq.input[2], q.input[1], q.input[2]],
                           [y], f"{name}_{op}", domain="com.microsoft", **attrs)
            else:
                tname = b.fresh(f"{name}_table")
                b.inits.append(numpy_helper.from_array(tables[y], tname))
                gather_codes(b, _Codes(reg.root, xqp), tname, y, name)
                if record is not None:
                    record(xqp, reg.root, g.qparams(g.producer_node(y)), y, tables[y],
                           rec["op_types"], rec["nodes"])
            forms.append(kind if key is None else f"{kind}:{key[0]}")
            out["absorbed_q"].add(g.producer[y])
        rec["form"] = forms[0] if len(set(forms)) == 1 else forms
        rec["tables"] = {y: [int(v) for v in tables[y]] for y in reg.exports}
        out["replaced"].update(reg.nodes)
    return out


def fuse_model(model: onnx.ModelProto, form: str = "fastest") -> tuple[onnx.ModelProto, dict]:
    """The pass on its own: a QDQ model with its element-wise regions in ``form``; the
    rest of the graph is untouched. Returns (model, report)."""
    g = Graph.from_model(model)
    b = Builder(g, "ort")
    res = fuse_regions(g, b, form)
    keep = [n for i, n in enumerate(g.nodes)
            if i not in res["absorbed_q"] and i not in res["replaced"]]
    # replaced DQ/compute nodes other regions' exports no longer need are dead code
    nodes = drop_dead_nodes(rename_inputs(keep + b.nodes, res["aliases"]), g.outputs)
    out, nodes = assemble(model, nodes, b.inits, g.inputs)
    regions = res["regions"]
    report = {
        "form": form,
        "regions": len(regions),
        "by_form": count_forms(regions),
        "per_region": [{k: v for k, v in r.items() if k != "tables"} for r in regions],
    }
    return out, report


def count_forms(regions: list) -> dict:
    from collections import Counter

    c = Counter()
    for r in regions:
        f = r.get("form")
        for x in (f if isinstance(f, list) else [f]):
            c[str(x).split(":")[0]] += 1
    return dict(sorted(c.items()))
