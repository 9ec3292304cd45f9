"""Honest figures: interleaved timings with spread, onnxruntime per-op profiles side by
side (the profile rule), the evaluate rule's interleaved latency, and the unfused-op cost
in the lowering report. Structure and consistency only: never timed assertions."""

from __future__ import annotations

import json

import onnx
import pytest
from qbuild_lower.checking.feeds import random_feeds
from qbuild_lower.lowering.driver import lower_model
from qbuild_lower.profiling.macs import macs
from qbuild_lower.profiling.timing import interleaved_latency, op_profile
from test_lower_tables import cnn_qdq, small_cnn  # noqa: F401  (fixture)


def test_interleaved_latency_and_profile(cnn_qdq, tmp_path):  # noqa: F811
    onnx.save(small_cnn(), str(tmp_path / "f.onnx"))
    models = {"float": tmp_path / "f.onnx", "qdq": cnn_qdq}
    feed = random_feeds(small_cnn(), 1)[0]
    lat = interleaved_latency(models, feed, threads=1, runs=5, warmup=1, reference="float")
    assert lat["order"] == "interleaved" and lat["threads"] == 1
    for name, m in lat["models"].items():
        assert m["runs"] == 5 and m["q1_ms"] <= m["median_ms"] <= m["q3_ms"]
        assert isinstance(m["noisy"], bool)
        # one thread: "slower" is decided on CPU time, steady under load (wall is not)
        assert m["slower_basis"] == "cpu"
        assert m["slower_than_reference"] == (name != "float"
                                              and m["cpu"]["median_ms"] > lat["models"]
                                              ["float"]["cpu"]["median_ms"])
        # one thread: each run's CPU time is recorded beside its wall time, and a run
        # cannot use more CPU on one thread than the wall time it took
        c = m["cpu"]
        assert c["runs"] == 5 and 0 < c["min_ms"] <= c["median_ms"] <= c["q3_ms"]
        assert c["min_ms"] <= m["q3_ms"] * 1.05
        assert c["speedup"] == round(lat["models"]["float"]["cpu"]["median_ms"]
                                     / c["median_ms"], 3)
        assert c["slower_than_reference"] == (name != "float" and c["median_ms"] >
                                              lat["models"]["float"]["cpu"]["median_ms"])
    two = interleaved_latency(models, feed, threads=2, runs=2, warmup=0, reference="float")
    assert all("cpu" not in m for m in two["models"].values())  # not the run's whole cost
    assert two["models"]["qdq"]["slower_basis"] == "wall"
    assert two["models"]["qdq"]["slower_than_reference"] == (
        two["models"]["qdq"]["median_ms"] > two["models"]["float"]["median_ms"])
    prof = op_profile(cnn_qdq, feed, threads=1, runs=3, warmup=1, top=5)
    assert prof["runs"] == 3 and "QLinearConv" in prof["op_types"]
    assert len(prof["top_nodes"]) == 5
    assert abs(sum(t["share"] for t in prof["op_types"].values()) - 1) < 0.01
    # each node's fastest run: never above the per-run median of its op type
    for t in prof["op_types"].values():
        assert 0 <= t["min_ms"] <= t["ms"] + 1e-3
    assert prof["kernel_min_ms"] == pytest.approx(
        sum(t["min_ms"] for t in prof["op_types"].values()), abs=1e-3)
    # the QDQ model counts the same multiply-accumulates as its float source
    assert macs(onnx.load(str(cnn_qdq)))["total"] == macs(small_cnn())["total"] == (
        9 * 16 * 16 * 8 * 9 * 8 - 16 * 16 * 8 * 9 * 5)


def test_profile_rule_and_unfused_cost(qbuild_workspace, cnn_qdq, tmp_path):  # noqa: F811
    ws = qbuild_workspace
    onnx.save(small_cnn(), str(tmp_path / "f.onnx"))
    ws.copy(tmp_path / "f.onnx", "m/f.onnx")
    ws.copy(cnn_qdq, "m/qdq.onnx")
    ws.write("m/BUILD.toml", """
[f]
rule = "onnx_model"
src = "f.onnx"

[qdq]
rule = "onnx_model"
src = "qdq.onnx"

[low]
rule = "lower_integer"
model = ":qdq"
max_samples = 1
profile_runs = 2

[prof]
rule = "profile"
models = [":qdq", ":low"]
reference = ":f"
runs = 3
warmup = 1
profile_runs = 2
""")
    r = ws.build("//m:prof", "//m:low")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:prof")}
    rep = json.loads(outs["report.json"].read_text())
    assert rep["reference"] == "//m:f" and set(rep["models"]) == {"//m:f", "//m:qdq", "//m:low"}
    assert rep["latency"]["threads"] == 1 and rep["latency"]["runs"] == 3
    assert set(rep["conditions"]) == {"before", "after"}
    md = outs["report.md"].read_text()
    assert "| QLinearConv |" in md and "//m:low" in md
    cpu = rep["latency"]["models"]["//m:low"]["cpu"]
    assert f"{cpu['median_ms']:.3f} ({cpu['spread']:.1%})" in md  # the CPU column
    low = json.loads(next(p for p in r.outputs("//m:low") if p.name == "report.json")
                      .read_text())
    assert low["profile"]["threads"] == 1 and low["profile"]["unfused"] == []
    assert "GatherElements" in low["profile"]["op_types"]  # the GELU table


def test_lowering_report_lists_float_nodes_with_cost(cnn_qdq):  # noqa: F811
    from qbuild_lower.rules.lower_integer import _unfused_cost

    src = onnx.load(str(cnn_qdq))
    # a float consumer of the last Conv's output keeps that Conv in float
    last = next(n for n in reversed(src.graph.node) if n.op_type == "Conv")
    src.graph.output.append(onnx.helper.make_tensor_value_info(last.output[0], 1, None))
    low, rep, _ = lower_model(src, "ort")
    prof = _unfused_cost(low, rep, random_feeds(src, 1)[0], 2)
    names = {u["node"]: u for u in prof["unfused"]}
    assert last.name in names and names[last.name]["ms"] is not None
    assert prof["unfused_ms"] >= names[last.name]["ms"]


def test_evaluate_latency_is_interleaved_and_flags_slower(cnn_qdq, tmp_path):  # noqa: F811
    from qbuild_onnx.rules.accuracy import _latency
    from qbuild_onnx_common.ort import session

    onnx.save(small_cnn(), str(tmp_path / "f.onnx"))
    sessions = {"//ref": session(tmp_path / "f.onnx"), "//q": session(cnn_qdq)}
    report = {"models": {"//q": {}}}
    feed = random_feeds(small_cnn(), 1)[0]
    _latency(report, sessions, feed, 4, ["//ref"])
    lat = report["latency"]
    assert lat["order"] == "interleaved" and lat["threads"] == 1 and lat["runs"] == 4
    q = report["models"]["//q"]
    assert q["latency_ms"] == q["latency"]["median_ms"]
    assert q["latency"]["ratio_to_reference"] > 0  # per-round ratio to the reference
    assert q["latency"]["cpu"]["ratio_to_reference"] > 0 and q["latency"]["cpu"]["runs"] == 4
    from qbuild_onnx_common.latency import inside_noise

    slower = (q["latency"]["cpu"]["median_ms"] > lat["reference"]["cpu"]["median_ms"]
              and not inside_noise(q["latency"]["cpu"]))
    assert q["latency"]["slower_basis"] == "cpu"
    assert q["latency"]["slower_than_reference"] == slower
    assert lat["slower_than_reference"] == (["//q"] if slower else [])
    # the HTML report says it too, on the same basis
    from qbuild_onnx.report.html import evaluate_html

    report.update(reference="//ref", samples=1, task="sqnr")
    q.update(outputs={}, bytes=1)
    note = "slower than the reference" if slower else "speed vs reference (CPU time"
    assert note in evaluate_html(report)


def test_slower_verdict_uses_cpu_time_when_both_have_it():
    from qbuild_onnx_common.latency import slower_verdict

    # wall time says slower (a burst of load), CPU time says faster: CPU decides
    q = {"median_ms": 12.0, "cpu": {"median_ms": 8.0}}
    ref = {"median_ms": 10.0, "cpu": {"median_ms": 9.0}}
    assert slower_verdict(q, ref) == {"slower": False, "basis": "cpu", "ms": 8.0,
                                      "reference_ms": 9.0}
    assert slower_verdict(ref, q)["slower"] is True
    # without CPU time on both sides (several threads): wall time
    assert slower_verdict({"median_ms": 12.0}, ref) == {"slower": True, "basis": "wall",
                                                        "ms": 12.0, "reference_ms": 10.0}
