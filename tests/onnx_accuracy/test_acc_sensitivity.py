"""Sensitivity ranking on MNIST with one activation made deliberately sensitive."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from acc_paths import MODELS
from qbuild_onnx.accuracy.metrics import run_model, sqnr_db
from qbuild_onnx.accuracy.ortq import quantize_qdq
from qbuild_onnx.accuracy.sensitivity import analyze, dequantize_sites, find_sites
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session

SENSITIVE = "Input3"


@pytest.fixture(scope="module")
def mnist_pre(tmp_path_factory):
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    d = tmp_path_factory.mktemp("mnist")
    m13 = version_converter.convert_version(onnx.load(MODELS / "mnist.onnx"), 13)
    onnx.save(m13, d / "m13.onnx")
    quant_pre_process(str(d / "m13.onnx"), str(d / "pre.onnx"))
    return d / "pre.onnx"


@pytest.fixture(scope="module")
def mnist_sensitive_qdq(mnist_pre, mnist_feeds):
    # A range 1000× too wide on one tensor: its 8-bit grid swallows the signal.
    out = mnist_pre.parent / "q_sensitive.onnx"
    return quantize_qdq(mnist_pre, out, mnist_feeds, per_channel=False,
                        overrides={"tensors": {SENSITIVE: {"rmin": 0.0, "rmax": 300.0}}})


def test_sites_found(mnist_sensitive_qdq, mnist_pre):
    sites = find_sites(mnist_sensitive_qdq, mnist_pre)
    acts = {s.name for s in sites if s.kind == "activation"}
    weights = {s.name for s in sites if s.kind == "weight"}
    assert {"Input3", "Pooling66_Output_0"} <= acts
    assert {"Parameter5", "Parameter87"} <= weights


def test_all_sites_float_is_the_float_model(mnist_sensitive_qdq, mnist_pre, mnist_feeds):
    sites = find_sites(mnist_sensitive_qdq, mnist_pre)
    m = dequantize_sites(onnx.load(mnist_sensitive_qdq), sites, onnx.load(mnist_pre))
    assert not [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    ref = run_model(session(mnist_pre, optimize=False), mnist_feeds[:4])
    got = run_model(session(m.SerializeToString(), optimize=False), mnist_feeds[:4])
    name = next(iter(ref[0]))
    assert sqnr_db(ref[0][name], got[0][name]) > 100


@pytest.mark.parametrize("mode", ["only", "leave_out"])
def test_sensitive_tensor_ranks_first(mode, mnist_sensitive_qdq, mnist_pre, mnist_feeds):
    rep = analyze(mnist_sensitive_qdq, mnist_pre, mnist_feeds, mode=mode)
    top = rep["ranking"][0]
    short = [(r["site"], r["score"], r["effect"]) for r in rep["ranking"][:4]]
    assert top["site"] == SENSITIVE and top["kind"] == "activation", short
    second = rep["ranking"][1]
    if mode == "only":
        assert top["score"] < second["score"] - 3  # dB
    else:
        assert top["effect"] > 3 and top["effect"] > second["effect"] + 3


def test_normal_quantization_has_no_such_outlier(mnist_pre, mnist_feeds):
    q = quantize_qdq(mnist_pre, mnist_pre.parent / "q.onnx", mnist_feeds, per_channel=False)
    rep = analyze(q, mnist_pre, mnist_feeds, mode="only", kinds=("activation",))
    scores = [r["score"] for r in rep["ranking"]]
    assert all(isinstance(s, float) and s > 20 for s in scores)
    assert rep["quantized_model_score"] > 15


def test_bad_mode_and_float_model(mnist_pre, mnist_feeds):
    with pytest.raises(OnnxError, match="mode"):
        analyze(mnist_pre, mnist_pre, mnist_feeds, mode="bogus")
    with pytest.raises(OnnxError, match="no quantization sites"):
        analyze(mnist_pre, mnist_pre, mnist_feeds)
    assert np.isfinite(1.0)


def test_weight_sites_found_when_the_float_model_has_unnamed_nodes(mnist_sensitive_qdq,
                                                                     mnist_pre, mnist_feeds):
    # quantize names unnamed nodes (UltraFace after pre-processing has them), so the QDQ
    # model's Conv names are not in the float model: the float weight is then found
    # through onnxruntime's '<weight>_quantized' initializer name
    fm = onnx.load(mnist_pre)
    for n in fm.graph.node:
        n.name = ""
    sites = find_sites(mnist_sensitive_qdq, fm)
    assert {"Parameter5", "Parameter87"} <= {s.name for s in sites if s.kind == "weight"}
    m = dequantize_sites(onnx.load(mnist_sensitive_qdq), sites, fm)
    ref = run_model(session(mnist_pre, optimize=False), mnist_feeds[:4])
    got = run_model(session(m.SerializeToString(), optimize=False), mnist_feeds[:4])
    name = next(iter(ref[0]))
    assert sqnr_db(ref[0][name], got[0][name]) > 100
    rep = analyze(mnist_sensitive_qdq, fm, mnist_feeds[:4], mode="only",
                  kinds=("activation",))
    assert rep["ranking"][0]["site"] == SENSITIVE


@pytest.mark.parametrize("mode", ["only", "leave_out"])
def test_a_coarse_task_metric_ties_are_ranked_by_output_sqnr(mode, mnist_sensitive_qdq,
                                                            mnist_pre, mnist_feeds):
    """A task score that ties every site (F1 on a few samples often does) leaves the order
    to the worst output SQNR, never to site names: the region and top-k trials of
    auto_quantize read this order past its first entries."""
    rep = analyze(mnist_sensitive_qdq, mnist_pre, mnist_feeds, mode=mode,
                  kinds=("activation",), metric=lambda ref, outs: 1.0)
    worst = [min(r["per_output_sqnr_db"].values()) for r in rep["ranking"]]
    assert worst == sorted(worst, reverse=mode == "leave_out")
    assert rep["ranking"][0]["site"] == SENSITIVE
    assert "_per" not in rep["ranking"][0]
