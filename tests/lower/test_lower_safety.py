"""Never fold across a graph output or a multi-consumer tensor; per-op lowering of a small
model with Add/Mul/Concat (different scales)/Sigmoid/MaxPool/AveragePool/Gemm."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from qbuild_lower.checking import reference
from qbuild_lower.checking.compare import compare
from qbuild_lower.checking.feeds import synthetic_feeds
from qbuild_lower.lowering.driver import lower_model
from qbuild_onnx_common.ort import session


def _q(x, s, z, out):
    return h.make_node("QuantizeLinear", [x, s, z], [out])


def _dq(x, s, z, out):
    return h.make_node("DequantizeLinear", [x, s, z], [out])


def _model(nodes, outputs, inits):
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info(o, T.FLOAT, None) for o in outputs],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


INITS = [
    nh.from_array(np.array(0.05, np.float32), "s"),
    nh.from_array(np.array(128, np.uint8), "z"),
    nh.from_array(np.array(0.02, np.float32), "s2"),
]


def test_graph_output_between_op_and_quantize_stays_float():
    # x -> Q -> DQ -> Sigmoid -> sig (graph output AND quantized) -> Q -> DQ -> out
    nodes = [
        _q("x", "s", "z", "xq"),
        _dq("xq", "s", "z", "xf"),
        h.make_node("Sigmoid", ["xf"], ["sig"]),
        _q("sig", "s2", "z", "sq"),
        _dq("sq", "s2", "z", "out"),
    ]
    m = _model(nodes, ["out", "sig"], INITS)
    for mode in ("ort", "fixed_point"):
        low, rep, _ = lower_model(m, mode)
        (e,) = rep["per_node"]
        assert e["status"] == "float" and e["category"] == "graph_output"
        feeds = synthetic_feeds(m, 2)
        a, b = session(m).run(None, feeds[0]), session(low).run(None, feeds[0])
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_float_consumer_and_mismatched_quantizers_stay_float():
    nodes = [
        _q("x", "s", "z", "xq"),
        _dq("xq", "s", "z", "xf"),
        h.make_node("Sigmoid", ["xf"], ["sig"]),
        _q("sig", "s2", "z", "sq"),
        _dq("sq", "s2", "z", "out"),
        h.make_node("Neg", ["sig"], ["neg"]),  # a float consumer of the same tensor
        h.make_node("Relu", ["xf"], ["r"]),
        _q("r", "s", "z", "rq1"),
        _q("r", "s2", "z", "rq2"),
        _dq("rq1", "s", "z", "o1"),
        _dq("rq2", "s2", "z", "o2"),
    ]
    m = _model(nodes, ["out", "neg", "o1", "o2"], INITS)
    low, rep, _ = lower_model(m, "ort")
    by = {e["op_type"]: e for e in rep["per_node"]}
    assert by["Sigmoid"]["category"] == "several_consumers"
    assert by["Relu"]["category"] == "several_consumers"
    assert by["Neg"]["category"] == "float_input" or by["Neg"]["status"] == "float"
    feeds = synthetic_feeds(m, 1)
    a, b = session(m).run(None, feeds[0]), session(low).run(None, feeds[0])
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_not_a_qdq_model_is_an_error():
    from qbuild_onnx_common.errors import OnnxError

    m = _model([h.make_node("Relu", ["x"], ["y"])], ["y"], [])
    with pytest.raises(OnnxError, match="not a QDQ model"):
        lower_model(m, "ort")


@pytest.fixture(scope="module")
def small_qdq(tmp_path_factory):
    """A small CNN exercising every lowered op kind, quantized by onnxruntime."""
    from qbuild_lower.qdq.source import make_qdq

    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("small")
    w1 = nh.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1")
    b1 = nh.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1")
    w2 = nh.from_array(rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32), "w2")
    wg = nh.from_array(rng.normal(0, 0.2, (5, 32)).astype(np.float32), "wg")
    bg = nh.from_array(rng.normal(0, 0.1, 5).astype(np.float32), "bg")
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c1"], ["s1"]),
        h.make_node("Mul", ["c1", "s1"], ["silu"]),
        h.make_node("Conv", ["silu", "w2"], ["c2"]),
        h.make_node("Add", ["c2", "silu"], ["a"]),
        h.make_node("MaxPool", ["a"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Concat", ["mp", "c2"], ["cat"], axis=1),
        h.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[4, 4], strides=[4, 4]),
        h.make_node("GlobalAveragePool", ["ap"], ["gp"]),
        h.make_node("Flatten", ["ap"], ["fl"]),
        h.make_node("Slice", ["fl", "st", "en", "ax"], ["sl"]),
        h.make_node("Gemm", ["sl", "wg", "bg"], ["y"], transB=1),
    ]
    inits = [
        w1,
        b1,
        w2,
        wg,
        bg,
        nh.from_array(np.array([0], np.int64), "st"),
        nh.from_array(np.array([32], np.int64), "en"),
        nh.from_array(np.array([1], np.int64), "ax"),
    ]
    g = h.make_graph(
        nodes,
        "small",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
        [
            h.make_tensor_value_info("y", T.FLOAT, [1, 5]),
            h.make_tensor_value_info("gp", T.FLOAT, [1, 16, 1, 1]),
        ],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    fp32 = d / "small.onnx"
    onnx.save(m, str(fp32))
    batches = [rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(8)]
    return {
        act: onnx.load(str(make_qdq(fp32, d / f"small_{act}.onnx", batches, act)))
        for act in ("uint8", "int8")
    }


@pytest.mark.parametrize("act", ["uint8", "int8"])
@pytest.mark.parametrize("mode", ["ort", "fixed_point"])
def test_per_op_lowering(small_qdq, act, mode):
    src = small_qdq[act]
    low, rep, params = lower_model(src, mode)
    assert rep["nodes"]["float"] == 0, [e for e in rep["per_node"] if e["status"] == "float"]
    assert rep["float_edges_between_lowered_ops"] == []
    res = compare(src, low, synthetic_feeds(src, 16, seed=3))
    assert res["within_1lsb"] >= 0.99 and res["max_error_lsb"] <= 2
    if mode == "fixed_point":
        assert rep["domains"] == ["ai.onnx"]
        kinds = {p["kind"] for p in params}
        assert {
            "conv",
            "matmul",
            "add",
            "mul",
            "lookup_table",
            "average_pool",
            "global_average_pool",
        } <= kinds
        feed = synthetic_feeds(src, 1, seed=5)[0]
        got = session(low).run(None, feed)
        ref = reference.run(low, feed)
        for o, v in zip(low.graph.output, got):
            assert np.array_equal(v, ref[o.name]), o.name


def _quantized_tensors(model, names):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in have)
    return m


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_per_op_onnxruntime_rounding(small_qdq, act):
    """rounding=onnxruntime: Conv/Gemm requantization, Add/Mul/Concat tables and lookup
    tables reproduce onnxruntime bit for bit on every quantized tensor; only what depends
    on the AveragePool (rounded half up: its kernel is not reproduced) may differ."""
    src = small_qdq[act]
    low, rep, params = lower_model(src, "fixed_point", "onnxruntime")
    assert rep["nodes"]["float"] == 0 and rep["domains"] == ["ai.onnx"]
    by_kind = {}
    for p in params:
        by_kind.setdefault(p["kind"], set()).add(p["rounding"])
    assert by_kind["conv"] == {"onnxruntime"} and by_kind["matmul"] == {"onnxruntime"}
    assert by_kind["lookup_table_2d"] == {"onnxruntime"}  # Add of two activations
    assert by_kind["average_pool"] == {"half_up"}
    assert by_kind["global_average_pool"] == {"onnxruntime"}
    produced = {t for n in low.graph.node for t in n.output}
    q_of = {n.input[0]: n.output[0] for n in src.graph.node if n.op_type == "QuantizeLinear"}
    upstream = [q_of[t] for t in ("c1", "silu", "c2", "a", "mp", "cat")]
    assert all(t in produced for t in upstream)
    # SiLU: Mul(x, Sigmoid(x)) became one 256-entry table of x; the Sigmoid's own output
    # had no other reader and is gone
    assert [p["composed_with"] for p in params if "composed_with" in p] != []
    assert q_of["s1"] not in produced
    feeds = synthetic_feeds(src, 16, seed=3)
    s_src = session(_quantized_tensors(src, upstream))
    s_low = session(_quantized_tensors(low, upstream))
    for feed in feeds:
        want = s_src.run(upstream, feed)
        got = s_low.run(upstream, feed)
        for t, w, v in zip(upstream, want, got):
            assert np.array_equal(w, v), t
    res = compare(src, low, feeds)
    assert res["within_1lsb"] >= 0.99
    got = session(low).run(None, feeds[0])
    ref = reference.run(low, feeds[0])
    for o, v in zip(low.graph.output, got):
        assert np.array_equal(v, ref[o.name]), o.name
