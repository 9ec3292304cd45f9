"""evaluate, auto_quantize and profile on OpenVINO, on real models and real runtimes.

OpenVINO 2026.4 computes a CSP block (two branches of convolutions concatenated and read
by a 1x1 convolution, YOLOX's pattern) wrongly once its activations are signed int8 with
onnxruntime's asymmetric ranges, and right as uint8: the per-target check fails the int8
model with the reason and ``auto_quantize`` never picks it. Results are keyed by the
runtime and its version; OpenVINO's trials place Q/DQ at convolution inputs only."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from qbuild_lower import rules as rules_lower
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.rules import quantize as rules_quantize
from qbuild_onnx.rules import source as rules_source
from rt_models import csp_block, images

pytest.importorskip("openvino", reason="the openvino extra is not installed "
                                       "(pip install -r requirements.lock installs it)")

BUILD = """
[fp]
rule = "onnx_model"
src = "csp.onnx"

[calib_data]
rule = "numpy_dataset"
files = ["calib.npy"]
mapping = { x = "calib.npy" }

[eval_data]
rule = "numpy_dataset"
files = ["eval.npy"]
mapping = { x = "eval.npy" }

[calib]
rule = "calibrate"
model = ":fp"
dataset = ":calib_data"

[u8]
rule = "quantize"
model = ":fp"
calibration = ":calib"
per_channel = true
activation_type = "uint8"

[i8]
rule = "quantize"
model = ":fp"
calibration = ":calib"
per_channel = true
activation_type = "int8"

[ev_u8]
rule = "evaluate"
models = [":u8"]
reference = ":fp"
dataset = ":eval_data"
runtime = "openvino"
latency_runs = 3

[ev_i8]
rule = "evaluate"
models = [":i8"]
reference = ":fp"
dataset = ":eval_data"
runtime = "openvino"

[ev_i8_ort]
rule = "evaluate"
models = [":i8"]
reference = ":fp"
dataset = ":eval_data"

[aq]
rule = "auto_quantize"
model = ":fp"
calibration_data = ":calib_data"
evaluation_data = ":eval_data"
runtime = "openvino"
bar = { min_sqnr_db = 15 }
steps = ["activation_type"]
latency_runs = 3

[prof]
rule = "profile"
models = [":fp", ":u8"]
dataset = ":eval_data"
runtime = "openvino"
runs = 3
warmup = 1
profile_runs = 2
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from qbuild.testing import Workspace

    root = tmp_path_factory.mktemp("runtime_rules")
    w = Workspace(root / "ws", root / "cache")
    for plugin in (rules_source, rules_quantize, rules_accuracy, rules_lower):
        w.register(plugin)
    w.path("m").mkdir(parents=True)
    onnx.save(csp_block(), str(w.path("m/csp.onnx")))
    np.save(w.path("m/calib.npy"), images(0, 8))
    np.save(w.path("m/eval.npy"), images(1, 4))
    w.write("m/BUILD.toml", BUILD)
    return w


def _report(r, label: str) -> dict:
    return json.loads(next(p for p in r.outputs(label) if p.name == "report.json").read_text())


def test_openvino_computes_uint8_like_onnxruntime_and_reports_its_baseline(ws):
    r = ws.build("//m:ev_u8")
    assert r.ok, r.error
    rep = _report(r, "//m:ev_u8")
    rt = rep["runtime"]
    assert rt["name"] == "openvino" and rt["version"] and rt["float_forms"][0] == "fp32"
    # the float model on OpenVINO (each form) against onnxruntime's float outputs
    assert float(rt["float_outputs"]["fp32"]["head"]["sqnr_db"]) > 60
    entry = rep["models"]["//m:u8"]
    check = entry["runtime_check"]
    assert check["ok"] and "reason" not in check
    on_ov = float(entry["outputs"]["head"]["sqnr_db"])
    on_ort = float(check["onnxruntime"]["outputs"]["head"])
    assert abs(on_ov - on_ort) < 1.0  # the same model, computed alike
    assert float(check["agreement_sqnr_db"]["head"]) > on_ort  # closer than to float
    lat = rep["latency"]
    assert lat["baseline"] in rt["float_forms"] and lat["runs"] == 3
    assert entry["latency"]["cpu"]["runs"] == 3


def test_openvino_computing_int8_differently_fails_with_the_reason(ws):
    r = ws.build("//m:ev_i8", "//m:ev_i8_ort", keep_going=True)
    assert "//m:ev_i8_ort" not in r.failed  # onnxruntime computes the same model well
    why = r.failed["//m:ev_i8"]
    assert "openvino computes this model differently from onnxruntime: output 'head' " \
           "SQNR against the float model" in why
    assert "\n" not in why
    # the numbers behind it: ten times onnxruntime's error power, at least
    on_ov, on_ort = (float(x) for x in
                     why.split("float model ")[1].split(" dB on openvino, ")[:1]
                     + why.split(" dB on openvino, ")[1].split(" dB on onnxruntime")[:1])
    assert on_ov < on_ort - 10


def test_results_are_keyed_by_the_runtime_and_its_version(ws, monkeypatch):
    import qbuild_onnx_common.runtimes as runtimes

    def keys() -> dict[tuple[str, str], str]:
        return {(rec["target"], rec["mnemonic"]): rec["key"]
                for rec in ws.aquery("//m:ev_i8", "//m:ev_i8_ort")}

    before = keys()
    # the same attributes but the runtime: different keys
    assert before[("//m:ev_i8", "Evaluate")] != before[("//m:ev_i8_ort", "Evaluate")]
    real = runtimes.dist_version
    monkeypatch.setattr(runtimes, "dist_version",
                        lambda d: "2099.1" if d == "openvino" else real(d))
    after = keys()
    assert after[("//m:ev_i8", "Evaluate")] != before[("//m:ev_i8", "Evaluate")]
    assert after[("//m:ev_i8_ort", "Evaluate")] == before[("//m:ev_i8_ort", "Evaluate")]


def test_auto_quantize_on_openvino_never_picks_what_openvino_computes_wrongly(ws):
    r = ws.build("//m:aq", "//m:aq.u8")
    assert r.ok, r.error
    rep = _report(r, "//m:aq")
    rows = {t["name"]: t for t in rep["trials"]}
    assert set(rows) == {"u8", "i8"}  # no lowered trials: onnxruntime's operators
    assert rows["i8"]["status"] == "failed" and rep["chosen"] != "i8"
    assert "openvino computes this model differently from onnxruntime" in rows["i8"]["failed"]
    assert rows["u8"]["passes"]
    # the preset: Q/DQ at convolution inputs only, so SiLU stays float between them
    u8 = onnx.load(str(next(p for p in r.outputs("//m:aq.u8") if p.suffix == ".onnx")))
    readers = {n.op_type for n in u8.graph.node for i in n.input
               if any(d.output[0] == i for d in u8.graph.node
                      if d.op_type == "DequantizeLinear")}
    assert readers <= {"Conv", "MatMul", "Gemm"}, readers
    latency = json.loads(next(p for p in r.outputs("//m:aq")
                              if p.name == "latency.json").read_text())
    assert latency["runtime"]["name"] == "openvino"
    assert latency["baseline"] in latency["float_forms"] and "u8" in latency["candidates"]
    assert rep["runtime"]["name"] == "openvino" and rep["runtime"]["version"]
    assert rep["float_baseline"]["form"] == latency["baseline"]


def test_profile_on_openvino_names_the_precision_each_kernel_ran_in(ws):
    r = ws.build("//m:prof")
    assert r.ok, r.error
    rep = _report(r, "//m:prof")
    lat = rep["latency"]
    assert lat["runtime"] == "openvino" and lat["runtime_version"]
    assert lat["baseline"].startswith("//m:fp")  # fp32, or the CPU's faster default
    assert {"//m:fp", "//m:u8"} <= set(lat["models"])
    fp, u8 = (rep["models"][k]["profile"]["op_types"] for k in ("//m:fp", "//m:u8"))
    assert fp["Convolution FP32"]["nodes"] == 6  # OpenVINO's kernels, by precision
    assert u8["Convolution I8"]["nodes"] == 6  # every convolution of the QDQ model in int8
    md = next(p for p in r.outputs("//m:prof") if p.name == "report.md").read_text()
    assert md.startswith("# Profile on openvino (1 thread(s), 3 interleaved rounds")
