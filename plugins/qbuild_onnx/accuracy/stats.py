"""Streaming statistics of a float model's intermediate tensors over a dataset: the model is
run once per sample with the requested tensors exposed as extra outputs, and only running
sums are kept (memory does not grow with the number of samples, and results do not depend
on how samples are chunked).

Per tensor: min, max, the mean over samples of the full tensor (for bias correction), and the
per-channel (axis 1) mean and min. A second pass builds histograms on [min, max] for range
setting (see accuracy_ranges).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common import models
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.models import ModelSource
from qbuild_onnx_common.ort import session

if TYPE_CHECKING:
    from onnx import ModelProto
    from qbuild_onnx_common.arrays import Array, Float64Array


def load_model(model: ModelSource) -> ModelProto:
    """An onnx ModelProto from a path (or the proto itself)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return models.load_model(model)
    except Exception as e:
        raise OnnxError(f"{model}: not a readable ONNX model: {e}") from e


def float_tensor_names(model: ModelProto) -> list[str]:
    """Names of every float32 tensor produced by a node (graph order, deduplicated)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        types[vi.name] = vi.type.tensor_type.elem_type
    names, seen = [], set()
    for node in model.graph.node:
        for o in node.output:
            if o and o not in seen and types.get(o) == onnx.TensorProto.FLOAT:
                seen.add(o)
                names.append(o)
    return names


def with_outputs(model: ModelProto, names: Sequence[str]) -> ModelProto:
    """A copy of ``model`` that also outputs the named tensors (float32)."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    produced = {o for n in m.graph.node for o in n.output} | {i.name for i in m.graph.input}
    for n in names:
        if n not in produced:
            raise OnnxError(f"tensor '{n}' is not produced by any node of the model")
        if n not in existing:
            vi = onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
            m.graph.output.append(vi)
    return m


@dataclass
class TensorStats:
    name: str
    count: int = 0
    min: float = float("inf")
    max: float = float("-inf")
    # float64 running sum of the tensor (the sample mean when divided by count)
    sum: Float64Array | None = None
    ch_min: Float64Array | None = None  # per-channel minimum (axis 1)
    hist: Array | None = None
    hist_range: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def mean(self) -> Float64Array | None:
        return None if self.sum is None else self.sum / max(self.count, 1)

    def channel_mean(self) -> Float64Array | None:
        m = self.mean()
        if m is None or m.ndim < 2:
            return None
        axes = tuple(i for i in range(m.ndim) if i != 1)
        means: Float64Array = m.mean(axis=axes)
        return means


def collect(
    model: ModelSource,
    feeds: Iterable[Mapping[str, Any]],
    names: Sequence[str] | None = None,
    keep_mean: bool = True,
    bins: int = 0,
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, TensorStats]:
    """Runs the model over ``feeds`` and returns statistics of ``names`` (default: every float
    tensor a node produces). With ``bins`` > 0, also histograms over ``ranges[name]``."""
    import numpy as np

    m = load_model(model)
    names = list(names) if names is not None else float_tensor_names(m)
    sess = session(with_outputs(m, names).SerializeToString(), optimize=False)
    stats = {n: TensorStats(n) for n in names}
    for feed in feeds:
        outs = sess.run(names, dict(feed))
        for n, a in zip(names, outs):
            s = stats[n]
            a = np.asarray(a)
            if a.size == 0:
                continue
            s.count += 1
            s.min = min(s.min, float(a.min()))
            s.max = max(s.max, float(a.max()))
            if keep_mean:
                a64 = a.astype(np.float64)
                s.sum = a64 if s.sum is None else s.sum + a64
            if a.ndim >= 2:
                axes = tuple(i for i in range(a.ndim) if i != 1)
                cm = a.min(axis=axes).astype(np.float64)
                s.ch_min = cm if s.ch_min is None else np.minimum(s.ch_min, cm)
            if bins and ranges is not None and n in ranges:
                lo, hi = ranges[n]
                h, _ = np.histogram(a, bins=bins, range=(lo, hi if hi > lo else lo + 1e-12))
                s.hist = h.astype(np.int64) if s.hist is None else s.hist + h
                s.hist_range = (lo, hi)
    return stats
