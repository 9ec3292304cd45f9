"""The ONNX specification's QuantizeLinear / DequantizeLinear node tests, run through the
plugin's own numpy arithmetic, onnx's reference evaluator and onnxruntime, and through both
QDQ forms after the plugin's conversion."""

from __future__ import annotations

import dtypes_testlib as lib
import numpy as np
import onnx
import pytest
from qbuild_dtypes.conversion import forms
from qbuild_dtypes.numerics import arithmetic
from qbuild_dtypes.numerics.qtypes import qtensor_values, qtype
from qbuild_dtypes.runtime import targets
from qbuild_onnx_common.graph import attr

CASES = lib.qdq_cases()


def test_every_qdq_node_test_is_present():
    assert len(CASES) == 27
    assert "test_quantizelinear_blocked_symmetric" in CASES


def _node(model):
    (node,) = [n for n in model.graph.node if n.op_type in ("QuantizeLinear",
                                                            "DequantizeLinear")]
    return node


@pytest.mark.parametrize("case", CASES)
def test_plugin_arithmetic_matches_spec(case):
    model, ins, (expected,) = lib.load_case(case)
    node = _node(model)
    axis, block = int(attr(node, "axis", 1)), int(attr(node, "block_size", 0))
    zp = qtensor_values(ins[2]) if len(ins) > 2 else None
    scale = onnx.numpy_helper.to_array(ins[1])
    if node.op_type == "QuantizeLinear":
        elem = int(attr(node, "output_dtype", 0)) or (ins[2].data_type if len(ins) > 2
                                                      else onnx.TensorProto.UINT8)
        got = arithmetic.quantize(onnx.numpy_helper.to_array(ins[0]), scale, zp, qtype(elem),
                             axis, block, saturate=bool(attr(node, "saturate", 1)))
        want = qtensor_values(expected)
    else:
        got = arithmetic.dequantize(qtensor_values(ins[0]), scale, zp, axis, block)
        want = onnx.numpy_helper.to_array(expected)
    assert got.shape == want.shape
    assert np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64),
                          equal_nan=True), case


@pytest.mark.parametrize("case", CASES)
def test_reference_and_onnxruntime_match_spec(case):
    model, ins, (expected,) = lib.load_case(case)
    want = lib.as_float(expected)
    assert lib.same(lib.run_ref(model, ins)[0], want)
    node = _node(model)
    elem = (int(attr(node, "output_dtype", 0)) or (ins[2].data_type if len(ins) > 2 else 2)
            if node.op_type == "QuantizeLinear" else ins[0].data_type)
    runs_in_ort = targets.ONNXRUNTIME_CPU.allows_qtype(qtype(elem).name)
    if runs_in_ort:
        assert lib.same(lib.run_ort(model, ins)[0], want), case
    elif node.op_type == "QuantizeLinear":
        # The target table says onnxruntime 1.31 cannot: check that it really cannot.
        with pytest.raises(Exception, match="NOT_IMPLEMENTED|not implemented|Could not find"):
            lib.run_ort(model, ins)


@pytest.mark.parametrize("form", ["output_dtype", "zero_point"])
@pytest.mark.parametrize("case", CASES)
def test_both_forms_compute_the_spec_result(case, form):
    model, ins, (expected,) = lib.load_case(case)
    baked, feeds = lib.bake(model, ins)
    target = targets.ONNX_REFERENCE
    converted, stats = forms.convert_form(baked, target, form)
    onnx.checker.check_model(converted, full_check=True)
    node = _node(converted)
    is_q = node.op_type == "QuantizeLinear"
    if form == "zero_point":
        assert len(node.input) == 3 and not attr(node, "output_dtype", 0)
    elif is_q:
        assert attr(node, "output_dtype", 0)
    zp_zero = len(ins) > 2 and not np.any(qtensor_values(ins[2]))
    if form == "output_dtype" and (zp_zero or len(ins) == 2):
        assert len(node.input) == 2, "an all-zero zero point must be elided"
    assert lib.same(lib.run_ref(converted, feeds)[0], lib.as_float(expected))
    elem = (int(attr(node, "output_dtype", 0)) or expected.data_type if is_q
            else ins[0].data_type)
    if targets.ONNXRUNTIME_CPU.allows_qtype(qtype(elem).name):
        assert lib.same(lib.run_ort(converted, feeds)[0], lib.as_float(expected))
