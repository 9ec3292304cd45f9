"""Empirical bias correction of a QDQ model's quantized Conv/Gemm weights.

For every Conv or Gemm whose weight is an initializer behind a DequantizeLinear, the
expected output error caused by weight quantization over the calibration data is

    δ_c = mean over samples and output positions of  op(x, Ŵ − W)_c

where W is the float weight (taken from the float model, matched by node name), Ŵ the
dequantized weight and x the node's input in the float model. Because op is linear in x,
the sample mean can be taken first: δ = spatial-mean(op(x̄, Ŵ − W)) with x̄ the mean input,
so one pass over the data collecting x̄ suffices. The bias becomes b − δ: an int32 bias
behind a DequantizeLinear is re-quantized on its own scale, a float bias is edited, and a
missing bias is added as a float initializer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex
from qbuild_onnx_common.models import ModelSource

from .stats import collect, load_model

if TYPE_CHECKING:
    from onnx import NodeProto
    from qbuild_onnx_common.arrays import Float64Array


def _dequantize(index: GraphIndex, tensor: str) -> tuple[Float64Array, NodeProto] | None:
    """(float array, DQ node) if ``tensor`` is DequantizeLinear(initializer...), else None."""
    import numpy as np
    from onnx import numpy_helper
    from qbuild_onnx_common.graph import attr

    inits = index.initializers
    producer = index.producers.get(tensor)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    if any(i not in inits for i in producer.input if i):
        return None
    q = numpy_helper.to_array(inits[producer.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[producer.input[1]]).astype(np.float64)
    zp: float | Float64Array = 0.0
    if len(producer.input) > 2 and producer.input[2]:
        zp = numpy_helper.to_array(inits[producer.input[2]]).astype(np.float64)
    axis = attr(producer, "axis", 1)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        if np.ndim(zp):
            zp = np.reshape(zp, shape)
    return (q - zp) * scale, producer


def _conv_mean_error(node: NodeProto, x_mean: Float64Array, dw: Float64Array
                     ) -> Float64Array:
    """Spatial mean of Conv(x̄, ΔW) per output channel, computed by onnxruntime."""
    import numpy as np
    import onnx
    from onnx import helper
    from qbuild_onnx_common.ort import session

    attrs = [a for a in node.attribute]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "bias_correction_probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_mean.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(dw.astype(np.float32), "w")],
    )
    g.node[0].attribute.extend(attrs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    sess = session(m.SerializeToString(), optimize=False)
    y = sess.run(None, {"x": x_mean.astype(np.float32)})[0]
    spatial = tuple(i for i in range(y.ndim) if i != 1)
    means: Float64Array = y.astype(np.float64).mean(axis=spatial)
    return means


def _gemm_mean_error(node: NodeProto, x_mean: Float64Array, dw: Float64Array
                     ) -> Float64Array:
    import numpy as np

    att = {a.name: a for a in node.attribute}
    x = x_mean.reshape(x_mean.shape[0], -1) if x_mean.ndim > 2 else x_mean
    if "transA" in att and att["transA"].i:
        x = x.T
    w = dw.T if ("transB" in att and att["transB"].i) else dw
    alpha = att["alpha"].f if "alpha" in att else 1.0
    means: Float64Array = (alpha * (x.astype(np.float64) @ w)).mean(axis=0)
    return means


def bias_correct(
    qdq_model: ModelSource,
    float_model: ModelSource,
    feeds: Iterable[Mapping[str, Any]],
    out_path: str | Path | None = None,
    op_types: tuple[str, ...] = ("Conv", "Gemm"),
    from_quantizer: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Corrects the biases of ``qdq_model`` for the mean weight-quantization error measured
    against ``float_model`` on ``feeds``. Returns (corrected ModelProto, report) and saves the
    model to ``out_path`` if given. The report lists |δ| per corrected node.
    ``from_quantizer``: the model is a quantizer's output, so one without any quantized
    weight (every weight layer excluded) is returned unchanged instead of refused as a
    float model."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    qm = onnx.ModelProto()
    qm.CopyFrom(load_model(qdq_model))
    fm = load_model(float_model)
    q_index = GraphIndex(qm.graph)  # the second loop edits initializers, never nodes' producers
    q_inits, f_inits = q_index.initializers, GraphIndex(fm.graph).initializers
    f_nodes = {n.name: n for n in fm.graph.node if n.name}

    targets = []  # (qnode, fnode, float W, dequantized W)
    quantized = 0  # nodes with a dequantized initializer weight, matched or not
    for node in qm.graph.node:
        if node.op_type not in op_types or len(node.input) < 2:
            continue
        deq = _dequantize(q_index, node.input[1])
        if deq is None:
            continue
        quantized += 1
        fnode = f_nodes.get(node.name)
        if fnode is None or fnode.op_type != node.op_type or fnode.input[1] not in f_inits:
            continue
        w = numpy_helper.to_array(f_inits[fnode.input[1]]).astype(np.float64)
        if w.shape != deq[0].shape:
            raise OnnxError(
                f"node '{node.name}': quantized weight shape {deq[0].shape} differs from the "
                f"float model's {w.shape}"
            )
        targets.append((node, fnode, w, deq[0]))
    if not quantized and (from_quantizer or any(n.op_type == "DequantizeLinear"
                                                for n in qm.graph.node)):
        # a QDQ model whose every weight layer stays float (e.g. auto_quantize's widest
        # region): nothing to correct, and the model is returned unchanged
        if out_path is not None:
            onnx.save(qm, str(out_path))
        return qm, {"corrected_nodes": 0, "nodes": {},
                    "note": "no quantized Conv/Gemm weight: nothing to correct"}
    if not targets:
        raise OnnxError("no Conv/Gemm node with a dequantized initializer weight that matches "
                            "a node of the float model by name")

    stats = collect(fm, feeds, sorted({f.input[0] for _, f, _, _ in targets}))
    report: dict[str, Any] = {}
    new_inits = []
    for node, fnode, w, wq in targets:
        x_mean = stats[fnode.input[0]].mean()
        if x_mean is None:
            continue
        if node.op_type == "Conv":
            delta = _conv_mean_error(node, x_mean, wq - w)
        else:
            delta = _gemm_mean_error(node, x_mean, wq - w)
        bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
        if bias_name:
            deq_b = _dequantize(q_index, bias_name)
            if deq_b is not None:
                b, dq = deq_b
                init_q = q_inits[dq.input[0]]
                scale = numpy_helper.to_array(q_inits[dq.input[1]]).astype(np.float64)
                qdt = numpy_helper.to_array(init_q).dtype
                info = np.iinfo(qdt)
                new_q = np.clip(np.rint((b - delta) / scale), info.min, info.max).astype(qdt)
                init_q.CopyFrom(numpy_helper.from_array(new_q, init_q.name))
            elif bias_name in q_inits:
                b = numpy_helper.to_array(q_inits[bias_name]).astype(np.float64)
                q_inits[bias_name].CopyFrom(
                    numpy_helper.from_array((b - delta).astype(np.float32), bias_name))
            else:
                continue  # bias computed at run time: leave it alone
        else:
            name = f"{node.name}_bias_correction"
            new_inits.append(numpy_helper.from_array((-delta).astype(np.float32), name))
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = name
        report[node.name] = {
            "max_abs_delta": round(float(np.abs(delta).max()), 8),
            "mean_abs_delta": round(float(np.abs(delta).mean()), 8),
        }
    qm.graph.initializer.extend(new_inits)
    if out_path is not None:
        onnx.save(qm, str(out_path))
    return qm, {"corrected_nodes": len(report), "nodes": dict(sorted(report.items()))}
