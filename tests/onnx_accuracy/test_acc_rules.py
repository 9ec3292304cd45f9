"""The accuracy rules through a real qbuild workspace (MNIST, small and fast)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from acc_paths import MODELS
from qbuild_onnx.accuracy.ortq import quantize_qdq
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.source.datasets import write_dataset


def _setup(ws, tmp_path, feeds):
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    m13 = version_converter.convert_version(onnx.load(MODELS / "mnist.onnx"), 13)
    onnx.save(m13, tmp_path / "m13.onnx")
    quant_pre_process(str(tmp_path / "m13.onnx"), str(tmp_path / "pre.onnx"))
    quantize_qdq(tmp_path / "pre.onnx", tmp_path / "q.onnx", feeds, per_channel=False)
    write_dataset(tmp_path / "ds", {"Input3": np.concatenate([f["Input3"] for f in feeds])})
    for name in ("pre.onnx", "q.onnx"):
        # mnist.onnx is IR 3, where every initializer must also be a graph input; the
        # tools above drop those inputs but keep IR 3, which onnx_model's check refuses
        m = onnx.load(tmp_path / name)
        m.ir_version = max(m.ir_version, 7)
        onnx.save(m, tmp_path / name)
    ws.copy(tmp_path / "pre.onnx", "m/float/pre.onnx")
    ws.copy(tmp_path / "q.onnx", "m/quant/q.onnx")
    for f in sorted((tmp_path / "ds").iterdir()):
        ws.copy(f, f"m/ds/{f.name}")
    ws.register(rules_accuracy)


BUILD = """
[fp]
rule = "onnx_model"
src = "float/pre.onnx"

[q]
rule = "onnx_model"
src = "quant/q.onnx"

[ds]
rule = "saved_dataset"
srcs = ["ds/*"]

[report]
rule = "evaluate"
models = [":q"]
reference = ":fp"
dataset = ":ds"
min_sqnr_db = {min_sqnr}

[sens]
rule = "sensitivity"
model = ":q"
reference = ":fp"
dataset = ":ds"
kinds = ["activation"]

[mp]
rule = "mixed_precision"
model = ":fp"
sensitivity = ":sens"
top_k = 2
"""


def test_rules_build_and_cache(qbuild_workspace, tmp_path, mnist_feeds):
    ws = qbuild_workspace
    _setup(ws, tmp_path, mnist_feeds)
    ws.write("m/BUILD.toml", BUILD.format(min_sqnr=5.0))
    r = ws.build("//m:report", "//m:mp")
    assert r.ok, r.error
    rep = json.loads(r.outputs("//m:report")[0].read_text())
    (out, metrics), = rep["models"]["//m:q"]["outputs"].items()
    assert metrics["sqnr_db"] > 15 and metrics["cosine"] > 0.99
    mp = json.loads(r.outputs("//m:mp")[0].read_text())
    assert len(mp["tensors"]) == 2
    again = ws.build("//m:report", "//m:mp")
    assert again.ok and again.ran == []
    ws.write("m/BUILD.toml", BUILD.format(min_sqnr=200.0))
    bad = ws.build("//m:report")
    assert not bad.ok and "min_sqnr_db" in bad.error
    assert "//m:sens" not in bad.ran


def test_mixed_precision_tensors_take_selectors(qbuild_workspace, tmp_path, mnist_feeds):
    ws = qbuild_workspace
    _setup(ws, tmp_path, mnist_feeds)
    ws.write("m/BUILD.toml", BUILD.format(min_sqnr=5.0) + """
[by_op]
rule = "mixed_precision"
model = ":fp"
op_types = ["Relu"]

[by_selector]
rule = "mixed_precision"
model = ":fp"
tensors = ["op:Relu"]

[typo]
rule = "mixed_precision"
model = ":fp"
tensors = ["op:Rleu"]
""")
    r = ws.build("//m:by_op", "//m:by_selector")
    assert r.ok, r.error
    a, b = (json.loads(r.outputs(t)[0].read_text()) for t in ("//m:by_op", "//m:by_selector"))
    assert a["promoted"] == b["promoted"] and len(b["promoted"]) == 2
    bad = ws.build("//m:typo")
    assert not bad.ok and "attribute tensors" in bad.error.replace("'", "")
    assert "selector 'op:Rleu' selects no tensor" in bad.error


def test_bias_correction_of_a_quantize_target_with_nothing_quantized(qbuild_workspace,
                                                                      tmp_path, mnist_feeds):
    # auto_quantize's widest region can exclude every node (YOLOv8-style detector): its
    # bias-corrected trial must pass the model through, not fail the search
    from qbuild_onnx.rules import quantize as rules_quantize
    from qbuild_onnx.rules import source as rules_source

    ws = qbuild_workspace
    _setup(ws, tmp_path, mnist_feeds)
    ws.register(rules_quantize)
    ws.register(rules_source)
    ws.write("m/BUILD.toml", BUILD.format(min_sqnr=5.0) + """
[cal]
rule = "calibrate"
model = ":fp"
dataset = ":ds"

[none]
rule = "quantize"
model = ":fp"
calibration = ":cal"
op_types = ["Softmax"]

[none_bc]
rule = "bias_correction"
model = ":none"
reference = ":fp"
dataset = ":ds"

[fp_bc]
rule = "bias_correction"
model = ":fp"
reference = ":fp"
dataset = ":ds"
""")
    r = ws.build("//m:none", "//m:none_bc")
    assert r.ok, r.error
    none = next(p for p in r.outputs("//m:none") if p.suffix == ".onnx")
    assert not [n for n in onnx.load(none).graph.node if "Quantize" in n.op_type]
    rep = json.loads(next(p for p in r.outputs("//m:none_bc")
                          if p.name == "report.json").read_text())
    assert rep["corrected_nodes"] == 0 and "nothing to correct" in rep["note"]
    bad = ws.build("//m:fp_bc")  # a float model is still refused
    assert not bad.ok and "no Conv/Gemm node" in bad.error
