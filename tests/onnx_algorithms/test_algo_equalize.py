"""``equalize``: cross-layer equalization keeps the float model's function and makes
per-tensor int8 much more accurate on a chain with spread channel ranges; SmoothQuant keeps
the function, folds into LayerNormalization or inserts a Mul, and makes int8 MatMuls more
accurate on activations with outlier channels. Real onnxruntime throughout."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
import onnx
import pytest
from qbuild_onnx.algorithms import rules as algo_rules
from qbuild_onnx.rules import quantize as quantize_rules
from qbuild_onnx.rules import source as source_rules

from qbuild.testing import Workspace

CLE_BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[data]
rule = "numpy_dataset"
files = ["data.npy"]
mapping = { x = "data.npy" }

[cle]
rule = "equalize"
model = ":fp"

[calib_fp]
rule = "calibrate"
model = ":fp"
dataset = ":data"

[calib_cle]
rule = "calibrate"
model = ":cle"
dataset = ":data"

[q_fp]
rule = "quantize"
model = ":fp"
calibration = ":calib_fp"
per_channel = false

[q_cle]
rule = "quantize"
model = ":cle"
calibration = ":calib_cle"
per_channel = false
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("equalize")
    w = Workspace(root / "ws", root / "cache")
    for plugin in (source_rules, quantize_rules, algo_rules):
        w.register(plugin)
    return w


def _out(result, label, suffix):
    return next(p for p in result.outputs(label) if p.name.endswith(suffix))


def test_cle_keeps_the_function_and_helps_per_tensor_int8(ws):
    ws.write_bytes("cle/model.onnx", lib.conv_chain().SerializeToString())
    data = lib.images(8, 0)
    np.save(ws.path("cle/data.npy"), data)
    ws.write("cle/BUILD.toml", CLE_BUILD)
    r = ws.build("//cle:q_fp", "//cle:q_cle", "//cle:cle")
    assert r.ok, r.error
    rep = json.loads(_out(r, "//cle:cle", "report.json").read_text())
    assert rep["pairs"] == 3 and rep["clips_replaced_by_relu"] == []
    feeds = [{"x": data[i:i + 1]} for i in range(len(data))]
    fp = lib.run(ws.path("cle/model.onnx"), feeds)
    eq = lib.run(_out(r, "//cle:cle", ".onnx"), feeds)
    assert all(np.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(fp, eq))
    base = lib.sqnr_db(fp, lib.run(_out(r, "//cle:q_fp", ".onnx"), feeds))
    cle = lib.sqnr_db(fp, lib.run(_out(r, "//cle:q_cle", ".onnx"), feeds))
    assert cle > base + 3.0, (base, cle)
    # ranges of each equalized pair now match channel by channel
    m = onnx.load(str(_out(r, "//cle:cle", ".onnx")))
    w = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    r1 = np.abs(w["w1"]).reshape(8, -1).max(axis=1)
    r2 = np.abs(w["w2"]).transpose(1, 0, 2, 3).reshape(8, -1).max(axis=1)
    assert np.allclose(r1, r2, rtol=0.05)


def test_cle_across_clip_only_when_asked(ws):
    m = lib.conv_chain()
    for node in m.graph.node:
        if node.name == "relu2":
            node.CopyFrom(onnx.helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"],
                                                name="relu2"))
    m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                onnx.numpy_helper.from_array(np.array(6, np.float32), "hi")])
    ws.write_bytes("clip/model.onnx", m.SerializeToString())
    ws.write("clip/BUILD.toml", """
        [fp]
        rule = "onnx_model"
        src = "model.onnx"

        [skip]
        rule = "equalize"
        model = ":fp"

        [relu]
        rule = "equalize"
        model = ":fp"
        clip = "relu"
        """)
    r = ws.build("//clip:skip", "//clip:relu")
    assert r.ok, r.error
    skip = json.loads(_out(r, "//clip:skip", "report.json").read_text())
    relu = json.loads(_out(r, "//clip:relu", "report.json").read_text())
    assert skip["pairs"] == 2 and skip["skipped_clip_pairs"] == 1
    assert relu["pairs"] == 3 and relu["clips_replaced_by_relu"] == ["relu2"]
    ops = [n.op_type for n in onnx.load(str(_out(r, "//clip:relu", ".onnx"))).graph.node]
    assert "Clip" not in ops


SQ_BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[data]
rule = "numpy_dataset"
files = ["data.npy"]
mapping = {{ x = "data.npy" }}

[sq]
rule = "equalize"
model = ":fp"
method = "smoothquant"
dataset = ":data"
alpha = {alpha}

[calib_fp]
rule = "calibrate"
model = ":fp"
dataset = ":data"

[calib_sq]
rule = "calibrate"
model = ":sq"
dataset = ":data"

[q_fp]
rule = "quantize"
model = ":fp"
calibration = ":calib_fp"

[q_sq]
rule = "quantize"
model = ":sq"
calibration = ":calib_sq"
"""


@pytest.mark.parametrize("layernorm", [False, True])
def test_smoothquant_keeps_the_function_and_helps_int8_matmuls(ws, layernorm):
    pkg = f"sq{int(layernorm)}"
    model = lib.matmul_model(layernorm=layernorm)
    ws.write_bytes(f"{pkg}/model.onnx", model.SerializeToString())
    data = lib.outlier_inputs(64, 8, 0)
    if layernorm:  # LayerNormalization's own gamma makes the outliers
        data = np.random.default_rng(1).standard_normal(data.shape).astype(np.float32)
    np.save(ws.path(f"{pkg}/data.npy"), data)
    ws.write(f"{pkg}/BUILD.toml", SQ_BUILD.format(alpha=0.5))
    r = ws.build(f"//{pkg}:q_fp", f"//{pkg}:q_sq", f"//{pkg}:sq")
    assert r.ok, r.error
    rep = json.loads(_out(r, f"//{pkg}:sq", "report.json").read_text())
    assert rep["smoothed"] == 2
    assert rep["folded"] == (1 if layernorm else 0)
    ops = [n.op_type for n in onnx.load(str(_out(r, f"//{pkg}:sq", ".onnx"))).graph.node]
    assert ops.count("Mul") == (1 if layernorm else 2)
    feeds = [{"x": data[i:i + 1]} for i in range(len(data))]
    fp = lib.run(ws.path(f"{pkg}/model.onnx"), feeds)
    sq = lib.run(_out(r, f"//{pkg}:sq", ".onnx"), feeds)
    assert lib.sqnr_db(fp, sq) > 80  # the same function up to float rounding
    base = lib.sqnr_db(fp, lib.run(_out(r, f"//{pkg}:q_fp", ".onnx"), feeds))
    smoothed = lib.sqnr_db(fp, lib.run(_out(r, f"//{pkg}:q_sq", ".onnx"), feeds))
    assert smoothed > base + 3.0, (base, smoothed)


def test_smoothquant_needs_a_dataset_and_quantize_points_at_equalize(ws):
    ws.write_bytes("sqerr/model.onnx", lib.matmul_model(layernorm=False).SerializeToString())
    ws.write("sqerr/BUILD.toml", """
        [fp]
        rule = "onnx_model"
        src = "model.onnx"

        [sq]
        rule = "equalize"
        model = ":fp"
        method = "smoothquant"
        """)
    r = ws.build("//sqerr:sq")
    assert r.exit_code == 2 and "needs a dataset" in r.error and "dataset" in r.error
    from qbuild_onnx.quantization.options import StaticOptions, check_static_options
    from qbuild_onnx_common.errors import OnnxError as QuantizeError

    with pytest.raises(QuantizeError) as e:
        check_static_options(StaticOptions(extra_options={"SmoothQuant": True}))
    assert "equalize" in str(e.value) and 'method = "smoothquant"' in str(e.value)
    assert "calibrate rule" not in str(e.value)
