"""A streaming model with a state input one rank higher and a scalar input goes through
calibrate, evaluate, sensitivity and bias_correction as rules (calibrate crashed on the
scalar; the others fed every input as a batch of samples)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.rules import quantize as rules_quantize
from qbuild_onnx.rules import source as rules_source
from qbuild_onnx.source.datasets import write_dataset


def _stateful_model():
    """y = Gemm(x, W) + state[0] * float(gain); new_state = state + y (x [1, 8], state
    [2, 1, 8], gain an int64 scalar)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    b = rng.normal(size=(8,)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="gemm"),
        helper.make_node("Gather", ["state", "zero"], ["s0"], name="gather", axis=0),
        helper.make_node("Cast", ["gain"], ["gf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s0", "gf"], ["sg"], name="mul"),
        helper.make_node("Add", ["h", "sg"], ["y"], name="add"),
        helper.make_node("Unsqueeze", ["y", "zero1"], ["yu"], name="unsq"),
        helper.make_node("Add", ["state", "yu"], ["new_state"], name="add_state"),
    ]
    g = helper.make_graph(
        nodes, "stateful",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 8]),
         helper.make_tensor_value_info("gain", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("new_state", TensorProto.FLOAT, [2, 1, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "zero1")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


BUILD = """
[fp]
rule = "onnx_model"
src = "m.onnx"

[data]
rule = "numpy_dataset"
mapping = {{ x = "x.npy", state = "state.npy", gain = "gain.npy" }}
files = ["x.npy", "state.npy", "gain.npy"]
model = ":fp"

[calib]
rule = "calibrate"
model = ":fp"
dataset = ":data"

[q]
rule = "quantize"
model = ":fp"
calibration = ":calib"

[ev]
rule = "evaluate"
models = [":q"]
reference = ":fp"
dataset = ":data"
min_sqnr_db = {bar}

[sens]
rule = "sensitivity"
model = ":q"
reference = ":fp"
dataset = ":data"

[bc]
rule = "bias_correction"
model = ":q"
reference = ":fp"
dataset = ":data"
"""


def test_stateful_scalar_model_through_every_rule(qbuild_workspace):
    ws = qbuild_workspace
    ws.register(rules_source)
    ws.register(rules_quantize)
    ws.register(rules_accuracy)
    m = _stateful_model()
    (ws.root / "s").mkdir()
    onnx.save(m, ws.root / "s" / "m.onnx")
    rng = np.random.default_rng(1)
    n = 12
    np.save(ws.root / "s" / "x.npy", rng.normal(size=(n, 1, 8)).astype(np.float32))
    np.save(ws.root / "s" / "state.npy", rng.normal(size=(n, 2, 1, 8)).astype(np.float32))
    np.save(ws.root / "s" / "gain.npy", np.arange(n, dtype=np.int64) % 3)
    ws.write("s/BUILD.toml", BUILD.format(bar=10.0))
    r = ws.build("//s:ev", "//s:sens", "//s:bc")
    assert r.ok, r.error
    rep = json.loads(r.outputs("//s:ev")[0].read_text())
    assert rep["samples"] == n
    outs = rep["models"]["//s:q"]["outputs"]
    assert set(outs) == {"y", "new_state"}
    assert all(float(v["sqnr_db"]) > 20 for v in outs.values())
    sens = json.loads(r.outputs("//s:sens")[0].read_text())
    assert sens["sites"] >= 2
    bc = json.loads(next(p for p in r.outputs("//s:bc") if p.name == "report.json").read_text())
    assert bc["corrected_nodes"] == 1
    # the corrected model passes its source's precision choices on (select_best's cost)
    from qbuild_onnx_common.providers import OnnxModelInfo

    q, corrected = (r.provider(t, OnnxModelInfo) for t in ("//s:q", "//s:bc"))
    assert (corrected.promoted, corrected.float_joins) == (q.promoted, q.float_joins)


def test_write_dataset_rejects_bare_scalar(tmp_path):
    from qbuild_onnx_common.errors import OnnxError

    try:
        write_dataset(tmp_path / "d", {"gain": np.array(3)})
    except OnnxError as e:
        assert "leading axis" in str(e)
    else:
        raise AssertionError("a bare scalar was accepted")
