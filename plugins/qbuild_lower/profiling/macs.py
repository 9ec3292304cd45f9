"""Multiply-accumulate counts of a model's convolutions and matrix products, the other half
(with the per-op profile) of the argument about what bounds a model's latency."""

from __future__ import annotations

from collections import defaultdict

from qbuild_onnx_common.models import ModelSource


def macs(model: ModelSource) -> dict[str, int]:
    """Multiply-accumulates of Conv, ConvInteger, QLinearConv, MatMul-like and Gemm nodes
    (shapes from onnx shape inference), total and by kind (dense/depthwise/grouped conv,
    matmul)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper, shape_inference
    from qbuild_onnx_common.graph import GraphIndex, attr
    from qbuild_onnx_common.models import load_model

    m = shape_inference.infer_shapes(model if isinstance(model, onnx.ModelProto)
                                     else load_model(model))
    shapes: dict[str, list[int]] = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else 1
                for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    inits = {t.name: numpy_helper.to_array(t).shape for t in m.graph.initializer}
    producer = GraphIndex(m.graph).producers

    def shape(t: str) -> list[int] | None:
        if t in inits:
            return list(inits[t])
        if t in shapes:
            return shapes[t]
        p = producer.get(t)  # a DequantizeLinear of a weight: the weight's shape
        if p is not None and p.op_type == "DequantizeLinear":
            return shape(p.input[0])
        return None

    by: defaultdict[str, int] = defaultdict(int)
    unresolved = 0
    for n in m.graph.node:
        if n.op_type in ("Conv", "ConvInteger", "QLinearConv"):
            w = shape(n.input[3] if n.op_type == "QLinearConv" else n.input[1])
            y = shape(n.output[0])
            if not w or not y:
                unresolved += 1
                continue
            group = attr(n, "group", 1)
            k = int(np.prod(w[1:]))
            kind = "conv_depthwise" if group > 1 and w[1] == 1 else (
                "conv_grouped" if group > 1 else "conv")
            by[kind] += int(np.prod(y)) * k
        elif n.op_type in ("MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "QGemm"):
            a = shape(n.input[0])
            y = shape(n.output[0])
            if not a or not y:
                unresolved += 1
                continue
            k = a[-1] if not (n.op_type in ("Gemm", "QGemm") and any(
                x.name == "transA" and x.i for x in n.attribute)) else a[0]
            by["matmul"] += int(np.prod(y)) * int(k)
    # shape inference stops at com.microsoft operators: then the count is a lower bound
    return {"total": sum(by.values()), **dict(sorted(by.items())),
            "unresolved_nodes": unresolved}
