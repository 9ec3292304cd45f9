"""auto_quantize's cle and adaround branches: each an ordinary cached target (equalized
model, its calibration, its quantization, learned rounding of u8 and of cle), evaluated
against the original float model, listed in the report; a bar change reruns only the
selection."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
from qbuild_onnx.algorithms import rules as algo_rules
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
mapping = {{ x = "cal.npy" }}

[ev]
rule = "numpy_dataset"
files = ["ev.npy"]
mapping = {{ x = "ev.npy" }}

[aq]
rule = "auto_quantize"
model = ":fp"
calibration_data = ":cal"
evaluation_data = ":ev"
bar = {{ {bar} }}
objective = "size"
latency_runs = 0
steps = ["cle", "adaround"]
adaround_options = {{ iterations = 60, rows = 256 }}
"""


def test_cle_and_adaround_trials_are_cached_targets(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, accuracy_rules, algo_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx", lib.conv_chain().SerializeToString())
    np.save(ws.path("m/cal.npy"), lib.images(6, 0))
    np.save(ws.path("m/ev.npy"), lib.images(6, 1))
    ws.write("m/BUILD.toml", BUILD.format(bar="min_sqnr_db = 10"))
    r = ws.build("//m:aq")
    assert r.ok, r.error
    for target in ("aq.cle_model", "aq.calib_cle", "aq.cle", "aq.u8_ar", "aq.cle_ar",
                   "aq.ev_cle", "aq.ev_u8_ar", "aq.ev_cle_ar"):
        assert f"//m:{target}" in r.ran, target
    rep = json.loads(next(p for p in r.outputs("//m:aq") if p.name == "report.json")
                     .read_text())
    assert [t["name"] for t in rep["trials"]] == ["u8", "cle", "u8_ar", "cle_ar"]
    by = {t["name"]: t for t in rep["trials"]}
    assert by["cle"]["worst_sqnr_db"] > by["u8"]["worst_sqnr_db"] - 1.0  # vs the original
    ws.write("m/BUILD.toml", BUILD.format(bar="min_sqnr_db = 11"))
    again = ws.build("//m:aq")
    assert again.ok and again.ran == ["//m:aq"]
