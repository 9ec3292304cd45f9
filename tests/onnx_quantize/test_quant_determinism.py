"""Same inputs, identical bytes: in one process and across processes with different hash
seeds (set and dict iteration inside onnxruntime's quantizer must not leak into outputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from qbuild_onnx.quantization.options import DynamicOptions, StaticOptions
from qbuild_onnx.quantization.quantize import quantize_dynamic_model, quantize_static_model

OVERRIDES = {
    "hidden_output": {"quant_type": "uint8",
                      "convert": {"quant_type": "uint16", "recv_nodes": ["conv4", "conv2"]}},
    "w3": [{"axis": 0, "quant_type": "int8"}],
}

_SCRIPT = """
import json, sys
from pathlib import Path
from qbuild_onnx.quantization.quantize import quantize_dynamic_model, quantize_static_model
from qbuild_onnx.quantization.options import DynamicOptions, StaticOptions
model, calib, out = (Path(p) for p in sys.argv[1:4])
overrides = json.loads(sys.argv[4])
quantize_static_model(model, calib, out / "static.onnx",
                      StaticOptions(per_channel=True, tensor_overrides=overrides),
                      report_path=out / "static.json")
quantize_static_model(model, calib, out / "qop.onnx", StaticOptions(quant_format="qoperator"),
                      report_path=out / "qop.json")
quantize_dynamic_model(model, out / "dynamic.onnx", DynamicOptions(per_channel=True),
                       report_path=out / "dynamic.json")
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_bytes_in_one_process(conv_case, tmp_path):
    results = []
    for run in ("a", "b"):
        out = tmp_path / run
        out.mkdir()
        info = quantize_static_model(conv_case.model, conv_case.calibration, out / "q.onnx",
                                     StaticOptions(per_channel=True, tensor_overrides=OVERRIDES),
                                     report_path=out / "report.json")
        results.append((_files(out), info))
    assert results[0] == results[1]


def test_same_bytes_across_processes_and_hash_seeds(conv_case, tmp_path):
    outputs = []
    for seed in ("0", "12345"):
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(conv_case.model), str(conv_case.calibration),
             str(out), json.dumps(OVERRIDES)],
            env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append(_files(out))
    assert set(outputs[0]) == {"static.onnx", "static.json", "qop.onnx", "qop.json",
                               "dynamic.onnx", "dynamic.json"}
    assert outputs[0] == outputs[1]
    # and the same as this process produces
    quantize_dynamic_model(conv_case.model, tmp_path / "dynamic.onnx",
                           DynamicOptions(per_channel=True))
    assert (tmp_path / "dynamic.onnx").read_bytes() == outputs[0]["dynamic.onnx"]
