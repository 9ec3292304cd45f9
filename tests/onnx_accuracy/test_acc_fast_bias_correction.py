"""Fast bias correction (method "fast", NNCF's FastBiasCorrection): each Conv's bias absorbs
the mean error of the whole quantized layer (input Q/DQ and weights) against the float
layer; checked exactly on one MobileNetV2 layer against the layer run by onnxruntime, and
on what it is for: smaller mean errors of every Conv output, on held-out images too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from acc_paths import MODELS
from onnx import helper, numpy_helper
from qbuild_onnx.accuracy.bias_correction import bias_correct
from qbuild_onnx.accuracy.stats import with_outputs
from qbuild_onnx.calibration.calibrate import CalibrationOptions, calibrate
from qbuild_onnx.quantization.options import StaticOptions
from qbuild_onnx.quantization.quantize import quantize_static_model
from qbuild_onnx.source.datasets import write_dataset
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session


@pytest.fixture(scope="module")
def nncf_like(tmp_path_factory, mobilenet_feeds):
    """MobileNetV2 pre-processed, mean_minmax ranges on 12 images, Q/DQ at Conv inputs,
    per-channel weights (NNCF's recipe without its bias correction)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = tmp_path_factory.mktemp("fbc")
    pre = d / "pre.onnx"
    quant_pre_process(str(MODELS / "mobilenet_v2_128_0.5.onnx"), str(pre))
    calib = mobilenet_feeds[:12]
    write_dataset(d / "ds", {"input_1:0": np.concatenate([f["input_1:0"] for f in calib])})
    calibrate(pre, d / "ds", d / "cal", CalibrationOptions(method="mean_minmax"))
    q = d / "q.onnx"
    quantize_static_model(pre, d / "cal" / "calibration.json", q,
                          StaticOptions(per_channel=True, placement="conv_inputs",
                                        preset="mixed", weight_symmetric=True))
    return pre, q, d


def _mean_conv_errors(float_model, quantized, feeds) -> float:
    """Mean over the Conv outputs of |per-channel mean error| / the output's std."""
    fm = onnx.load(str(float_model))
    names = [n.output[0] for n in fm.graph.node if n.op_type == "Conv"]

    def means(path):
        sess = session(with_outputs(onnx.load(str(path)), names).SerializeToString(),
                       optimize=False)
        sums = [np.zeros(1)] * len(names)
        for feed in feeds:
            sums = [s + a.astype(np.float64) for s, a in zip(sums, sess.run(names, feed))]
        return [s / len(feeds) for s in sums]

    errors = []
    for ref, got in zip(means(float_model), means(quantized)):
        axes = (0, 2, 3)
        errors.append(np.abs((got - ref).mean(axis=axes)).mean() / ref.std())
    return float(np.mean(errors))


def test_fast_correction_reduces_mean_errors_of_every_layer(nncf_like, mobilenet_feeds):
    pre, q, d = nncf_like
    calib, held_out = mobilenet_feeds[:12], mobilenet_feeds[12:]
    out = d / "fast.onnx"
    _, report = bias_correct(q, pre, calib, out, method="fast")
    layers = [n for n in onnx.load(str(pre)).graph.node if n.op_type in ("Conv", "Gemm")]
    assert report["method"] == "fast" and report["corrected_nodes"] == len(layers) == 53
    before = _mean_conv_errors(pre, q, calib)
    after = _mean_conv_errors(pre, out, calib)
    assert after < 0.6 * before, (before, after)  # measured: 0.019 -> 0.008
    assert _mean_conv_errors(pre, out, held_out) < _mean_conv_errors(pre, q, held_out)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def _probe(nodes, inits, x_shape) -> bytes:
    graph = helper.make_graph(nodes, "probe",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                             x_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
                                                             None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_fast_correction_is_the_mean_error_of_the_quantized_layer(nncf_like,
                                                                  mobilenet_feeds):
    pre, q, d = nncf_like
    calib = mobilenet_feeds[:12]
    fm, qm = onnx.load(str(pre)), onnx.load(str(q))
    f_inits = {i.name: i for i in fm.graph.initializer}
    q_inits = {i.name: i for i in qm.graph.initializer}
    producer = {o: n for n in qm.graph.node for o in n.output}
    name = [n.name for n in fm.graph.node if n.op_type == "Conv"][20]  # mid-network
    fnode = next(n for n in fm.graph.node if n.name == name)
    qnode = next(n for n in qm.graph.node if n.name == name)
    dq_x = producer[qnode.input[0]]
    q_x = producer[dq_x.input[0]]
    dq_w, dq_b = producer[qnode.input[1]], producer[qnode.input[2]]
    assert (q_x.op_type, dq_x.op_type, dq_w.op_type) == ("QuantizeLinear",
                                                         "DequantizeLinear",
                                                         "DequantizeLinear")
    # the layer as quantized and as float, both with the float bias, on the float input
    conv_attrs = {a.name: helper.get_attribute_value(a) for a in fnode.attribute}
    quant_layer = _probe(
        [helper.make_node("QuantizeLinear", ["x", *q_x.input[1:]], ["xq"]),
         helper.make_node("DequantizeLinear", ["xq", *dq_x.input[1:]], ["xd"]),
         dq_w, helper.make_node("Conv", ["xd", dq_w.output[0], "b"], ["y"], **conv_attrs)],
        [q_inits[t] for t in (*q_x.input[1:], *dq_x.input[1:], *dq_w.input)]
        + [numpy_helper.from_array(numpy_helper.to_array(f_inits[fnode.input[2]]), "b")],
        None)
    float_layer = _probe(
        [helper.make_node("Conv", ["x", "W", "b"], ["y"], **conv_attrs)],
        [numpy_helper.from_array(numpy_helper.to_array(f_inits[fnode.input[1]]), "W"),
         numpy_helper.from_array(numpy_helper.to_array(f_inits[fnode.input[2]]), "b")], None)
    xs = session(with_outputs(fm, [fnode.input[0]]).SerializeToString(), optimize=False)
    qs, fs = session(quant_layer, optimize=False), session(float_layer, optimize=False)
    diff = 0.0
    for feed in calib:
        x = xs.run([fnode.input[0]], feed)[0]
        diff = diff + (qs.run(None, {"x": x})[0].astype(np.float64)
                       - fs.run(None, {"x": x})[0])
    delta = (diff / len(calib)).mean(axis=(0, 2, 3))

    corrected, _ = bias_correct(q, pre, calib, method="fast")
    new_inits = {i.name: numpy_helper.to_array(i) for i in corrected.graph.initializer}
    scale = numpy_helper.to_array(q_inits[dq_b.input[1]]).astype(np.float64)
    old = numpy_helper.to_array(q_inits[dq_b.input[0]]).astype(np.float64) * scale
    new = new_inits[dq_b.input[0]].astype(np.float64) * scale
    # the int32 bias moved by -δ, to within its own rounding (half a step of its scale)
    assert np.abs(delta).max() > 20 * scale.max()  # a correction worth testing
    np.testing.assert_array_less(np.abs((new - old) + delta), 0.5 * scale + 1e-4 * np.abs(delta))
    # "weights" corrects only the weight error: not this layer's whole error
    weights_only, _ = bias_correct(q, pre, calib, method="weights")
    w_new = {i.name: numpy_helper.to_array(i) for i in weights_only.graph.initializer}
    moved = w_new[dq_b.input[0]].astype(np.float64) * scale - old
    assert np.abs(moved + delta).max() > 5 * scale.max()


def test_fast_correction_is_deterministic_and_checks_its_method(nncf_like, mobilenet_feeds):
    pre, q, _ = nncf_like
    a, _ = bias_correct(q, pre, mobilenet_feeds[:3], method="fast")
    b, _ = bias_correct(q, pre, mobilenet_feeds[:3], method="fast")
    assert a.SerializeToString() == b.SerializeToString()
    with pytest.raises(OnnxError, match="unknown bias correction method 'exact'"):
        bias_correct(q, pre, mobilenet_feeds[:3], method="exact")


CONVS = [
    ({"pads": [1, 1, 1, 1]}, (8, 3, 3, 3)),
    ({"strides": [2, 2], "pads": [1, 0, 2, 1]}, (8, 3, 3, 3)),
    ({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, (8, 3, 3, 3)),
    ({"group": 3, "strides": [2, 1]}, (6, 1, 3, 3)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (4, 3, 4, 4)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (4, 3, 4, 4)),
    ({"auto_pad": "VALID", "strides": [3, 3]}, (4, 3, 5, 5)),
    ({"pads": [3, 0]}, (4, 3, 7)),  # 1-D, a tap that only ever meets padding at the edge
]


@pytest.mark.parametrize(("attrs", "wshape"), CONVS)
def test_layer_sums_give_the_mean_output_of_a_conv(attrs, wshape):
    """The tap sums give onnxruntime's Conv output mean per channel, streamed over runs of
    different batch sizes."""
    from qbuild_onnx.accuracy.layer_sums import LayerSums

    rng = np.random.default_rng(len(wshape) * 10 + len(attrs))
    cin = wshape[1] * attrs.get("group", 1)
    spatial = (11, 13) if len(wshape) == 4 else (17,)
    w = rng.normal(size=wshape)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    model = _probe([node], [numpy_helper.from_array(w.astype(np.float32), "w")], None)
    sess = session(model, optimize=False)
    sums = LayerSums(node, w.shape)
    total, count = 0.0, 0
    for batch in (1, 3, 2):
        x = rng.normal(1.0, 2.0, (batch, cin, *spatial)).astype(np.float32)
        y = sess.run(None, {"x": x})[0].astype(np.float64)
        axes = tuple(i for i in range(y.ndim) if i != 1)
        total = total + y.sum(axis=axes)
        count += y.size // y.shape[1]
        sums.add(x)
    np.testing.assert_allclose(sums.mean_output(w), total / count, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5}])
def test_layer_sums_give_the_mean_output_of_a_gemm(attrs):
    from qbuild_onnx.accuracy.layer_sums import LayerSums

    rng = np.random.default_rng(5)
    w = rng.normal(size=(6, 5) if attrs.get("transB") else (5, 6))
    node = helper.make_node("Gemm", ["x", "w"], ["y"], **attrs)
    sums = LayerSums(node, w.shape)
    outs = []
    for rows in (4, 7):
        x = rng.normal(size=(5, rows) if attrs.get("transA") else (rows, 5))
        a = x.T if attrs.get("transA") else x
        b = w.T if attrs.get("transB") else w
        outs.append(attrs.get("alpha", 1.0) * a @ b)
        sums.add(x)
    np.testing.assert_allclose(sums.mean_output(w), np.concatenate(outs).mean(axis=0))
