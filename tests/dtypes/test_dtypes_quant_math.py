"""Weight quantization arithmetic: packing as the spec requires, bit-exact agreement with
QuantizeLinear / DequantizeLinear in onnx's reference and onnxruntime for every dtype and
granularity, block_size validation, float8 saturation, scale types."""

from __future__ import annotations

import dtypes_testlib as lib
import numpy as np
import onnx
import onnx.helper as H
import pytest
from onnx import TensorProto as T
from qbuild_dtypes.numerics import arithmetic
from qbuild_dtypes.numerics.qtypes import make_qtensor, qtensor_values, qtype
from qbuild_onnx_common.errors import OnnxError


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2"])
@pytest.mark.parametrize("count", [1, 5, 8, 13])
def test_sub_byte_packing_matches_onnx(name, count):
    q = qtype(name)
    rng = np.random.default_rng(count)
    vals = rng.integers(int(q.qmin), int(q.qmax) + 1, size=count)
    t = make_qtensor("w", q, vals)
    assert len(t.raw_data) == -(-count * q.bits // 8)  # ceil: packed, zero-padded
    # onnx's own decoder is the independent oracle.
    assert np.array_equal(onnx.numpy_helper.to_array(t).astype(np.int64), vals)
    assert np.array_equal(qtensor_values(t), vals)
    if count == 5 and name == "int4":
        # element 0 in the low nibble of byte 0, element 1 in its high nibble
        assert t.raw_data[0] == ((vals[0] & 15) | ((vals[1] & 15) << 4))


def test_out_of_range_values_are_refused():
    with pytest.raises(OnnxError, match="outside the int4 range"):
        make_qtensor("w", qtype("int4"), np.array([8]))


CASES = [(d, g) for d in ["int8", "uint8", "int16", "uint16", "int4", "uint4",
                          "float8e4m3fn", "float8e5m2"]
         for g in ["per_tensor", "per_channel", "blocked"]]


def _q_model(w_shape, scale, zp, q, axis, block):
    inits = [onnx.numpy_helper.from_array(scale, "s")]
    ins = ["x", "s"]
    if zp is not None:
        inits.append(make_qtensor("z", q, zp))
        ins.append("z")
    kw = {}
    if axis is not None:
        kw["axis"] = axis
    if block:
        kw["block_size"] = block
    qn = H.make_node("QuantizeLinear", ins, ["q"], output_dtype=q.onnx, **kw)
    dq = H.make_node("DequantizeLinear", ["q"] + ins[1:], ["y"], **kw)
    g = H.make_graph([qn, dq], "g", [H.make_tensor_value_info("x", T.FLOAT, w_shape)],
                     [H.make_tensor_value_info("q", q.onnx, w_shape),
                      H.make_tensor_value_info("y", T.FLOAT, w_shape)], inits)
    m = H.make_model(g, opset_imports=[H.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("dtype,gran", CASES)
def test_weight_quantization_is_bit_exact_with_runtimes(dtype, gran):
    q = qtype(dtype)
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((6, 40)) * rng.uniform(0.01, 3, size=(6, 1))).astype(np.float32)
    axis = {"per_tensor": None, "per_channel": 0, "blocked": 1}[gran]
    block = 16 if gran == "blocked" else 0  # 40 = 16 + 16 + 8: an uneven last block
    symmetric = q.kind == "float" or dtype.startswith("int")
    scale, zp = arithmetic.choose_params(w, q, axis, block, symmetric, np.float32, "w")
    codes = arithmetic.quantize(w, scale, zp, q, 1 if axis is None else axis, block)
    approx = arithmetic.dequantize(codes, scale, zp, 1 if axis is None else axis, block)
    assert codes.min() >= q.qmin and codes.max() <= q.qmax
    floor = {"int4": 13, "uint4": 13, "int8": 30, "uint8": 30, "int16": 70, "uint16": 70,
             "float8e4m3fn": 25, "float8e5m2": 20}[dtype]
    assert arithmetic.sqnr_db(w, approx) > floor
    m = _q_model(list(w.shape), scale, zp, q, axis, block)
    x = onnx.numpy_helper.from_array(w, "x")
    ref_q, ref_y = lib.run_ref(m, [x])
    assert np.array_equal(ref_q, codes.astype(np.float64))
    assert np.array_equal(ref_y, approx.astype(np.float64))
    ort_q, ort_y = lib.run_ort(m, [x])
    assert np.array_equal(ort_q, codes.astype(np.float64))
    assert np.array_equal(ort_y, approx.astype(np.float64))


def test_block_size_range_follows_the_spec():
    assert arithmetic.block_size_range(6, 2) == (3, 5)
    assert arithmetic.block_size_range(64, 3) == (22, 31)
    for b in (3, 4, 5):
        arithmetic.validate_block_size(6, 2, b, "x")
    for b in (2, 6, 0, -1):
        with pytest.raises(OnnxError, match="block_size"):
            arithmetic.validate_block_size(6, 2, b, "x")
    arithmetic.validate_block_size(16, 1, 32, "x")  # one block longer than the axis is legal
    with pytest.raises(OnnxError, match="block_size 8 is invalid"):
        arithmetic.validate_block_size(16, 1, 8, "x")


def test_expand_param_rejects_what_the_reference_accepts():
    # x 2x6, scale 2x2: block_size 6 passes onnx's checker and reference silently.
    with pytest.raises(OnnxError, match=r"allows \[3, 5\]"):
        arithmetic.expand_param(np.ones((2, 2)), (2, 6), 1, 6, "DequantizeLinear 'dq'")


def test_float8_saturates_and_has_no_zero_point():
    x = np.array([1e6, -1e6, np.inf, 0.3], np.float32)
    e4 = arithmetic.quantize(x, np.float32(1), None, qtype("float8e4m3fn"))
    assert list(e4[:3]) == [448, -448, 448]
    e5 = arithmetic.quantize(x, np.float32(1), None, qtype("float8e5m2"))
    assert list(e5[:3]) == [57344, -57344, 57344]
    with pytest.raises(OnnxError, match="no zero point"):
        arithmetic.choose_params(x[3:], qtype("float8e4m3fn"), None, 0, False, np.float32, "w")


def test_scale_takes_the_weight_float_type():
    w = np.linspace(-1, 1, 64, dtype=np.float16).reshape(4, 16)
    scale, zp = arithmetic.choose_params(w, qtype("int4"), 1, 8, True, np.float16, "w")
    assert scale.dtype == np.float16 and scale.shape == (4, 2) and zp is None


def test_unsigned_symmetric_uses_the_mid_code():
    w = np.array([[-1.0, 0.5, 1.0]], np.float32)
    scale, zp = arithmetic.choose_params(w, qtype("uint4"), None, 0, True, np.float32, "w")
    assert int(zp) == 8 and np.isclose(scale, 1 / 7)
