"""Range selection from collected statistics: entropy (KL divergence), percentile and
distribution, computed from histograms; plus the symmetric option.

The definitions follow onnxruntime.quantization.calibrate (1.31) so results are
comparable: the value histogram spans ``[-t, t]`` with ``t = max(|min|, |max|)``; entropy
tries every threshold window centred on the zero bin (``num_quantized_bins // 2`` up to
half the bins), folds the outliers into the edge bins, merges the window into
``num_quantized_bins`` bins, smooths zeros with eps = 1e-4 and keeps the window of least
KL divergence; symmetric percentile uses a histogram of ``|x|`` over ``[min|x|, max|x|]``;
every threshold is clamped to the observed ``[min, max]``. Our entropy search is
vectorised over candidate windows (ORT loops in Python) and accumulates in float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from qbuild_onnx_common.arrays import Array, Float64Array

_EPS = 1e-4


def symmetric_range(lo: float, hi: float) -> tuple[float, float]:
    a = max(abs(lo), abs(hi))
    return -a, a


def _clamp(lo: float, hi: float, vmin: float, vmax: float) -> tuple[float, float]:
    return (vmin if lo < vmin else lo), (vmax if hi > vmax else hi)


def _smooth(p: Float64Array, valid: NDArray[np.bool_]
            ) -> tuple[Float64Array, NDArray[np.bool_]]:
    """Replace zeros with eps, taking the same mass off the non-zero bins (per row)."""
    import numpy as np

    zeros = valid & (p == 0)
    nonzeros = valid & (p != 0)
    n_zero = zeros.sum(axis=1)
    n_nonzero = nonzeros.sum(axis=1)
    ok = n_nonzero > 0
    eps1 = np.where(ok, _EPS * n_zero / np.maximum(n_nonzero, 1), 0.0)
    out = p + _EPS * zeros - eps1[:, None] * nonzeros
    return np.where(valid, out, 0.0), ok


def entropy_threshold(hist: Array, edges: Array, num_quantized_bins: int, vmin: float, vmax: float
                      ) -> tuple[float, float]:
    """The (lo, hi) window of a ``[-t, t]`` value histogram with the least KL divergence."""
    import numpy as np

    hist = np.asarray(hist, dtype=np.int64)
    nb = hist.size
    nq = int(num_quantized_bins)
    zero = nb // 2
    half = nq // 2
    if nq < 1 or half > zero:
        return _clamp(float(edges[0]), float(edges[-1]), vmin, vmax)
    cs = np.concatenate(([0], np.cumsum(hist)))
    total = cs[-1]
    cand = np.arange(half, zero + 1)
    starts = zero - cand
    ends = np.minimum(zero + cand + 1, nb)
    lengths = ends - starts
    merge = lengths // nq
    kl = np.full(cand.size, np.inf)
    for m in np.unique(merge):
        sel = np.nonzero(merge == m)[0]
        S, E, L = starts[sel], ends[sel], lengths[sel]
        K, Lmax = sel.size, int(L.max())
        k = np.arange(Lmax)
        valid = k[None, :] < L[:, None]
        idx = np.minimum(S[:, None] + k[None, :], nb - 1)
        sliced = np.where(valid, hist[idx], 0)
        p = sliced.astype(np.float64)
        rows = np.arange(K)
        p[rows, 0] += cs[S]                 # left outliers into the first bin
        p[rows, L - 1] += total - cs[E]     # right outliers into the last bin
        span = nq * int(m)
        blocks = sliced[:, :span].reshape(K, nq, m).sum(axis=2)
        blocks[:, -1] += sliced[:, span:].sum(axis=1)
        norm = ((p[:, :span] != 0) & valid[:, :span]).reshape(K, nq, m).sum(axis=2)
        per_bin = np.where(norm > 0, blocks // np.maximum(norm, 1), 0)
        q = np.zeros((K, Lmax), dtype=np.float64)
        q[:, :span] = np.repeat(per_bin, m, axis=1)
        ps, p_ok = _smooth(p, valid)
        qs, q_ok = _smooth(q, valid)
        with np.errstate(divide="ignore", invalid="ignore"):
            pk = ps / ps.sum(axis=1, keepdims=True)
            qk = qs / qs.sum(axis=1, keepdims=True)
            terms = np.where(valid & (pk > 0), pk * np.log(pk / qk), 0.0)
        div = terms.sum(axis=1)
        div[~(p_ok & q_ok)] = np.inf
        kl[sel] = div
    best = int(np.argmin(kl))
    lo, hi = float(edges[starts[best]]), float(edges[ends[best]])
    return _clamp(lo, hi, vmin, vmax)


def percentile_range(hist: Array, edges: Array, percentile: float, absolute: bool, vmin: float,
                     vmax: float
                     ) -> tuple[float, float]:
    """Percentile thresholds; ``absolute``: ``hist`` is a histogram of ``|x|``."""
    import numpy as np

    hist = np.asarray(hist, dtype=np.int64)
    total = hist.sum()
    if total == 0:
        return vmin, vmax
    cdf = np.cumsum(hist / total)
    if absolute:
        t = float(edges[np.searchsorted(cdf, percentile / 100.0)])
        lo, hi = -t, t
    else:
        cut = (100.0 - percentile) / 200.0
        lo = float(edges[np.searchsorted(cdf, cut)])
        hi = float(edges[np.searchsorted(cdf, 1.0 - cut)])
    return _clamp(lo, hi, vmin, vmax)


def distribution_stats(hist: Array, edges: Array, scenario: str = "same") -> dict[str, float]:
    """Mean and standard deviation of the histogrammed values (``scenario="p3"``: of
    ``x ** (1/3)``, for float8 weights assumed cubic of a Gaussian), and the histogram's
    span as the range."""
    import numpy as np

    hist = np.asarray(hist, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    centres = (e[:-1] + e[1:]) * 0.5
    n = hist.sum()
    if n == 0:
        return {"avg": 0.0, "std": 0.0, "lo": float(e[0]), "hi": float(e[-1])}
    if scenario == "same":
        v = centres
    elif scenario == "p3":
        v = np.sign(centres) * np.abs(centres) ** (1.0 / 3.0)
    else:
        raise ValueError(f"unknown distribution scenario {scenario!r} (same, p3)")
    avg = float((hist * v).sum() / n)
    var = float((hist * v * v).sum() / n - avg * avg)
    return {"avg": avg, "std": max(var, 0.0) ** 0.5, "lo": float(e[0]), "hi": float(e[-1])}


def choose_range(method: str, stats: Mapping[str, Any], hist: Array, edges: Array,
                 options: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """Apply a histogram method to one tensor; returns extra fields and ``range``."""
    vmin, vmax = stats["min"], stats["max"]
    if method == "entropy":
        lo, hi = entropy_threshold(hist, edges, options["num_quantized_bins"], vmin, vmax)
        return {"range": [lo, hi]}
    if method == "percentile":
        lo, hi = percentile_range(hist, edges, options["percentile"],
                                  options["symmetric"], vmin, vmax)
        return {"range": [lo, hi]}
    if method == "distribution":
        d = distribution_stats(hist, edges, options["scenario"])
        return {"range": [d["lo"], d["hi"]], "avg": d["avg"], "std": d["std"]}
    raise ValueError(f"not a histogram method: {method}")
