"""runtime_compat: models written with onnx 1.23 defaults (IR 14, opset 28) made loadable in
onnxruntime 1.31, and clear errors naming what blocks it."""

from __future__ import annotations

import dtypes_testlib as lib
import numpy as np
import onnx
import onnx.helper as H
import pytest
from onnx import TensorProto as T
from onnx import version_converter
from qbuild_dtypes import runtime_compat, validate
from qbuild_dtypes.errors import DtypeError


@pytest.fixture(scope="module")
def mobilenet_28(tmp_path_factory):
    m = version_converter.convert_version(
        onnx.load(str(lib.MODELS / "mobilenet_v2_128_0.5.onnx")), 28)
    m.ir_version = 14
    path = tmp_path_factory.mktemp("compat") / "mb28.onnx"
    onnx.save(m, str(path))
    return path


def test_onnx_defaults_are_lowered_for_onnxruntime(mobilenet_28, tmp_path):
    with pytest.raises(DtypeError, match="IR version 14 is newer than the 13"):
        runtime_compat.check_loadable(mobilenet_28, "onnxruntime-cpu")
    with pytest.raises(DtypeError, match="onnxruntime cannot load"):
        validate.ort_session(mobilenet_28)
    fixed = runtime_compat.make_loadable(onnx.load(str(mobilenet_28)), "onnxruntime-cpu")
    assert fixed.ir_version == 13 and fixed.opset_import[0].version == 26
    onnx.save(fixed, str(tmp_path / "ok.onnx"))
    info = runtime_compat.check_loadable(tmp_path / "ok.onnx", "onnxruntime-cpu")
    assert info["ran"] and info["outputs"][0]["shape"] == [1, 2]
    src = lib.MODELS / "mobilenet_v2_128_0.5.onnx"
    feeds = validate.synthetic_feeds(onnx.load(str(src)))
    assert validate.max_abs_diff(validate.run_onnxruntime(src, feeds),
                                 validate.run_onnxruntime(tmp_path / "ok.onnx", feeds)) == 0
    # The reference target loads what onnx writes: nothing to lower.
    same = runtime_compat.make_loadable(onnx.load(str(mobilenet_28)), "onnx-reference")
    assert same.ir_version == 14 and same.opset_import[0].version == 28


def _single(op, inputs, outputs, opset, inits=(), **kw):
    g = H.make_graph([H.make_node(op, [i[0] for i in inputs] + [t.name for t in inits],
                                  [o[0] for o in outputs], name="blocker", **kw)], "g",
                     [H.make_tensor_value_info(*i) for i in inputs],
                     [H.make_tensor_value_info(*o) for o in outputs], list(inits))
    return H.make_model(g, opset_imports=[H.make_opsetid("", opset)])


def test_new_operator_blocks_lowering():
    m = _single("SwiGLU", [("x", T.FLOAT, [2, 8])], [("y", T.FLOAT, [2, 4])], 28)
    with pytest.raises(DtypeError, match="loads ai.onnx opset <= 26: .*operator SwiGLU "
                                         "'blocker' does not exist before opset 28"):
        runtime_compat.make_loadable(m, "onnxruntime-cpu")


def test_new_type_blocks_lowering():
    s = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "s")
    m = _single("DequantizeLinear", [("x", T.FLOAT6E2M3, [4])], [("y", T.FLOAT, [4])], 28,
                [s])
    with pytest.raises(DtypeError, match="DequantizeLinear 'blocker' uses FLOAT6E2M3, which "
                                         "needs opset 28"):
        runtime_compat.make_loadable(m, "onnxruntime-cpu")


def test_ir_version_follows_the_types_used():
    w = onnx.helper.make_tensor("w", T.INT4, [4], [1, -2, 3, -4])
    s = onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s")
    g = H.make_graph([H.make_node("DequantizeLinear", ["w", "s"], ["y"])], "g", [],
                     [H.make_tensor_value_info("y", T.FLOAT, [4])], [w, s])
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    m.ir_version = 7  # too old for int4
    assert runtime_compat.required_ir(m) == (10, "initializer 'w' has type INT4")
    assert runtime_compat.make_loadable(m, "onnxruntime-cpu").ir_version == 10
    m.ir_version = 14
    assert runtime_compat.make_loadable(m, "onnxruntime-cpu").ir_version == 13


def test_other_domains_are_checked():
    m = _single("Relu", [("x", T.FLOAT, [2])], [("y", T.FLOAT, [2])], 21)
    m.opset_import.append(H.make_opsetid("ai.onnx.ml", 6))
    with pytest.raises(DtypeError, match="opset ai.onnx.ml 6 is newer than the 5"):
        runtime_compat.make_loadable(m, "onnxruntime-cpu")


def test_raising_the_opset_keeps_results(tmp_path):
    src = lib.MODELS / "silero_vad_v3.1_transformer.onnx"
    m = onnx.load(str(src))
    up = runtime_compat.set_opset(m, 21)
    assert up.opset_import[0].version == 21
    assert len(up.graph.value_info) == len(m.graph.value_info)
    onnx.save(up, str(tmp_path / "up.onnx"))
    feeds = validate.synthetic_feeds(m, {"sequence": 512})
    a = validate.run_onnxruntime(src, feeds)
    b = validate.run_onnxruntime(tmp_path / "up.onnx", feeds)
    assert validate.max_abs_diff(a, b) < 1e-5
