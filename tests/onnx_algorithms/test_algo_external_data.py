"""A model whose weights live in an external data file goes through onnx_model,
quant_preprocess, calibrate, quantize, quantize_dynamic, equalize and
quantize_weights_int4 with external data kept: the code path models over 2 GB take
(bench/bench_large_model.py runs it at 2.2 GB), on a small model."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
import onnx
from qbuild_onnx.algorithms import rules as algo_rules
from qbuild_onnx.rules import quantize as quantize_rules
from qbuild_onnx.rules import source as source_rules

from qbuild.testing import Workspace

BUILD = """
[fp]
rule = "onnx_model"
src = "model.onnx"
data = ["model.onnx.data"]

[pre]
rule = "quant_preprocess"
model = ":fp"
external_data = true

[data]
rule = "numpy_dataset"
files = ["data.npy"]
mapping = { x = "data.npy" }

[calib]
rule = "calibrate"
model = ":pre"
dataset = ":data"

[q]
rule = "quantize"
model = ":pre"
calibration = ":calib"

[dyn]
rule = "quantize_dynamic"
model = ":pre"

[sq]
rule = "equalize"
model = ":pre"
method = "smoothquant"
dataset = ":data"
external_data = true

[int4]
rule = "quantize_weights_int4"
model = ":pre"
block_size = 32
external_data = true
"""


def test_external_data_model_through_every_step(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, algo_rules):
        ws.register(plugin)
    # weights of 96 KiB and 24 KiB: over external_data.SMALL (64 KiB) the first stays on
    # disk until the quantizer reads it, the second is loaded with the graph
    model = lib.matmul_model(k=256, n=96, m=64, layernorm=False)
    ws.path("m").mkdir(parents=True)
    onnx.save(model, str(ws.path("m/model.onnx")), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
    assert ws.path("m/model.onnx.data").stat().st_size > 90_000
    data = np.random.default_rng(0).standard_normal((4, 16, 256)).astype(np.float32)
    np.save(ws.path("m/data.npy"), data)
    ws.write("m/BUILD.toml", BUILD)
    r = ws.build("//m:q", "//m:dyn", "//m:sq", "//m:int4", "//m:pre")
    assert r.ok, r.error
    names = {p.name for p in r.outputs("//m:pre")}
    assert names == {"pre.onnx", "pre.onnx.data"}
    pre = next(p for p in r.outputs("//m:pre") if p.name == "pre.onnx")
    assert pre.stat().st_size < 10_000  # the weights are in pre.onnx.data
    feeds = [{"x": data[i:i + 1]} for i in range(len(data))]
    fp = lib.run(pre, feeds)
    for label, floor_db in (("q", 25), ("dyn", 25), ("sq", 80), ("int4", 10)):
        path = next(p for p in r.outputs(f"//m:{label}") if p.name == f"{label}.onnx")
        assert lib.sqnr_db(fp, lib.run(path, feeds)) > floor_db, label
    for label in ("sq", "int4"):
        outs = {p.name for p in r.outputs(f"//m:{label}")}
        assert f"{label}.onnx.data" in outs
        proto = onnx.load(str(next(p for p in r.outputs(f"//m:{label}")
                                   if p.name == f"{label}.onnx")), load_external_data=False)
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def test_quantize_describes_the_written_model_from_a_weightless_copy(tmp_path):
    """quantize frees its result once written and reports on a weightless copy: the copy
    keeps every node, value and initializer type/shape, drops only large weights' data,
    and the report built from it equals the one built from the full model."""
    from qbuild_onnx.quantization.report import build_report
    from qbuild_onnx_common.models import weightless

    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, quantize_rules, algo_rules):
        ws.register(plugin)
    model = lib.matmul_model(k=256, n=96, m=64, layernorm=False)
    ws.path("m").mkdir(parents=True)
    onnx.save(model, str(ws.path("m/model.onnx")))
    np.save(ws.path("m/data.npy"),
            np.random.default_rng(0).standard_normal((4, 16, 256)).astype(np.float32))
    ws.write("m/BUILD.toml", BUILD.replace('\ndata = ["model.onnx.data"]', "")
             .replace("external_data = true", "external_data = false"))
    r = ws.build("//m:q")
    assert r.ok, r.error
    written = onnx.load(str(next(p for p in r.outputs("//m:q") if p.name == "q.onnx")))
    light = weightless(written, small=1024)  # the int8 weights (24 KiB, 6 KiB) go
    assert light.ByteSize() < written.ByteSize() // 4
    assert [n.name for n in light.graph.node] == [n.name for n in written.graph.node]
    for a, b in zip(light.graph.initializer, written.graph.initializer, strict=True):
        assert (a.name, a.data_type, list(a.dims)) == (b.name, b.data_type, list(b.dims))
        assert a.ByteSize() == b.ByteSize() or b.ByteSize() > 1024
    settings = {"mode": "static"}
    assert build_report(light, model_bytes=1, float_model_bytes=2, settings=settings) == \
        build_report(written, model_bytes=1, float_model_bytes=2, settings=settings)
    report = json.loads(next(p for p in r.outputs("//m:q")
                             if p.name == "report.json").read_text())
    assert report["quantized_nodes"] >= 2 and report["model_bytes"] == \
        next(p for p in r.outputs("//m:q") if p.name == "q.onnx").stat().st_size
