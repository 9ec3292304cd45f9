"""``quantize_weights_int4``: onnxruntime's MatMulNBits quantizer as a rule, on a small
MatMul model generated here: RTN to MatMulNBits and to QDQ, GPTQ on a dataset, clear
configuration errors. Real onnxruntime runs the results."""

from __future__ import annotations

import json

import algo_testlib as lib
import numpy as np
import onnx
from qbuild_onnx.algorithms import rules as algo_rules
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

[rtn]
rule = "quantize_weights_int4"
model = ":fp"
block_size = 32

[rtn_qdq]
rule = "quantize_weights_int4"
model = ":fp"
block_size = 32
format = "qdq"

[gptq]
rule = "quantize_weights_int4"
model = ":fp"
algorithm = "gptq"
block_size = 32
dataset = ":data"
"""


def test_rtn_and_gptq_make_smaller_models_that_stay_accurate(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, algo_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx",
                   lib.matmul_model(k=128, n=96, m=64, layernorm=False).SerializeToString())
    data = np.random.default_rng(0).standard_normal((6, 16, 128)).astype(np.float32)
    np.save(ws.path("m/data.npy"), data)
    ws.write("m/BUILD.toml", BUILD)
    r = ws.build("//m:rtn", "//m:rtn_qdq", "//m:gptq")
    assert r.ok, r.error
    feeds = [{"x": data[i:i + 1]} for i in range(len(data))]
    fp = lib.run(ws.path("m/model.onnx"), feeds)
    float_bytes = ws.path("m/model.onnx").stat().st_size
    for label, op in (("gptq", "MatMulNBits"), ("rtn", "MatMulNBits"),
                      ("rtn_qdq", "DequantizeLinear")):
        outs = {p.suffix: p for p in r.outputs(f"//m:{label}")}
        rep = json.loads(outs[".json"].read_text())
        assert rep["matmuls"] == 2 and rep["quantized_matmuls"] == 2, rep
        ops = [n.op_type for n in onnx.load(str(outs[".onnx"])).graph.node]
        assert ops.count(op) == 2 and (op != "MatMulNBits" or "MatMul" not in ops)
        assert outs[".onnx"].stat().st_size < float_bytes / 3
        sqnr = lib.sqnr_db(fp, lib.run(outs[".onnx"], feeds))
        assert sqnr > 10, (label, sqnr)  # measured: rtn 18.2 dB, gptq 14.7 dB
        assert rep["bits"] == 4


def test_bad_options_are_configuration_errors(tmp_path):
    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (source_rules, algo_rules):
        ws.register(plugin)
    ws.write_bytes("m/model.onnx", lib.matmul_model(layernorm=False).SerializeToString())
    for extra, attr, words in (('bits = 3', "bits", "expected 2, 4 or 8"),
                               ('block_size = 24', "block_size", "power of two"),
                               ('algorithm = "gptq"', "dataset", "needs calibration samples"),
                               ('algorithm = "gptq"\nformat = "qdq"', "format",
                                "MatMulNBits only")):
        ws.write("m/BUILD.toml", f'[fp]\nrule = "onnx_model"\nsrc = "model.onnx"\n\n'
                 f'[q]\nrule = "quantize_weights_int4"\nmodel = ":fp"\n{extra}\n')
        r = ws.build("//m:q")
        assert r.exit_code == 2 and words in r.error and f"'{attr}'" in r.error, r.error
