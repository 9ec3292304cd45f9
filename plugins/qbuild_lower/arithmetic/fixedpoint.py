"""Fixed-point arithmetic of the lowering: multiplier decomposition and requantization.

A real rescale factor ``M`` (for example ``S_in * S_w / S_out``) is represented as an int32
multiplier ``M0`` in ``[2**30, 2**31)`` and a right shift ``n`` so that
``M ~= M0 * 2**-n`` (Jacob et al., 2018, eq. 6). Requantization is a single rounding,
round half up::

    y = clamp(zp + floor((acc * M0 + 2**(n - 1)) / 2**n), lo, hi)

computed in int64. ``requantize`` is the exact numpy definition; ``lowering.fixed_point``
emits the same computation as standard ONNX integer ops and ``checking.reference``
executes those ops, and the tests hold all three to ``fractions.Fraction`` arithmetic.

Rounding ``onnxruntime`` reproduces onnxruntime's CPU requantization instead, still in
integers: onnxruntime computes ``rint_half_even(float32(float32(acc) * S))`` with the
float32 scale ``S``. When ``M0 * 2**-n`` equals ``S`` exactly (it does: a float32 has 24
significant bits) the float32 product differs from the exact one only where it lands
exactly on a half-integer ``h``, which happens iff ``|acc*S - h| <= ulp(h)/2``; the result
is then the even neighbour instead of the one rounding half up picks.
``requantize_onnxruntime`` corrects the half-up result by at most one step in exactly
those cases (``requantize_float32`` is onnxruntime's formula, for the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

Int64s = NDArray[np.int64]

#: The graph adds a bias of ``2**BIAS_BITS`` before its truncating integer division so that
#: the dividend is always positive (truncation then equals floor); the bias must be a
#: multiple of ``2**shift``, hence the shift limit.
BIAS_BITS = 61
MAX_SHIFT = BIAS_BITS
#: ``|acc * M0|`` must stay below this: the dividend then lies in (0, 2**62), far from
#: int64 overflow.
PRODUCT_LIMIT = 2**60


@dataclass(frozen=True)
class Multiplier:
    """``M ~= m0 * 2**-shift`` (``shift`` is a right shift, always >= 1)."""

    m0: int
    shift: int

    @property
    def value(self) -> float:
        return math.ldexp(self.m0, -self.shift)


def decompose(m: float) -> Multiplier:
    """Split a non-negative real multiplier into an int32 ``M0`` and a right shift.

    ``M0`` is in ``[2**30, 2**31)`` whenever the shift stays within ``[1, MAX_SHIFT]``,
    giving at least 30 bits of relative precision (error at most ``2**-31`` relative).
    Multipliers of ``2**30`` or more keep a shift of 1 and a larger (int64) ``M0``; tiny
    multipliers whose shift would exceed ``MAX_SHIFT`` lose precision (``M0`` below
    ``2**30``, possibly 0, which makes the layer output its zero point).
    """
    if not math.isfinite(m) or m < 0:
        raise ValueError(f"multiplier must be finite and non-negative, got {m!r}")
    if m == 0:
        return Multiplier(0, 1)
    f, e = math.frexp(m)  # m = f * 2**e, f in [0.5, 1)
    m0 = round(f * 2**31)  # round() is exact here: f * 2**31 is a dyadic rational
    shift = 31 - e
    if m0 == 2**31:
        m0, shift = 2**30, shift - 1
    if shift < 1:  # M >= 2**30: fold the left shift into M0 (exact)
        m0, shift = m0 << (1 - shift), 1
    elif shift > MAX_SHIFT:  # tiny M: keep the shift legal, give up precision
        m0 = round(math.ldexp(m, MAX_SHIFT))
        shift = MAX_SHIFT
    return Multiplier(int(m0), int(shift))


def decompose_all(ms: ArrayLike) -> tuple[Int64s, Int64s]:
    """Vectorised ``decompose`` for per-channel multipliers: (M0 int64, shift int64)."""
    parts = [decompose(float(m)) for m in np.asarray(ms, dtype=np.float64).ravel()]
    return (
        np.array([p.m0 for p in parts], dtype=np.int64),
        np.array([p.shift for p in parts], dtype=np.int64),
    )


def shared_shift(ms: ArrayLike) -> tuple[Int64s, int]:
    """Several multipliers on one accumulator (e.g. the two inputs of Add): one shift.

    The shift is chosen for the largest multiplier, so that one has 31 bits of precision
    and the others as many as their size allows.
    """
    values = np.asarray(ms, dtype=np.float64).ravel()
    top = decompose(float(values.max()))
    m0 = np.array([round(math.ldexp(float(m), top.shift)) for m in values], dtype=np.int64)
    return m0, top.shift


def round_shift(prod: ArrayLike, shift: ArrayLike) -> Int64s:
    """``floor((prod + 2**(shift-1)) / 2**shift)`` on int64: round half up."""
    p = np.asarray(prod, dtype=np.int64)
    n = np.asarray(shift, dtype=np.int64)
    return np.asarray((p + (np.int64(1) << (n - 1))) >> n, dtype=np.int64)


def requantize(acc: ArrayLike, m0: ArrayLike, shift: ArrayLike, zero_point: ArrayLike, lo: int,
               hi: int) -> Int64s:
    """The documented requantization, exactly: clamp(zp + round_half_up(acc*M0/2**n))."""
    prod = np.asarray(acc, dtype=np.int64) * np.asarray(m0, dtype=np.int64)
    if np.any(np.abs(prod) >= PRODUCT_LIMIT):
        raise OverflowError("acc * M0 exceeds the int64 requantization range")
    y = round_shift(prod, shift) + np.asarray(zero_point, dtype=np.int64)
    return np.clip(y, lo, hi)


#: Accumulators must stay below this for float32(acc) to be exact (24 significant bits).
FLOAT32_EXACT = 2**24
#: ``POW2_FLOOR[m]`` = the largest power of two <= m (m >= 1). For a half-integer ``h``,
#: ``m = |2h|`` and ``ulp(h)/2 = POW2_FLOOR[m] * 2**-25``; indices above 1023 are never
#: needed because the output clamps long before (|h| <= 256 matters for 8-bit outputs).
POW2_FLOOR = np.array([1] + [1 << (m.bit_length() - 1) for m in range(1, 1026)], np.int64)
#: Rounding ``onnxruntime`` needs ``shift >= MIN_ORT_SHIFT`` (the window is computed as
#: ``POW2_FLOOR * 2**(shift-16) / 2**9`` in int64).
MIN_ORT_SHIFT = 16


def exact_float32(m0: ArrayLike, shift: ArrayLike, scale: ArrayLike) -> bool:
    """True when ``m0 * 2**-shift`` equals the float32 ``scale`` exactly (per channel)."""
    m0s, shifts = np.ravel(m0), np.ravel(shift)
    scales = np.broadcast_to(np.asarray(scale, np.float32).ravel(), m0s.shape)
    return all(math.ldexp(int(q), -int(n)) == float(s) for q, n, s in zip(m0s, shifts, scales))


def round_to_float32(acc: ArrayLike) -> Int64s:
    """Integers as float32 holds them: rounded to 24 significant bits, ties to even."""
    return np.asarray(acc, dtype=np.int64).astype(np.float32).astype(np.int64)


def requantize_float32(acc: ArrayLike, scale: ArrayLike, zero_point: ArrayLike, lo: int,
                       hi: int) -> Int64s:
    """onnxruntime's CPU requantization: clamp(zp + rint(float32(acc) * float32(scale)))."""
    v = np.asarray(acc).astype(np.float32) * np.asarray(scale, np.float32)
    z = np.asarray(zero_point, np.int64)
    v = np.clip(v, (lo - z).astype(np.float32), (hi - z).astype(np.float32))
    return np.asarray(np.rint(v).astype(np.int64) + z, dtype=np.int64)


def requantize_onnxruntime(acc: ArrayLike, m0: ArrayLike, shift: ArrayLike,
                           zero_point: ArrayLike, lo: int, hi: int) -> Int64s:
    """``requantize_float32`` computed with integers only (the definition the lowered graph
    implements): round half up, then step to the even neighbour where float32 would have
    landed exactly on the half-integer between the two."""
    n = np.asarray(shift, dtype=np.int64)
    prod = np.asarray(acc, dtype=np.int64) * np.asarray(m0, dtype=np.int64)
    t = prod + (np.int64(1) << (n - 1))
    r0 = t >> n
    rem = t - (r0 << n)
    return np.clip(_correct(r0, rem, n) + np.asarray(zero_point, np.int64), lo, hi)


def _correct(r0: Int64s, rem: Int64s, shift: Int64s) -> Int64s:
    r0c = np.clip(r0, -512, 512)
    k = np.int64(1) << (shift - MIN_ORT_SHIFT)
    w_lo = POW2_FLOOR[np.abs(2 * r0c - 1)] * k // 512
    w_hi = POW2_FLOOR[np.abs(2 * r0c + 1)] * k // 512
    down = rem <= w_lo
    up = ((np.int64(1) << shift) - rem) <= w_hi
    odd = np.mod(r0, 2)
    return np.asarray(r0 + odd * (up.astype(np.int64) - down.astype(np.int64)), np.int64)


def dtype_range(dtype: DTypeLike) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)
