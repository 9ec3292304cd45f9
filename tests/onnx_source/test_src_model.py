"""onnx_model functions: validation, info, external data, bad files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from qbuild_onnx.source.model import stage_model, validate_model
from qbuild_onnx_common.errors import OnnxError

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "testdata" / "models"


def _matmul_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 64])],
                          [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_real_models_info():
    info = validate_model(MODELS / "mnist.onnx")
    # initializers listed as graph inputs (IR 3) are not model inputs
    assert [i["name"] for i in info["inputs"]] == ["Input3"]
    assert info["inputs"][0] == {"name": "Input3", "dtype": "float32", "shape": [1, 1, 28, 28]}
    assert info["opsets"] == {"ai.onnx": 7} and info["ir_version"] == 3
    mb = validate_model(MODELS / "mobilenet_v2_128_0.5.onnx")
    assert mb["inputs"][0]["shape"][0] == "unk__150"  # symbolic dim kept as a string
    assert mb["opsets"]["ai.onnx.ml"] == 2 and mb["opset"] == 15
    assert len(mb["model_sha256"]) == 64


@pytest.mark.parametrize("content,needle", [
    (b"this is plainly not a model", "not"),
    (b"", "empty"),
])
def test_non_onnx_files(tmp_path, content, needle):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    with pytest.raises(OnnxError) as e:
        validate_model(p)
    assert "bad.onnx" in str(e.value) and needle in str(e.value)


def test_truncated_file(tmp_path):
    data = (MODELS / "mnist.onnx").read_bytes()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxError) as e:
        validate_model(p)
    assert "trunc.onnx" in str(e.value)


def test_invalid_graph(tmp_path):
    g = helper.make_graph([helper.make_node("Add", ["x", "missing"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    p = tmp_path / "graph.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    with pytest.raises(OnnxError) as e:
        validate_model(p)
    assert "graph.onnx" in str(e.value) and "invalid ONNX model" in str(e.value)


def test_external_data_staged_with_same_names(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(_matmul_model(), src / "m.onnx", save_as_external_data=True,
                    location="weights.bin", size_threshold=0)
    info = validate_model(src / "m.onnx")
    assert info["external_data"] == ["weights.bin"]
    out = tmp_path / "out" / "renamed.onnx"
    stage_model(src / "m.onnx", out, [src / "weights.bin"])
    assert (out.parent / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    loaded = onnx.load(str(out))  # external data resolves next to the staged copy
    assert numpy_helper.to_array(loaded.graph.initializer[0])[1, 2] == 66.0
    with pytest.raises(OnnxError, match="not listed"):
        stage_model(src / "m.onnx", tmp_path / "o2" / "x.onnx", [])


def _reshape_matmul_model(shape_type=onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("y", shape_type, [1, 8])
    weights = numpy_helper.from_array(np.ones((48, 8), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 48], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [weights, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_shape_constant_is_checked_not_refused(tmp_path):
    # onnx's full_check by path cannot read external tensors during shape inference, so a
    # Reshape whose shape constant was saved externally used to be refused as invalid.
    onnx.save_model(_reshape_matmul_model(), tmp_path / "m.onnx", save_as_external_data=True,
                    location="m.onnx.data", size_threshold=0)
    assert validate_model(tmp_path / "m.onnx")["external_data"] == ["m.onnx.data"]
    # ... while a type error in such a model is still found.
    bad = tmp_path / "bad"
    bad.mkdir()
    onnx.save_model(_reshape_matmul_model(onnx.TensorProto.INT64), bad / "m.onnx",
                    save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    with pytest.raises(OnnxError, match="invalid ONNX model"):
        validate_model(bad / "m.onnx")


@pytest.mark.parametrize("location", ["../outside.bin", "/tmp/abs.bin"])
def test_external_data_outside_folder_refused(tmp_path, location):
    sub = tmp_path / "sub"
    sub.mkdir()
    onnx.save_model(_matmul_model(), sub / "m.onnx", save_as_external_data=True,
                    location="w.bin", size_threshold=0)
    m = onnx.load(str(sub / "m.onnx"), load_external_data=False)
    for entry in m.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(m, sub / "evil.onnx")
    os.replace(sub / "w.bin", tmp_path / "outside.bin")
    with pytest.raises(OnnxError) as e:
        validate_model(sub / "evil.onnx")
    assert "evil.onnx" in str(e.value) and location in str(e.value)
