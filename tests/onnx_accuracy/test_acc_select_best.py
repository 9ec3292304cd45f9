"""Automatic mixed precision as a composition of cached targets: a matrix of
mixed_precision -> quantize (overrides label) -> evaluate trials, and select_best picking the
cheapest trial that meets a target (MNIST, through the real engine)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from acc_paths import MODELS
from qbuild_onnx.accuracy.mixed_precision import overrides_for_tensors, search
from qbuild_onnx.rules.accuracy import select, trial_score
from qbuild_onnx.source.datasets import write_dataset

TRIALS = [0, 1, 2, 4]

BUILD = """
[fp]
rule = "onnx_model"
src = "pre.onnx"

[ds]
rule = "saved_dataset"
srcs = ["ds/*"]

[calib]
rule = "calibrate"
model = ":fp"
dataset = ":ds"

[base]
rule = "quantize"
model = ":fp"
calibration = ":calib"
per_channel = false  # the documented per-tensor scenario (per-channel is the default)

[sens]
rule = "sensitivity"
model = ":base"
reference = ":fp"
dataset = ":ds"
kinds = ["activation"]

[mp]
rule = "mixed_precision"
model = ":fp"
sensitivity = ":sens"
matrix = {{ top_k = {trials} }}

[q]
rule = "quantize"
model = ":fp"
calibration = ":calib"
overrides = ":mp@top_k={{trial}}"
per_channel = false
matrix = {{ trial = {trials} }}

[ev]
rule = "evaluate"
models = [":q@trial={{trial}}"]
reference = ":fp"
dataset = ":ds"
matrix = {{ trial = {trials} }}

[best]
rule = "select_best"
models = {models}
reports = {reports}
metric = "sqnr_db"
threshold = {threshold}
"""


def _build_file(threshold: float) -> str:
    return BUILD.format(trials=TRIALS, threshold=threshold,
                        models='[":q"]', reports='[":ev"]')  # groups: all variants


def _setup(ws, tmp_path, feeds):
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    m13 = version_converter.convert_version(onnx.load(MODELS / "mnist.onnx"), 21)
    onnx.save(m13, tmp_path / "m13.onnx")
    quant_pre_process(str(tmp_path / "m13.onnx"), str(tmp_path / "pre.onnx"))
    # mnist.onnx is IR 3 (initializers must be graph inputs); pre-processing drops those
    # inputs but keeps the IR version, which onnx_model's check refuses
    pre = onnx.load(tmp_path / "pre.onnx")
    pre.ir_version = max(pre.ir_version, 7)
    onnx.save(pre, tmp_path / "pre.onnx")
    write_dataset(tmp_path / "ds", {"Input3": np.concatenate([f["Input3"] for f in feeds])})
    ws.copy(tmp_path / "pre.onnx", "m/pre.onnx")
    for f in sorted((tmp_path / "ds").iterdir()):
        ws.copy(f, f"m/ds/{f.name}")


def _report(outcome, label="//m:best"):
    path = next(p for p in outcome.outputs(label) if p.name == "report.json")
    return json.loads(path.read_text())


def test_select_best_over_cached_trials(qbuild_workspace, tmp_path, mnist_feeds):
    # Measured worst-output SQNR on these inputs: k=0 30.9 dB, k=1 and k=2 31.7, k=4 31.7.
    ws = qbuild_workspace
    _setup(ws, tmp_path, mnist_feeds)
    ws.write("m/BUILD.toml", _build_file(31.3))
    r = ws.build("//m:best")
    assert r.ok, r.error
    rep = _report(r)
    assert [t["promoted"] for t in rep["trials"]] == TRIALS
    assert rep["chosen"] == "//m:q@trial=1"
    from qbuild_onnx_common.providers import OnnxModelInfo

    best = r.provider("//m:best", OnnxModelInfo)  # the chosen trial's promoted tensors
    assert len(best.promoted) == 1 and list(best.promoted) == rep["trials"][1]["tensors"]
    chosen = next(p for p in r.outputs("//m:best") if p.suffix == ".onnx")
    assert chosen.name == "best.onnx"
    trial_model = ws.build("//m:q@trial=1")
    assert chosen.read_bytes() == trial_model.outputs("//m:q@trial=1")[0].parent.joinpath(
        "q@trial=1.onnx").read_bytes()
    # The promoted tensor really is 16-bit in the chosen model.
    promoted = best.promoted[0]
    q = onnx.load(str(chosen))
    zps = {i.name: i for i in q.graph.initializer}
    types = {n.name: zps[n.input[2]].data_type for n in q.graph.node
             if n.op_type == "QuantizeLinear"}
    assert types.pop(f"{promoted}_QuantizeLinear") == onnx.TensorProto.UINT16
    assert set(types.values()) == {onnx.TensorProto.UINT8}

    again = ws.build("//m:best")
    assert again.ok and again.ran == []

    # Only the selection reruns when the target changes; every trial stays cached.
    ws.write("m/BUILD.toml", _build_file(20.0))
    looser = ws.build("//m:best")
    assert looser.ok, looser.error
    assert looser.ran == ["//m:best"]
    assert _report(looser)["chosen"] == "//m:q@trial=0"

    ws.write("m/BUILD.toml", _build_file(40.0))
    bad = ws.build("//m:best")
    assert not bad.ok and bad.ran == [] and list(bad.failed) == ["//m:best"]
    assert "no candidate meets sqnr_db >= 40.0" in bad.error


def _entry(sqnrs, f1=None):
    e = {"outputs": {f"o{i}": {"sqnr_db": s, "cosine": 0.9, "max_abs_error": 0.1 * (i + 1)}
                     for i, s in enumerate(sqnrs)}}
    if f1 is not None:
        e["detection"] = {"f1": f1}
    return e


def test_trial_score_and_select():
    e = _entry([30.0, "inf", 12.5], f1=0.8)
    assert trial_score(e, "sqnr_db") == 12.5
    assert trial_score(e, "sqnr_db", "o1") == float("inf")
    assert trial_score(e, "max_abs_error") == pytest.approx(0.3)
    assert trial_score(e, "f1") == 0.8
    with pytest.raises(KeyError, match="task = 'yolo'"):
        trial_score(_entry([1.0]), "f1")
    with pytest.raises(KeyError, match="no output 'x'"):
        trial_score(e, "sqnr_db", "x")
    trials = [{"model": m, "index": i, "promoted": p, "score": s}
              for i, (m, p, s) in enumerate([("a", 4, 40.0), ("b", 1, 35.0), ("c", 2, 36.0),
                                             ("d", 1, 20.0)])]
    assert select(trials, "sqnr_db", 30.0)["model"] == "b"
    assert select(trials, "sqnr_db", 36.0)["model"] == "c"
    assert select(trials, "sqnr_db", 50.0) is None
    assert select(trials, "max_abs_error", 25.0)["model"] == "d"


def test_search_adds_ranked_tensors_until_the_target(tmp_path):
    model = MODELS / "mnist.onnx"
    m = onnx.load(model)
    ranking = [n.output[0] for n in m.graph.node][:5]
    seen = []

    def trial(doc):  # a stand-in score: the number of 16-bit tensors
        seen.append(sorted(doc["tensors"]))
        return 10.0 * len(doc["tensors"])

    logs = []
    res = search(model, ranking, trial, target=25.0, steps=(1, 2, 3, 4), log=logs.append)
    assert res["met"] and res["k"] == 3 and res["score"] == 30.0
    assert [t["k"] for t in res["trials"]] == [0, 1, 2, 3]
    assert res["overrides"] == overrides_for_tensors(model, ranking[:3])
    assert seen[-1] == sorted(ranking[:3]) and len(logs) == 4

    # Never met: the best trial comes back with met = false; k stops at the ranking length.
    res = search(model, ranking[:2], lambda d: -abs(len(d["tensors"]) - 1), target=1.0,
                 steps=(1, 2, 3))
    assert not res["met"] and res["k"] == 1 and [t["k"] for t in res["trials"]] == [0, 1, 2]

    # base is merged under every trial; action float excludes producer and consumers.
    base = {"tensors": {ranking[4]: {"symmetric": True}}, "nodes_to_exclude": []}
    res = search(model, ranking, lambda d: 1.0, target=0.0, base=base)
    assert res["k"] == 0 and res["overrides"]["tensors"] == base["tensors"]
    res = search(model, ranking, lambda d: len(d["nodes_to_exclude"]), target=1.0,
                 action="float")
    assert res["k"] == 1 and res["overrides"]["tensors"] == {}
    producer = m.graph.node[0].name
    assert producer in res["overrides"]["nodes_to_exclude"]
