"""qdq_retarget's core: round trips between the zero-point and output_dtype forms on real QDQ
models (MobileNetV2, YOLOX-Nano), onnxruntime policies measured on the optimized graph, and
the bad cases (conflicting output_dtype, invalid block_size, float8 zero point, a target that
cannot express the request)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as H
import pluggy
import pytest
from onnx import TensorProto as T
from qbuild_dtypes import hookspecs
from qbuild_dtypes.conversion import forms, pipeline
from qbuild_dtypes.graph import qdq
from qbuild_dtypes.runtime import targets
from qbuild_dtypes.validation import checks
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import attr
from qbuild_onnx_common.ort import session

FUSED = ("QLinearConv", "QLinearAdd", "QLinearMatMul", "QuantizeLinear", "DequantizeLinear")


def _fused(rec):
    return {k: v for k, v in rec["onnxruntime_fused_ops"].items() if k in FUSED}


def _q_nodes(model):
    return [n for n in model.graph.node if n.op_type == "QuantizeLinear"]


def test_mobilenet_uint8_round_trip(mobilenet_u8, tmp_path):
    src = onnx.load(str(mobilenet_u8))
    base = pipeline.retarget_file(mobilenet_u8, tmp_path / "zp.onnx", "onnxruntime-cpu",
                                  "zero_point")
    ref = pipeline.retarget_file(mobilenet_u8, tmp_path / "od.onnx", "onnx-reference",
                                 "output_dtype", run=False)
    od = onnx.load(str(tmp_path / "od.onnx"))
    assert ref["opset_after"] == 21 and ref["before"]["opset"] == 15
    assert all(attr(n, "output_dtype") == T.UINT8 for n in _q_nodes(od))
    assert ref["conversion"]["zero_points_elided"] > 100
    assert ref["after"]["zero_points"].get("absent", 0) > 100
    assert ref["after"]["bytes"] < ref["before"]["bytes"]
    # Back to the zero-point form: every zero point explicit again, nothing changed.
    back, info = pipeline.retarget(od, "onnxruntime-cpu", "zero_point")
    assert info["conversion"]["zero_points_materialized"] > 100
    assert all(len(n.input) == 3 for n in back.graph.node
               if n.op_type in qdq.Q_OPS and "bias" not in n.input[0])
    qdq.check_equivalent(src, back)
    # onnxruntime computes exactly the same as on the source model.
    onnx.save(back, str(tmp_path / "back.onnx"))
    feeds = checks.synthetic_feeds(src)
    a = checks.run_onnxruntime(mobilenet_u8, feeds)
    b = checks.run_onnxruntime(tmp_path / "back.onnx", feeds)
    assert checks.max_abs_diff(a, b) == 0.0
    assert base["validation"]["max_abs_diff_vs_source"] == 0.0


def test_onnxruntime_policy_keeps_every_fusion(mobilenet_u8, mobilenet_s8, tmp_path):
    for src in (mobilenet_u8, mobilenet_s8):
        plain = pipeline.retarget_file(src, tmp_path / "a.onnx", "onnxruntime-cpu",
                                       "zero_point")
        ort_od = pipeline.retarget_file(src, tmp_path / "b.onnx", "onnxruntime-cpu",
                                        "output_dtype")
        assert _fused(ort_od["validation"]) == _fused(plain["validation"])
        assert ort_od["conversion"]["policy_activation_zero_point_kept"] > 0
        assert ort_od["validation"]["max_abs_diff_vs_source"] == 0.0
        m = onnx.load(str(tmp_path / "b.onnx"))
        for n in _q_nodes(m):  # never output_dtype together with an int8 zero point
            assert not (attr(n, "output_dtype") == T.INT8 and len(n.input) == 3)
    # Without the policy (the reference target's form: output_dtype=INT8 next to the int8
    # zero points) onnxruntime cannot even create a session (its issue 25526).
    pipeline.retarget_file(mobilenet_s8, tmp_path / "c.onnx", "onnx-reference", "output_dtype",
                           run=False)
    with pytest.raises(OnnxError, match="output_dtype INT8 does not match y_zero_point"):
        session(tmp_path / "c.onnx")


def _symmetric_int8_conv():
    """DQ -> Conv -> Q with symmetric (zero point 0) int8 activations and weights."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(8, 4, 3, 3)).astype(np.int8)
    inits = [onnx.numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             onnx.numpy_helper.from_array(np.array(0, np.int8), "xz"),
             onnx.numpy_helper.from_array(w, "w"),
             onnx.numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
             onnx.numpy_helper.from_array(np.zeros(8, np.int8), "wz"),
             onnx.numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
             onnx.numpy_helper.from_array(np.array(0, np.int8), "yz")]
    nodes = [H.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
             H.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"], name="dqx"),
             H.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], name="dqw", axis=0),
             H.make_node("Conv", ["xf", "wf"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             H.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"], name="qy"),
             H.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"], name="dqy")]
    g = H.make_graph(nodes, "g", [H.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
                     [H.make_tensor_value_info("y", T.FLOAT, [1, 8, 8, 8])], inits)
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def test_int8_activation_zero_point_policy_keeps_qlinearconv(tmp_path):
    m = _symmetric_int8_conv()
    counts = {}
    for tgt in ("onnx-reference", "onnxruntime-cpu"):
        out, info = pipeline.retarget(m, tgt, "output_dtype")
        onnx.save(out, str(tmp_path / f"{tgt}.onnx"))
        counts[tgt] = checks.fused_op_counts(tmp_path / f"{tgt}.onnx", tmp_path)
    # Elided int8 activation zero points: onnxruntime runs a float Conv between DQ and Q.
    assert "QLinearConv" not in counts["onnx-reference"]
    assert counts["onnx-reference"].get("Conv") == 1
    # The onnxruntime target keeps them (and the weight's all-zero one is still elided).
    assert counts["onnxruntime-cpu"].get("QLinearConv") == 1
    ort_model = onnx.load(str(tmp_path / "onnxruntime-cpu.onnx"))
    dqw = [n for n in ort_model.graph.node if n.name == "dqw"][0]
    assert len(dqw.input) == 2


def test_yolo_round_trip(yolo_u8, tmp_path):
    rep = pipeline.retarget_file(yolo_u8, tmp_path / "yolo_od.onnx", "onnx-reference",
                                 "output_dtype", run=False)
    assert rep["equivalence"]["dequantized_weights_identical"] == 226  # 113 conv w + b
    od = onnx.load(str(tmp_path / "yolo_od.onnx"))
    back = pipeline.retarget_file(tmp_path / "yolo_od.onnx", tmp_path / "yolo_zp.onnx",
                                  "onnxruntime-cpu", "zero_point")
    qdq.check_equivalent(onnx.load(str(yolo_u8)), onnx.load(str(tmp_path / "yolo_zp.onnx")))
    assert back["validation"]["loadable"]["ran"]
    assert back["validation"]["onnxruntime_fused_ops"]["QLinearConv"] == 113
    assert len(_q_nodes(od)) == 365


def _ort_bug_model(with_output_dtype: bool):
    s = onnx.numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = onnx.numpy_helper.from_array(np.array(3, np.int8), "z")
    kw = {"output_dtype": T.INT8} if with_output_dtype else {}
    g = H.make_graph([H.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q", **kw),
                      H.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")],
                     "g", [H.make_tensor_value_info("x", T.FLOAT, [4])],
                     [H.make_tensor_value_info("y", T.FLOAT, [4])], [s, z])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def test_onnxruntime_issue_25526_is_avoided(tmp_path):
    bad = _ort_bug_model(True)
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    with pytest.raises(OnnxError, match="cannot load"):
        session(tmp_path / "bad.onnx")
    for form in ("output_dtype", "zero_point"):
        out, info = pipeline.retarget(bad, "onnxruntime-cpu", form)
        assert not attr(_q_nodes(out)[0], "output_dtype")
        onnx.save(out, str(tmp_path / "ok.onnx"))
        y = checks.run_onnxruntime(tmp_path / "ok.onnx",
                                     {"x": np.array([0, 1, -1, 9], np.float32)})[0]
        assert np.allclose(y, [0, 1, -1, 6.2])  # (127 - 3) * 0.05: saturated


def test_conflicting_output_dtype_and_zero_point():
    m = _ort_bug_model(True)
    m.graph.node[0].attribute[0].i = T.UINT8
    onnx.checker.check_model(m)  # the plain checker does not see it
    with pytest.raises(OnnxError, match="output_dtype UINT8 conflicts with zero point 'z' "
                                         "of type INT8"):
        pipeline.retarget(m, "generic", "output_dtype")
    with pytest.raises(OnnxError, match="full_check"):
        checks.full_check(m)


def test_invalid_block_size_is_refused():
    x = onnx.numpy_helper.from_array(np.arange(12, dtype=np.int8).reshape(2, 6), "x")
    s = onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "s")
    g = H.make_graph([H.make_node("DequantizeLinear", ["x", "s"], ["y"], name="dq", axis=1,
                                  block_size=6)], "g", [],
                     [H.make_tensor_value_info("y", T.FLOAT, [2, 6])], [x, s])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    onnx.checker.check_model(m, full_check=True)  # onnx accepts it
    with pytest.raises(OnnxError, match=r"DequantizeLinear 'dq' \(attribute block_size\): "
                                         r"block_size 6 is invalid .* allows \[3, 5\]"):
        pipeline.retarget(m, "onnx-reference", "output_dtype")


def test_float8_with_nonzero_zero_point_is_refused():
    x = onnx.numpy_helper.from_array(np.zeros(3, np.float32), "x")
    s = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "s")
    z = H.make_tensor("z", T.FLOAT8E4M3FN, [], [1.0])
    g = H.make_graph([H.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q8")],
                     "g", [], [H.make_tensor_value_info("q", T.FLOAT8E4M3FN, [3])], [x, s, z])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    with pytest.raises(OnnxError, match="QuantizeLinear 'q8': float8e4m3fn zero point 'z' "
                                         "is not zero"):
        pipeline.retarget(m, "onnx-reference", "zero_point")


class _LegacyPlugin:
    @staticmethod
    @pluggy.HookimplMarker("qbuild")
    def qbuild_dtype_targets():
        return [{"name": "legacy-17", "runtime": None, "max_opset": {"": 17}, "max_ir": 8,
                 "preferred_form": "zero_point"}]


def _pm():
    pm = pluggy.PluginManager("qbuild")
    pm.add_hookspecs(hookspecs)
    pm.register(_LegacyPlugin())
    return pm


def test_plugins_add_targets_and_unexpressible_requests_fail(mobilenet_u8):
    pm = _pm()
    assert "legacy-17" in targets.collect_targets(pm)
    legacy = targets.get_target("legacy-17", pm)
    m = onnx.load(str(mobilenet_u8))
    # The zero-point form is expressible at opset 15 ...
    out, info = pipeline.retarget(m, legacy, "auto")
    assert info["form"] == "zero_point" and info["opset_after"] == 15
    # ... the output_dtype form is not.
    with pytest.raises(OnnxError, match="'legacy-17' cannot express the output_dtype form"):
        pipeline.retarget(m, legacy, "output_dtype")
    with pytest.raises(OnnxError, match="unknown dtype target 'nope'; known: generic, "
                                         "legacy-17"):
        targets.get_target("nope", pm)


def test_target_without_a_kernel_is_refused():
    x = onnx.numpy_helper.from_array(np.zeros(4, np.float32), "x")
    s = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "s")
    g = H.make_graph([H.make_node("QuantizeLinear", ["x", "s"], ["q"], name="fp4",
                                  output_dtype=T.FLOAT4E2M1)], "g", [],
                     [H.make_tensor_value_info("q", T.FLOAT4E2M1, [4])], [x, s])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 23)])
    with pytest.raises(OnnxError, match="'onnxruntime-cpu' cannot run QuantizeLinear 'fp4' "
                                         "with FLOAT4E2M1"):
        pipeline.retarget(m, "onnxruntime-cpu", "output_dtype")
    out, _ = pipeline.retarget(m, "onnx-reference", "zero_point")
    assert len(out.graph.node[0].input) == 3


def test_output_is_deterministic(mobilenet_u8, tmp_path):
    for i in (1, 2):
        pipeline.retarget_file(mobilenet_u8, tmp_path / f"m{i}.onnx", "onnx-reference",
                               "output_dtype", report_path=tmp_path / f"r{i}.json", run=False)
    assert (tmp_path / "m1.onnx").read_bytes() == (tmp_path / "m2.onnx").read_bytes()
    assert (tmp_path / "r1.json").read_text() == (tmp_path / "r2.json").read_text()


def test_form_conversion_is_idempotent(mobilenet_u8):
    m = onnx.load(str(mobilenet_u8))
    once, _ = pipeline.retarget(m, "onnx-reference", "output_dtype")
    twice, stats = forms.convert_form(once, targets.ONNX_REFERENCE, "output_dtype")
    assert stats.get("zero_points_elided", 0) == 0 and stats.get("output_dtype_set", 0) == 0
    assert once.SerializeToString() == twice.SerializeToString()
