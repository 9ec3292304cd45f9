"""Where the time goes: honest latency figures and onnxruntime per-op profiles.

Owns two measurements of onnxruntime CPU sessions, both with a stated thread count:

* ``interleaved_latency``: several models timed in turn, run after run, in one process
  after warm-ups (``qbuild_onnx_common.latency``), so that load from other processes hits
  every model alike. Reports per
  model the median, the quartiles and the relative spread, flags noisy measurements, and
  gives each model's speed-up against a reference model from the ratio of medians.
* ``op_profile``: onnxruntime's own profiler (``enable_profiling``) over a few runs,
  aggregated into time per op type and the most expensive nodes, per run (median).

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
from typing import Any, TypedDict

from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.latency import interleaved_latency_ms, slower_verdict
from qbuild_onnx_common.models import ModelSource
from qbuild_onnx_common.ort import session


class Latency(TypedDict):
    """``interleaved_latency``'s result; each model's summary is
    ``qbuild_onnx_common.latency``'s, with the comparisons to the reference added."""

    threads: int
    runs: int
    warmup: int
    order: str
    models: dict[str, dict[str, Any]]
    noisy: bool


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
                        runs: int = 30, warmup: int = 3, reference: str | None = None
                        ) -> Latency:
    """Time ``models`` ({name: ModelProto or path}) in turn on one feed.

    Every round runs each model once, in an order rotated from round to round; the first
    ``warmup`` rounds are not counted. Returns {"threads", "runs", "warmup", "models":
    {name: summary}} and, with a ``reference`` name, each model's ``speedup`` (reference
    median / model median) and ``slower_than_reference``. With one thread each summary
    also has ``cpu``: the same statistics of the runs' CPU time (steady under load from
    other processes), with ``speedup`` from CPU medians, and ``slower_than_reference`` is
    then decided on CPU time (``slower_basis``: "cpu", else "wall")."""
    sessions = {name: session(m, threads) for name, m in models.items()}
    names = list(sessions)
    summaries: dict[str, dict[str, Any]] = interleaved_latency_ms(sessions, feed, runs, warmup,
                                                                 reference)
    if threads != 1:  # the calling thread's CPU time is not the run's: not reported
        for m in summaries.values():
            m.pop("cpu", None)
    if reference is not None:
        ref = summaries[reference]
        for n in names:
            m = summaries[n]
            m["speedup"] = round(ref["median_ms"] / m["median_ms"], 3) if m["median_ms"] else None
            if "cpu" in m:
                c, rc = m["cpu"], ref["cpu"]
                c["speedup"] = (round(rc["median_ms"] / c["median_ms"], 3)
                                if c["median_ms"] else None)
                c["slower_than_reference"] = n != reference and c["median_ms"] > rc["median_ms"]
            v = slower_verdict(m, ref)
            m["slower_than_reference"] = n != reference and v["slower"]
            m["slower_basis"] = v["basis"]
    return {"threads": threads, "runs": runs, "warmup": warmup, "order": "interleaved",
            "models": summaries, "noisy": any(m["noisy"] for m in summaries.values())}


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
                runs: int = 10, warmup: int = 3, top: int = 15) -> dict[str, OpProfile]:
    """``op_profile`` of several models with their runs interleaved (one run of each model
    in turn), so that load from other processes falls on all profiles alike."""
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
    """The measurement conditions: machine, versions, load from other processes."""
    import platform

    import onnxruntime as ort

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "processor": platform.processor() or None, "python": platform.python_version(),
            "onnxruntime": ort.__version__, "load_average_1_5_15min": load}


