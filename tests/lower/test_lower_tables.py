"""Element-wise chains between quantized tensors become 256-entry tables (or the identity,
or a matching onnxruntime lookup op), bit-exact with the QDQ source: in lower_integer's
ort mode and in the fuse_lut pass."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from lower_paths import YOLOX
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from qbuild_lower.checking.compare import compare
from qbuild_lower.checking.feeds import synthetic_feeds
from qbuild_lower.lowering.driver import lower_model
from qbuild_lower.patterns.fuse import fuse_model
from qbuild_lower.patterns.regions import find_regions
from qbuild_lower.qdq.graph import Graph
from qbuild_onnx_common.providers import OnnxModelInfo

C = 8


def small_cnn() -> onnx.ModelProto:
    """Nine 3x3 Convs separated by SiLU, HardSwish, Sigmoid, Tanh, LeakyRelu, Clip, GELU
    written out (Div, Erf, Add, Mul, Mul) and Relu -> HardSigmoid -> Tanh."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(x, cin, name):
        inits.append(nh.from_array((rng.standard_normal((C, cin, 3, 3)) * 0.3)
                                   .astype(np.float32), f"{name}_w"))
        inits.append(nh.from_array((rng.standard_normal(C) * 0.1).astype(np.float32),
                                   f"{name}_b"))
        nodes.append(h.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name],
                                 pads=[1, 1, 1, 1], name=name))
        return name

    def const(name, v):
        inits.append(nh.from_array(np.array(v, np.float32), name))
        return name

    x = conv("x", 3, "c1")
    nodes += [h.make_node("Sigmoid", [x], ["s1"], name="sig1"),
              h.make_node("Mul", [x, "s1"], ["silu"], name="silu_mul")]
    nodes.append(h.make_node("HardSwish", [conv("silu", C, "c2")], ["hs"], name="hswish"))
    nodes.append(h.make_node("Sigmoid", [conv("hs", C, "c3")], ["sg"], name="sigmoid"))
    nodes.append(h.make_node("Tanh", [conv("sg", C, "c4")], ["th"], name="tanh"))
    nodes.append(h.make_node("LeakyRelu", [conv("th", C, "c5")], ["lr"], alpha=0.1,
                             name="leaky"))
    nodes.append(h.make_node("Clip", [conv("lr", C, "c6"), const("lo", -1.0),
                                      const("hi", 1.5)], ["cl"], name="clip"))
    x = conv("cl", C, "c7")
    nodes += [h.make_node("Div", [x, const("sqrt2", 1.4142135)], ["g1"], name="gelu_div"),
              h.make_node("Erf", ["g1"], ["g2"], name="gelu_erf"),
              h.make_node("Add", ["g2", const("one", 1.0)], ["g3"], name="gelu_add"),
              h.make_node("Mul", [x, "g3"], ["g4"], name="gelu_mul"),
              h.make_node("Mul", ["g4", const("half", 0.5)], ["gelu"], name="gelu_half")]
    x = conv("gelu", C, "c8")
    nodes += [h.make_node("Relu", [x], ["r1"], name="relu"),
              h.make_node("HardSigmoid", ["r1"], ["r2"], name="hsig"),
              h.make_node("Tanh", ["r2"], ["r3"], name="tanh2")]
    conv("r3", C, "c9")
    g = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("c9", T.FLOAT, [1, C, 16, 16])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _cnn_qdq(tmp_path_factory, activation):
    from qbuild_lower.qdq.source import make_qdq

    d = tmp_path_factory.mktemp("cnn")
    onnx.save(small_cnn(), str(d / "cnn.onnx"))
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((1, 3, 16, 16)) * 2).astype(np.float32) for _ in range(8)]
    return make_qdq(d / "cnn.onnx", d / "cnn_qdq.onnx", batches, activation, scratch=d)


@pytest.fixture(scope="module")
def cnn_qdq(tmp_path_factory):
    return _cnn_qdq(tmp_path_factory, "uint8")


def test_small_cnn_int8_activations_tables_bit_exact(tmp_path_factory):
    src = onnx.load(str(_cnn_qdq(tmp_path_factory, "int8")))
    feeds = synthetic_feeds(src, 2)
    low, rep, _ = lower_model(src, "ort", tables="table")
    assert rep["regions"]["by_form"] == {"table": 7}
    assert compare(src, low, feeds)["exact"] == 1.0


def _clip_and_relu() -> onnx.ModelProto:
    """Hand-written QDQ: x -> Q -> [DQ -> Clip(-1, .5) -> Q'], [DQ -> Relu -> Q] and
    [DQ -> Sigmoid -> Q]; x -> Q (zero point 0) -> DQ -> Relu -> Q (the identity)."""
    i = [nh.from_array(np.array(v, dt), n) for n, v, dt in (
        ("s", 0.02, np.float32), ("z", 0, np.uint8), ("s8", 0.03, np.float32),
        ("z8", 128, np.uint8), ("s2", 0.01, np.float32), ("z2", 100, np.uint8),
        ("lo", -1.0, np.float32), ("hi", 0.5, np.float32), ("ss", 1 / 256, np.float32))]
    n = [h.make_node("QuantizeLinear", ["x", "s8", "z8"], ["xq"]),
         h.make_node("DequantizeLinear", ["xq", "s8", "z8"], ["xd"]),
         h.make_node("Clip", ["xd", "lo", "hi"], ["c"], name="clip"),
         h.make_node("QuantizeLinear", ["c", "s2", "z2"], ["cq"]),
         h.make_node("DequantizeLinear", ["cq", "s2", "z2"], ["y1"]),
         h.make_node("Relu", ["xd"], ["r"], name="relu"),  # zero point 128: LeakyRelu(0)
         h.make_node("QuantizeLinear", ["r", "s8", "z8"], ["rq"]),
         h.make_node("DequantizeLinear", ["rq", "s8", "z8"], ["y2"]),
         h.make_node("QuantizeLinear", ["x", "s", "z"], ["x0"]),  # zero point 0
         h.make_node("DequantizeLinear", ["x0", "s", "z"], ["x0d"]),
         h.make_node("Relu", ["x0d"], ["r0"], name="relu_zp0"),  # the identity on codes
         h.make_node("QuantizeLinear", ["r0", "s", "z"], ["r0q"]),
         h.make_node("DequantizeLinear", ["r0q", "s", "z"], ["y4"]),
         h.make_node("Sigmoid", ["xd"], ["g"], name="sigmoid"),
         h.make_node("QuantizeLinear", ["g", "ss", "z"], ["gq"]),
         h.make_node("DequantizeLinear", ["gq", "ss", "z"], ["y3"])]
    outs = [h.make_tensor_value_info(y, T.FLOAT, [2, 4, 8, 8])
            for y in ("y1", "y2", "y3", "y4")]
    g = h.make_graph(n, "hand", [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 8, 8])],
                     outs, i)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("form", ["table", "fastest"])
def test_small_cnn_chains_bit_exact(cnn_qdq, form):
    src = onnx.load(str(cnn_qdq))
    feeds = synthetic_feeds(src, 4)
    low, rep, _ = lower_model(src, "ort", tables=form)
    res = compare(src, low, feeds)
    assert res["exact"] == 1.0 and res["max_error_lsb"] == 0
    assert rep["nodes"]["float"] == 0 and rep["float_edges_between_lowered_ops"] == []
    regions = {tuple(r["op_types"]): r for r in rep["regions"]["per_region"]}
    assert {("Sigmoid", "Mul"), ("HardSigmoid", "Mul"), ("Tanh",), ("LeakyRelu",),
            ("Div", "Erf", "Add", "Mul", "Mul"), ("HardSigmoid", "Tanh")} <= set(regions)
    ops = rep["op_counts"]
    for op in ("Sigmoid", "Tanh", "Erf", "HardSigmoid", "Div", "Mul"):
        assert op not in ops  # nothing element-wise left in float
    if form == "table":
        assert set(rep["regions"]["by_form"]) == {"table"}
        assert ops["GatherElements"] == rep["regions"]["count"]
        assert "QLinearSigmoid" not in ops and "QLinearMul" not in ops
    else:
        # SiLU: QLinearSigmoid + QLinearMul beat a table; GELU's five ops do not
        assert regions[("Sigmoid", "Mul")]["form"] == "kept"
        assert regions[("Div", "Erf", "Add", "Mul", "Mul")]["form"] == "table"
        assert ops["QLinearMul"] == 1 and ops["QLinearSigmoid"] == 2
    fused, frep = fuse_model(src, form)
    onnx.checker.check_model(fused)
    assert compare(src, fused, feeds)["exact"] == 1.0
    if form == "table":
        assert frep["by_form"] == {"table": rep["regions"]["count"]}


def test_identity_lookup_and_clip_tables():
    src = _clip_and_relu()
    g = Graph.from_model(src)
    reg, reg0 = find_regions(g)
    assert sorted(reg.exports) == ["cq", "gq", "rq"] and reg0.exports == ["r0q"]
    x = np.random.default_rng(0).normal(0, 2, (2, 4, 8, 8)).astype(np.float32)
    # integer-only lowering must replace Clip/Relu: each export in its fastest form
    low, rep, _ = lower_model(src, "ort")
    forms = rep["regions"]["per_region"][0]["form"]
    assert sorted(forms) == ["lookup:QLinearLeakyRelu", "lookup:QLinearSigmoid", "table"]
    assert rep["regions"]["per_region"][1]["form"] == "identity"
    assert compare(src, low, [{"x": x}])["exact"] == 1.0
    ops = {n.op_type for n in low.graph.node}
    assert not {"Relu", "Clip", "Sigmoid"} & ops and "QLinearSigmoid" in ops
    # the identity is no node at all: y4's DequantizeLinear reads the root's codes
    assert next(n for n in low.graph.node if n.output[0] == "y4").input[0] == "x0"
    # as a pass on the QDQ model, float Clip/Relu/Sigmoid are cheaper than this region's
    # tables: kept; forced tables are bit-exact too
    fused, frep = fuse_model(src, "fastest")
    assert frep["by_form"] == {"identity": 1, "kept": 1}
    for m in (fused, fuse_model(src, "table")[0]):
        assert compare(src, m, [{"x": x}])["exact"] == 1.0


def test_region_read_in_float_outside_is_kept():
    """A chain whose float result is also a graph output cannot become a table."""
    src = _clip_and_relu()
    src.graph.output.append(h.make_tensor_value_info("c", T.FLOAT, [2, 4, 8, 8]))
    reg = find_regions(Graph.from_model(src))[0]
    assert reg.reason and "'c'" in reg.reason
    fused, rep = fuse_model(src, "table")
    assert rep["by_form"] == {"kept": 1, "table": 1}
    x = np.random.default_rng(0).normal(0, 2, (2, 4, 8, 8)).astype(np.float32)
    assert compare(src, fused, [{"x": x}])["exact"] == 1.0


def test_yolox_silu_tables_bit_exact(qdq_models, image_feeds):
    src = onnx.load(str(qdq_models(YOLOX, "yolox", 416)))
    low, rep, _ = lower_model(src, "ort", tables="table")
    n_silu = sum(1 for n in src.graph.node if n.op_type == "Sigmoid")
    assert rep["regions"]["by_form"] == {"table": n_silu}
    assert "QLinearSigmoid" not in rep["op_counts"]
    res = compare(src, low, image_feeds("images", "yolox", 416, 2))
    assert res["exact"] == 1.0 and res["max_error_lsb"] == 0


def test_fuse_lut_rule(qbuild_workspace, cnn_qdq):
    ws = qbuild_workspace
    ws.copy(cnn_qdq, "m/qdq.onnx")
    ws.write("m/BUILD.toml", """
[qdq]
rule = "onnx_model"
src = "qdq.onnx"

[lut]
rule = "fuse_lut"
model = ":qdq"
form = "table"
""")
    r = ws.build("//m:lut")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:lut")}
    assert {"lut.onnx", "report.json"} <= set(outs)
    rep = json.loads(outs["report.json"].read_text())
    assert rep["check"]["exact"] == 1.0 and rep["by_form"] == {"table": rep["regions"]}
    assert r.provider("//m:lut", OnnxModelInfo).model == outs["lut.onnx"]
    r2 = ws.build("//m:lut")
    assert r2.ok and not r2.ran


def test_fixed_point_lowers_float_chains_as_tables(cnn_qdq):
    """Fixed-point mode: chains with float between their ops (GELU written out, Relu ->
    HardSigmoid -> Tanh) become one table each; the others still lower node by node."""
    src = onnx.load(str(cnn_qdq))
    low, rep, params = lower_model(src, "fixed_point", "onnxruntime")
    assert rep["nodes"]["float"] == 0
    assert rep["regions"]["by_form"] == {"table": 2}
    chains = {tuple(p["composed_of"]) for p in params if "composed_of" in p}
    assert ("gelu_div", "gelu_erf", "gelu_add", "gelu_mul", "gelu_half") in chains
    assert all(len(p["table"]) == 256 for p in params if "composed_of" in p)
    assert {n.domain for n in low.graph.node} <= {"", "ai.onnx"}  # standard ONNX only
    res = compare(src, low, synthetic_feeds(src, 4))
    assert res["exact"] == 1.0


def test_constant_that_broadcasts_to_a_higher_rank_keeps_the_chain():
    i = [nh.from_array(np.array(v, dt), n) for n, v, dt in (
        ("s", 0.02, np.float32), ("z", 128, np.uint8))]
    i.append(nh.from_array(np.full((1, 1, 1), 2.0, np.float32), "two"))
    n = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
         h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
         h.make_node("Mul", ["xd", "two"], ["m"], name="mul"),
         h.make_node("Tanh", ["m"], ["t"], name="tanh"),
         h.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"]),
         h.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"])]
    g = h.make_graph(n, "bcast", [h.make_tensor_value_info("x", T.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], i)
    src = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    (reg,) = find_regions(Graph.from_model(src))
    assert reg.reason and "rank 3" in reg.reason
    fused, rep = fuse_model(src, "table")
    assert rep["by_form"] == {"kept": 1}
    x = np.random.default_rng(0).normal(0, 1, (4, 8)).astype(np.float32)
    assert compare(src, fused, [{"x": x}])["exact"] == 1.0
