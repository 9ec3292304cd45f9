"""Quantization arithmetic in numpy, following the ONNX QuantizeLinear / DequantizeLinear spec:
parameter broadcasting (per tensor, per axis, blocked), ``block_size`` validation, rounding
(half to even) and saturation, and the choice of scale / zero point for weights.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from qbuild_onnx_common.errors import OnnxError

from .qtypes import QType, QValues, float_to_qfloat

GRANULARITIES = ("per_tensor", "per_channel", "blocked")

ScalarT = TypeVar("ScalarT", bound=np.generic)


class Reduction(Protocol):
    """``np.max`` or ``np.min``: reduce an array over ``axis`` (every axis when None)."""

    def __call__(self, a: npt.NDArray[np.float32],
                 axis: int | tuple[int, ...] | None = ...) -> Any: ...


def block_size_range(dim: int, n_scales: int) -> tuple[int, int | None]:
    """The spec's valid ``block_size`` range for an axis of length ``dim`` with ``n_scales``
    scales along it: [ceil(dim/n), ceil(dim/(n-1)) - 1]; no upper bound when n == 1."""
    lo = math.ceil(dim / n_scales)
    hi = None if n_scales == 1 else math.ceil(dim / (n_scales - 1)) - 1
    return lo, hi


def validate_block_size(dim: int, n_scales: int, block_size: int, where: str) -> None:
    """Raise unless ``block_size`` is legal (onnx's checker and reference do not check it)."""
    if block_size <= 0:
        raise OnnxError(f"{where}: block_size must be a positive integer, got {block_size}")
    if n_scales <= 0 or n_scales > dim:
        raise OnnxError(f"{where}: {n_scales} scales along an axis of length {dim}")
    lo, hi = block_size_range(dim, n_scales)
    if block_size < lo or (hi is not None and block_size > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f"[{lo}, inf)"
        raise OnnxError(f"{where}: block_size {block_size} is invalid for an axis of length "
                         f"{dim} with {n_scales} scales (the spec allows {rng})")


def normalize_axis(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < rank:
        raise OnnxError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def expand_param(p: npt.NDArray[ScalarT], x_shape: tuple[int, ...], axis: int,
                 block_size: int, where: str) -> npt.NDArray[ScalarT]:
    """Broadcast a scale or zero point to ``x_shape`` the way the spec defines it."""
    p = np.asarray(p)
    rank = len(x_shape)
    if p.ndim == 0 or (p.ndim == 1 and p.size == 1 and block_size == 0):
        return np.broadcast_to(p.reshape(()), x_shape)
    ax = normalize_axis(axis, rank, where)
    if block_size == 0:
        if p.ndim != 1 or p.shape[0] != x_shape[ax]:
            raise OnnxError(f"{where}: per-axis parameter of shape {list(p.shape)} does not "
                             f"match axis {ax} of length {x_shape[ax]}")
        shape = [1] * rank
        shape[ax] = x_shape[ax]
        return np.broadcast_to(p.reshape(shape), x_shape)
    if p.ndim != rank or any(p.shape[i] != x_shape[i] for i in range(rank) if i != ax):
        raise OnnxError(f"{where}: blocked parameter of shape {list(p.shape)} must have the "
                         f"input's shape {list(x_shape)} except on axis {ax}")
    validate_block_size(x_shape[ax], p.shape[ax], block_size, where)
    rep = np.repeat(p, block_size, axis=ax)
    return np.take(rep, np.arange(x_shape[ax]), axis=ax)


def quantize(x: npt.ArrayLike, scale: npt.ArrayLike, zero_point: npt.ArrayLike | None,
             q: QType, axis: int = 1, block_size: int = 0, saturate: bool = True,
             where: str = "QuantizeLinear") -> QValues:
    """QuantizeLinear: int32 codes for integer types, float32 grid values for float types."""
    xf = np.asarray(x, dtype=np.float32)
    s = expand_param(np.asarray(scale, dtype=np.float32), xf.shape, axis, block_size, where)
    if q.kind == "float":
        # A float8 zero point is ignored by QuantizeLinear (and must be 0 for Dequantize).
        return float_to_qfloat(xf / s, q, saturate=saturate)
    v = np.rint(xf / s).astype(np.float64)
    if zero_point is not None:
        v = v + expand_param(np.asarray(zero_point), xf.shape, axis, block_size, where)
    codes: npt.NDArray[np.int32] = np.clip(v, q.qmin, q.qmax).astype(np.int32)
    return codes


def dequantize(v: npt.ArrayLike, scale: npt.ArrayLike, zero_point: npt.ArrayLike | None,
               axis: int = 1, block_size: int = 0,
               where: str = "DequantizeLinear") -> npt.NDArray[np.floating[Any]]:
    """DequantizeLinear: (v - zero_point) * scale, returned in the scale's float type."""
    scale_array = np.asarray(scale)
    values = np.asarray(v)
    s = expand_param(scale_array.astype(np.float32), values.shape, axis, block_size, where)
    x = values.astype(np.float32)
    if zero_point is not None:
        x = x - expand_param(np.asarray(zero_point, np.float32), values.shape, axis,
                             block_size, where)
    out_type = scale_array.dtype if scale_array.dtype.kind == "f" else np.dtype(np.float32)
    result: npt.NDArray[np.floating[Any]] = (x * s).astype(out_type)
    return result


def reduce_blocks(w: npt.NDArray[np.float32], fn: Reduction, axis: int | None,
                  block_size: int) -> npt.NDArray[np.float32]:
    """Apply a reduction (np.max / np.min) per tensor (axis None), per channel along ``axis``
    (block_size 0: reduce every other axis) or per block along ``axis``."""
    if axis is None:
        return np.asarray(fn(w))
    if block_size == 0:
        others = tuple(i for i in range(w.ndim) if i != axis)
        return np.asarray(fn(w, axis=others)) if others else w.copy()
    d = w.shape[axis]
    n = math.ceil(d / block_size)
    pad = n * block_size - d
    moved = np.moveaxis(w, axis, -1)
    if pad:
        edge = moved[..., -1:]  # repeat the last element: changes no min/max
        moved = np.concatenate([moved] + [edge] * pad, axis=-1)
    blocks = moved.reshape(moved.shape[:-1] + (n, block_size))
    return np.moveaxis(fn(blocks, axis=-1), -1, axis)


def choose_params(w: npt.ArrayLike, q: QType, axis: int | None, block_size: int,
                  symmetric: bool, scale_dtype: np.dtype[np.floating[Any]], where: str
                  ) -> tuple[npt.NDArray[np.floating[Any]], npt.NDArray[np.int32] | None]:
    """Scale (in ``scale_dtype``) and zero point (None when it is 0) for a weight tensor.

    Symmetric signed integers and float types use zero point 0 and scale = amax / qmax;
    unsigned symmetric uses the mid code; asymmetric maps [min(w,0), max(w,0)] onto the range.
    """
    wf = np.asarray(w, dtype=np.float32)
    if not np.all(np.isfinite(wf)):
        raise OnnxError(f"{where}: weight has non-finite values")
    wmax = reduce_blocks(wf, np.max, axis, block_size).astype(np.float64)
    wmin = reduce_blocks(wf, np.min, axis, block_size).astype(np.float64)
    tiny = float(np.finfo(scale_dtype).tiny)
    zp: npt.NDArray[np.int32] | None = None
    if q.kind == "float":
        if not symmetric:
            raise OnnxError(f"{where}: {q.name} has no zero point; use symmetric = true")
        amax = np.maximum(np.abs(wmax), np.abs(wmin))
        scale = amax / q.qmax
    elif symmetric:
        amax = np.maximum(np.abs(wmax), np.abs(wmin))
        if q.signed:
            scale = amax / q.qmax
        else:
            mid = (q.qmax + 1) // 2
            scale = amax / (q.qmax - mid)
            zp = np.full(np.shape(amax), mid, dtype=np.int32)
    else:
        lo, hi = np.minimum(wmin, 0.0), np.maximum(wmax, 0.0)
        scale = (hi - lo) / (q.qmax - q.qmin)
        safe = np.where(scale > 0, scale, 1.0)
        zp = np.clip(np.rint(q.qmin - lo / safe), q.qmin, q.qmax).astype(np.int32)
    typed_scale = np.where(scale > 0, np.maximum(scale, tiny), 1.0).astype(scale_dtype)
    if zp is not None and not np.any(zp):
        zp = None
    return np.asarray(typed_scale), zp


def sqnr_db(ref: npt.ArrayLike, approx: npt.ArrayLike) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when exact)."""
    exact = np.asarray(ref, dtype=np.float64)
    err = np.sum((exact - np.asarray(approx, dtype=np.float64)) ** 2)
    sig = np.sum(exact ** 2)
    if err == 0:
        return math.inf
    if sig == 0:
        return -math.inf
    return float(10.0 * np.log10(sig / err))
