"""Multiplier decomposition and requantization rounding against exact rational arithmetic,
and the emitted ONNX requantization graph (run by onnxruntime and by the reference)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import helper
from qbuild_lower.arithmetic import fixedpoint as fp
from qbuild_lower.checking import reference
from qbuild_lower.emit.builder import Builder
from qbuild_lower.qdq.graph import Graph
from qbuild_onnx_common.ort import session


@pytest.mark.parametrize("m", [0.3, 0.5, 0.999999, 1.0, 1.7, 3.0e3, 2.0**-20, 1.234e-9,
                               0.0072])
def test_decompose_precision(m):
    d = fp.decompose(m)
    assert 1 <= d.shift <= fp.MAX_SHIFT
    assert 2**30 <= d.m0 < 2**31
    exact = Fraction(d.m0, 2**d.shift)
    assert abs(exact - Fraction(m)) <= Fraction(m) * Fraction(1, 2**31)


def test_decompose_edges():
    assert fp.decompose(0.0) == fp.Multiplier(0, 1)
    # 1 - 2**-40 rounds up to 2**31 and renormalises
    d = fp.decompose(1 - 2.0**-40)
    assert (d.m0, d.shift) == (2**30, 30)
    # M >= 2**30 keeps shift 1 with an exact larger M0
    d = fp.decompose(2.0**31)
    assert Fraction(d.m0, 2**d.shift) == 2**31 and d.shift == 1
    # tiny M: shift capped, precision given up, never an illegal shift
    d = fp.decompose(1e-25)
    assert d.shift == fp.MAX_SHIFT and d.m0 < 2**30
    with pytest.raises(ValueError):
        fp.decompose(-1.0)


def test_decompose_per_channel_vector():
    rng = np.random.default_rng(0)
    ms = np.concatenate([rng.uniform(1e-6, 4.0, 200), [0.25, 1.0, 2.0]])
    m0, shift = fp.decompose_all(ms)
    for m, q, s in zip(ms, m0, shift):
        assert abs(Fraction(int(q), 2 ** int(s)) - Fraction(float(m))) <= Fraction(float(m)) / 2**31


def test_shared_shift_keeps_precision_of_largest():
    m0, s = fp.shared_shift([0.4, 0.013])
    assert 2**30 <= m0[0] < 2**31
    assert abs(Fraction(int(m0[1]), 2**s) - Fraction(0.013)) <= Fraction(1, 2**s)


def _exact(acc, m0, shift, zp, lo, hi):
    v = Fraction(acc * m0, 2**shift) + Fraction(1, 2)
    return min(max(zp + math.floor(v), lo), hi)


def test_requantize_matches_fraction_including_ties():
    rng = np.random.default_rng(1)
    acc = np.concatenate([rng.integers(-(2**24), 2**24, 3000), np.arange(-40, 41)])
    for m in (0.0123, 0.5, 0.25, 1.5, 3.7e-4):  # 0.5, 0.25, 1.5 produce exact ties
        d = fp.decompose(m)
        got = fp.requantize(acc, d.m0, d.shift, 3, -128, 127)
        want = [_exact(int(a), d.m0, d.shift, 3, -128, 127) for a in acc]
        assert got.tolist() == want
    # ties go up: -2.5 -> -2, 2.5 -> 3
    d = fp.decompose(0.5)
    assert fp.requantize(np.array([-5, 5]), d.m0, d.shift, 0, -128, 127).tolist() == [-2, 3]


def test_requant_graph_bit_exact_in_ort_and_reference():
    """The standard-ONNX requantization tail (Add, truncating Div, Add, Clip, Cast) equals
    the exact definition for negative and positive accumulators, per channel."""
    rng = np.random.default_rng(2)
    ms = np.array([0.0031, 0.77, 1.9, 2.0**-12])
    m0, shift = fp.decompose_all(ms)
    acc = rng.integers(-(2**22), 2**22, size=(3, 4, 50)).astype(np.int64)
    acc[0, :, :9] = np.arange(-4, 5)  # small values around 0 (sign handling)
    dummy = helper.make_model(helper.make_graph([], "g", [], []))
    b = Builder(Graph.from_model(dummy), "fixed_point")
    b.node("Mul", ["acc", b.const("m0", m0.reshape(4, 1))], ["prod"], "mul")
    bias = np.array([-(2**40), 5, 0, 2**35], dtype=object)
    fp_bias = bias * m0.astype(object)
    from qbuild_lower.emit.requantize import requant_tail

    requant_tail(b, "prod", shift, fp_bias, -3, np.int8, "y", "t", (4, 1), prod_bound=2**22 * 2**31)
    g = helper.make_graph(b.nodes, "rq",
                          [helper.make_tensor_value_info("acc", onnx.TensorProto.INT64, acc.shape)],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.INT8, acc.shape)],
                          b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    got = session(model).run(None, {"acc": acc})[0]
    ref = reference.run(model, {"acc": acc})["y"]
    assert np.array_equal(got, ref)
    for c in range(4):
        want = [_exact(int(a), int(m0[c]), int(shift[c]), -3, -128, 127) for a in acc[:, c].ravel()]
        with_bias = [min(max(-3 + math.floor(Fraction(int(a) * int(m0[c]) + int(fp_bias[c]),
                                                        2 ** int(shift[c])) + Fraction(1, 2)),
                             -128), 127) for a in acc[:, c].ravel()]
        assert got[:, c].ravel().tolist() == with_bias
        assert len(want) == len(with_bias)


def _near_ties(rng, scale: float, n: int) -> np.ndarray:
    """Accumulators whose product with ``scale`` falls next to a half-integer, where
    float32 and exact rounding part ways."""
    h = rng.integers(-260, 260, n) + 0.5
    acc = np.rint(h / scale).astype(np.int64) + rng.integers(-1, 2, n)
    return acc[np.abs(acc) < fp.FLOAT32_EXACT]


def test_onnxruntime_rounding_equals_float32_formula():
    """Integer-only emulation == onnxruntime's rint(float32(acc) * float32(S)), on
    accumulators chosen next to half-integers (where half-up differs from it)."""
    rng = np.random.default_rng(3)
    differs_from_half_up = 0
    for _ in range(400):
        s = np.float32(np.exp(rng.uniform(np.log(1e-5), np.log(4.0))))
        d = fp.decompose(float(s))
        assert fp.exact_float32(d.m0, d.shift, s)
        zp, (lo, hi) = int(rng.integers(-128, 128)), (-128, 127)
        acc = np.concatenate([_near_ties(rng, float(s), 1500),
                              rng.integers(-int(300 / s), int(300 / s) + 1, 200)])
        want = fp.requantize_float32(acc, s, zp, lo, hi)
        got = fp.requantize_onnxruntime(acc, d.m0, d.shift, zp, lo, hi)
        assert np.array_equal(got, want), s
        differs_from_half_up += int((fp.requantize(acc, d.m0, d.shift, zp, lo, hi) != want).sum())
    assert differs_from_half_up > 1000  # the cases exist, and the emulation handles them


def test_onnxruntime_rounding_graph_in_ort_and_reference():
    """The emitted correction (standard integer ops only) equals the float32 formula per
    channel, with a folded bias, in onnxruntime and in the numpy reference."""
    from qbuild_lower.emit.requantize import requant_tail

    rng = np.random.default_rng(4)
    scales = np.array([0.0031, 0.77, 0.0123, 2.0**-12 * 1.37], np.float32)
    m0, shift = fp.decompose_all(scales)
    acc = np.stack([_near_ties(rng, float(s), 4000)[:3000] for s in scales], axis=1)
    acc = acc.reshape(3000, 4, 1)
    bias = np.array([-17, 5, 0, 300], dtype=np.int64)
    acc_nb = acc - bias.reshape(4, 1)  # the graph adds the bias back (folded, times M0)
    dummy = helper.make_model(helper.make_graph([], "g", [], []))
    b = Builder(Graph.from_model(dummy), "fixed_point")
    b.node("Mul", ["acc", b.const("m0", m0.reshape(4, 1))], ["prod"], "mul")
    requant_tail(b, "prod", shift, bias.astype(object) * m0.astype(object), 7, np.uint8, "y",
                 "t", (4, 1), prod_bound=2**24 * 2**31, rounding="onnxruntime")
    g = helper.make_graph(
        b.nodes, "rq",
        [helper.make_tensor_value_info("acc", onnx.TensorProto.INT64, acc.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, acc.shape)], b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    got = session(model).run(None, {"acc": acc_nb})[0]
    ref = reference.run(model, {"acc": acc_nb})["y"]
    assert np.array_equal(got, ref)
    for c in range(4):
        want = fp.requantize_float32(acc[:, c, 0], scales[c], 7, 0, 255)
        assert np.array_equal(got[:, c, 0], want), c


def test_float32_accumulator_rounding_graph():
    """Accumulators of 2**24 and more: the integer graph rounds them to float32's 24
    significant bits (ties to even), as onnxruntime's int32 -> float32 conversion does."""
    from qbuild_lower.lowering.accumulator import float32_accumulator

    rng = np.random.default_rng(5)
    big = rng.integers(-(2**30), 2**30, 4000)
    ties = np.array([2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**25 + 2, 2**25 + 6, 2**26 + 4,
                     2**26 + 12, 2**24 - 1, 0, 1, -1, 2**30 - 1])
    acc = np.concatenate([big, ties]).astype(np.int64)
    dummy = helper.make_model(helper.make_graph([], "g", [], []))
    b = Builder(Graph.from_model(dummy), "fixed_point")
    out, _ = float32_accumulator(b, "acc", 2**30, "f")
    g = helper.make_graph(
        b.nodes, "f32", [helper.make_tensor_value_info("acc", onnx.TensorProto.INT64, acc.shape)],
        [helper.make_tensor_value_info(out, onnx.TensorProto.INT64, acc.shape)], b.inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    want = fp.round_to_float32(acc)
    assert not np.array_equal(want, acc)
    assert np.array_equal(session(model).run(None, {"acc": acc})[0], want)
    assert np.array_equal(reference.run(model, {"acc": acc})[out], want)
