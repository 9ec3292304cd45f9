"""Per-tensor quantization sensitivity of a QDQ model against its float model.

A *site* is one place where the QDQ model quantizes: an activation (QuantizeLinear on a
tensor computed at run time, plus its DequantizeLinear nodes) or a weight (a
DequantizeLinear of an initializer feeding a Conv/Gemm/MatMul weight input). Sites are
turned back to float by graph surgery on the QDQ model (each DequantizeLinear becomes an
Identity of the float tensor), so every trial reuses the same calibration: no trial
re-calibrates.

Two modes, both ranked so that the most harmful site comes first:

* ``only``: every site float except one; the score is the model's output SQNR with only
  that site quantized (low = sensitive).
* ``leave_out``: every site quantized except one; the score is the output SQNR gained by
  leaving that site float (high = sensitive).

Trials run in onnxruntime with graph optimisations disabled: the Q/DQ nodes then execute
as written (a float-simulated model), which onnxruntime's fusions would otherwise rewrite
(its weight/bias quantization pass re-quantizes float weights inside QDQ groups).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex
from qbuild_onnx_common.models import ModelSource
from qbuild_onnx_common.ort import session

from .metrics import ErrorAccumulator, json_float, run_model
from .ranking import _rank
from .stats import load_model

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, TensorProto

# one {output name: array} per sample, as metrics.run_model gives them
Outputs = list[dict[str, Any]]

WEIGHT_OPS = {"Conv": 1, "Gemm": 1, "MatMul": 1, "ConvTranspose": 1}


@dataclass(frozen=True)
class Site:
    name: str  # the float tensor's name (activation) or the float weight's name (weight)
    kind: str  # "activation" | "weight"
    consumers: tuple[str, ...]  # names of the nodes that read the dequantized value
    dq_nodes: tuple[str, ...]  # output names of the DequantizeLinear nodes of this site
    quant_type: str  # the ONNX element type name of the quantized value, e.g. "UINT8"


def _dtype_name(model: ModelProto, tensor: str, q_node: NodeProto | None) -> str:
    import onnx

    inits = {i.name: i for i in model.graph.initializer}
    if tensor in inits:
        return str(onnx.TensorProto.DataType.Name(inits[tensor].data_type))
    if q_node is not None and len(q_node.input) > 2 and q_node.input[2] in inits:
        return str(onnx.TensorProto.DataType.Name(inits[q_node.input[2]].data_type))
    return "UINT8"


def find_sites(qdq_model: ModelSource,
               float_model: ModelSource | None = None) -> list[Site]:
    """Every activation and weight quantization site of a QDQ model, in graph order.

    Weight sites are named after the float model's weight (matched through the consuming
    node's name) when ``float_model`` is given, else after the quantized initializer."""
    qm = load_model(qdq_model)
    g = qm.graph
    inits = {i.name for i in g.initializer}
    index = GraphIndex(g)
    producer, readers = index.producers, index.consumers
    f_nodes = {}
    if float_model is not None:
        f_nodes = {n.name: n for n in load_model(float_model).graph.node if n.name}

    sites: list[Site] = []
    seen_q = set()
    for n in g.node:
        if n.op_type != "DequantizeLinear":
            continue
        src = producer.get(n.input[0])
        if src is not None and src.op_type == "QuantizeLinear" and src.input[0] not in inits:
            if src.output[0] in seen_q:
                continue
            seen_q.add(src.output[0])
            dqs = [c for c in readers.get(src.output[0], []) if c.op_type == "DequantizeLinear"]
            cons = sorted({c.name for d in dqs for c in readers.get(d.output[0], [])})
            # A quantized graph output keeps its name on the DQ output; use that name.
            outs = {o.name for o in g.output}
            name = next((d.output[0] for d in dqs if d.output[0] in outs), src.input[0])
            sites.append(Site(name, "activation", tuple(cons),
                              tuple(d.output[0] for d in dqs), _dtype_name(qm, "", src)))
        elif n.input[0] in inits:
            users = readers.get(n.output[0], [])
            ws = [u for u in users if u.op_type in WEIGHT_OPS and len(u.input) > 1
                  and u.input[WEIGHT_OPS[u.op_type]] == n.output[0]]
            if not ws:
                continue  # a bias or another constant
            name = n.input[0]
            fn = f_nodes.get(ws[0].name)
            if fn is not None and len(fn.input) > 1:
                name = fn.input[WEIGHT_OPS[fn.op_type]]
            elif float_model is not None:
                name = _float_name(name)
            dq_outs = [n.output[0]]
            # The bias of the same node belongs to the weight site: its int32 scale derives
            # from the weight's, and leaving it quantized keeps "all float" from being float.
            b = ws[0].input[2] if ws[0].op_type in ("Conv", "Gemm") and len(ws[0].input) > 2 else ""
            bp = producer.get(b)
            if b and bp is not None and bp.op_type == "DequantizeLinear" and bp.input[0] in inits:
                dq_outs.append(b)
            sites.append(Site(name, "weight", tuple(sorted(u.name for u in users)),
                              tuple(dq_outs), _dtype_name(qm, n.input[0], None)))
    return sites


_QUANTIZED_SUFFIX = "_quantized"  # onnxruntime's name for a quantized initializer


def _float_name(quantized: str) -> str:
    """The float initializer's name behind onnxruntime's quantized ``<name>_quantized``."""
    return quantized[:-len(_QUANTIZED_SUFFIX)] if quantized.endswith(_QUANTIZED_SUFFIX) \
        else quantized


def dequantize_sites(qdq_model: ModelSource, sites: Sequence[Site],
                     float_model: ModelSource | None = None) -> ModelProto:
    """A copy of the QDQ model with the given sites turned back to float. Weight sites need
    ``float_model`` (their float weights are copied from it by consuming-node name)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(load_model(qdq_model))
    g = m.graph
    producer = GraphIndex(g).producers
    f_inits, f_nodes = {}, {}
    if float_model is not None:
        fm = load_model(float_model)
        f_inits = {i.name: i for i in fm.graph.initializer}
        f_nodes = {n.name: n for n in fm.graph.node if n.name}
    init_names = {t.name for t in g.initializer}
    inits_by_name = {t.name: t for t in g.initializer}
    # one index, not a scan of the graph per weight site ("only" mode calls this once per
    # site with every other site: the scans were a quarter of YOLOX's ranking time)
    by_name = {n.name: n for n in g.node if n.name}
    replace: dict[str, Any] = {}  # DQ output name -> Identity node
    new_inits = []
    for s in sites:
        for dq_out in s.dq_nodes:
            dq = producer.get(dq_out)
            if dq is None or dq.op_type != "DequantizeLinear":
                raise OnnxError(f"site '{s.name}': '{dq_out}' is not a DequantizeLinear output")
            op = "Identity"
            if s.kind == "activation":
                q = producer[dq.input[0]]
                src = q.input[0]
                if _clamps_at_zero(q, inits_by_name):
                    op = "Relu"  # onnxruntime folded a Relu into this Q (zero point = qmin)
            else:
                fn = next((f_nodes[c] for c in s.consumers if c in f_nodes), None)
                w = None
                if fn is not None:
                    qn = by_name[fn.name]
                    idx = list(qn.input).index(dq_out)
                    w = f_inits.get(fn.input[idx]) if idx < len(fn.input) else None
                if w is None:  # nodes renamed by the quantizer (unnamed in the float model)
                    w = f_inits.get(_float_name(dq.input[0]))
                if w is None and fn is None:
                    raise OnnxError(f"weight site '{s.name}': no float node to copy it from")
                if w is None:
                    raise OnnxError(
                        f"weight site '{s.name}': float weight is not an initializer")
                src = f"{dq_out}_float_weight"
                t = onnx.TensorProto()
                t.CopyFrom(w)
                t.name = src
                new_inits.append(t)
            replace[dq_out] = helper.make_node(op, [src], [dq_out], name=f"{dq.name}_float")
    nodes = [replace.get(n.output[0], n) if n.op_type == "DequantizeLinear" else n for n in g.node]
    used = {i for n in nodes for i in n.input} | {o.name for o in g.output}
    nodes = [n for n in nodes if not (n.op_type == "QuantizeLinear" and n.output[0] not in used)]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    # Drop the scales/zero points nothing reads any more (IR < 4 models reject them).
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    graph_inputs = [i for i in g.input if i.name in used or i.name not in init_names]
    del g.input[:]
    g.input.extend(graph_inputs)
    return m


def _clamps_at_zero(q_node: NodeProto, inits: Mapping[str, TensorProto]) -> bool:
    """True if the QuantizeLinear's zero point is its type's minimum (uint8 0, int8 -128):
    the Q then also clamps negatives to 0, which is how onnxruntime removes Relu/Clip."""
    import numpy as np
    from onnx import numpy_helper

    if len(q_node.input) < 3 or q_node.input[2] not in inits:
        return True  # no zero point: uint8 with zero point 0
    zp = numpy_helper.to_array(inits[q_node.input[2]])
    if zp.dtype.kind not in "iu":
        return False
    return bool(np.all(zp == np.iinfo(zp.dtype).min))


def _score(ref_outs: Outputs, cand_outs: Outputs) -> tuple[float, dict[str, float]]:
    """The worst per-output SQNR (dB) and all per-output SQNRs."""
    acc: dict[str, ErrorAccumulator] = {}
    for r, c in zip(ref_outs, cand_outs):
        for k in sorted(r):
            acc.setdefault(k, ErrorAccumulator()).add(r[k], c[k], f"output '{k}'")
    per = {k: a.sqnr_db() for k, a in acc.items()}
    return min(per.values()), per


def analyze(
    qdq_model: ModelSource,
    float_model: ModelSource,
    feeds: Sequence[Mapping[str, Any]],
    mode: str = "only",
    kinds: Sequence[str] = ("activation", "weight"),
    metric: Callable[[Outputs, Outputs], float] | None = None,
    log: Callable[[str], None] | None = None,
    shard: int = 0,
    shards: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Ranks the QDQ model's quantization sites by their effect on the outputs (see module doc).

    ``metric(ref_outputs, cand_outputs) -> float`` (higher is better) replaces the default
    worst-output SQNR. Returns a JSON-ready report with ``ranking`` (most sensitive first).
    With ``shards`` > 1 only every ``shards``-th site from ``shard`` on is measured (sites
    are independent); ``ranking.merge`` joins the shards' reports into the full ranking.
    ``progress(done, total)`` is told the sites measured so far."""
    if mode not in ("only", "leave_out"):
        raise OnnxError(f"sensitivity mode must be 'only' or 'leave_out', got '{mode}'")
    if not feeds:
        raise OnnxError("sensitivity analysis needs at least one sample")
    # every model run below is one of these two, or the QDQ model with sites turned
    # back to float (no tensor changes shape): checked once, here
    for given in (qdq_model, float_model):
        check_model(given)
    qm, fm = load_model(qdq_model), load_model(float_model)
    if not 0 <= shard < shards:
        raise OnnxError(f"shard {shard} of {shards}: expected 0 <= shard < shards")
    sites = [s for s in find_sites(qm, fm) if s.kind in kinds]
    if not sites:
        raise OnnxError("the model has no quantization sites (is it a QDQ model?)")
    all_sites = find_sites(qm, fm)
    ref = run_model(session(fm.SerializeToString(), optimize=False, checked=True), feeds)

    def evaluate(model: ModelProto) -> tuple[float, dict[str, float]]:
        outs = run_model(session(model.SerializeToString(), optimize=False, checked=True),
                         feeds)
        s, per = _score(ref, outs)
        return (metric(ref, outs) if metric else s), per

    base_q, base_q_per = evaluate(qm)
    total = len(sites)
    sites = sites[shard::shards]
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(sites):
        if mode == "only":
            others = [o for o in all_sites if o != s]
            score, per = evaluate(dequantize_sites(qm, others, fm))
            effect = score
        else:
            score, per = evaluate(dequantize_sites(qm, [s], fm))
            effect = score - base_q
        rows.append({"site": s.name, "kind": s.kind, "consumers": list(s.consumers),
                     "quant_type": s.quant_type, "score": score, "effect": effect,
                     "per_output_sqnr_db": {k: json_float(v) for k, v in sorted(per.items())}})
        if log:
            log(f"[{i + 1}/{len(sites)}] {s.kind} {s.name}: {score:.3f}")
        if progress:
            progress(i + 1, len(sites))
    for r in rows:  # rounded first, so that merged shards rank exactly as one run
        r["score"], r["effect"] = json_float(r["score"], 4), json_float(r["effect"], 4)
    _rank(rows, mode)
    return {
        "mode": mode,
        "metric": "custom" if metric else "min_output_sqnr_db",
        "samples": len(feeds),
        "quantized_model_score": json_float(base_q, 4),
        "quantized_model_sqnr_db": {k: json_float(v) for k, v in sorted(base_q_per.items())},
        "sites": len(rows),
        "ranking": rows,
        **({"shard": shard, "shards": shards, "all_sites": total} if shards > 1 else {}),
    }
