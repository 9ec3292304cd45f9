"""runtime_compat: models written with onnx's defaults made loadable in the installed
onnxruntime (whose limits are measured by ort_probe), and clear errors naming what blocks it.
Every expectation follows the probe, so the tests hold on onnxruntime 1.31 (IR 13 / opset 26)
and 1.32 (IR 14 / opset 28) alike."""

from __future__ import annotations

import dtypes_testlib as lib
import numpy as np
import onnx
import onnx.helper as H
import pytest
from onnx import TensorProto as T
from onnx import version_converter
from qbuild_dtypes.runtime import compat, ort_probe, targets
from qbuild_dtypes.validation import checks
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session


@pytest.fixture(scope="module")
def mobilenet_28(tmp_path_factory):
    m = version_converter.convert_version(
        onnx.load(str(lib.MODELS / "mobilenet_v2_128_0.5.onnx")), 28)
    m.ir_version = 14
    path = tmp_path_factory.mktemp("compat") / "mb28.onnx"
    onnx.save(m, str(path))
    return path


def test_probe_matches_what_onnxruntime_loads(tmp_path):
    facts = ort_probe.probe()
    assert facts == ort_probe.measure()  # the kept answer is the measured one
    ir, opset = onnx.IR_VERSION, onnx.defs.onnx_opset_version()
    assert facts.max_ir <= ir and facts.max_opset[""] <= opset
    for version, loads in ((facts.max_ir, True), (facts.max_ir + 1, False)):
        if version > ir:
            continue
        m = H.make_model(H.make_graph([H.make_node("Relu", ["x"], ["y"])], "g",
                                      [H.make_tensor_value_info("x", T.FLOAT, [2])],
                                      [H.make_tensor_value_info("y", T.FLOAT, [2])]),
                         opset_imports=[H.make_opsetid("", 21)])
        m.ir_version = version
        onnx.save(m, str(tmp_path / "m.onnx"))
        if loads:
            session(tmp_path / "m.onnx")
        else:
            with pytest.raises(OnnxError, match="onnxruntime cannot load"):
                session(tmp_path / "m.onnx")
    target = targets.get_target("onnxruntime-cpu")
    assert target.ir_limit() == facts.max_ir and target.opset_limit("") == facts.max_opset[""]
    assert target.float8_weights_in_qdq_groups == facts.float8_weights_in_qdq_groups


def test_probe_survives_a_damaged_cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ort_probe.probe.cache_clear()
    try:
        first = ort_probe.probe()
        (file,) = (tmp_path / "qbuild-probes").iterdir()
        file.write_text('{"max_ir": "garbage"')
        ort_probe.probe.cache_clear()
        assert ort_probe.probe() == first
    finally:
        ort_probe.probe.cache_clear()


def test_onnx_defaults_are_lowered_for_onnxruntime(mobilenet_28, tmp_path):
    facts = ort_probe.probe()
    if facts.max_ir < 14:
        with pytest.raises(OnnxError, match=f"IR version 14 is newer than the {facts.max_ir}"):
            compat.check_loadable(mobilenet_28, "onnxruntime-cpu")
    if facts.max_ir < 14 or facts.max_opset[""] < 28:
        with pytest.raises(OnnxError, match="onnxruntime cannot load"):
            session(mobilenet_28)
    else:  # this onnxruntime loads onnx's defaults as they are
        compat.check_loadable(mobilenet_28, "onnxruntime-cpu")
    fixed = compat.make_loadable(onnx.load(str(mobilenet_28)), "onnxruntime-cpu")
    assert fixed.ir_version == min(14, facts.max_ir)
    assert fixed.opset_import[0].version == min(28, facts.max_opset[""])
    onnx.save(fixed, str(tmp_path / "ok.onnx"))
    info = compat.check_loadable(tmp_path / "ok.onnx", "onnxruntime-cpu")
    assert info["ran"] and info["outputs"][0]["shape"] == [1, 2]
    src = lib.MODELS / "mobilenet_v2_128_0.5.onnx"
    feeds = checks.synthetic_feeds(onnx.load(str(src)))
    assert checks.max_abs_diff(checks.run_onnxruntime(src, feeds),
                                 checks.run_onnxruntime(tmp_path / "ok.onnx", feeds)) == 0
    # The reference target loads what onnx writes: nothing to lower.
    same = compat.make_loadable(onnx.load(str(mobilenet_28)), "onnx-reference")
    assert same.ir_version == 14 and same.opset_import[0].version == 28


# A target with onnxruntime 1.31's limits written down, so that the lowering logic is tested
# the same way whatever onnxruntime is installed.
IR13_OPSET26 = targets.DtypeTarget(name="ir13-opset26", max_opset={"": 26, "ai.onnx.ml": 5},
                                   max_ir=13)


def _single(op, inputs, outputs, opset, inits=(), **kw):
    g = H.make_graph([H.make_node(op, [i[0] for i in inputs] + [t.name for t in inits],
                                  [o[0] for o in outputs], name="blocker", **kw)], "g",
                     [H.make_tensor_value_info(*i) for i in inputs],
                     [H.make_tensor_value_info(*o) for o in outputs], list(inits))
    return H.make_model(g, opset_imports=[H.make_opsetid("", opset)])


def test_new_operator_blocks_lowering():
    m = _single("SwiGLU", [("x", T.FLOAT, [2, 8])], [("y", T.FLOAT, [2, 4])], 28)
    with pytest.raises(OnnxError, match="loads ai.onnx opset <= 26: .*operator SwiGLU "
                                         "'blocker' does not exist before opset 28"):
        compat.make_loadable(m, IR13_OPSET26)


def test_new_type_blocks_lowering():
    s = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "s")
    m = _single("DequantizeLinear", [("x", T.FLOAT6E2M3, [4])], [("y", T.FLOAT, [4])], 28,
                [s])
    with pytest.raises(OnnxError, match="DequantizeLinear 'blocker' uses FLOAT6E2M3, which "
                                         "needs opset 28"):
        compat.make_loadable(m, IR13_OPSET26)


def test_ir_version_follows_the_types_used():
    w = onnx.helper.make_tensor("w", T.INT4, [4], [1, -2, 3, -4])
    s = onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")
    g = H.make_graph([H.make_node("DequantizeLinear", ["w", "s"], ["y"])], "g", [],
                     [H.make_tensor_value_info("y", T.FLOAT, [4])], [w, s])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    m.ir_version = 7  # too old for int4
    assert compat.required_ir(m) == (10, "initializer 'w' has type INT4")
    assert compat.make_loadable(m, IR13_OPSET26).ir_version == 10
    m.ir_version = 14
    assert compat.make_loadable(m, IR13_OPSET26).ir_version == 13
    # The installed onnxruntime: whatever the probe measured, never above it.
    limit = min(14, ort_probe.probe().max_ir)
    assert compat.make_loadable(m, "onnxruntime-cpu").ir_version == limit


def test_other_domains_are_checked():
    m = _single("Relu", [("x", T.FLOAT, [2])], [("y", T.FLOAT, [2])], 21)
    m.opset_import.append(H.make_opsetid("ai.onnx.ml", 6))
    with pytest.raises(OnnxError, match="opset ai.onnx.ml 6 is newer than the 5"):
        compat.make_loadable(m, "onnxruntime-cpu")


def test_raising_the_opset_keeps_results(tmp_path):
    src = lib.MODELS / "silero_vad_v3.1_transformer.onnx"
    m = onnx.load(str(src))
    up = compat.set_opset(m, 21)
    assert up.opset_import[0].version == 21
    assert len(up.graph.value_info) == len(m.graph.value_info)
    onnx.save(up, str(tmp_path / "up.onnx"))
    feeds = checks.synthetic_feeds(m, {"sequence": 512})
    a = checks.run_onnxruntime(src, feeds)
    b = checks.run_onnxruntime(tmp_path / "up.onnx", feeds)
    assert checks.max_abs_diff(a, b) < 1e-5
