"""auto_quantize's opt-in NNCF families: ``sym`` (preset symmetric) and ``nncf`` /
``nncf_bc`` (mean_minmax ranges, preset mixed, Q/DQ at Conv inputs only, fast bias
correction), each an ordinary cached target, evaluated and listed in the report; the
default search does not grow."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
import onnx
from qbuild_onnx.auto.plan import expand
from qbuild_onnx.rules import accuracy as accuracy_rules
from qbuild_onnx.rules import quantize as quantize_rules
from qbuild_onnx.rules import source as source_rules

from qbuild.testing import Workspace

BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"

[cal]
rule = "numpy_dataset"
files = ["cal.npy"]
mapping = { x = "cal.npy" }

[ev]
rule = "numpy_dataset"
files = ["ev.npy"]
mapping = { x = "ev.npy" }

[aq]
rule = "auto_quantize"
model = ":fp"
calibration_data = ":cal"
evaluation_data = ":ev"
bar = { min_sqnr_db = 10 }
objective = "size"
latency_runs = 0
steps = ["symmetric", "nncf"]
"""

RAW = {"model": ":fp", "calibration_data": ":cal", "evaluation_data": ":ev",
       "bar": {"min_sqnr_db": 10}}


def test_nncf_and_symmetric_trials_are_cached_targets(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, accuracy_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx", lib.conv_chain().SerializeToString())
    np.save(ws.path("m/cal.npy"), lib.images(6, 0))
    np.save(ws.path("m/ev.npy"), lib.images(6, 1))
    ws.write("m/BUILD.toml", BUILD)
    r = ws.build("//m:aq", "//m:aq.calib_mean_minmax", "//m:aq.nncf", "//m:aq.nncf_bc")
    assert r.ok, r.error
    for target in ("aq.calib_mean_minmax", "aq.sym", "aq.nncf", "aq.nncf_bc", "aq.ev_nncf_bc"):
        assert f"//m:{target}" in r.ran, target
    rep = json.loads(next(p for p in r.outputs("//m:aq") if p.name == "report.json")
                     .read_text())
    assert [t["name"] for t in rep["trials"]] == ["u8", "sym", "nncf", "nncf_bc"]
    calib = json.loads(r.outputs("//m:aq.calib_mean_minmax")[0].read_text())
    assert calib["method"] == "mean_minmax"
    nncf = next(p for p in r.outputs("//m:aq.nncf") if p.suffix == ".onnx")
    readers = {t for n in onnx.load(str(nncf)).graph.node if n.op_type == "DequantizeLinear"
               for t in n.output}
    assert all(n.op_type == "Conv" for n in onnx.load(str(nncf)).graph.node
               if any(t in readers for t in n.input))
    bc = json.loads(next(p for p in r.outputs("//m:aq.nncf_bc") if p.name == "report.json")
                    .read_text())
    assert bc["method"] == "fast" and bc["corrected_nodes"] > 0


def test_plan_tables_and_default_steps():
    tables, own = expand("aq", {**RAW, "steps": ["nncf", "region"]})
    assert tables["aq.calib_mean_minmax"]["method"] == "mean_minmax"
    for trial in ("nncf", "nncf_region"):
        q = tables[f"aq.{trial}"]
        assert (q["preset"], q["placement"], q["calibration"]) == (
            "mixed", "conv_inputs", ":aq.calib_mean_minmax")
        assert tables[f"aq.{trial}_bc"]["method"] == "fast"
    assert tables["aq.nncf_region"]["overrides"] == ":aq.region_overrides"
    assert {"nncf", "nncf_bc", "nncf_region", "nncf_region_bc"} <= set(own["trial_names"])
    # not in the default search (it times trials on onnxruntime, where conv_inputs is slow)
    default_tables, default_own = expand("aq", dict(RAW))
    assert not [t for t in default_own["trial_names"] if t.startswith(("nncf", "sym"))]
    assert "aq.calib_mean_minmax" not in default_tables
