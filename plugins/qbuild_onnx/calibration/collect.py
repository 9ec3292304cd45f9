"""Streaming statistics over a model's intermediate tensors, one batch at a time.

Owns choosing the tensors to calibrate (float inputs/outputs of top-level graph nodes,
not initializers, as onnxruntime's calibrators choose them), exposing them as extra
graph outputs, and the two passes over the data: pass 1 keeps per-tensor min/max (and
the moving average of per-batch min/max, the running sums of each run's own min and max
for ``mean_minmax``, and min/max of |x| when needed); pass 2, only
for histogram methods, fills fixed-range histograms whose range comes from pass 1. A
bin's count is a plain sum over samples, so the result does not depend on how the data
is chunked. Nothing but the current batch and the histograms is ever held in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.models import (
    file_uses_external_data,
    lean_load,
    load_model,
    stage_beside,
    unstage,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from onnx import ModelProto
    from qbuild_onnx_common.arrays import Array, Float32Array

_FLOAT_TYPES = ("tensor(float)", "tensor(float16)")
_MAX_PROTO = 2**31 - 1


@dataclass
class TensorStats:
    """Running statistics of one tensor (finite values only)."""

    min: float = float("inf")
    max: float = float("-inf")
    absmin: float = float("inf")
    absmax: float = float("-inf")
    ema_min: float | None = None
    ema_max: float | None = None
    run_min_sum: float = 0.0  # sums over runs of each run's own min and max (mean_minmax)
    run_max_sum: float = 0.0
    runs: int = 0  # runs with a finite value
    nonfinite: int = 0
    count: int = 0

    def mean_run_range(self) -> tuple[float, float] | None:
        """The mean over runs of each run's min and max (None: no finite value seen)."""
        if not self.runs:
            return None
        return self.run_min_sum / self.runs, self.run_max_sum / self.runs


@dataclass
class CalibrationSession:
    """An ORT session over the model with every calibrated tensor as an extra output."""

    session: Any
    tensors: list[str]
    input_names: list[str]
    skipped: list[str] = field(default_factory=list)

    def run(self, feed: dict[str, Any]) -> dict[str, Any]:
        outs = self.session.run(self.tensors, feed)
        return dict(zip(self.tensors, outs))


def _candidate_tensors(model: ModelProto, op_types: Sequence[str] | None) -> list[str]:
    """Inputs and outputs of the (selected) top-level nodes, minus initializers, in graph
    order without repeats."""
    initializers = {i.name for i in model.graph.initializer}
    seen: dict[str, None] = {}
    for node in model.graph.node:
        if op_types and node.op_type not in op_types:
            continue
        for name in list(node.input) + list(node.output):
            if name and name not in initializers:
                seen.setdefault(name, None)
    return list(seen)


def open_calibration_session(model_path: str | Path, op_types: Sequence[str] | None = None,
                             threads: int = 1, scratch: str | Path | None = None,
                             ) -> CalibrationSession:
    """Load the model, add the calibrated tensors as outputs and open an ORT session with
    graph optimisations off, so tensors are exactly the graph's. A model with external
    data is opened by path with its weights read from the original files (never loaded
    into Python: see algorithms.external_data).

    Outputs are added without type information; ORT infers their types, and only float32
    and float16 tensors are kept.
    """
    import onnx
    from qbuild_onnx_common.ort import session

    model_path = Path(model_path)
    external = file_uses_external_data(model_path)
    # External weights stay on disk: onnxruntime reads them from the original files.
    model = lean_load(model_path) if external else load_model(model_path)
    existing = {o.name for o in model.graph.output}
    candidates = _candidate_tensors(model, op_types)
    for name in candidates:
        if name not in existing:
            vi = onnx.ValueInfoProto()
            vi.name = name
            model.graph.output.append(vi)
    if external:
        if scratch is None:
            raise ValueError("a model with external data needs a scratch directory to "
                             "calibrate")
        payload: Any = str(stage_beside(model, model_path.parent, scratch, "augmented.onnx"))
    elif model.ByteSize() < _MAX_PROTO:
        payload = model.SerializeToString()
    else:
        if scratch is None:
            raise ValueError("a model over 2 GB needs a scratch directory to calibrate")
        path = Path(scratch) / "augmented.onnx"
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="augmented.onnx.data")
        payload = str(path)
    del model
    sess = session(payload, threads, optimize=False)
    if external:  # the session holds the weights: drop the hard links
        unstage(Path(payload))
    types = {o.name: o.type for o in sess.get_outputs()}
    keep = [n for n in candidates if types.get(n) in _FLOAT_TYPES]
    skipped = [n for n in candidates if n in types and n not in keep]
    inputs = [i.name for i in sess.get_inputs()]
    return CalibrationSession(sess, keep, inputs, skipped)


def _finite_minmax(x: Array) -> tuple[float, float, int]:
    import numpy as np

    if x.size == 0:
        return float("inf"), float("-inf"), 0
    lo, hi = x.min(), x.max()
    if np.isfinite(lo) and np.isfinite(hi):
        return float(lo), float(hi), 0
    finite = x[np.isfinite(x)]
    bad = x.size - finite.size
    if finite.size == 0:
        return float("inf"), float("-inf"), bad
    return float(finite.min()), float(finite.max()), bad


class MinMaxPass:
    """Pass 1: global min/max, EMA of per-batch min/max, sums of per-run min/max,
    optional min/max of |x|."""

    def __init__(self, names: Iterable[str], averaging_constant: float = 0.01,
                 need_abs: bool = False) -> None:
        self.stats = {n: TensorStats() for n in names}
        self.c = float(averaging_constant)
        self.need_abs = need_abs

    def update(self, arrays: dict[str, Any]) -> None:
        import numpy as np

        for name, x in arrays.items():
            s = self.stats[name]
            x = np.asarray(x)
            lo, hi, bad = _finite_minmax(x)
            s.nonfinite += bad
            s.count += x.size
            if lo > hi:  # no finite value in this batch
                continue
            s.min, s.max = min(s.min, lo), max(s.max, hi)
            s.run_min_sum += lo
            s.run_max_sum += hi
            s.runs += 1
            if s.ema_min is None or s.ema_max is None:  # the first finite batch
                s.ema_min, s.ema_max = lo, hi
            else:
                s.ema_min += self.c * (lo - s.ema_min)
                s.ema_max += self.c * (hi - s.ema_max)
            if self.need_abs:
                a = np.abs(x[np.isfinite(x)] if bad else x)
                s.absmin = min(s.absmin, float(a.min()))
                s.absmax = max(s.absmax, float(a.max()))


class HistogramPass:
    """Pass 2: per-tensor histograms over a range fixed in advance.

    ``absolute``: histogram ``|x|`` over ``[min|x|, max|x|]``; otherwise ``x`` over
    ``[-t, t]``, ``t = max(|min|, |max|)`` (onnxruntime's layout, so thresholds compare).
    """

    def __init__(self, stats: dict[str, TensorStats], num_bins: int, absolute: bool) -> None:
        import numpy as np

        self.num_bins = int(num_bins)
        self.absolute = absolute
        self.ranges: dict[str, tuple[np.float32, np.float32]] = {}
        self.counts: dict[str, NDArray[np.int64]] = {}
        for name, s in stats.items():
            if absolute:
                lo, hi = (s.absmin, s.absmax) if s.absmin <= s.absmax else (0.0, 0.0)
                r = (np.float32(lo), np.float32(hi))
            else:
                t = max(abs(s.min), abs(s.max)) if s.min <= s.max else 0.0
                r = (np.float32(-t), np.float32(t))
            self.ranges[name] = r
            self.counts[name] = np.zeros(self.num_bins, dtype=np.int64)

    def update(self, arrays: dict[str, Any]) -> None:
        import numpy as np

        for name, x in arrays.items():
            x = np.asarray(x)
            if x.dtype != np.float32:
                x = x.astype(np.float32)
            x = x.reshape(-1)
            if self.absolute:
                x = np.abs(x)
            # float32 bounds (numpy's stubs allow only Python floats) keep float32 edges
            h, _ = np.histogram(x, self.num_bins, range=self.ranges[name])  # type: ignore[arg-type]
            self.counts[name] += h

    def edges(self, name: str) -> Float32Array:
        import numpy as np

        lo, hi = self.ranges[name]
        # the same edges np.histogram used (float32 data and range -> float32 edges)
        _, e = np.histogram(np.zeros(0, dtype=np.float32), self.num_bins,
                            range=(lo, hi))  # type: ignore[arg-type]
        edges: Float32Array = e
        return edges


def stream(feeds: Iterable[tuple[int, dict[str, Any]]], session: CalibrationSession,
           sink: Callable[[dict[str, Any]], None]) -> int:
    """Run every ``(n, feed)`` through the session, hand each batch's tensors to ``sink``,
    drop them; return the number of samples seen."""
    total = 0
    for n, feed in feeds:
        outputs = session.run(feed)
        sink(outputs)
        del outputs
        total += n
    return total
