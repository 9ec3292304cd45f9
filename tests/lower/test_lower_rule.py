"""The lower_integer rule through the real engine: outputs, report, caching, failure."""

from __future__ import annotations

import json

import onnx
from lower_paths import MOBILENET
from qbuild_onnx_common.providers import OnnxModelInfo


def _ws(ws, qdq, extra=""):
    ws.copy(qdq, "m/qdq.onnx")
    ws.write("m/BUILD.toml", f"""
[qdq]
rule = "onnx_model"
src = "qdq.onnx"

[int_ort]
rule = "lower_integer"
model = ":qdq"
mode = "ort"
max_samples = 2

[int_fixed]
rule = "lower_integer"
model = ":qdq"
mode = "fixed_point"
max_samples = 2
{extra}
""")


def test_rule_builds_caches_and_reports(qbuild_workspace, qdq_models):
    ws = qbuild_workspace
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"))
    r = ws.build("//m:int_ort", "//m:int_fixed")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:int_fixed")}
    assert {"int_fixed.onnx", "report.json", "fixed_point_params.json"} <= set(outs)
    rules = ws.cli("rules", "lower_integer").stdout
    assert "provides: DefaultInfo, OnnxModelInfo" in rules
    assert "model: label (default: required; must provide OnnxModelInfo)" in rules
    rep = json.loads(outs["report.json"].read_text())
    assert rep["check"]["passed"] and rep["check"]["inputs"] == "synthetic"
    assert len(rep["per_node"]) == rep["nodes"]["compute"]
    params = json.loads(outs["fixed_point_params.json"].read_text())
    assert params["format"] == "qbuild-fixed-point" and params["layers"]
    ort = {p.name: p for p in r.outputs("//m:int_ort")}
    assert json.loads(ort["report.json"].read_text())["nodes"]["lowered_share"] == 1.0
    # The lowered model is given to dependents as an OnnxModelInfo provider.
    model = r.provider("//m:int_fixed", OnnxModelInfo)
    assert model.model == outs["int_fixed.onnx"] and model.opset >= 13
    graph = onnx.load(str(outs["int_fixed.onnx"])).graph
    assert [i["name"] for i in model.inputs] == [graph.input[0].name]
    assert [o["name"] for o in model.outputs] == [o.name for o in graph.output]
    r2 = ws.build("//m:int_ort", "//m:int_fixed")
    assert r2.ok and not [x for x in r2.ran if "int_" in x]


def test_rule_fails_below_threshold(qbuild_workspace, qdq_models):
    ws = qbuild_workspace
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"), 'min_agreement = 1.01')
    r = ws.build("//m:int_fixed")
    assert not r.ok and "min_agreement" in r.error
    assert "action Check:" in r.error
    # The check's threshold is only the Check action's: lowering is not run again.
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"), 'min_agreement = 0.5')
    r2 = ws.build("//m:int_fixed")
    assert r2.ok, r2.error
    assert r2.actions["//m:int_fixed"] == {"Lower": "cached", "Check": "ran"}


def test_wrong_provider_is_refused_before_anything_runs(qbuild_workspace, qdq_models):
    ws = qbuild_workspace
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"), "")
    ws.write("m/BUILD.toml", (ws.path("m/BUILD.toml").read_text()
                              + '\n[notes]\nrule = "filegroup"\nsrcs = ["qdq.onnx"]\n'
                              + '\n[bad]\nrule = "lower_integer"\nmodel = ":int_ort"\n'
                              + 'dataset = ":notes"\n'))
    r = ws.build("//m:int_ort", "//m:bad")
    assert r.exit_code == 2 and r.ran == []
    assert r.error == ("m/BUILD.toml, target //m:bad, attribute 'dataset': //m:notes (rule "
                       "'filegroup') does not provide DatasetInfo (it provides: DefaultInfo)")


def test_rule_rounding_onnxruntime_is_bit_exact(qbuild_workspace, qdq_models):
    """rounding = "onnxruntime": the check finds every output element equal, the
    parameter file says which rounding each layer uses, and changing the attribute
    rebuilds only that target."""
    ws = qbuild_workspace
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"), 'rounding = "onnxruntime"')
    r = ws.build("//m:int_fixed", "//m:int_ort")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:int_fixed")}
    rep = json.loads(outs["report.json"].read_text())
    assert rep["check"]["exact"] == 1.0 and rep["check"]["max_error_lsb"] == 0.0
    params = json.loads(outs["fixed_point_params.json"].read_text())
    assert params["rounding"] == "onnxruntime"
    assert {p["rounding"] for p in params["layers"] if p["kind"] == "conv"} == {"onnxruntime"}
    # only the AveragePool is left rounding half up (its kernel is not reproduced); the
    # residual Adds (symbolic batch dimension) are tables
    assert [p["kind"] for p in params["layers"] if "rounding_note" in p] == ["average_pool"]
    assert [p["kind"] for p in params["layers"]].count("lookup_table_2d") == 10
    produced = {t for n in __import__("onnx").load(str(outs["int_fixed.onnx"])).graph.node
                for t in n.output}
    assert all(p["output"]["tensor"] in produced for p in params["layers"])
    _ws(ws, qdq_models(MOBILENET, "mobilenet", 128, "uint8"), 'rounding = "half_up"')
    r2 = ws.build("//m:int_fixed", "//m:int_ort")
    assert r2.ok and r2.ran == ["//m:int_fixed"]


def test_check_feeds_inputs_stored_one_rank_higher_whole(tmp_path):
    """A streaming model's dataset stores each state input whole, one rank higher than
    the model input (as calibrate feeds it); the check must feed it the same way."""
    import numpy as np
    from onnx import TensorProto, helper
    from qbuild_lower.checking.feeds import load_dataset

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 1, 8]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]))
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 4), np.float32))
    np.save(tmp_path / "h.npy", np.zeros((3, 2, 1, 8), np.float32))
    np.save(tmp_path / "sr.npy", np.full(3, 16000, np.int64))
    (tmp_path / "dataset.json").write_text(json.dumps({
        "format": "qbuild-dataset", "count": 3,
        "inputs": {k: {"file": f"{k}.npy"} for k in ("x", "h", "sr")}}))
    feeds = load_dataset(tmp_path, 2, model)
    assert len(feeds) == 2
    assert feeds[0]["x"].shape == (1, 4) and feeds[0]["h"].shape == (2, 1, 8)
    assert feeds[0]["sr"].shape == ()
    # without the model: the old batch-of-one slicing
    assert load_dataset(tmp_path, 1)[0]["x"].shape == (1, 1, 4)
