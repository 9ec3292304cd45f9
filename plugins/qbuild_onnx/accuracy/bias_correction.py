"""Empirical bias correction of a QDQ model's quantized Conv/Gemm layers.

Two methods, both one streaming pass of the float model over the calibration data, then
one small computation per layer:

``weights`` (the default): for every Conv or Gemm whose weight is an initializer behind a
DequantizeLinear, the expected output error caused by weight quantization is

    δ_c = mean over samples and output positions of  op(x, Ŵ − W)_c

where W is the float weight (taken from the float model, matched by node name), Ŵ the
dequantized weight and x the node's input in the float model. Because op is linear in x,
the sample mean can be taken first: δ = spatial-mean(op(x̄, Ŵ − W)) with x̄ the mean input
(kept as a running sum the size of each corrected layer's input).

``fast`` (NNCF's FastBiasCorrection, done exactly): the error of the whole quantized
layer, its input's Q/DQ included, against the float layer, each fed the float model's
input x:

    δ_c = mean of  op(q(x), Ŵ)_c − op(x, W)_c
        = spatial-mean(op(x̄, Ŵ − W) + op(mean(q(x) − x), Ŵ))

with q the input's QuantizeLinear→DequantizeLinear in the quantized model (scale and zero
point read from it; identity when the input is not quantized). The second term is what
clipping and rounding of the input shift on average: with ranges that clip (mean_minmax,
percentile) it is often the larger one. Layers are corrected independently ("layer by
layer" against float inputs, as NNCF's fast variant). Both means follow exactly from
per-layer tap sums (``layer_sums``) the size of the weight, added run by run: no mean
activation is kept (YOLOX-Nano, 32 samples: about 120 MB above the start against 250 MB for
``weights``).

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
    """The shift q(x) − x that the fake quantization q = DQ(Q(·)) producing ``tensor`` (a
    layer's input in the quantized model) makes to its float value, or None if ``tensor``
    is not a Q/DQ output."""
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
    # in float32, as QuantizeLinear / DequantizeLinear compute it
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    zp_name = dq.input[2] if len(dq.input) > 2 else ""
    if zp_name and zp_name not in inits:
        return None
    zp_arr = numpy_helper.to_array(inits[zp_name]) if zp_name else np.zeros((), np.uint8)
    info = np.iinfo(zp_arr.dtype)
    zp = zp_arr.astype(np.float32)
    axis = attr(dq, "axis", 1)

    def fake_quantize(x: Array) -> Float64Array:
        """q(x) − x in float64."""
        s, z = scale, zp
        if s.ndim == 1 and s.size > 1:  # per-axis activation scales (tensor overrides)
            shape = [1] * x.ndim
            shape[axis] = -1
            s, z = s.reshape(shape), np.reshape(z, shape) if np.ndim(z) else z
        x32 = np.asarray(x, dtype=np.float32)
        levels = np.clip(np.rint(x32 / s) + z, info.min, info.max)
        out: Float64Array = ((levels - z) * s).astype(np.float64) - x32
        return out

    return fake_quantize


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

    errors = (_fast_errors(fm, feeds, targets, q_index) if method == "fast"
              else _weight_errors(fm, feeds, targets))
    report: dict[str, Any] = {}
    new_inits: list[Any] = []
    for node, _, _, _ in targets:
        delta = errors.get(node.name)
        if delta is None:
            continue
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


Target = tuple["NodeProto", "NodeProto", "Float64Array", "Float64Array"]


def _weight_errors(fm: ModelProto, feeds: Iterable[Mapping[str, Any]],
                   targets: list[Target]) -> dict[str, Float64Array]:
    """``weights``: δ = spatial mean of op(x̄, Ŵ − W) per target node, from the mean
    input x̄ of each layer in the float model."""
    stats = collect(fm, feeds, sorted({f.input[0] for _, f, _, _ in targets}))
    errors: dict[str, Float64Array] = {}
    for node, fnode, w, wq in targets:
        x_mean = stats[fnode.input[0]].mean()
        if x_mean is None:
            continue
        error = _conv_mean_error if node.op_type == "Conv" else _gemm_mean_error
        errors[node.name] = error(node, x_mean, wq - w)
    return errors


def _fast_errors(fm: ModelProto, feeds: Iterable[Mapping[str, Any]], targets: list[Target],
                 q_index: GraphIndex) -> dict[str, Float64Array]:
    """``fast``: δ = mean of op(q(x), Ŵ) − op(x, W) per target node, from each layer's
    tap sums of x and of q(x) − x (``layer_sums``), streamed over the float model's runs."""

    from .layer_sums import LayerSums
    from .stats import with_outputs

    readers: dict[str, list[tuple[str, LayerSums, LayerSums | None,
                                  Callable[[Array], Float64Array] | None]]] = {}
    for node, fnode, w, _ in targets:
        fq = _input_quantizer(q_index, node.input[0])
        readers.setdefault(fnode.input[0], []).append(
            (node.name, LayerSums(fnode, w.shape),
             LayerSums(fnode, w.shape) if fq is not None else None, fq))
    names = sorted(readers)
    sess = session(with_outputs(fm, names).SerializeToString(), optimize=False)
    for feed in feeds:
        for name, x in zip(names, sess.run(names, dict(feed))):
            shifts: dict[int, Float64Array] = {}  # one per quantizer of this tensor
            for _, sx, sd, fq in readers[name]:
                sx.add(x)
                if sd is not None and fq is not None:
                    if id(fq) not in shifts:
                        shifts[id(fq)] = fq(x)
                    sd.add(shifts[id(fq)])
    errors: dict[str, Float64Array] = {}
    by_name = {node.name: (w, wq) for node, _, w, wq in targets}
    for group in readers.values():
        for node_name, sx, sd, _ in group:
            if not sx.count:
                continue
            w, wq = by_name[node_name]
            delta = sx.mean_output(wq - w)
            if sd is not None:  # the input's rounding and clipping, through Ŵ
                delta = delta + sd.mean_output(wq)
            errors[node_name] = delta
    return errors
