"""``adaround``: learned rounding of a QDQ model's int8 weights lowers every changed layer's
reconstruction error and the model's output error on its calibration data; scales, zero
points and the graph stay as onnxruntime wrote them. Real onnxruntime throughout."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
import onnx
from onnx import numpy_helper
from qbuild_onnx.algorithms import rules as algo_rules
from qbuild_onnx.rules import quantize as quantize_rules
from qbuild_onnx.rules import source as source_rules

from qbuild.testing import Workspace

BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[data]
rule = "numpy_dataset"
files = ["data.npy"]
mapping = { x = "data.npy" }

[calib]
rule = "calibrate"
model = ":fp"
dataset = ":data"

[q]
rule = "quantize"
model = ":fp"
calibration = ":calib"

[ar]
rule = "adaround"
model = ":q"
reference = ":fp"
dataset = ":data"
rows = 512
iterations = 300
"""


def test_adaround_lowers_the_error_it_optimises_and_keeps_the_graph(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, algo_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx", lib.conv_chain(seed=3).SerializeToString())
    data = lib.images(8, 0)
    np.save(ws.path("m/data.npy"), data)
    ws.write("m/BUILD.toml", BUILD)
    r = ws.build("//m:ar", "//m:q")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:ar")}
    rep = json.loads(outs["report.json"].read_text())
    assert rep["layers"] == 4 and rep["changed_layers"] >= 1
    for node in rep["nodes"].values():
        if not node["kept_nearest"]:
            assert node["learned_loss"] < node["nearest_loss"] and node["flipped"] > 0
    q_path = next(p for p in r.outputs("//m:q") if p.suffix == ".onnx")
    q, ar = onnx.load(str(q_path)), onnx.load(str(outs["ar.onnx"]))
    assert [n.op_type for n in q.graph.node] == [n.op_type for n in ar.graph.node]
    qi = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    ai = {i.name: numpy_helper.to_array(i) for i in ar.graph.initializer}
    changed = [n for n in qi if not np.array_equal(qi[n], ai[n])]
    assert changed and all(qi[n].dtype == np.int8 for n in changed)  # only integer weights
    # each changed integer moved by at most one step (up or down instead of nearest)
    assert all(np.abs(qi[n].astype(int) - ai[n].astype(int)).max() <= 1 for n in changed)
    feeds = [{"x": data[i:i + 1]} for i in range(len(data))]
    fp = lib.run(ws.path("m/model.onnx"), feeds)
    base = lib.sqnr_db(fp, lib.run(q_path, feeds))
    learned = lib.sqnr_db(fp, lib.run(outs["ar.onnx"], feeds))
    assert learned > base, (base, learned)
    again = ws.build("//m:ar")
    assert again.ok and again.ran == []  # cached


def test_a_float_model_is_refused_at_analysis(tmp_path):
    # adaround re-rounds a quantized model's weights: a float model fails before anything
    # runs, naming the attribute and the provider it lacks.
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, algo_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx", lib.conv_chain(seed=3).SerializeToString())
    np.save(ws.path("m/data.npy"), lib.images(8, 0))
    ws.write("m/BUILD.toml", BUILD.replace('model = ":q"', 'model = ":fp"'))
    r = ws.build("//m:ar")
    assert r.exit_code == 2 and r.ran == []
    assert "'model'" in r.error and "QuantizedModelInfo" in r.error
