"""The integer requantization tail both modes share (an int64 product to 8-bit codes, rounded
half up or as onnxruntime rounds) and biases as int32 codes at the accumulator scale."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from numpy.typing import ArrayLike, DTypeLike, NDArray

from ..arithmetic import fixedpoint as fp
from ..qdq.graph import onnx_opset
from ..qdq.groups import Group, Unsupported
from .builder import Builder

#: Shapes an int64 constant to broadcast along the tensor it is applied to.
Shaper = Callable[[ArrayLike], fp.Int64s]


def requant_tail(b: Builder, prod: str, shift: ArrayLike, c_extra: ArrayLike, zp: int,
                 dtype: DTypeLike, out: str, base: str, shape: tuple[int, ...] = (-1,),
                 prod_bound: int = fp.PRODUCT_LIMIT, rounding: str = "half_up") -> list[str]:
    """int64 ``prod`` (already multiplied by M0) -> 8-bit ``out``:
    Add(2**(n-1) + 2**61 + c_extra) -> Div(2**n) -> Add(zp - 2**(61-n)) -> Clip -> Cast.

    The 2**61 bias keeps the dividend positive so that ONNX's truncating integer Div is a
    floor; ``c_extra`` carries folded constants (bias * M0, -zero point * M0). With
    ``rounding="onnxruntime"`` the half-up result is corrected to onnxruntime's float32
    rounding (``fixedpoint.requantize_onnxruntime``) before the zero point is added."""
    shifts = np.asarray(shift, dtype=np.int64)
    # Split the folded constant into whole output steps (added after the division) and a
    # remainder in [0, 2**n) (added before it): exact, and keeps the dividend small.
    folded = np.asarray(c_extra, dtype=object)
    div_o = np.asarray(1, dtype=object) << shifts.astype(object)
    whole, rest = np.floor_divide(folded, div_o), np.mod(folded, div_o)
    # onnxruntime 1.31's int64 Clip/Max mis-compare some values beyond the int32 range, so
    # the value reaching Clip must stay inside it. Limiting the folded whole steps to
    # +-lim changes nothing: beyond lim the output saturates either way.
    reach = (int(prod_bound) >> shifts.astype(object)) + 2 + abs(int(zp)) + 256
    lim = (2**31 - 1) - reach
    clamp = lim > 2**20  # only where the accumulator's reach is known to be small
    whole = np.where(clamp, np.minimum(np.maximum(whole, -lim), lim), whole)
    big = 1 << fp.BIAS_BITS
    c = (div_o >> 1) + big + rest
    div = div_o
    off = zp + whole - big // div_o

    def shaped(a: ArrayLike) -> fp.Int64s:
        v = np.asarray(np.asarray(a, dtype=object).astype(np.int64), dtype=np.int64)
        return v.reshape(shape) if v.size > 1 else v.reshape(())

    lo, hi = fp.dtype_range(dtype)
    t1, t2, t3, t4 = (b.tmp(f"{base}_{s}") for s in ("rnd", "shr", "zp", "clip"))
    b.node("Add", [prod, b.const(f"{base}_round", shaped(c))], [t1], f"{base}_round")
    b.node("Div", [t1, b.const(f"{base}_pow2", shaped(div))], [t2], f"{base}_shift")
    ops = ["Add", "Div"]
    if rounding == "onnxruntime":
        r0 = b.tmp(f"{base}_r0")
        b.node("Add", [t2, b.const(f"{base}_offset", shaped(off - zp))], [r0], f"{base}_r0")
        r, extra = _float32_rounding(b, t1, t2, r0, shifts, shaped, base)
        b.node("Add", [r, b.const(f"zp_i64_{zp}", np.array(zp, np.int64))], [t3], f"{base}_zp")
        ops += ["Add", *extra, "Add"]
    else:
        b.node("Add", [t2, b.const(f"{base}_offset", shaped(off))], [t3], f"{base}_zp")
        ops += ["Add"]
    b.node("Clip", [t3, b.const(f"clip_lo_i64_{lo}", np.array(lo, np.int64)),
                    b.const(f"clip_hi_i64_{hi}", np.array(hi, np.int64))], [t4],
           f"{base}_clip")
    to = onnx.TensorProto.UINT8 if np.dtype(dtype) == np.uint8 else onnx.TensorProto.INT8
    b.node("Cast", [t4], [out], f"{base}_cast", to=to)
    return ops + ["Clip", "Cast"]


def _float32_rounding(b: Builder, t1: str, t2: str, r0: str, shift: fp.Int64s,
                      shaped: Shaper, base: str) -> tuple[str, list[str]]:
    """Emit ``fixedpoint._correct``: r0 (rounded half up) -> onnxruntime's result.

    ``t1`` is the biased dividend and ``t2 = t1 / 2**n``, so the remainder is
    ``t1 - t2 * 2**n`` (in [0, 2**n)); the window around each half-integer comes from the
    ``POW2_FLOOR`` table. Returns (result tensor, op types emitted)."""
    i64 = onnx.TensorProto.INT64
    shifts = np.asarray(shift, dtype=object)
    pow2 = shaped(np.asarray(1, dtype=object) << shifts)
    k = shaped(np.asarray(1, dtype=object) << (shifts - fp.MIN_ORT_SHIFT))
    t = {s: b.tmp(f"{base}_{s}") for s in (
        "q2n", "rem", "r0c", "r0x2", "mlo", "mhi", "alo", "ahi", "tlo", "thi", "klo", "khi",
        "wlo", "whi", "gap", "down", "up", "downi", "upi", "step", "odd", "corr", "r")}
    c = b.const
    b.node("Mul", [t2, c(f"{base}_pow2", pow2)], [t["q2n"]], f"{base}_q2n")
    b.node("Sub", [t1, t["q2n"]], [t["rem"]], f"{base}_rem")
    b.node("Clip", [r0, c("clip_lo_i64_-512", np.array(-512, np.int64)),
                    c("clip_hi_i64_512", np.array(512, np.int64))], [t["r0c"]], f"{base}_r0c")
    b.node("Mul", [t["r0c"], c("i64_2", np.array(2, np.int64))], [t["r0x2"]], f"{base}_r0x2")
    one = c("i64_1", np.array(1, np.int64))
    b.node("Sub", [t["r0x2"], one], [t["mlo"]], f"{base}_mlo")
    b.node("Add", [t["r0x2"], one], [t["mhi"]], f"{base}_mhi")
    table = c("pow2_floor_table", fp.POW2_FLOOR)
    for side in ("lo", "hi"):
        b.node("Abs", [t[f"m{side}"]], [t[f"a{side}"]], f"{base}_abs{side}")
        b.node("Gather", [table, t[f"a{side}"]], [t[f"t{side}"]], f"{base}_ulp{side}", axis=0)
        b.node("Mul", [t[f"t{side}"], c(f"{base}_ulpk", k)], [t[f"k{side}"]], f"{base}_k{side}")
        b.node("Div", [t[f"k{side}"], c("i64_512", np.array(512, np.int64))], [t[f"w{side}"]],
               f"{base}_w{side}")
    b.node("Sub", [c(f"{base}_pow2", pow2), t["rem"]], [t["gap"]], f"{base}_gap")
    if onnx_opset(b.g.model) >= 12:
        b.node("LessOrEqual", [t["rem"], t["wlo"]], [t["down"]], f"{base}_down")
        b.node("LessOrEqual", [t["gap"], t["whi"]], [t["up"]], f"{base}_up")
        cmp_ops = ["LessOrEqual", "LessOrEqual"]
    else:
        gt_lo, gt_hi = b.tmp(f"{base}_gtlo"), b.tmp(f"{base}_gthi")
        b.node("Greater", [t["rem"], t["wlo"]], [gt_lo], f"{base}_gtlo")
        b.node("Not", [gt_lo], [t["down"]], f"{base}_down")
        b.node("Greater", [t["gap"], t["whi"]], [gt_hi], f"{base}_gthi")
        b.node("Not", [gt_hi], [t["up"]], f"{base}_up")
        cmp_ops = ["Greater", "Not", "Greater", "Not"]
    b.node("Cast", [t["down"]], [t["downi"]], f"{base}_downi", to=i64)
    b.node("Cast", [t["up"]], [t["upi"]], f"{base}_upi", to=i64)
    b.node("Sub", [t["upi"], t["downi"]], [t["step"]], f"{base}_step")
    b.node("Mod", [r0, c("i64_2", np.array(2, np.int64))], [t["odd"]], f"{base}_odd")
    b.node("Mul", [t["odd"], t["step"]], [t["corr"]], f"{base}_corr")
    b.node("Add", [r0, t["corr"]], [t["r"]], f"{base}_even")
    ops = ["Mul", "Sub", "Clip", "Mul", "Sub", "Add"] + ["Abs", "Gather", "Mul", "Div"] * 2
    ops += ["Sub", *cmp_ops, "Cast", "Cast", "Sub", "Mod", "Mul", "Add"]
    return t["r"], ops


def bias_codes(grp: Group, b: Builder, k: int, acc_scale: ArrayLike,
               beta: float = 1.0) -> NDArray[np.int32] | None:
    """The bias input ``k`` as int32 at the accumulator scale ``acc_scale`` (= S_x * S_w,
    per output channel), or None when absent. A bias already quantized at that scale is
    kept bit for bit; anything else is rescaled (rounded half to even)."""
    if k >= len(grp.ins) or grp.ins[k].kind == "none":
        return None
    x = grp.ins[k]
    acc = np.asarray(acc_scale, dtype=np.float64)
    real: NDArray[np.float64]
    if x.kind == "qconst":
        qp = x.quantized().qp
        q = x.value(b.g).astype(np.int64) - qp.zero_point.astype(np.int64)
        s = qp.scale.astype(np.float64)
        if beta == 1.0 and qp.dtype == np.int32 and np.array_equal(
            np.asarray(s, np.float32), np.asarray(acc, np.float32) * np.ones_like(s)
        ):
            return q.astype(np.int32)
        real = q * s
    elif x.kind == "fconst":
        real = x.value(b.g).astype(np.float64)
    else:
        raise Unsupported(f"bias {x.name!r} is not a constant")
    codes = np.rint(beta * real / acc)
    if np.any(np.abs(codes) > 2**31 - 1):
        raise Unsupported(f"bias {x.name!r} does not fit int32 at the accumulator scale")
    return codes.astype(np.int32)
