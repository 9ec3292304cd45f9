"""Bad input gives one clear OnnxError naming the file, tensor or attribute."""

from __future__ import annotations

import json

import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import DynamicOptions, StaticOptions
from qbuild_onnx.quantization.quantize import quantize_dynamic_model, quantize_static_model
from qbuild_onnx_common.errors import OnnxError


def _static(case, tmp_path, calibration=None, **options):
    return quantize_static_model(case.model, calibration or case.calibration,
                                 tmp_path / "q.onnx", StaticOptions(**options))


def test_calibration_of_another_model_is_refused(conv_case, gemm_case, tmp_path):
    with pytest.raises(OnnxError, match="sha256") as err:
        _static(conv_case, tmp_path, calibration=gemm_case.calibration)
    assert err.value.attr == "calibration"
    assert str(conv_case.model) in str(err.value)
    assert not (tmp_path / "q.onnx").exists()


def test_calibration_of_the_unprocessed_model_is_refused(conv_case, tmp_path):
    # Same graph, different bytes (a different producer name): still a different file.
    model = lib.conv_chain_model()
    model.producer_name = "someone-else"
    other = lib.save(model, tmp_path / "other.onnx")
    with pytest.raises(OnnxError, match="calibrate the same"):
        quantize_static_model(other, conv_case.calibration, tmp_path / "q.onnx",
                              StaticOptions())


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(format="something-else"), "not a qbuild-calibration artifact"),
    (lambda d: d.update(version=2), "version 2"),
    (lambda d: d.update(model_sha256="abc"), "no valid model_sha256"),
    (lambda d: d.update(tensors={}), "no tensor ranges"),
    (lambda d: d["tensors"]["c1"].update(range=[1.0, -1.0]), "tensor 'c1'.*lo > hi"),
    (lambda d: d["tensors"]["c1"].update(range=[0.0]), "tensor 'c1'.*must be \\[lo, hi\\]"),
    (lambda d: d["tensors"]["c1"].pop("range"), "tensor 'c1' has no 'range'"),
])
def test_malformed_calibration_files(conv_case, tmp_path, change, message):
    doc = json.loads(conv_case.calibration.read_text())
    change(doc)
    bad = tmp_path / "calibration.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(OnnxError, match=message) as err:
        _static(conv_case, tmp_path, calibration=bad)
    assert err.value.attr == "calibration" and str(bad) in str(err.value)


def test_missing_and_non_json_files(conv_case, tmp_path):
    with pytest.raises(OnnxError, match="does not exist"):
        _static(conv_case, tmp_path, calibration=tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(OnnxError, match="is not JSON"):
        _static(conv_case, tmp_path, calibration=tmp_path / "x.json")
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    with pytest.raises(OnnxError, match="is not an ONNX model") as err:
        quantize_dynamic_model(tmp_path / "m.onnx", tmp_path / "q.onnx", DynamicOptions())
    assert err.value.attr == "model"


@pytest.mark.parametrize("options,attr,message", [
    ({"activation_type": "int4"}, "activation_type", "4-bit types are for weights only"),
    ({"activation_type": "uint4"}, "activation_type", "4-bit types are for weights only"),
    ({"weight_type": "int3"}, "weight_type", "not one of"),
    ({"quant_format": "qoperator", "activation_type": "int16"}, "format", "only 8-bit"),
    ({"quant_format": "qoperator", "weight_type": "int4"}, "format", "only 8-bit"),
    ({"activation_type": "int8", "weight_type": "uint8"}, "weight_type", "not supported"),
    ({"per_channel": True, "weight_symmetric": False}, "weight_symmetric",
     "always quantizes per-channel weights symmetrically"),
    ({"op_types": ["Conv", "Frobnicate"]}, "op_types", "Frobnicate"),
    ({"nodes_to_quantize": ["conv1"], "nodes_to_exclude": ["conv1"]}, "nodes_to_exclude",
     "both in"),
    ({"nodes_to_exclude": ["conv9"]}, "nodes_to_exclude", "no node named 'conv9'"),
    ({"nodes_to_quantize": ["conv9"]}, "nodes_to_quantize", "no node named 'conv9'"),
    ({"extra_options": {"ActivationSymmetric": True}}, "extra_options",
     "use the attribute activation_symmetric"),
    ({"extra_options": {"TensorQuantOverrides": {}}}, "extra_options", "tensor_overrides"),
    ({"extra_options": {"CalibMovingAverage": True}}, "extra_options", "calibration option"),
    ({"extra_options": {"SmoothQuant": True}}, "extra_options", "equalize target with method"),
    ({"extra_options": {"DedicatedQdqPair": True}}, "extra_options", "not an onnxruntime"),
    ({"extra_options": {"BlockSize": 20}}, "extra_options", "power of two"),
    ({"tensor_overrides": {"nope": {"symmetric": True}}}, "tensor_overrides",
     "no tensor named 'nope'"),
    ({"tensor_overrides": {"c1": {"quant_type": "int4"}}}, "tensor_overrides",
     "4-bit quant_type is for weights"),
    ({"tensor_overrides": {"c1": {"colour": "red"}}}, "tensor_overrides", "colour"),
    ({"tensor_overrides": {"c1": {"scale": 0.1}}}, "tensor_overrides",
     "both 'scale' and 'zero_point'"),
    ({"tensor_overrides": {"c1": {"scale": 0.1, "zero_point": 3, "rmin": 0.0}}},
     "tensor_overrides", "onnxruntime's quantizer rejected"),
    ({"tensor_overrides": {"c1": {"rmin": "low"}}}, "tensor_overrides", "expected a number"),
    ({"node_overrides": {"conv9": {"symmetric": True}}}, "node_overrides", "no node named"),
    ({"tensor_overrides": {"c1": {"symmetric": True}},
      "node_overrides": {"conv1": {"symmetric": False}}}, "node_overrides", "one place"),
])
def test_bad_options(conv_case, tmp_path, options, attr, message):
    with pytest.raises(OnnxError, match=message) as err:
        _static(conv_case, tmp_path, **options)
    if "rejected" not in message:  # onnxruntime's own checks name no attribute
        assert err.value.attr == attr
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("options,attr,message", [
    ({"weight_type": "int16"}, "weight_type", "dynamic quantization supports int8, uint8"),
    ({"weight_type": "int4"}, "weight_type", "dynamic quantization supports"),
    ({"op_types": ["Add"]}, "op_types", "dynamic quantizer cannot quantize"),
    ({"extra_options": {"QDQKeepRemovableActivations": True}}, "extra_options",
     "not an onnxruntime dynamic"),
    ({"nodes_to_exclude": ["matmul9"]}, "nodes_to_exclude", "no node named"),
])
def test_bad_dynamic_options(gemm_case, tmp_path, options, attr, message):
    with pytest.raises(OnnxError, match=message) as err:
        quantize_dynamic_model(gemm_case.model, tmp_path / "q.onnx", DynamicOptions(**options))
    assert err.value.attr == attr
