"""Converting a QDQ model between the zero-point form and the ``output_dtype`` form, under a
target's policies.

* zero-point form: every Q/DQ carries an explicit zero point; no ``output_dtype``.
* output_dtype form (opset >= 21): every QuantizeLinear states ``output_dtype``; all-zero
  zero points are elided wherever that is legal (DequantizeLinear: always; QuantizeLinear:
  when ``output_dtype`` is set or the type is uint8).

Target policies override the form node by node (``keep_activation_zero_point``,
``output_dtype_with_int8_zero_point``); every override is counted in the returned stats.
The rewrite never changes a scale, a zero point value, an axis or a block size.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import ModelProto, TensorProto
from qbuild_onnx_common.errors import OnnxError

from ..graph.editing import (
    copy_model,
    del_attr,
    prune_initializers,
    set_attr,
    taken_names,
    unique_name,
)
from ..graph.qdq import QdqNode, analyze
from ..graph.reading import Shape
from ..numerics.qtypes import make_qtensor, qtype
from ..runtime.qdq_support import check_target_types
from ..runtime.targets import FORMS, DtypeTarget

OUTPUT_DTYPE_OPSET = 21

# Zero point initializers made during one conversion, by (scale, quantized type, shape).
ZeroPointCache = dict[tuple[str, int, Shape | None], str]


def _zero_zp(model: ModelProto, qn: QdqNode, qelem: int, cache: ZeroPointCache,
             taken: set[str]) -> str:
    """Name of an all-zero zero point initializer matching ``qn``'s scale shape and its
    quantized type ``qelem``."""
    scale_name = qn.node.input[1]
    key = (scale_name, qelem, None if qn.scale is None else qn.scale.shape)
    if key in cache:
        return cache[key]
    if qn.scale is None:
        raise OnnxError(f"{qn.label}: cannot materialize a zero point for a scale computed "
                         f"at run time")
    q = qtype(qelem, where=qn.label)
    name = unique_name(f"{scale_name}_zero_point", taken)
    model.graph.initializer.append(make_qtensor(name, q, np.zeros(qn.scale.shape, np.int32)))
    cache[key] = name
    return name


def _set_zp(qn: QdqNode, name: str | None) -> None:
    node = qn.node
    inputs = list(node.input)
    if name is None:
        inputs = inputs[:2]
    else:
        inputs = inputs[:2] + [name]
    del node.input[:]
    node.input.extend(inputs)


def convert_form(model: ModelProto, target: DtypeTarget, form: str,
                 max_opset: int | None = None) -> tuple[ModelProto, dict[str, int]]:
    """Return a converted copy of ``model`` and counters of what changed.

    ``max_opset`` is the highest opset the caller may raise the model to; when the
    output_dtype form needs 21 and that is not available, uint8 zero points are still elided
    and every other node is left in the zero-point form, which the stats report.
    """
    if form not in FORMS:
        raise OnnxError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    model = copy_model(model)
    nodes = analyze(model)
    check_target_types(nodes, target, model)
    stats: Counter[str] = Counter()
    taken = taken_names(model)
    zp_cache: ZeroPointCache = {}
    can_od = max_opset is None or max_opset >= OUTPUT_DTYPE_OPSET
    for qn in nodes:
        if qn.qelem is None or qn.qelem == TensorProto.INT32:
            stats["skipped_unknown_or_int32"] += 1
            continue
        qelem = qn.qelem
        qname = qtype(qelem).name
        policy_keep = qn.is_activation and qname in target.keep_activation_zero_point
        if form == "zero_point" or policy_keep:
            if form == "output_dtype":
                stats["policy_activation_zero_point_kept"] += 1
            if qn.zp_name is None:
                _set_zp(qn, _zero_zp(model, qn, qelem, zp_cache, taken))
                stats["zero_points_materialized"] += 1
        elif qn.zp_all_zero and (not qn.is_q or can_od or qn.qelem == TensorProto.UINT8):
            _set_zp(qn, None)
            stats["zero_points_elided"] += 1
        if not qn.is_q:
            continue
        has_zp = len(qn.node.input) > 2 and bool(qn.node.input[2])
        int8_zp = qn.qelem == TensorProto.INT8 and has_zp
        if form == "zero_point" or (int8_zp and not target.output_dtype_with_int8_zero_point):
            if form == "output_dtype":
                stats["policy_no_output_dtype_with_int8_zero_point"] += 1
            if qn.output_dtype:
                del_attr(qn.node, "output_dtype")
                stats["output_dtype_removed"] += 1
            continue
        if not can_od:
            stats["output_dtype_unavailable"] += 1
            continue
        if qn.output_dtype != qn.qelem:
            set_attr(qn.node, "output_dtype", int(qn.qelem))
            stats["output_dtype_set"] += 1
    stats["initializers_pruned"] = prune_initializers(model)
    return model, dict(sorted(stats.items()))

