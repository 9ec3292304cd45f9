"""Metrics on known arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from qbuild_onnx.accuracy.metrics import (
    ErrorAccumulator,
    compare_outputs,
    cosine_similarity,
    max_abs_error,
    sqnr_db,
)
from qbuild_onnx_common.errors import OnnxError


def test_sqnr_known_values():
    ref = np.array([3.0, 4.0])  # signal energy 25
    assert sqnr_db(ref, ref + np.array([0.5, 0.0])) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(ref, ref) == math.inf
    assert sqnr_db(np.zeros(2), np.ones(2)) == -math.inf


def test_sqnr_of_8bit_uniform_quantizer_is_about_6_db_per_bit():
    x = np.linspace(-1, 1, 100001)
    step = 2 / 255
    q = np.round(x / step) * step
    assert 47.0 < sqnr_db(x, q) < 49.5


def test_max_abs_and_cosine():
    a = np.array([1.0, -2.0, 3.0])
    assert max_abs_error(a, a + np.array([0, 0.25, -1.5])) == 1.5
    assert cosine_similarity(a, 2 * a) == pytest.approx(1.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert cosine_similarity([1.0, 0.0], [0.0, 1.0]) == pytest.approx(0.0)


def test_shape_mismatch_names_the_tensor():
    with pytest.raises(OnnxError, match="logits.*shape mismatch"):
        sqnr_db(np.zeros((2, 3)), np.zeros((3, 2)), "output 'logits'")


def test_accumulator_equals_metrics_of_concatenation():
    rng = np.random.default_rng(0)
    refs = [rng.normal(size=(4, 5)) for _ in range(3)]
    cands = [r + rng.normal(scale=0.1, size=r.shape) for r in refs]
    acc = ErrorAccumulator()
    for r, c in zip(refs, cands):
        acc.add(r, c)
    R, C = np.concatenate(refs), np.concatenate(cands)
    assert acc.sqnr_db() == pytest.approx(sqnr_db(R, C))
    assert acc.cosine() == pytest.approx(cosine_similarity(R, C))
    assert acc.max_abs == pytest.approx(max_abs_error(R, C))


def test_compare_outputs_per_output_and_missing_output():
    ref = [{"a": np.ones(3), "b": np.array([1.0, 2.0])}]
    rep = compare_outputs(ref, [{"a": np.ones(3), "b": np.array([1.0, 2.5])}])
    assert rep["a"]["sqnr_db"] == "inf"
    assert rep["b"]["max_abs_error"] == 0.5
    with pytest.raises(OnnxError, match="output 'b' is missing"):
        compare_outputs(ref, [{"a": np.ones(3)}])
