"""Inputs for the check and the profiles: a qbuild dataset directory read into feeds, or,
without one, seeded random inputs (over each input's quantization range for a QDQ model).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from qbuild_onnx_common.allocation import check_arrays
from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.errors import OnnxError

from ..qdq.graph import Graph


def load_dataset(path: Path, max_samples: int | None = None,
                 model: onnx.ModelProto | None = None) -> list[Feed]:
    """Read a qbuild dataset directory into a list of feeds (batch of 1 each). With the
    ``model``, an array one rank higher than its input holds whole inputs (streaming
    states, scalars), as ``calibrate`` feeds it."""
    meta_path = Path(path) / "dataset.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise OnnxError(f"{meta_path}: cannot read dataset metadata ({e})") from e
    if meta.get("format") != "qbuild-dataset":
        raise OnnxError(f"{meta_path}: not a qbuild-dataset (format={meta.get('format')!r})")
    arrays = {}
    for name, spec in sorted(meta.get("inputs", {}).items()):
        arrays[name] = np.load(Path(path) / spec["file"], mmap_mode="r")
    n = int(meta.get("count", min(len(a) for a in arrays.values())))
    if max_samples:
        n = min(n, max_samples)
    ranks = {} if model is None else {
        vi.name: len(vi.type.tensor_type.shape.dim) for vi in model.graph.input}
    whole = {k for k, a in arrays.items() if k in ranks and a.ndim == ranks[k] + 1}
    return [{k: np.array(a[i]) if k in whole else np.ascontiguousarray(a[i:i + 1])
             for k, a in arrays.items()} for i in range(n)]


def _declared(vi: onnx.ValueInfoProto) -> list[int]:
    """An input's declared shape, unknown dims set to 1."""
    return [d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim]


def synthetic_feeds(model: onnx.ModelProto, count: int, seed: int = 0) -> list[Feed]:
    """Random inputs covering each float input's quantization range (the first
    QuantizeLinear reading it), shapes from the graph with unknown dims set to 1."""
    g = Graph.from_model(model)
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = [{} for _ in range(count)]
    check_arrays("input", {vi.name: (np.float32, _declared(vi)) for vi in model.graph.input
                           if vi.name not in g.inits})
    for vi in model.graph.input:
        if vi.name in g.inits:
            continue
        shape = _declared(vi)
        q = next((g.nodes[u] for u in g.consumers.get(vi.name, [])
                  if g.nodes[u].op_type == "QuantizeLinear"), None)
        if q is None:
            raise OnnxError(f"input {vi.name!r} has no QuantizeLinear: cannot synthesize data")
        qp = g.qparams(q)
        info = np.iinfo(qp.dtype)
        s, z = float(qp.scale.ravel()[0]), int(qp.zero_point.ravel()[0])
        for f in feeds:
            f[vi.name] = ((rng.uniform(info.min, info.max, shape) - z) * s).astype(np.float32)
    return feeds


def random_feeds(model: onnx.ModelProto, count: int, seed: int = 0) -> list[Feed]:
    """``synthetic_feeds`` for a QDQ model; for a float model seeded uniform [0, 1) float
    inputs (integer inputs zero) with unknown dims set to 1."""
    g = Graph.from_model(model)
    if all(any(g.nodes[u].op_type == "QuantizeLinear" for u in g.consumers.get(t, []))
           for t in g.inputs):
        return synthetic_feeds(model, count, seed)
    rng = np.random.default_rng(seed)
    types = {1: np.float32, 10: np.float16, 11: np.float64, 7: np.int64, 6: np.int32,
             2: np.uint8, 3: np.int8, 9: np.bool_}
    check_arrays("input", {
        vi.name: (types.get(vi.type.tensor_type.elem_type, np.float32), _declared(vi))
        for vi in model.graph.input if vi.name not in g.inits})
    feeds = []
    for _ in range(count):
        f: Feed = {}
        for vi in model.graph.input:
            if vi.name in g.inits:
                continue
            tt = vi.type.tensor_type
            shape = _declared(vi)
            dt = types.get(tt.elem_type, np.float32)
            f[vi.name] = (rng.random(shape).astype(dt) if np.dtype(dt).kind == "f"
                          else np.zeros(shape, dt))
        feeds.append(f)
    return feeds
