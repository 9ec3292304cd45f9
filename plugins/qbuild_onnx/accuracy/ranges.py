"""Activation range setting beyond min/max: per-tensor percentile or MSE-optimal clipping
ranges computed from streaming histograms of the float model's tensors, written as
``rmin``/``rmax`` precision overrides that the ``quantize`` rule (onnxruntime
``TensorQuantOverrides``) applies on top of its calibration.

Histograms are built in two passes (min/max, then a fixed-bin histogram on [min, max]) so the
result does not depend on how the samples are chunked. The MSE criterion is the expected
squared error of a uniform asymmetric quantizer with ``2**bits`` levels on the histogram:
step²/12 for every value inside the range plus the squared clipping distance outside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError

from .stats import collect

if TYPE_CHECKING:
    from qbuild_onnx_common.arrays import Array

_QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999, 1.0)


def _quantile_edges(hist: Array, edges: Array, q: float) -> tuple[float, float]:
    import numpy as np

    c = np.cumsum(hist)
    total = c[-1]
    lo_i = int(np.searchsorted(c, total * (1.0 - q), side="left"))
    hi_i = int(np.searchsorted(c, total * q, side="left"))
    return float(edges[lo_i]), float(edges[min(hi_i + 1, len(edges) - 1)])


def quant_mse(hist: Array, edges: Array, lo: float, hi: float, bits: int = 8) -> float:
    """Expected squared quantization error of the histogram for the range [lo, hi]."""
    import numpy as np

    lo, hi = min(lo, 0.0), max(hi, 0.0)  # zero must be representable
    step = (hi - lo) / (2**bits - 1) if hi > lo else 0.0
    centers = (edges[:-1] + edges[1:]) / 2
    clip = np.clip(centers, lo, hi)
    err = np.where((centers >= lo) & (centers <= hi), step * step / 12.0, (centers - clip) ** 2)
    return float((hist * err).sum() / max(hist.sum(), 1))


def choose_range(hist: Array, edges: Array, method: str, bits: int = 8,
                 percentile: float = 99.999) -> tuple[float, float]:
    """(rmin, rmax) for one tensor by ``method`` = "percentile" or "mse"."""
    if method == "percentile":
        return _quantile_edges(hist, edges, percentile / 100.0)
    if method != "mse":
        raise OnnxError(f"range method must be 'percentile' or 'mse', got '{method}'")
    best = None
    for ql in _QUANTILES:
        lo = _quantile_edges(hist, edges, ql)[0]
        for qh in _QUANTILES:
            hi = _quantile_edges(hist, edges, qh)[1]
            e = quant_mse(hist, edges, lo, hi, bits)
            if best is None or e < best[0] - 1e-15:
                best = (e, lo, hi)
    assert best is not None  # _QUANTILES is not empty
    return best[1], best[2]


def compute_ranges(
    model: str | Path | Any,
    feeds: Sequence[Mapping[str, Any]],
    names: Sequence[str] | None = None,
    method: str = "mse",
    bits: int = 8,
    bins: int = 2048,
    percentile: float = 99.999,
) -> dict[str, Any]:
    """Per-tensor ranges as a precision-override document {"tensors": {name: {rmin, rmax}}}.

    Tensors whose chosen range equals their min/max are left out (nothing to override)."""
    if not feeds:
        raise OnnxError("range setting needs at least one calibration sample")
    first = collect(model, feeds, names, keep_mean=False)
    ranges = {n: (s.min, s.max) for n, s in first.items() if s.count}
    second = collect(model, feeds, sorted(ranges), keep_mean=False, bins=bins, ranges=ranges)
    import numpy as np

    out: dict[str, dict[str, float]] = {}
    for n in sorted(second):
        s = second[n]
        if s.hist is None or s.hist_range is None:
            continue
        lo0, hi0 = s.hist_range
        edges = np.linspace(lo0, hi0, bins + 1)
        lo, hi = choose_range(s.hist, edges, method, bits, percentile)
        lo, hi = max(lo, lo0), min(hi, hi0)
        if lo <= lo0 and hi >= hi0:
            continue
        out[n] = {"rmin": round(float(lo), 7), "rmax": round(float(max(hi, lo + 1e-6)), 7)}
    return {"tensors": out, "nodes_to_exclude": [], "method": method, "bits": bits}
