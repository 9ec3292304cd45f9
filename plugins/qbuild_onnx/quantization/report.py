"""What a quantized model contains: the info handed to dependents and ``report.json``.

Owns counting Q/DQ nodes and quantized operators by type, telling per-channel from
per-tensor weights, and counting tensor dtypes. Everything is computed from the written
model, sorted, and free of paths and times, so the report is as deterministic as the
model bytes. Graph inputs and outputs are described by ``qbuild_onnx_common.summary``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import onnx
from qbuild_onnx_common.graph import GraphIndex, opset
from qbuild_onnx_common.summary import onnx_type_name

_Q_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
_WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Integer operators (QOperator and dynamic formats) and where their weight scale or, for
# the *Integer ops that carry no scale, the weight zero point sits.
# (weight input index, scale or zero-point input index)
_INTEGER_WEIGHT_INPUT = {"QLinearConv": (3, 4), "QLinearMatMul": (3, 4), "QGemm": (3, 4),
                         "ConvInteger": (1, 3), "MatMulInteger": (1, 3)}


def _is_integer_op(op_type: str) -> bool:
    if op_type in _Q_OPS:
        return False
    return (op_type.startswith(("QLinear", "QGemm", "QAttention", "QEmbed", "DynamicQuantize"))
            or op_type.endswith(("Integer", "IntegerToFloat")))


def quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Quantized operators by type.

    Integer operators (QOperator and dynamic formats) count, and so do float operators of a
    QDQ unit: fed by a DequantizeLinear and either feeding a QuantizeLinear or taking a
    dequantized constant weight. A float op merely sitting between Q/DQ pairs of its
    neighbours (e.g. an Add left out by ``op_types``) does not count.
    """
    inits = {i.name for i in model.graph.initializer}
    producer = GraphIndex(model.graph).producers
    quantized_inputs = {o for n in model.graph.node if n.op_type == "QuantizeLinear"
                        for o in n.input[:1]}
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        if _is_integer_op(node.op_type):
            counts[node.op_type] += 1
            continue
        if node.op_type in _Q_OPS:
            continue
        fed = [producer[i] for i in node.input if i in producer]
        if not any(p.op_type == "DequantizeLinear" for p in fed):
            continue
        weight = producer.get(node.input[1]) if len(node.input) > 1 else None
        has_weight = (node.op_type in _WEIGHT_OPS and weight is not None
                      and weight.op_type == "DequantizeLinear" and weight.input[0] in inits)
        if has_weight or any(o in quantized_inputs for o in node.output):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def weight_granularity(model: onnx.ModelProto) -> dict[str, Any]:
    """Quantized Conv/Gemm/MatMul weights split into per-channel and per-tensor (node names)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = GraphIndex(model.graph).producers
    per_channel: list[str] = []
    per_tensor: list[str] = []
    for node in model.graph.node:
        param = None
        if node.op_type in _WEIGHT_OPS and len(node.input) > 1:
            dq = producer.get(node.input[1])
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
                param = dq.input[1]
        elif node.op_type in _INTEGER_WEIGHT_INPUT:
            weight, index = _INTEGER_WEIGHT_INPUT[node.op_type]
            if len(node.input) > index and node.input[weight] in inits:
                param = node.input[index]
        if param is None or param not in inits:
            continue
        # A 1-D scale (or zero point) is per-axis even with one channel; per-tensor is 0-D.
        (per_channel if len(inits[param].dims) >= 1 else per_tensor).append(node.name)
    return {"per_channel": len(per_channel), "per_tensor": len(per_tensor),
            "per_tensor_nodes": sorted(per_tensor)}


def _elements(tensor: onnx.TensorProto) -> int:
    count = 1
    for d in tensor.dims:
        count *= d
    return count


def dtype_counts(model: onnx.ModelProto) -> dict[str, Any]:
    """Initializers by dtype (count and elements), and typed graph values by dtype."""
    inits: dict[str, dict[str, int]] = {}
    for init in model.graph.initializer:
        entry = inits.setdefault(onnx_type_name(init.data_type), {"count": 0, "elements": 0})
        entry["count"] += 1
        entry["elements"] += _elements(init)
    inferred = onnx.shape_inference.infer_shapes(model)
    values = Counter(
        onnx_type_name(v.type.tensor_type.elem_type)
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
        if v.type.HasField("tensor_type")
    )
    return {"initializers": dict(sorted(inits.items())), "values": dict(sorted(values.items()))}


def build_report(model: onnx.ModelProto, *, model_bytes: int, float_model_bytes: int,
                 settings: dict[str, Any]) -> dict[str, Any]:
    """The content of ``report.json`` for a quantized model."""
    ops = Counter(n.op_type for n in model.graph.node)
    qops = quantized_ops(model)
    return {
        "settings": settings,
        "opset": opset(model),
        "nodes": len(model.graph.node),
        "quantize_nodes": ops.get("QuantizeLinear", 0),
        "dequantize_nodes": ops.get("DequantizeLinear", 0),
        "dynamic_quantize_nodes": ops.get("DynamicQuantizeLinear", 0),
        "quantized_nodes": sum(qops.values()),
        "quantized_ops": qops,
        "weights": weight_granularity(model),
        "dtypes": dtype_counts(model),
        "model_bytes": model_bytes,
        "float_model_bytes": float_model_bytes,
        "size_ratio": round(model_bytes / float_model_bytes, 4) if float_model_bytes else None,
    }
