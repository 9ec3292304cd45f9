"""Numeric error metrics between a reference and a candidate tensor, and running two ONNX
models side by side on the same inputs to compare their outputs.

Definitions (see docs/accuracy-tools.md):

* SQNR (dB) = 10·log10(Σ ref² / Σ (ref − cand)²); +inf when the tensors are identical.
* max abs error = max |ref − cand|.
* cosine = ⟨ref, cand⟩ / (‖ref‖·‖cand‖), computed in float64.

All sums are taken in float64 over every element of every sample, so a figure for a
dataset is the figure of the concatenated tensors (not a mean of per-sample figures).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from qbuild_onnx_common.arrays import Array, Float64Array


def _as64(a: Any) -> Float64Array:
    import numpy as np

    return np.asarray(a, dtype=np.float64)


def _check_shapes(ref: Array, cand: Array, what: str) -> None:
    if ref.shape != cand.shape:
        raise OnnxError(
            f"{what}: shape mismatch, reference {ref.shape} vs candidate {cand.shape}")


def sqnr_db(ref: Any, cand: Any, what: str = "tensor") -> float:
    """Signal-to-quantization-noise ratio of ``cand`` against ``ref`` in dB."""
    r, c = _as64(ref), _as64(cand)
    _check_shapes(r, c, what)
    signal = float((r * r).sum())
    noise = float(((r - c) ** 2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def max_abs_error(ref: Any, cand: Any, what: str = "tensor") -> float:
    """Largest absolute element-wise difference."""
    r, c = _as64(ref), _as64(cand)
    _check_shapes(r, c, what)
    if r.size == 0:
        return 0.0
    return float(abs(r - c).max())


def cosine_similarity(ref: Any, cand: Any, what: str = "tensor") -> float:
    """Cosine of the angle between the flattened tensors (1.0 when both are zero)."""
    r, c = _as64(ref).ravel(), _as64(cand).ravel()
    _check_shapes(r, c, what)
    nr, nc = float((r * r).sum()), float((c * c).sum())
    if nr == 0.0 and nc == 0.0:
        return 1.0
    if nr == 0.0 or nc == 0.0:
        return 0.0
    return float((r * c).sum() / math.sqrt(nr * nc))


class ErrorAccumulator:
    """Accumulates SQNR, max abs error and cosine over many samples of one tensor."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.dot = 0.0
        self.cand_sq = 0.0
        self.max_abs = 0.0
        self.count = 0

    def add(self, ref: Any, cand: Any, what: str = "tensor") -> None:
        r, c = _as64(ref), _as64(cand)
        _check_shapes(r, c, what)
        d = r - c
        self.signal += float((r * r).sum())
        self.noise += float((d * d).sum())
        self.dot += float((r * c).sum())
        self.cand_sq += float((c * c).sum())
        if d.size:
            self.max_abs = max(self.max_abs, float(abs(d).max()))
        self.count += 1

    def sqnr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    def cosine(self) -> float:
        if self.signal == 0.0 and self.cand_sq == 0.0:
            return 1.0
        if self.signal == 0.0 or self.cand_sq == 0.0:
            return 0.0
        return self.dot / math.sqrt(self.signal * self.cand_sq)

    def summary(self) -> dict[str, float | str]:
        return {
            "sqnr_db": json_float(self.sqnr_db()),
            "max_abs_error": json_float(self.max_abs),
            "cosine": json_float(self.cosine()),
        }


def json_float(x: float, digits: int = 6) -> float | str:
    """A float rounded for stable JSON reports; infinities become the strings "inf"/"-inf"."""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if math.isnan(x):
        return "nan"
    return round(float(x), digits)


def run_model(session: InferenceSession, feeds: Iterable[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
    """Runs ``session`` on every feed dict; returns one {output name: array} per sample."""
    names = [o.name for o in session.get_outputs()]
    results = []
    for feed in feeds:
        outs = session.run(names, dict(feed))
        results.append(dict(zip(names, outs)))
    return results


def compare_outputs(
    ref_outputs: Sequence[Mapping[str, Any]], cand_outputs: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, float | str]]:
    """Per-output SQNR / max abs error / cosine over all samples, keyed by output name."""
    if len(ref_outputs) != len(cand_outputs):
        raise OnnxError(
            f"sample count mismatch: reference {len(ref_outputs)} vs candidate {len(cand_outputs)}"
        )
    acc: dict[str, ErrorAccumulator] = {}
    for ref, cand in zip(ref_outputs, cand_outputs):
        for name in sorted(ref):
            if name not in cand:
                raise OnnxError(f"output '{name}' is missing from the candidate model")
            acc.setdefault(name, ErrorAccumulator()).add(ref[name], cand[name], f"output '{name}'")
    return {name: acc[name].summary() for name in sorted(acc)}
