"""Runtime compatibility of written models: the IR version and opsets a target loads.

onnx 1.23 writes IR 14 / opset 28 by default; what a runtime loads is the target's business
(onnxruntime's limits are measured on the installed version: 1.31 loads IR <= 13 and ai.onnx
opset <= 26, 1.32 IR 14 / opset 28). Any qbuild rule that writes a model can call:

* :func:`make_loadable` (model, target) -> ModelProto: lowers the IR version and ai.onnx opset
  where that is legal, raises the IR version to what the model's types need, and raises
  :class:`~qbuild_onnx_common.errors.OnnxError` naming the blocking operator / type otherwise;
* :func:`check_loadable` (path, target): limits, onnx's full checker, then a load-and-run in
  the target's runtime; returns a small JSON-friendly dict.

Opset changes go through :func:`set_opset`, which uses onnx's version converter after
checking that every operator exists (and every Q/DQ feature is available) at the new opset.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import onnx
import onnx.defs
from onnx import ModelProto, NodeProto, TypeProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import attr, min_ir_version, opset
from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.summary import onnx_type_name

from ..graph import editing, reading
from ..graph.qdq import find_qdq
from ..numerics.qtypes import SCALE_TYPES, is_qtype, qtype, type_min_ir
from ..validation.checks import full_check, run_onnxruntime, run_reference, synthetic_feeds
from .qdq_support import check_target_types
from .targets import DtypeTarget, get_target

_DEFAULT = ("", "ai.onnx")
# Quantized types this plugin does not write but must recognise when lowering.
_LATER_QTYPES = {getattr(onnx.TensorProto, n): v for n, v in
                 (("FLOAT6E2M3", 28), ("FLOAT6E3M2", 28)) if hasattr(onnx.TensorProto, n)}


class OutputShape(TypedDict):
    name: str
    shape: list[int]


class LoadCheck(TypedDict):
    """What :func:`check_loadable` checked, and the outputs of the run (if it ran)."""

    target: str
    ir_version: int
    opset: int | None
    runtime: str | None
    ran: bool
    outputs: list[OutputShape]


def _node_label(node: NodeProto) -> str:
    return f"{node.op_type} {node.name or (node.output[0] if node.output else '')!r}"


def _qdq_requirements(model: ModelProto) -> list[tuple[int, str]]:
    """(min opset, reason) for each Q/DQ feature used in the model."""
    consts = reading.Constants(model.graph)
    elem, _ = reading.inferred_types(model)
    reqs = []
    for node in reading.walk_nodes(model):
        if node.domain not in _DEFAULT or node.op_type not in ("QuantizeLinear",
                                                               "DequantizeLinear"):
            continue
        label = _node_label(node)
        is_q = node.op_type == "QuantizeLinear"
        names = [a.name for a in node.attribute]
        if "block_size" in names and attr(node, "block_size", 0):
            reqs.append((21, f"{label} uses block_size"))
        if is_q and attr(node, "output_dtype", 0):
            reqs.append((21, f"{label} uses output_dtype"))
        if not is_q and attr(node, "output_dtype", 0):
            reqs.append((23, f"{label} uses output_dtype"))
        if "precision" in names:
            reqs.append((23, f"{label} uses precision"))
        if "saturate" in names:
            reqs.append((19, f"{label} uses saturate"))
        # Quantized element type.
        qe: int | None
        if is_q:
            od = attr(node, "output_dtype", 0)
            z = node.input[2] if len(node.input) > 2 and node.input[2] else None
            qe = od or (elem.get(z) if z else None)
        else:
            qe = elem.get(node.input[0])
        if qe and is_qtype(qe):
            q = qtype(qe)
            reqs.append((q.min_opset, f"{label} uses {onnx_type_name(qe)}"))
        elif qe is not None and qe in _LATER_QTYPES:
            reqs.append((_LATER_QTYPES[qe], f"{label} uses {onnx_type_name(qe)}"))
        s = node.input[1] if len(node.input) > 1 else None
        se = elem.get(s) if s else None
        if se in SCALE_TYPES:
            reqs.append((SCALE_TYPES[se], f"{label} has a {onnx_type_name(se)} scale"))
        elif se is not None and se != onnx.TensorProto.FLOAT:
            reqs.append((24, f"{label} has a {onnx_type_name(se)} scale"))
        st = consts.tensor(s) if s else None
        if st is not None and len(st.dims) == 1 and st.dims[0] > 1:
            reqs.append((13, f"{label} is per-axis"))
    return reqs


def required_opset(model: ModelProto) -> tuple[int, str]:
    """Lowest ai.onnx opset that expresses the model's operators and Q/DQ features."""
    best = (1, "")
    for node in reading.walk_nodes(model):
        if node.domain not in _DEFAULT:
            continue
        first = _first_version(node.op_type)
        if first is None:
            raise OnnxError(f"{_node_label(node)}: unknown ai.onnx operator")
        if first > best[0]:
            best = (first, f"{_node_label(node)} exists since opset {first}")
    for req in _qdq_requirements(model):
        if req[0] > best[0]:
            best = req
    return best


@functools.lru_cache(maxsize=1)
def _first_versions() -> dict[str, int]:
    first: dict[str, int] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "":
            first[s.name] = min(first.get(s.name, s.since_version), s.since_version)
    return first


def _first_version(op: str) -> int | None:
    return _first_versions().get(op)


def _since(op: str, version: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, version, "").since_version
    except onnx.defs.SchemaError:
        return None


def lowering_blockers(model: ModelProto, version: int) -> list[str]:
    """Why ``model`` cannot be expressed at ai.onnx ``version`` (empty if it can)."""
    out = []
    seen = set()
    for node in reading.walk_nodes(model):
        if node.domain not in _DEFAULT or node.op_type in seen:
            continue
        if _since(node.op_type, version) is None:
            seen.add(node.op_type)
            out.append(f"operator {_node_label(node)} does not exist before opset "
                       f"{_first_version(node.op_type)}")
    for need, reason in _qdq_requirements(model):
        if need > version:
            out.append(f"{reason}, which needs opset {need}")
    return out


def changed_operators(model: ModelProto, old: int, new: int) -> list[str]:
    """Operator types used in the model whose schema differs between two opsets."""
    ops = sorted({n.op_type for n in reading.walk_nodes(model) if n.domain in _DEFAULT})
    return [op for op in ops if _since(op, old) != _since(op, new)]


def set_opset(model: ModelProto, version: int) -> ModelProto:
    """A copy of ``model`` converted to ai.onnx ``version`` (raising or lowering)."""
    cur = opset(model)
    if cur is None or cur == version:
        return editing.copy_model(model)
    if version < cur:
        blockers = lowering_blockers(model, version)
        if blockers:
            raise OnnxError(f"cannot lower ai.onnx opset {cur} to {version}: "
                             + "; ".join(blockers[:5]))
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, version)
    except Exception as e:
        changed = changed_operators(model, cur, version)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxError(f"cannot convert ai.onnx opset {cur} to {version}; operators whose "
                         f"definition changed in between: {', '.join(changed) or 'none'} "
                         f"(onnx version converter: {reason})") from None
    converted.ir_version = max(converted.ir_version, model.ir_version)
    # The converter stores every inferred type as value_info; keep only what the model had.
    keep = {v.name for v in model.graph.value_info}
    infos = [v for v in converted.graph.value_info if v.name in keep]
    del converted.graph.value_info[:]
    converted.graph.value_info.extend(infos)
    return converted


def required_ir(model: ModelProto) -> tuple[int, str]:
    """Lowest IR version whose element types and fields the model uses, with the reason."""
    best_version, best_reason = 3, ""

    def need(v: int, why: str) -> None:
        nonlocal best_version, best_reason
        if v > best_version:
            best_version, best_reason = v, why

    def tensor_type(tp: TypeProto, where: str) -> None:
        if tp.HasField("tensor_type"):
            e = tp.tensor_type.elem_type
            need(type_min_ir(e), f"{where} has type {onnx_type_name(e)}")
        elif tp.HasField("sequence_type"):
            tensor_type(tp.sequence_type.elem_type, where)
        elif tp.HasField("optional_type"):
            need(8, f"{where} is optional")
            tensor_type(tp.optional_type.elem_type, where)
        elif tp.HasField("sparse_tensor_type"):
            need(8, f"{where} is a sparse tensor")

    for g in reading.walk_graphs(model.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            tensor_type(vi.type, f"value {vi.name!r}")
        for t in g.initializer:
            need(type_min_ir(t.data_type), f"initializer {t.name!r} has type "
                                           f"{onnx_type_name(t.data_type)}")
        if len(g.metadata_props):
            need(10, "a graph has metadata_props")
        for n in g.node:
            if len(n.metadata_props):
                need(10, f"{_node_label(n)} has metadata_props")
            if getattr(n, "overload", ""):
                need(10, f"{_node_label(n)} calls an overloaded function")
            if len(getattr(n, "device_configurations", [])):
                need(11, f"{_node_label(n)} has device configurations")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    need(type_min_ir(a.t.data_type), f"{_node_label(n)} attribute {a.name} "
                                                     f"has type {onnx_type_name(a.t.data_type)}")
                if a.name in ("to", "output_dtype") and a.type == onnx.AttributeProto.INT:
                    need(type_min_ir(a.i), f"{_node_label(n)} attribute {a.name}="
                                           f"{onnx_type_name(a.i)}")
    if len(model.functions):
        need(8, "the model has local functions")
    if len(getattr(model, "configuration", [])):
        need(11, "the model has multi-device configurations")
    return best_version, best_reason


def _check_other_domains(model: ModelProto, target: DtypeTarget) -> None:
    for o in model.opset_import:
        if o.domain in _DEFAULT:
            continue
        lim = target.opset_limit(o.domain)
        if lim is not None and o.version > lim:
            users = [n for n in reading.walk_nodes(model) if n.domain == o.domain]
            who = f"; used by {_node_label(users[0])}" if users else ""
            raise OnnxError(f"opset {o.domain} {o.version} is newer than the "
                             f"{lim} target {target.name!r} loads{who}")


def make_loadable(model: ModelProto, target: DtypeTarget | str) -> ModelProto:
    """A copy of ``model`` that ``target`` loads: ai.onnx opset lowered to the target's
    limit where legal, IR version set within [what the model needs, the target's limit].

    Raises OnnxError naming the blocking operator, type or field when that is impossible.
    """
    target = get_target(target)
    m = editing.copy_model(model)
    limit = target.opset_limit("")
    cur = opset(m)
    if cur is not None and cur > limit:
        try:
            m = set_opset(m, limit)
        except OnnxError as e:
            raise OnnxError(f"target {target.name!r} loads ai.onnx opset <= {limit}: "
                             f"{e.message}") from None
    _check_other_domains(m, target)
    check_target_types(find_qdq(m), target, m)
    need, why = required_ir(m)
    ir_limit = target.ir_limit()
    if need > ir_limit:
        raise OnnxError(f"target {target.name!r} loads IR version <= {ir_limit}, but {why} "
                         f"(needs IR {need})")
    m.ir_version = min(ir_limit, max(m.ir_version, need, min_ir_version(m)))
    return m


def check_loadable(path: str | Path, target: DtypeTarget | str,
                   input_dims: Mapping[str, int] | None = None, run: bool = True) -> LoadCheck:
    """Check that the model at ``path`` loads (and runs, if ``run``) in ``target``.

    Checks the IR / opset limits, onnx's full checker, then, for onnxruntime and onnx-reference
    targets, a load and one run on deterministic synthetic inputs. Raises OnnxError with one
    clear message; returns {"target", "ir_version", "opset", "runtime", "ran", "outputs"}.
    """
    target = get_target(target)
    path = Path(path)
    m = load_model(path)
    ir_limit, op_limit = target.ir_limit(), target.opset_limit("")
    if m.ir_version > ir_limit:
        raise OnnxError(f"{path.name}: IR version {m.ir_version} is newer than the "
                         f"{ir_limit} target {target.name!r} loads")
    cur = opset(m)
    if cur is not None and cur > op_limit:
        raise OnnxError(f"{path.name}: ai.onnx opset {cur} is newer than the {op_limit} "
                         f"target {target.name!r} loads")
    _check_other_domains(m, target)
    full_check(m, path.name)
    info: LoadCheck = {"target": target.name, "ir_version": m.ir_version, "opset": cur,
            "runtime": target.runtime, "ran": False, "outputs": []}
    if not run or target.runtime is None:
        return info
    feeds = synthetic_feeds(m, input_dims)
    if target.runtime == "onnxruntime":
        outs = run_onnxruntime(path, feeds)
    else:
        outs = run_reference(m, feeds, path.name)
    info["ran"] = True
    info["outputs"] = [{"name": o.name, "shape": list(getattr(v, "shape", ()))}
                       for o, v in zip(m.graph.output, outs)]
    return info
