"""Models as they come: already-quantized models are refused with a clear line, compute
hidden in If branches is never "quantized" with nothing changed, initializers listed as
graph inputs are fixed by pre-processing, and per-channel grouped ConvTranspose (an
onnxruntime quantizer failure) gets its workaround by default."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from onnx import TensorProto, helper, numpy_helper
from qbuild_onnx.quantization.options import DynamicOptions, StaticOptions
from qbuild_onnx.quantization.preprocess import preprocess_model
from qbuild_onnx.quantization.quantize import quantize_dynamic_model, quantize_static_model
from qbuild_onnx_common.errors import OnnxError


def test_dynamic_convinteger_model_is_refused_everywhere(conv_case, tmp_path):
    dyn = tmp_path / "dyn.onnx"
    quantize_dynamic_model(conv_case.model, dyn, DynamicOptions(op_types=("Conv",)))
    assert any(n.op_type == "ConvInteger" for n in onnx.load(dyn).graph.node)
    cal = lib.write_calibration(conv_case.model, conv_case.feeds, tmp_path / "c.json")
    with pytest.raises(OnnxError, match=r"already quantized \(dynamic: .*ConvInteger") as e:
        quantize_static_model(dyn, cal, tmp_path / "q.onnx", StaticOptions())
    assert e.value.attr == "model"
    with pytest.raises(OnnxError, match="already quantized"):
        quantize_dynamic_model(dyn, tmp_path / "d2.onnx", DynamicOptions())
    with pytest.raises(OnnxError, match="already quantized.*pre-processing needs a float"):
        preprocess_model(dyn, tmp_path / "pre.onnx")


def test_qdq_model_is_refused_with_the_route(conv_case, tmp_path):
    q = tmp_path / "q.onnx"
    quantize_static_model(conv_case.model, conv_case.calibration, q, StaticOptions())
    with pytest.raises(OnnxError, match="already quantized \\(QDQ.*lower_integer"):
        quantize_static_model(q, conv_case.calibration, tmp_path / "qq.onnx", StaticOptions())


def _if_model():
    """y = If(cond, then: x @ W1, else: x @ W2): all compute inside the branches."""
    rng = np.random.default_rng(0)

    def branch(name, seed):
        w = np.random.default_rng(seed).normal(size=(8, 8)).astype(np.float32)
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"], name=f"{name}_mm")],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 8])],
            [numpy_helper.from_array(w, f"{name}_w")])

    g = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch("a", 1),
                          else_branch=branch("b", 2))],
        "if_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    del rng
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_compute_inside_if_branches_is_refused_not_silently_unchanged(tmp_path):
    path = lib.save(_if_model(), tmp_path / "if.onnx")
    with pytest.raises(OnnxError, match="inside control-flow subgraphs \\(If 'branch'"):
        quantize_dynamic_model(path, tmp_path / "d.onnx", DynamicOptions())


def _conv_bn_ir3_model():
    """Conv -> BatchNormalization with every initializer also listed as a graph input."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "scale"),
             numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.random(8).astype(np.float32) + 0.5, "var")]
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"],
                          name="bn")],
        "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])]
        + [helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)) for i in inits],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 6
    return m


def test_preprocess_folds_batchnorm_of_initializer_inputs(tmp_path):
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src = lib.save(_conv_bn_ir3_model(), tmp_path / "ir3.onnx")
    quant_pre_process(str(src), str(tmp_path / "plain.onnx"))
    plain = onnx.load(tmp_path / "plain.onnx")
    assert any(n.op_type == "BatchNormalization" for n in plain.graph.node)  # the problem
    info = preprocess_model(src, tmp_path / "pre.onnx")
    pre = onnx.load(tmp_path / "pre.onnx")
    assert [n.op_type for n in pre.graph.node] == ["Conv"]
    assert [i.name for i in pre.graph.input] == ["x"]
    assert "5 initializers were also listed as graph inputs" in info["notes"][0]
    x = {"x": np.random.default_rng(0).random((1, 3, 16, 16), np.float32)}
    np.testing.assert_allclose(lib.run(src, x)["y"], lib.run(tmp_path / "pre.onnx", x)["y"],
                               rtol=1e-4, atol=1e-4)


def _grouped_conv_transpose():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 8, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=16).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(size=(8, 16, 1, 1)).astype(np.float32), "w2")]
    g = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], name="up", group=2,
                          strides=[2, 2]),
         helper.make_node("Conv", ["t", "w2"], ["y"], name="proj")],
        "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_grouped_conv_transpose_workaround_by_default(tmp_path):
    path = lib.save(_grouped_conv_transpose(), tmp_path / "ct.onnx")
    cal = lib.write_calibration(path, lib.random_inputs(path, 4), tmp_path / "c.json")
    warnings: list[str] = []
    quantize_static_model(path, cal, tmp_path / "q.onnx", StaticOptions(per_channel=True),
                          warn=warnings.append)
    assert any("grouped ConvTranspose" in w and "up" in w for w in warnings)
    q = onnx.load(tmp_path / "q.onnx")
    up = next(n for n in q.graph.node if n.name == "up")
    producers = {o: n.op_type for n in q.graph.node for o in n.output}
    assert producers.get(up.input[1]) != "DequantizeLinear"  # kept float
    proj = next(n for n in q.graph.node if n.name == "proj")
    assert producers[proj.input[1]] == "DequantizeLinear"  # the rest is quantized


def test_per_channel_gemm_with_a_row_bias_is_quantized(tmp_path):
    """onnxruntime's MatMul+Add fusion leaves [1, N] Gemm biases, on which its per-channel
    int32-bias adjustment fails ("truth value of an array ... is ambiguous")."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(rng.normal(size=(16, 10)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(size=(1, 10)).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = lib.save(m, tmp_path / "gemm.onnx")
    feeds = lib.random_inputs(path, 4)
    cal = lib.write_calibration(path, feeds, tmp_path / "c.json")
    quantize_static_model(path, cal, tmp_path / "q.onnx", StaticOptions(per_channel=True))
    got = lib.run(tmp_path / "q.onnx", feeds[0])["y"]
    assert lib.sqnr_db(lib.run(path, feeds[0])["y"], got) > 25


def test_preprocess_names_unnamed_nodes(tmp_path):
    # regions, exclusions and sensitivity address nodes by name; onnxruntime's
    # pre-processing keeps a source's unnamed nodes unnamed (UltraFace has 62)
    m = _grouped_conv_transpose()
    for n in m.graph.node:
        n.name = ""
    src = lib.save(m, tmp_path / "unnamed.onnx")
    info = preprocess_model(src, tmp_path / "pre.onnx")
    pre = onnx.load(tmp_path / "pre.onnx")
    names = [n.name for n in pre.graph.node]
    assert all(names) and len(set(names)) == len(names), names
    assert any("unnamed node(s) were given names" in note for note in info["notes"])
    preprocess_model(src, tmp_path / "again.onnx")  # deterministic bytes
    assert (tmp_path / "pre.onnx").read_bytes() == (tmp_path / "again.onnx").read_bytes()
