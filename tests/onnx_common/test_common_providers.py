"""qbuild_onnx's rules give typed providers and ask for them: a dependency of the wrong
kind is refused at analysis (nothing runs), and dependents find the model, dataset and
calibration files through the providers."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from qbuild_onnx_common.providers import (
    CalibrationInfo,
    DatasetInfo,
    OnnxModelInfo,
    QuantizedModelInfo,
)

BUILD = """
[tiny]
rule = "onnx_model"
src = "tiny.onnx"

[data]
rule = "synthetic_dataset"
model = ":tiny"
count = 4

[calib]
rule = "calibrate"
model = ":tiny"
dataset = ":data"

[int8]
rule = "quantize"
model = ":tiny"
calibration = ":calib"
"""


def _tiny_model() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.1 * i for i in range(16)])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ws(ws, extra: str = ""):
    ws.path("m").mkdir(parents=True, exist_ok=True)
    onnx.save(_tiny_model(), str(ws.path("m/tiny.onnx")))
    ws.write("m/BUILD.toml", BUILD + extra)


def test_a_calibration_given_as_a_model_fails_at_analysis(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws, '\n[wrong]\nrule = "quantize"\nmodel = ":calib"\ncalibration = ":calib"\n')
    r = ws.build("//m:wrong")
    assert r.exit_code == 2 and r.ran == []
    assert r.error == ("m/BUILD.toml, target //m:wrong, attribute 'model': //m:calib (rule "
                       "'calibrate') does not provide OnnxModelInfo (it provides: "
                       "CalibrationInfo, DefaultInfo)")


def test_a_model_given_as_a_dataset_fails_at_analysis(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws, '\n[wrong]\nrule = "calibrate"\nmodel = ":tiny"\ndataset = ":tiny"\n')
    r = ws.build("//m:wrong")
    assert r.exit_code == 2 and r.ran == []
    assert "attribute 'dataset': //m:tiny (rule 'onnx_model') does not provide DatasetInfo" \
        in r.error


def test_dependents_read_files_through_providers(qbuild_workspace):
    ws = qbuild_workspace
    _ws(ws)
    r = ws.build("//m:tiny", "//m:data", "//m:calib", "//m:int8")  # all in qbuild-out
    assert r.ok, r.error
    model = r.provider("//m:tiny", OnnxModelInfo)
    assert model.model.name == "tiny.onnx" and model.opset == 17
    assert model.inputs == ({"name": "x", "dtype": "float32", "shape": (1, 4)},)
    data = r.provider("//m:data", DatasetInfo)
    assert data.samples == 4 and (data.path / "dataset.json").is_file()
    calib = r.provider("//m:calib", CalibrationInfo)
    assert calib.table.name == "calibration.json" and calib.method == "minmax"
    assert calib.samples == 4
    quantized = r.provider("//m:int8", QuantizedModelInfo)
    assert quantized.format == "qdq" and quantized.activation_type == "uint8"
    q_model = r.provider("//m:int8", OnnxModelInfo)
    assert q_model.model == quantized.model and q_model.model.name == "int8.onnx"
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(q_model.model)).graph.node)
