"""Empirical bias correction of a QDQ model's quantized Conv/Gemm layers.

Two methods, both one streaming pass of the float model over the calibration data
(memory: one or two running sums the size of each corrected layer's input, never the
samples), then one small computation per layer:

``weights`` (the default): for every Conv or Gemm whose weight is an initializer behind a
DequantizeLinear, the expected output error caused by weight quantization is

    δ_c = mean over samples and output positions of  op(x, Ŵ − W)_c

where W is the float weight (taken from the float model, matched by node name), Ŵ the
dequantized weight and x the node's input in the float model. Because op is linear in x,
the sample mean can be taken first: δ = spatial-mean(op(x̄, Ŵ − W)) with x̄ the mean input.

``fast`` (NNCF's FastBiasCorrection, done exactly): the error of the whole quantized
layer, its input's Q/DQ included, against the float layer, each fed the float model's
input x:

    δ_c = mean of  op(q(x), Ŵ)_c − op(x, W)_c
        = spatial-mean(op(x̄, Ŵ − W) + op(mean(q(x) − x), Ŵ))

with q the input's QuantizeLinear→DequantizeLinear in the quantized model (scale and zero
point read from it; identity when the input is not quantized). The second term is what
clipping and rounding of the input shift on average: with ranges that clip (mean_minmax,
percentile) it is often the larger one. Layers are corrected independently ("layer by
layer" against float inputs, as NNCF's fast variant), so the cost is that of ``weights``.

The bias becomes b − δ: an int32 bias behind a DequantizeLinear is re-quantized on its
own scale, a float bias is edited, and a missing bias is added as a float initializer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex
from qbuild_onnx_common.models import ModelSource
from qbuild_onnx_common.ort import session

from .stats import collect, load_model

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto
    from qbuild_onnx_common.arrays import Array, Float64Array


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


METHODS = ("weights", "fast")


def _input_quantizer(index: GraphIndex, tensor: str) -> Callable[[Array], Float64Array] | None:
    """The fake quantization q(x) = DQ(Q(x)) that ``tensor`` (a layer's input in the
    quantized model) applies to its float value, or None if it is not a Q/DQ output."""
    import numpy as np
    from onnx import numpy_helper
    from qbuild_onnx_common.graph import attr

    dq = index.producers.get(tensor)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q = index.producers.get(dq.input[0])
    inits = index.initializers
    if q is None or q.op_type != "QuantizeLinear" or dq.input[1] not in inits:
        return None
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zp_name = dq.input[2] if len(dq.input) > 2 else ""
    if zp_name and zp_name not in inits:
        return None
    zp_arr = numpy_helper.to_array(inits[zp_name]) if zp_name else np.zeros((), np.uint8)
    info = np.iinfo(zp_arr.dtype)
    zp = zp_arr.astype(np.float64)
    axis = attr(dq, "axis", 1)

    def fake_quantize(x: Array) -> Float64Array:
        s, z = scale, zp
        if s.ndim == 1 and s.size > 1:  # per-axis activation scales (tensor overrides)
            shape = [1] * x.ndim
            shape[axis] = -1
            s, z = s.reshape(shape), np.reshape(z, shape) if np.ndim(z) else z
        x64 = np.asarray(x, dtype=np.float64)
        levels = np.clip(np.rint(x64 / s) + z, info.min, info.max)
        out: Float64Array = (levels - z) * s
        return out

    return fake_quantize


def _input_means(model: ModelProto, feeds: Iterable[Mapping[str, Any]],
                 quantizers: Mapping[str, Callable[[Array], Float64Array] | None]
                 ) -> dict[str, tuple[Float64Array, Float64Array | None]]:
    """Per input tensor of the float model: (mean of x, mean of q(x) − x or None), from
    running sums (one sample's arrays in memory at a time)."""
    import numpy as np

    from .stats import with_outputs

    names = sorted(quantizers)
    sess = session(with_outputs(model, names).SerializeToString(), optimize=False)
    sums: dict[str, list[Any]] = {n: [None, None] for n in names}
    count = 0
    for feed in feeds:
        for name, a in zip(names, sess.run(names, dict(feed))):
            x = np.asarray(a, dtype=np.float64)
            acc = sums[name]
            acc[0] = x if acc[0] is None else acc[0] + x
            fq = quantizers[name]
            if fq is not None:
                d = fq(x) - x
                acc[1] = d if acc[1] is None else acc[1] + d
        count += 1
    if not count:
        return {}
    return {n: (s[0] / count, None if s[1] is None else s[1] / count)
            for n, s in sums.items() if s[0] is not None}


def bias_correct(
    qdq_model: ModelSource,
    float_model: ModelSource,
    feeds: Iterable[Mapping[str, Any]],
    out_path: str | Path | None = None,
    op_types: tuple[str, ...] = ("Conv", "Gemm"),
    from_quantizer: bool = False,
    method: str = "weights",
) -> tuple[Any, dict[str, Any]]:
    """Corrects the biases of ``qdq_model`` for the mean output error measured against
    ``float_model`` on ``feeds``: of weight quantization (``method`` "weights") or of the
    whole quantized layer, input quantization included ("fast"). Returns (corrected
    ModelProto, report) and saves the model to ``out_path`` if given. The report lists
    |δ| per corrected node. ``from_quantizer``: the model is a quantizer's output, so one
    without any quantized weight (every weight layer excluded) is returned unchanged
    instead of refused as a float model."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if method not in METHODS:
        raise OnnxError(f"unknown bias correction method {method!r} "
                        f"({', '.join(METHODS)})", attr="method")

    qm = onnx.ModelProto()
    qm.CopyFrom(load_model(qdq_model))
    fm = load_model(float_model)
    q_index = GraphIndex(qm.graph)  # the second loop edits initializers, never nodes' producers
    f_inits = GraphIndex(fm.graph).initializers
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

    means = _layer_input_means(fm, feeds, targets, q_index, method)
    report: dict[str, Any] = {}
    new_inits: list[Any] = []
    for node, fnode, w, wq in targets:
        if fnode.input[0] not in means:
            continue
        x_mean, dx_mean = means[fnode.input[0]]
        error = _conv_mean_error if node.op_type == "Conv" else _gemm_mean_error
        delta = error(node, x_mean, wq - w)
        if dx_mean is not None:  # the input's rounding and clipping, through Ŵ
            delta = delta + error(node, dx_mean, wq)
        if not _shift_bias(node, delta, q_index, new_inits):
            continue  # bias computed at run time: leave it alone
        report[node.name] = {
            "max_abs_delta": round(float(np.abs(delta).max()), 8),
            "mean_abs_delta": round(float(np.abs(delta).mean()), 8),
        }
    qm.graph.initializer.extend(new_inits)
    if out_path is not None:
        onnx.save(qm, str(out_path))
    return qm, {"method": method, "corrected_nodes": len(report),
                "nodes": dict(sorted(report.items()))}


def _shift_bias(node: NodeProto, delta: Float64Array, q_index: GraphIndex,
                new_inits: list[Any]) -> bool:
    """Subtract ``delta`` from ``node``'s bias: an int32 bias behind a DequantizeLinear on
    its own scale, a float initializer in place, a missing bias as a new initializer (in
    ``new_inits``). False when the bias is computed at run time (left alone)."""
    import numpy as np
    from onnx import numpy_helper

    q_inits = q_index.initializers
    bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if not bias_name:
        name = f"{node.name}_bias_correction"
        new_inits.append(numpy_helper.from_array((-delta).astype(np.float32), name))
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = name
        return True
    deq_b = _dequantize(q_index, bias_name)
    if deq_b is not None:
        b, dq = deq_b
        init_q = q_inits[dq.input[0]]
        scale = numpy_helper.to_array(q_inits[dq.input[1]]).astype(np.float64)
        qdt = numpy_helper.to_array(init_q).dtype
        info = np.iinfo(qdt)
        new_q = np.clip(np.rint((b - delta) / scale), info.min, info.max).astype(qdt)
        init_q.CopyFrom(numpy_helper.from_array(new_q, init_q.name))
        return True
    if bias_name in q_inits:
        b = numpy_helper.to_array(q_inits[bias_name]).astype(np.float64)
        q_inits[bias_name].CopyFrom(
            numpy_helper.from_array((b - delta).astype(np.float32), bias_name))
        return True
    return False


def _layer_input_means(fm: ModelProto, feeds: Iterable[Mapping[str, Any]],
                       targets: list[tuple[NodeProto, NodeProto, Float64Array, Float64Array]],
                       q_index: GraphIndex, method: str
                       ) -> dict[str, tuple[Float64Array, Float64Array | None]]:
    """Mean input of every target layer in the float model (and, for ``fast``, the mean
    shift its input quantizer makes), by float tensor name."""
    quantizers: dict[str, Callable[[Array], Float64Array] | None] = {}
    for node, fnode, _, _ in targets:
        fq = _input_quantizer(q_index, node.input[0]) if method == "fast" else None
        if quantizers.get(fnode.input[0]) is None:
            quantizers[fnode.input[0]] = fq
    if method == "fast":
        return _input_means(fm, feeds, quantizers)
    stats = collect(fm, feeds, sorted(quantizers))
    out: dict[str, tuple[Float64Array, Float64Array | None]] = {}
    for name, st in stats.items():
        mean = st.mean()
        if mean is not None:
            out[name] = (mean, None)
    return out
