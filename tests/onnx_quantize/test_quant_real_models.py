"""Real models: mnist (opset 7, IR 3, weights listed as graph inputs) and MobileNetV2
(pre-processed with onnxruntime, calibrated on the test images), quantized from saved
ranges and run in onnxruntime against the float model."""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import onnx
import pytest
import quant_testlib as lib
from qbuild_onnx.quantization.options import DynamicOptions, StaticOptions
from qbuild_onnx.quantization.quantize import quantize_dynamic_model, quantize_static_model


def _labels(path, feeds, output):
    return [int(np.argmax(lib.run(path, f)[output])) for f in feeds]


@pytest.mark.parametrize("options", [
    StaticOptions(per_channel=True),
    StaticOptions(),
    StaticOptions(quant_format="qoperator", per_channel=True),
    StaticOptions(activation_type="int16", weight_type="int8", per_channel=True),
])
def test_mnist_static(mnist_case, tmp_path, options):
    out = tmp_path / "q.onnx"
    info = quantize_static_model(mnist_case.model, mnist_case.calibration, out, options)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert info["opset"] == (21 if options.activation_type == "int16" else
                             13 if options.per_channel else 11)
    # The weights the old IR-3 file listed as inputs are constants, not required inputs.
    assert [i["name"] for i in info["inputs"]] == ["Input3"]
    assert info["outputs"] == [{"name": "Plus214_Output_0", "dtype": "FLOAT", "shape": [1, 10]}]
    feeds = mnist_case.feeds
    assert _labels(out, feeds, "Plus214_Output_0") == \
        _labels(mnist_case.model, feeds, "Plus214_Output_0")


def test_mnist_dynamic(mnist_case, tmp_path):
    out = tmp_path / "q.onnx"
    info = quantize_dynamic_model(mnist_case.model, out, DynamicOptions(),
                                  report_path=tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["quantized_ops"] == {"ConvInteger": 2}
    assert report["dynamic_quantize_nodes"] == 2 and info["format"] == "dynamic"
    feeds = mnist_case.feeds
    assert _labels(out, feeds, "Plus214_Output_0") == \
        _labels(mnist_case.model, feeds, "Plus214_Output_0")


def test_mobilenet_v2_from_saved_ranges(mobilenet_case, tmp_path):
    out = tmp_path / "q.onnx"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        info = quantize_static_model(mobilenet_case.model, mobilenet_case.calibration, out,
                                     StaticOptions(per_channel=True),
                                     report_path=tmp_path / "report.json")
        times.append(time.perf_counter() - start)
    print(f"\nMobileNetV2 per-channel QDQ from saved ranges: median "
          f"{statistics.median(times) * 1000:.0f} ms (load, quantize, validate, write)")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["quantized_ops"]["Conv"] == 52 and report["quantized_ops"]["Gemm"] == 1
    assert report["weights"]["per_channel"] == 53 and report["weights"]["per_tensor"] == 0
    assert report["size_ratio"] < 0.7  # depthwise convs: a scale and zero point per 9 weights
    assert info["outputs"][0]["name"] == "Identity:0"
    for feed in mobilenet_case.feeds:
        ref = lib.run(lib.MOBILENET, feed)["Identity:0"]
        got = lib.run(out, feed)["Identity:0"]
        assert np.argmax(ref) == np.argmax(got)
        assert np.abs(ref - got).max() < 0.1
