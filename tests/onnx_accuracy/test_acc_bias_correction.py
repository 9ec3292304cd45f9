"""Bias correction reduces MobileNetV2's output error (weight-only quantization error)."""

from __future__ import annotations

import onnx
import pytest
from acc_paths import MODELS
from qbuild_onnx.accuracy.bias_correction import bias_correct
from qbuild_onnx.accuracy.metrics import compare_outputs, run_model
from qbuild_onnx.accuracy.ortq import quantize_qdq
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session


@pytest.fixture(scope="module")
def mobilenet_pre(tmp_path_factory):
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = tmp_path_factory.mktemp("mnv2")
    quant_pre_process(str(MODELS / "mobilenet_v2_128_0.5.onnx"), str(d / "pre.onnx"))
    return d / "pre.onnx"


def _sqnr(float_model, cand, feeds):
    ref = run_model(session(float_model), feeds)
    got = run_model(session(cand), feeds)
    return next(iter(compare_outputs(ref, got).values()))["sqnr_db"]


def test_bias_correction_improves_held_out_error(mobilenet_pre, mobilenet_feeds):
    calib, held_out = mobilenet_feeds[:12], mobilenet_feeds[12:]
    # Per-tensor 8-bit weights make the weight error (and its mean) large enough to see.
    q = quantize_qdq(mobilenet_pre, mobilenet_pre.parent / "q.onnx", calib, per_channel=False,
                     activation_type="uint16")
    out = mobilenet_pre.parent / "q_bc.onnx"
    _, report = bias_correct(q, mobilenet_pre, calib, out)
    assert report["corrected_nodes"] >= 40
    before, after = _sqnr(mobilenet_pre, q, held_out), _sqnr(mobilenet_pre, out, held_out)
    assert after > before + 0.1, (before, after)
    onnx.checker.check_model(onnx.load(out))


def test_deterministic(mobilenet_pre, mobilenet_feeds):
    q = quantize_qdq(mobilenet_pre, mobilenet_pre.parent / "q2.onnx", mobilenet_feeds[:4])
    a, _ = bias_correct(q, mobilenet_pre, mobilenet_feeds[:4])
    b, _ = bias_correct(q, mobilenet_pre, mobilenet_feeds[:4])
    assert a.SerializeToString() == b.SerializeToString()


def test_float_model_is_rejected(mobilenet_pre, mobilenet_feeds):
    with pytest.raises(OnnxError, match="no Conv/Gemm node"):
        bias_correct(mobilenet_pre, mobilenet_pre, mobilenet_feeds[:2])


def test_qdq_model_with_every_weight_layer_float_is_returned_unchanged(mobilenet_pre,
                                                                        mobilenet_feeds):
    # auto_quantize's widest region can keep every Conv float (a YOLOv8-style detector):
    # its bias-corrected trial is then the same model, not a failed build
    from qbuild_onnx.accuracy.sensitivity import dequantize_sites, find_sites

    q = quantize_qdq(mobilenet_pre, mobilenet_pre.parent / "q3.onnx", mobilenet_feeds[:2])
    weights = [s for s in find_sites(q, mobilenet_pre) if s.kind == "weight"]
    acts_only = dequantize_sites(onnx.load(q), weights, onnx.load(mobilenet_pre))
    assert any(n.op_type == "QuantizeLinear" for n in acts_only.graph.node)
    out, rep = bias_correct(acts_only, mobilenet_pre, mobilenet_feeds[:2])
    assert rep["corrected_nodes"] == 0 and "nothing to correct" in rep["note"]
    assert out.SerializeToString() == acts_only.SerializeToString()
    # every node excluded: the quantizer's output has no Q/DQ at all; as a quantizer's
    # output it is returned unchanged, as a plain float model it is refused (above)
    plain = onnx.load(mobilenet_pre)
    out, rep = bias_correct(plain, mobilenet_pre, mobilenet_feeds[:2], from_quantizer=True)
    assert rep["corrected_nodes"] == 0
    assert out.SerializeToString() == plain.SerializeToString()
