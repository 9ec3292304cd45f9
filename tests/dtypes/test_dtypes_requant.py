"""Weight (re-)quantization: weight-only int4 blocked on the Silero transformer (a float
model), re-quantization of a QDQ MobileNetV2's int8 weights to other dtypes, and the policy
errors."""

from __future__ import annotations

import dtypes_testlib as lib
import numpy as np
import onnx
import pytest
from qbuild_dtypes.conversion import pipeline, requantize
from qbuild_dtypes.graph import qdq
from qbuild_dtypes.numerics.qtypes import qtype
from qbuild_dtypes.runtime import ort_probe
from qbuild_dtypes.validation import checks
from qbuild_onnx_common.errors import OnnxError

SILERO = lib.MODELS / "silero_vad_v3.1_transformer.onnx"
DIMS = {"sequence": 512}


def _tone_feeds():
    t = np.arange(1536, dtype=np.float32) / 16000
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 440 * t)
    return {"input": x[None].astype(np.float32), "h0": np.zeros((2, 1, 64), np.float32),
            "c0": np.zeros((2, 1, 64), np.float32)}


def test_silero_weight_only_int4_blocked(tmp_path):
    policy = {"MatMul": {"dtype": "int4", "granularity": "blocked", "block_size": 32}}
    rep = pipeline.requantize_file(SILERO, tmp_path / "s.onnx", "onnxruntime-cpu",
                                   policy=policy, input_dims=DIMS)
    weights = rep["requantization"]["weights"]
    assert len(weights) == 16  # every MatMul with a constant B (8 MatMuls are act x act)
    assert {w["dtype"] for w in weights} == {"int4"} and all(w["axis"] == 0 for w in weights)
    assert min(w["sqnr_db"] for w in weights) > 15
    assert rep["after"]["initializers_by_dtype"]["INT4"] == 16
    assert rep["after"]["bytes"] < rep["before"]["bytes"] - 100_000
    assert rep["opset_after"] == 21 and rep["ir_after"] == 10
    # onnxruntime turns every int4 blocked DQ -> MatMul into MatMulNBits.
    assert rep["validation"]["onnxruntime_fused_ops"]["MatMulNBits"] == 16
    a = checks.run_onnxruntime(SILERO, _tone_feeds())[0]
    b = checks.run_onnxruntime(tmp_path / "s.onnx", _tone_feeds())[0]
    assert np.abs(a - b).max() < 0.15  # speech probability
    # onnx's reference agrees with onnxruntime on the int4 model.
    m = onnx.load(str(tmp_path / "s.onnx"))
    r = checks.run_reference(m, _tone_feeds())[0]
    assert np.abs(r - b).max() < 1e-3


@pytest.mark.parametrize("spec", [
    {"dtype": "int4", "granularity": "per_channel"},
    {"dtype": "uint8", "granularity": "per_tensor", "symmetric": False},
    {"dtype": "int16", "granularity": "blocked", "block_size": 8},
    {"dtype": "float8e4m3fn", "granularity": "per_channel"},
])
def test_requantize_qdq_weights(mobilenet_u8, tmp_path, spec):
    target = "onnxruntime-cpu"
    # onnxruntime 1.31 rejects float8 weights in fused Conv groups, 1.32 runs them: the probe
    # says which, and the target refuses exactly what the installed runtime rejects.
    if spec["dtype"].startswith("float8") and \
            not ort_probe.probe().float8_weights_in_qdq_groups:
        with pytest.raises(OnnxError, match="FLOAT8E4M3FN weight inside a quantized Conv "
                                             "group"):
            pipeline.requantize_weights(onnx.load(str(mobilenet_u8)), target,
                                        policy={"Conv": spec})
        target = "onnx-reference"
    rep = pipeline.requantize_file(mobilenet_u8, tmp_path / "r.onnx", target,
                                   policy={"Conv": spec, "MatMul": spec})
    weights = rep["requantization"]["weights"]
    assert len(weights) == 53 and all(w["source"] == "int8" for w in weights)
    assert {w["dtype"] for w in weights} == {spec["dtype"]}
    assert rep["validation"]["loadable"]["ran"]
    out = onnx.load(str(tmp_path / "r.onnx"))
    w_inputs = {n.input[1] for n in out.graph.node if n.op_type in ("Conv", "MatMul")}
    dq = [q for q in qdq.find_qdq(out) if not q.is_q and q.node.output[0] in w_inputs]
    assert all(q.qelem == qtype(spec["dtype"]).onnx for q in dq)
    assert len(dq) == 53 and all(q.block_size == spec.get("block_size", 0) for q in dq)
    # Activations are untouched: their Q/DQ parameters are identical to the source's.
    src = qdq.effective_params(onnx.load(str(mobilenet_u8)))
    new = qdq.effective_params(out)
    acts = [k for k in src if k.startswith("QuantizeLinear")]
    assert acts and all(src[k] == new[k] for k in acts)


def test_float_conv_weights_and_tensor_overrides(tmp_path):
    src = lib.MODELS / "mnist.onnx"
    rep = pipeline.requantize_file(
        src, tmp_path / "m.onnx", "onnx-reference", form="zero_point",
        policy={"Conv": {"dtype": "int8"}, "MatMul": "float"},
        tensors={"Parameter87": {"dtype": "uint4", "granularity": "per_tensor",
                                 "symmetric": False}})
    by = {w["tensor"]: w for w in rep["requantization"]["weights"]}
    assert by["Parameter87"]["dtype"] == "uint4" and by["Parameter5"]["dtype"] == "int8"
    assert rep["opset_before"] == 7 and rep["opset_after"] == 21
    out = onnx.load(str(tmp_path / "m.onnx"))
    assert all(len(n.input) == 3 for n in out.graph.node if n.op_type == "DequantizeLinear")
    assert rep["validation"]["loadable"]["ran"]


@pytest.mark.parametrize("policy,tensors,message", [
    ({"Softmax": {"dtype": "int8"}}, None, "policy.Softmax: no weight slot"),
    ({"Conv": {"dtype": "int3"}}, None, "unknown dtype 'int3'"),
    ({"Conv": {"dtype": "float8e5m2", "symmetric": False}}, None,
     "float8e5m2 cannot have a non-zero zero point"),
    ({"MatMul": {"dtype": "int4", "granularity": "blocked", "block_size": 0}}, None,
     "block_size: must be a positive integer"),
    ({"Conv": {"dtype": "int8", "block": 4}}, None, "unknown key"),
    (None, {"not_a_weight": "int8"}, "tensors: not_a_weight is not a weight"),
])
def test_policy_errors(policy, tensors, message):
    m = onnx.load(str(lib.MODELS / "mnist.onnx"))
    with pytest.raises(OnnxError, match=message):
        pipeline.requantize_weights(m, "onnx-reference", policy=policy, tensors=tensors)


def test_target_that_cannot_run_the_dtype():
    m = onnx.load(str(lib.MODELS / "mnist.onnx"))
    with pytest.raises(OnnxError, match="'onnxruntime-cpu' cannot run float4e2m1"):
        pipeline.requantize_weights(m, "onnxruntime-cpu", policy={"Conv": "float4e2m1"})


def test_default_policy():
    assert requantize.DEFAULT_POLICY["MatMul"]["dtype"] == "int4"
    m = onnx.load(str(SILERO))
    plans, skipped = requantize.plan(m)
    kinds = {(w.op, w.spec.q.name, w.spec.granularity) for w in plans}
    assert kinds == {("MatMul", "int4", "blocked"), ("Conv", "int8", "per_channel")}
    assert any("min_elements" in s["reason"] for s in skipped)  # the 1x1x7 Conv kernel
