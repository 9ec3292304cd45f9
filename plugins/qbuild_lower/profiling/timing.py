"""Where the time goes: honest latency figures and per-op profiles, on a target runtime
(onnxruntime, or OpenVINO: ``qbuild_onnx_common.runtimes``).

Owns two measurements of CPU sessions, both with a stated thread count:

* ``interleaved_latency``: several models timed in turn, run after run, in one process
  after warm-ups (``qbuild_onnx_common.latency``), so that load from other processes hits
  every model alike. Reports per
  model the median, the quartiles and the relative spread, flags noisy measurements, and
  gives each model's speed-up against a reference model from the ratio of medians. The
  reference is timed in every float form the runtime offers (fp32, and OpenVINO's bf16
  on a CPU where it picks it, as "<reference> [bf16]"): speed-ups are against the
  fastest.
* ``op_profile``: the runtime's own profiler (onnxruntime's ``enable_profiling``,
  OpenVINO's per-node performance counters) over a few runs, aggregated into time per op
  type and the most expensive nodes, per run (median). OpenVINO's op types carry the
  precision its kernel ran in ("Convolution I8", "Convolution FP32"): what says whether
  a quantized layer ran in int8.

A profile names the kernels onnxruntime actually ran after its graph optimisations (e.g.
``QLinearConv`` with ``channels_last``, the Transposes its layout pass inserted), which is
what says what bounds a model; the MAC count of its Convs/MatMuls/Gemms (``macs`` module)
is the other half of that argument.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.latency import slower_verdict, summaries
from qbuild_onnx_common.models import ModelSource
from qbuild_onnx_common.ort import session
from qbuild_onnx_common.runtimes import ONNXRUNTIME, get
from qbuild_onnx_common.runtimes.base import DEFAULT, FP32, Session
from qbuild_onnx_common.runtimes.timing import fastest, interleaved


class _LatencyCore(TypedDict):
    threads: int
    runs: int
    warmup: int
    order: str
    models: dict[str, dict[str, Any]]
    noisy: bool


class Latency(_LatencyCore, total=False):
    """``interleaved_latency``'s result; each model's summary is
    ``qbuild_onnx_common.latency``'s, with the comparisons to the reference added.
    ``runtime`` names the runtime; ``baseline`` the reference's fastest float form's
    entry in ``models``, which every speed-up is against."""

    runtime: str
    runtime_version: str
    baseline: str


class OpTypeTime(TypedDict):
    ms: float  # median per run
    nodes: int
    min_ms: float  # the sum of each node's fastest run
    share: float  # of all kernels' time


class NodeTime(TypedDict):
    node: str
    op_type: str
    ms: float


class _ProfileCore(TypedDict):
    runs: int
    run_ms: float
    kernel_ms: float
    kernel_min_ms: float
    op_types: dict[str, OpTypeTime]
    top_nodes: list[NodeTime]


class OpProfile(_ProfileCore, total=False):
    """onnxruntime's profile of a model, per run (medians)."""

    node_ms: dict[str, float]  # every node, when asked for


class Conditions(TypedDict):
    """The machine, the versions and the load a measurement ran under."""

    cpus: int | None
    machine: str
    processor: str | None
    python: str
    onnxruntime: str
    load_average_1_5_15min: list[float] | None


def interleaved_latency(models: Mapping[str, ModelSource], feed: Feed, threads: int = 1,
                        runs: int = 30, warmup: int = 3, reference: str | None = None,
                        runtime: str = ONNXRUNTIME) -> Latency:
    """Time ``models`` ({name: ModelProto or path}) in turn on one feed, on ``runtime``.

    Every round runs each model once, in an order rotated from round to round; the first
    ``warmup`` rounds are not counted. Returns {"threads", "runs", "warmup", "models":
    {name: summary}} and, with a ``reference`` name, each model's ``speedup`` (baseline
    median / model median) and ``slower_than_reference``, the baseline being the fastest
    float form of the reference (``baseline``). With one thread each summary also has
    ``cpu``: the same statistics of the runs' CPU time (steady under load from other
    processes), with ``speedup`` from CPU medians, and ``slower_than_reference`` is then
    decided on CPU time (``slower_basis``: "cpu", else "wall")."""
    rt = get(runtime)
    sessions: dict[str, Session] = {
        name: rt.load(m, threads, precision=FP32 if name == reference else DEFAULT,
                      what=name) for name, m in models.items()}
    floats = [reference] if reference is not None else []
    if reference is not None:
        for form in rt.float_forms()[1:]:
            floats.append(f"{reference} [{form.name}]")
            sessions[floats[-1]] = rt.load(models[reference], threads,
                                           precision=form.precision, what=reference)
    times = interleaved(sessions, feed, runs, warmup)
    base = fastest(times, floats, "cpu" if threads == 1 else "wall") if floats else None
    summed: dict[str, dict[str, Any]] = summaries(times, base)
    if threads != 1:  # the calling thread's CPU time is not the run's: not reported
        for m in summed.values():
            m.pop("cpu", None)
    if base is not None:
        _compare(summed, base)
    out: Latency = {"threads": threads, "runs": runs, "warmup": warmup,
                    "order": "interleaved", "models": summed,
                    "noisy": any(m["noisy"] for m in summed.values()), "runtime": rt.name,
                    "runtime_version": rt.version()}
    if base is not None:
        out["baseline"] = base
    return out


def _compare(summed: dict[str, dict[str, Any]], base: str) -> None:
    """Each model's speed-up against ``base`` and whether it is slower."""
    ref = summed[base]
    for n, m in summed.items():
        m["speedup"] = round(ref["median_ms"] / m["median_ms"], 3) if m["median_ms"] else None
        if "cpu" in m:
            c, rc = m["cpu"], ref["cpu"]
            c["speedup"] = (round(rc["median_ms"] / c["median_ms"], 3)
                            if c["median_ms"] else None)
            c["slower_than_reference"] = n != base and c["median_ms"] > rc["median_ms"]
        v = slower_verdict(m, ref)
        m["slower_than_reference"] = n != base and v["slower"]
        m["slower_basis"] = v["basis"]


def op_profile(model: ModelSource, feed: Feed, threads: int = 1, runs: int = 10,
               warmup: int = 3, top: int = 15, all_nodes: bool = False) -> OpProfile:
    """onnxruntime's profiler over ``runs`` runs (after ``warmup``): per op type the
    median time per run and node count, and the ``top`` nodes by median time (with
    ``all_nodes``, also ``node_ms``: every node's median time)."""
    with tempfile.TemporaryDirectory() as tmp:
        s = session(model, threads, profile_prefix=os.path.join(tmp, "prof"))
        for _ in range(warmup):
            s.run(None, feed)
        # the profile also records the warm-up runs: keep only the last ``runs``
        for _ in range(runs):
            s.run(None, feed)
        path = Path(s.end_profiling())
        events = json.loads(path.read_text())
    return aggregate(events, runs, top, all_nodes)


def op_profiles(models: Mapping[str, ModelSource], feed: Feed, threads: int = 1,
                runs: int = 10, warmup: int = 3, top: int = 15,
                runtime: str = ONNXRUNTIME) -> dict[str, OpProfile]:
    """``op_profile`` of several models with their runs interleaved (one run of each model
    in turn), so that load from other processes falls on all profiles alike; on
    OpenVINO, from its per-node performance counters (``ov_op_profiles``)."""
    if runtime != ONNXRUNTIME:
        return ov_op_profiles(models, feed, threads, runs, warmup, top)
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {name: session(m, threads, profile_prefix=os.path.join(tmp, f"p{k}"))
                    for k, (name, m) in enumerate(models.items())}
        names = list(sessions)
        for r in range(warmup + runs):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                sessions[name].run(None, feed)
        out = {}
        for name, s in sessions.items():
            events = json.loads(Path(s.end_profiling()).read_text())
            out[name] = aggregate(events, runs, top)
    return out


def ov_op_profiles(models: Mapping[str, ModelSource], feed: Feed, threads: int = 1,
                   runs: int = 10, warmup: int = 3, top: int = 15) -> dict[str, OpProfile]:
    """OpenVINO's per-node performance counters over ``runs`` interleaved runs of each
    model, as ``op_profile``'s result: op types as "<node type> <kernel precision>"."""
    from qbuild_onnx_common.runtimes.ov_runtime import OpenVino

    rt = cast(OpenVino, get("openvino"))
    sessions = {name: rt.load(m, threads, what=name, perf_counts=True)
                for name, m in models.items()}
    names = list(sessions)
    per_run: dict[str, list[dict[str, tuple[str, float]]]] = {n: [] for n in names}
    run_ms: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            sessions[name].run(None, feed)
            if r >= warmup:
                nodes = sessions[name].node_times()
                per_run[name].append(nodes)
                run_ms[name].append(sum(ms for _, ms in nodes.values()))
    return {n: _node_profile(per_run[n], run_ms[n], top) for n in names}


def _node_profile(per_run: list[dict[str, tuple[str, float]]], run_ms: list[float],
                  top: int) -> OpProfile:
    """``OpProfile`` from each run's {node: (op type, ms)}."""
    n = len(per_run)
    node_type = {node: t for run in per_run for node, (t, _) in run.items()}

    def med(node: str) -> float:
        return statistics.median([run.get(node, ("", 0.0))[1] for run in per_run])

    node_med = {node: med(node) for node in node_type}
    node_min = {node: min(run.get(node, ("", 0.0))[1] for run in per_run)
                for node in node_type}
    type_nodes: defaultdict[str, list[str]] = defaultdict(list)
    for node, t in node_type.items():
        type_nodes[t].append(node)
    type_ms = {t: statistics.median([sum(run.get(k, ("", 0.0))[1] for k in nodes)
                                     for run in per_run]) for t, nodes in type_nodes.items()}
    kernels = sum(type_ms.values())
    types: dict[str, OpTypeTime] = {
        t: {"ms": round(type_ms[t], 4), "nodes": len(type_nodes[t]),
            "min_ms": round(sum(node_min[k] for k in type_nodes[t]), 4),
            "share": round(type_ms[t] / kernels, 4) if kernels else 0.0}
        for t in type_nodes}
    ranked = sorted(((v, k) for k, v in node_med.items()), reverse=True)[:top]
    return {"runs": n, "run_ms": round(statistics.median(run_ms), 4) if run_ms else 0.0,
            "kernel_ms": round(kernels, 4),
            "kernel_min_ms": round(sum(node_min.values()), 4),
            "op_types": dict(sorted(types.items(), key=lambda kv: -kv[1]["ms"])),
            "top_nodes": [{"node": k, "op_type": node_type[k], "ms": round(v, 4)}
                          for v, k in ranked]}


def aggregate(events: list[dict[str, Any]], runs: int, top: int = 15,
              all_nodes: bool = False) -> OpProfile:
    """Reduce onnxruntime profiler events to per-run medians (the last ``runs`` runs)."""
    run_starts = [e["ts"] for e in events if e.get("cat") == "Session"
                  and e.get("name") == "model_run"]
    run_starts = sorted(run_starts)[-runs:]
    run_ends = []
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run" and e["ts"] in run_starts:
            run_ends.append((e["ts"], e["ts"] + e["dur"], e["dur"]))
    run_ends.sort()

    def run_of(ts: float) -> int | None:
        for i, (a, b, _) in enumerate(run_ends):
            if a <= ts <= b:
                return i
        return None

    per_type: defaultdict[str, defaultdict[int, float]] = defaultdict(
        lambda: defaultdict(float))  # type -> run -> us
    per_node: defaultdict[str, defaultdict[int, float]] = defaultdict(lambda: defaultdict(float))
    node_type: dict[str, str] = {}
    type_nodes: defaultdict[str, set[str]] = defaultdict(set)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        r = run_of(e["ts"])
        if r is None:
            continue
        op = e.get("args", {}).get("op_name", "?")
        node = e["name"][: -len("_kernel_time")]
        per_type[op][r] += e["dur"]
        per_node[node][r] += e["dur"]
        node_type[node] = op
        type_nodes[op].add(node)
    n = len(run_ends)

    def med(d: Mapping[int, float]) -> float:
        return statistics.median([d.get(i, 0.0) for i in range(n)]) / 1000.0 if n else 0.0

    def least(d: Mapping[int, float]) -> float:
        return min(d.get(i, 0.0) for i in range(n)) / 1000.0 if n else 0.0

    total = statistics.median([d for _, _, d in run_ends]) / 1000.0 if n else 0.0
    # The profiler's times are wall times: on a loaded machine a node's median includes
    # the time its thread waited for a core. The sum of each node's fastest run is the
    # steadier estimate of what the kernels cost.
    node_min = {k: least(d) for k, d in per_node.items()}
    type_ms = {op: round(med(d), 4) for op, d in per_type.items()}
    kernels = sum(type_ms.values())
    types: dict[str, OpTypeTime] = {
        op: {"ms": type_ms[op], "nodes": len(type_nodes[op]),
             "min_ms": round(sum(node_min[k] for k in type_nodes[op]), 4),
             "share": round(type_ms[op] / kernels, 4) if kernels else 0.0}
        for op in per_type}
    ranked = sorted(((med(d), k) for k, d in per_node.items()), reverse=True)
    nodes = ranked[:top]
    profile: OpProfile = {
        "runs": n,
        "run_ms": round(total, 4),
        "kernel_ms": round(kernels, 4),
        "kernel_min_ms": round(sum(node_min.values()), 4),
        "op_types": dict(sorted(types.items(), key=lambda kv: -kv[1]["ms"])),
        "top_nodes": [{"node": k, "op_type": node_type[k], "ms": round(v, 4)}
                      for v, k in nodes],
    }
    if all_nodes:
        profile["node_ms"] = {k: round(v, 4) for v, k in ranked}
    return profile


def conditions() -> Conditions:
    """The measurement conditions: machine, versions, load from other processes (the
    target runtime's version is in the latency result)."""
    import platform

    import onnxruntime as ort

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "processor": platform.processor() or None, "python": platform.python_version(),
            "onnxruntime": ort.__version__, "load_average_1_5_15min": load}


