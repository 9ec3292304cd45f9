"""Models with external data (the route for models over 2 GB) build through every rule:
inputs are private regular files, so onnx's checks (no symlinks, no hard links) pass."""

import textwrap

import pytest

onnx = pytest.importorskip("onnx")
np = pytest.importorskip("numpy")


def _model_with_external_data(directory):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
                                     / 4096.0, name="W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(directory / "mm.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="mm.onnx.data", size_threshold=0)
    assert (directory / "mm.onnx.data").stat().st_size == 64 * 64 * 4


def test_a_model_with_external_data_builds_through_later_rules(qbuild_workspace):
    ws = qbuild_workspace
    _model_with_external_data(ws.path("m"))
    ws.write("m/BUILD.toml", textwrap.dedent("""
        [mm]
        rule = "onnx_model"
        src = "mm.onnx"
        data = ["mm.onnx.data"]

        [pre]
        rule = "quant_preprocess"
        model = ":mm"

        [q]
        rule = "quantize_dynamic"
        model = ":mm"
    """))
    result = ws.build("//m:mm", "//m:pre", "//m:q")
    assert result.ok, result.error
    names = sorted(p.name for p in result.outputs("//m:mm"))
    assert names == ["mm.onnx", "mm.onnx.data"]
    onnx.checker.check_model(str(result.outputs("//m:mm")[0]), full_check=True)
    import onnxruntime as ort

    session = ort.InferenceSession(str(result.outputs("//m:q")[0]),
                                   providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": np.ones((1, 64), np.float32)})[0]
    assert y.shape == (1, 64)


def test_a_symlinked_external_data_file_outside_the_workspace_is_refused(qbuild_workspace,
                                                                         tmp_path):
    ws = qbuild_workspace
    _model_with_external_data(tmp_path / "elsewhere")
    ws.copy(tmp_path / "elsewhere" / "mm.onnx", "m/mm.onnx")
    ws.path("m/mm.onnx.data").symlink_to(tmp_path / "elsewhere" / "mm.onnx.data")
    ws.write("m/BUILD.toml", '[mm]\nrule = "onnx_model"\nsrc = "mm.onnx"\n'
             'data = ["mm.onnx.data"]\n')
    result = ws.build("//m:mm")
    assert result.exit_code == 2
    assert "outside the workspace" in result.error and "attribute 'data'" in result.error
    assert not any(ws.cache_dir.rglob("*.val"))
