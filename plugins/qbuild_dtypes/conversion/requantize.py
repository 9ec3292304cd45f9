"""Weight (re-)quantization to int2/int4/int8/int16 (signed or unsigned) or float8, per tensor,
per channel or blocked, driven by a per-op policy with per-tensor overrides.

Weights are the constant inputs of known weight slots (MatMul B, Gemm B, Conv W, ...): a
float initializer gets a new DequantizeLinear in front of its consumers (weight-only
quantization); a weight that is already DequantizeLinear(constant) is dequantized and
re-quantized in place. Scales take the weight's float type. Zero points are written only when
non-zero; the form conversion that follows decides how they are stated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt
import onnx
from onnx import ModelProto, NodeProto, TensorProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import attr
from qbuild_onnx_common.summary import onnx_type_name

from ..graph.editing import (
    copy_model,
    del_attr,
    prune_initializers,
    set_attr,
    taken_names,
    unique_name,
)
from ..graph.qdq import QdqNode, find_qdq
from ..graph.reading import Constants, tensor_values
from ..numerics import arithmetic
from ..numerics.qtypes import QType, make_qtensor, qtype

# op -> {input index: (channel axis, block axis)} for a weight of rank r; callables take
# (node, rank). Axes follow each op's weight layout (output channels / reduction axis).
WEIGHT_SLOTS: dict[str, dict[int, Callable[[NodeProto, int], tuple[int, int]]]] = {
    "MatMul": {1: lambda n, r: (r - 1, r - 2)},
    "Gemm": {1: lambda n, r: (0, 1) if attr(n, "transB", 0) else (1, 0)},
    "Conv": {1: lambda n, r: (0, 1)},
    "ConvTranspose": {1: lambda n, r: (1, 0)},
    "LSTM": {1: lambda n, r: (1, 2), 2: lambda n, r: (1, 2)},
    "GRU": {1: lambda n, r: (1, 2), 2: lambda n, r: (1, 2)},
    "RNN": {1: lambda n, r: (1, 2), 2: lambda n, r: (1, 2)},
    "Gather": {0: lambda n, r: (0, 1)},
}

# A policy maps an op type (or, for ``tensors``, a weight name) to an entry: a dtype name,
# a table of spec keys, or "float" / "keep"; entries are checked by parse_spec.
Policy = Mapping[str, object]

DEFAULT_POLICY: Policy = {
    "MatMul": {"dtype": "int4", "granularity": "blocked", "block_size": 32},
    "Gemm": {"dtype": "int8", "granularity": "per_channel"},
    "Conv": {"dtype": "int8", "granularity": "per_channel"},
}
DEFAULT_MIN_ELEMENTS = 16

_SPEC_KEYS = {"dtype", "granularity", "block_size", "symmetric", "axis"}
# Float weight types, with the dtype their scales take.
_FLOAT_ELEMS: dict[int, np.dtype[np.floating[Any]]] = {
    TensorProto.FLOAT: np.dtype(np.float32), TensorProto.FLOAT16: np.dtype(np.float16)}


@dataclass(frozen=True)
class Spec:
    """How one weight is quantized."""

    q: QType
    granularity: str
    block_size: int
    symmetric: bool
    axis: int | None  # explicit axis override

    def min_opset(self) -> int:
        need = self.q.min_opset
        if self.granularity == "blocked":
            need = max(need, 21)
        elif self.granularity == "per_channel":
            need = max(need, 13)
        return need


def parse_spec(raw: object, where: str) -> Spec | None:
    """A policy entry -> Spec; "float" / "keep" / None -> None (leave the weight alone)."""
    if raw is None or raw in ("float", "keep"):
        return None
    if isinstance(raw, str):
        raw = {"dtype": raw}
    if not isinstance(raw, dict):
        raise OnnxError(f"{where}: expected a table like {{dtype = \"int4\"}}, got {raw!r}")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise OnnxError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(_SPEC_KEYS))}")
    if "dtype" not in raw:
        raise OnnxError(f"{where}: missing dtype")
    if raw["dtype"] in ("float", "keep"):
        return None
    q = qtype(raw["dtype"], where=f"{where}.dtype")
    gran = raw.get("granularity", "per_channel")
    if gran not in arithmetic.GRANULARITIES:
        raise OnnxError(f"{where}.granularity: {gran!r} is not one of "
                         f"{', '.join(arithmetic.GRANULARITIES)}")
    block = raw.get("block_size", 32 if gran == "blocked" else 0)
    if not isinstance(block, int) or isinstance(block, bool):
        raise OnnxError(f"{where}.block_size: expected an integer, got {block!r}")
    if gran == "blocked" and block <= 0:
        raise OnnxError(f"{where}.block_size: must be a positive integer, got {block}")
    if gran != "blocked" and "block_size" in raw:
        raise OnnxError(f"{where}.block_size: only valid with granularity = \"blocked\"")
    symmetric = raw.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise OnnxError(f"{where}.symmetric: expected true or false")
    if q.kind == "float" and not symmetric:
        raise OnnxError(f"{where}: {q.name} cannot have a non-zero zero point "
                         f"(symmetric = false is not possible)")
    axis = raw.get("axis")
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise OnnxError(f"{where}.axis: expected an integer")
    return Spec(q, gran, block if gran == "blocked" else 0, symmetric, axis)


def parse_policy(policy: Policy | None,
                 tensors: Policy | None) -> tuple[dict[str, Spec | None], dict[str, Spec | None]]:
    policy = DEFAULT_POLICY if policy is None else policy
    ops: dict[str, Spec | None] = {}
    for op, raw in sorted(policy.items()):
        if op not in WEIGHT_SLOTS:
            raise OnnxError(f"policy.{op}: no weight slot known for this op; known: "
                             f"{', '.join(sorted(WEIGHT_SLOTS))}")
        ops[op] = parse_spec(raw, f"policy.{op}")
    names = {name: parse_spec(raw, f"tensors.{name}")
             for name, raw in sorted((tensors or {}).items())}
    return ops, names


@dataclass
class WeightPlan:
    """One weight to (re-)quantize and where it is read."""

    key: str  # name of the constant holding the weight (float or quantized)
    op: str
    node_name: str
    spec: Spec
    dq_index: int | None  # existing DequantizeLinear (re-quantization), else None
    slots: list[tuple[NodeProto, int]]  # (node, input index) pairs to rewire (float weights)
    first: tuple[NodeProto, int]  # (node, input index) of the first consumer: decides the axes


class SkipNote(TypedDict):
    tensor: str
    reason: str


class WeightRecord(TypedDict):
    """How one weight was quantized, for report.json."""

    tensor: str
    op: str
    shape: list[int]
    source: str
    dtype: str
    granularity: str
    axis: int | None
    block_size: int
    symmetric: bool
    scale_dtype: str
    sqnr_db: float | str


class RequantizationRecord(TypedDict):
    weights: list[WeightRecord]
    skipped: list[SkipNote]
    initializers_pruned: int


def plan(model: ModelProto, policy: Policy | None = None, tensors: Policy | None = None,
         min_elements: int = DEFAULT_MIN_ELEMENTS) -> tuple[list[WeightPlan], list[SkipNote]]:
    """Which weights get which spec; returns (plans, skipped notes)."""
    ops, names = parse_policy(policy, tensors)
    consts = Constants(model.graph)
    dq_of = {qn.node.output[0]: qn for qn in find_qdq(model)
             if not qn.is_q and qn.x_const}
    weights: dict[str, WeightPlan] = {}
    skipped: list[SkipNote] = []
    unused = set(names)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in WEIGHT_SLOTS:
            continue
        for idx in sorted(WEIGHT_SLOTS[node.op_type]):
            if len(node.input) <= idx or not node.input[idx]:
                continue
            name = node.input[idx]
            dq = dq_of.get(name)
            key = dq.node.input[0] if dq is not None else name
            if dq is None and name not in consts:
                continue
            where = f"{node.op_type} {node.name or node.output[0]!r} input {idx}"
            spec = names[key] if key in names else (names[name] if name in names
                                                    else ops.get(node.op_type))
            unused.discard(key)
            unused.discard(name)
            if spec is None:
                continue
            if key in weights:
                w = weights[key]
                if w.spec != spec:
                    skipped.append({"tensor": key, "reason": f"{where} asks for another "
                                    f"spec; the first consumer's ({w.op}) is used"})
                if dq is None:
                    w.slots.append((node, idx))
                continue
            t = consts.tensor(key)
            if t is None:  # neither a constant nor DequantizeLinear(constant): not reached
                continue
            if dq is None and t.data_type not in _FLOAT_ELEMS:
                skipped.append({"tensor": key, "reason": f"{onnx_type_name(t.data_type)} weight"})
                continue
            size = int(np.prod(t.dims)) if len(t.dims) else 1
            if size < min_elements:
                skipped.append({"tensor": key, "reason": f"{size} elements < min_elements"})
                continue
            weights[key] = WeightPlan(key, node.op_type, node.name, spec,
                                   dq.index if dq is not None else None,
                                   [] if dq is not None else [(node, idx)], (node, idx))
    if unused:
        raise OnnxError(f"tensors: {', '.join(sorted(unused))} is not a weight of any "
                         f"op the policy knows")
    return list(weights.values()), skipped


def needed_opset(plans: list[WeightPlan]) -> int:
    return max((w.spec.min_opset() for w in plans), default=1)


def _axis(w: WeightPlan, rank: int) -> int | None:
    """The quantization axis (None: per tensor)."""
    spec = w.spec
    if spec.granularity == "per_tensor" or rank == 0:
        return None
    if spec.axis is not None:
        return arithmetic.normalize_axis(spec.axis, rank, f"tensor {w.key!r} axis")
    node, idx = w.first
    ch, blk = WEIGHT_SLOTS[w.op][idx](node, rank)
    ax = ch if spec.granularity == "per_channel" else blk
    return min(max(ax, 0), rank - 1)


def _float_weight(w: WeightPlan, consts: Constants, qdq: dict[int, QdqNode]
                  ) -> tuple[npt.NDArray[np.floating[Any]], str, np.dtype[np.floating[Any]]]:
    """The float values of ``w``, the name of the type it is stored in, and the float type
    its scale takes: the weight's own, or for DequantizeLinear(constant) the old scale's."""
    t = consts.tensor(w.key)
    if t is None:  # plan() only gives constants
        raise OnnxError(f"tensor {w.key!r} is not a constant")
    source = onnx_type_name(t.data_type).lower()
    if w.dq_index is None:
        return onnx.numpy_helper.to_array(t), source, _FLOAT_ELEMS[t.data_type]
    qn = qdq[w.dq_index]
    if qn.scale is None:
        raise OnnxError(f"{qn.label}: the scale of weight {w.key!r} is computed at run time")
    wf = arithmetic.dequantize(tensor_values(t), qn.scale, qn.zp, qn.axis, qn.block_size,
                               where=qn.label)
    scale_dtype: np.dtype[np.floating[Any]] = np.asarray(qn.scale).dtype
    return wf, source, scale_dtype


def _weight_dequantize_node(w: WeightPlan, qdq: dict[int, QdqNode], inputs: list[str],
                      taken: set[str]) -> tuple[NodeProto, NodeProto | None]:
    """The DequantizeLinear that reads ``inputs`` for ``w`` (and the new node, if one had to
    be made): a re-quantized weight keeps its node; a float weight's consumers are rewired
    to a new one."""
    if w.dq_index is not None:
        dq = qdq[w.dq_index].node
        del dq.input[:]
        dq.input.extend(inputs)
        return dq, None
    out = unique_name(f"{w.key}_dequantized", taken)
    dq = onnx.helper.make_node("DequantizeLinear", inputs, [out],
                               name=unique_name(f"{w.key}_DequantizeLinear", taken))
    for consumer, idx in w.slots:
        consumer.input[idx] = out
    return dq, dq


def _quantize_weight(model: ModelProto, w: WeightPlan, consts: Constants,
                     qdq: dict[int, QdqNode], taken: set[str]
                     ) -> tuple[WeightRecord, NodeProto | None]:
    """Quantize one weight into new initializers read by its DequantizeLinear; returns its
    record and the DequantizeLinear made for it (None when it kept its own)."""
    wf, source, scale_dtype = _float_weight(w, consts, qdq)
    rank = wf.ndim
    if w.spec.granularity == "blocked" and rank == 0:
        raise OnnxError(f"tensor {w.key!r}: a scalar cannot be block-quantized")
    red_axis = _axis(w, rank)
    dq_axis = 1 if red_axis is None else red_axis
    block = w.spec.block_size if w.spec.granularity == "blocked" else 0
    where = f"tensor {w.key!r}"
    if block and red_axis is not None:  # blocked weights always have an axis
        n_scales = -(-wf.shape[red_axis] // block)
        arithmetic.validate_block_size(wf.shape[red_axis], n_scales, block, where)
    scale, zp = arithmetic.choose_params(wf, w.spec.q, red_axis, block, w.spec.symmetric,
                                         scale_dtype, where)
    codes = arithmetic.quantize(wf, scale, zp, w.spec.q, dq_axis, block, where=where)
    approx = arithmetic.dequantize(codes, scale, zp, dq_axis, block, where=where)
    base = w.key
    xq = make_qtensor(unique_name(f"{base}_{w.spec.q.name}", taken), w.spec.q, codes)
    sc = onnx.numpy_helper.from_array(np.asarray(scale, scale_dtype),
                                      unique_name(f"{base}_scale", taken))
    model.graph.initializer.extend([xq, sc])
    inputs = [xq.name, sc.name]
    if zp is not None:
        zt = make_qtensor(unique_name(f"{base}_zero_point", taken), w.spec.q, zp)
        model.graph.initializer.append(zt)
        inputs.append(zt.name)
    dq, made = _weight_dequantize_node(w, qdq, inputs, taken)
    if red_axis is None:
        del_attr(dq, "axis")
    else:
        set_attr(dq, "axis", int(dq_axis))
    if block:
        set_attr(dq, "block_size", int(block))
    else:
        del_attr(dq, "block_size")
    record: WeightRecord = {
        "tensor": w.key, "op": w.op, "shape": list(wf.shape), "source": source,
        "dtype": w.spec.q.name, "granularity": w.spec.granularity,
        "axis": None if red_axis is None else int(dq_axis), "block_size": block,
        "symmetric": w.spec.symmetric, "scale_dtype": str(np.dtype(scale_dtype)),
        "sqnr_db": _round(arithmetic.sqnr_db(wf, approx)),
    }
    return record, made


def requantize(model: ModelProto, policy: Policy | None = None, tensors: Policy | None = None,
               min_elements: int = DEFAULT_MIN_ELEMENTS
               ) -> tuple[ModelProto, RequantizationRecord]:
    """Quantize / re-quantize the weights of a copy of ``model`` (opset must already be high
    enough: see :func:`needed_opset`). Returns (model, report)."""
    model = copy_model(model)
    plans, skipped = plan(model, policy, tensors, min_elements)
    consts = Constants(model.graph)
    qdq = {qn.index: qn for qn in find_qdq(model)}
    taken = taken_names(model)
    new_nodes: list[NodeProto] = []
    records: list[WeightRecord] = []
    for w in plans:
        record, made = _quantize_weight(model, w, consts, qdq, taken)
        if made is not None:
            new_nodes.append(made)
        records.append(record)
    if new_nodes:
        nodes = new_nodes + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    pruned = prune_initializers(model)
    return model, {"weights": records, "skipped": skipped, "initializers_pruned": pruned}


def _round(v: float) -> float | str:
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return round(v, 3)
