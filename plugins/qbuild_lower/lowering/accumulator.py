"""The integer accumulator of a fixed-point layer on its way to requantization: real
multipliers computed as onnxruntime computes them (float32), the largest values an input
or a product can take, the rounding a layer can use, and the accumulator rounded as
float32 rounds it (for rounding ``onnxruntime``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from numpy.typing import ArrayLike, NDArray

from ..arithmetic import fixedpoint as fp
from ..emit.builder import Builder
from ..qdq.graph import QParams
from ..qdq.groups import RANGE, Unsupported

I64 = onnx.TensorProto.INT64


def f32_ratio(num: ArrayLike, den: ArrayLike) -> NDArray[np.float32]:
    """A scale ratio computed as onnxruntime computes its requantization scale: float32."""
    return (np.asarray(num, np.float32) / np.asarray(den, np.float32)).astype(np.float32)


def span(qp: QParams) -> int:
    """Largest |q - zero point| an input can have."""
    lo, hi = fp.dtype_range(qp.dtype)
    z = int(qp.zero_point.ravel()[0])
    return max(z - lo, hi - z)


def check_range(bound: NDArray[Any], m0: NDArray[Any], what: str) -> None:
    """Refuse a layer whose accumulator times M0 could leave the int64 range."""
    if np.any(bound.astype(object) * m0.astype(object) >= fp.PRODUCT_LIMIT):
        raise Unsupported(f"{what}: accumulator * M0 could exceed the int64 range", RANGE)


def choose_rounding(b: Builder, m0: ArrayLike, shift: ArrayLike, real: ArrayLike,
                    acc_bound: int, exact_op: bool = True) -> tuple[str, str | None, bool]:
    """How this layer requantizes: (rounding, why not onnxruntime, round the accumulator
    to float32 first). onnxruntime converts the int32 accumulator to float32, which
    rounds it once ``|acc| >= 2**24``; that matters only if such values can still land
    inside the output range."""
    if b.rounding != "onnxruntime":
        return "half_up", None, False
    if not exact_op:
        return "half_up", "onnxruntime's kernel for this op is not reproduced", False
    if not fp.exact_float32(m0, shift, real):
        return "half_up", "M0 * 2**-shift is not onnxruntime's float32 scale exactly", False
    if int(np.min(shift)) < fp.MIN_ORT_SHIFT:
        return "half_up", f"shift below {fp.MIN_ORT_SHIFT} (multiplier too large)", False
    round_acc = (acc_bound >= fp.FLOAT32_EXACT
                 and fp.FLOAT32_EXACT * float(np.min(real)) < 1024)
    return "onnxruntime", None, round_acc


def accumulator(b: Builder, acc64: str, bias: fp.Int64s, shape: tuple[int, ...], bound: int,
                round_acc: bool, name: str) -> tuple[str, list[str], fp.Int64s]:
    """(accumulator, ops, bias still to fold after M0). Without float32 rounding the bias
    is folded into the rounding constant; with it, the bias must be in the accumulator
    before float32 rounds it."""
    if not round_acc:
        return acc64, [], bias
    with_bias = b.tmp(f"{name}_acc_bias")
    b.node("Add", [acc64, b.const(f"{name}_bias", bias.reshape(shape) if bias.size > 1
                                  else bias.reshape(()))], [with_bias], f"{name}_bias")
    acc64, ops = float32_accumulator(b, with_bias, bound, f"{name}_f32acc")
    return acc64, ["Add", *ops], np.zeros_like(bias)


def float32_accumulator(b: Builder, acc: str, bound: int, base: str) -> tuple[str, list[str]]:
    """int64 ``acc`` -> float32(acc) as an integer: rounded to 24 significant bits, ties
    to even (``fixedpoint.round_to_float32``), for |acc| up to ``bound``."""
    extra_bits = max(int(bound).bit_length() - 24, 0)
    a, g, q, qg, rem, r2 = (b.tmp(f"{base}_{t}") for t in
                            ("abs", "step", "q", "qg", "rem", "rem2"))
    b.node("Abs", [acc], [a], f"{base}_abs")
    ops = ["Abs"]
    # j = the number of bits beyond float32's 24: one comparison per possible bit
    j = b.const("i64_0", np.array(0, np.int64))
    for i in range(1, extra_bits + 1):
        ge, gi, total = (b.tmp(f"{base}_{t}{i}") for t in ("ge", "gei", "bits"))
        b.node("Greater", [a, b.const(f"i64_{2**(23 + i) - 1}",
                                      np.array(2 ** (23 + i) - 1, np.int64))], [ge],
               f"{base}_ge{i}")
        b.node("Cast", [ge], [gi], f"{base}_gei{i}", to=I64)
        b.node("Add", [j, gi], [total], f"{base}_bits{i}")
        j = total
        ops += ["Greater", "Cast", "Add"]
    pow2 = b.const("pow2_table_i64", np.array([1 << k for k in range(40)], np.int64))
    b.node("Gather", [pow2, j], [g], f"{base}_step", axis=0)
    b.node("Div", [a, g], [q], f"{base}_q")
    b.node("Mul", [q, g], [qg], f"{base}_qg")
    b.node("Sub", [a, qg], [rem], f"{base}_rem")
    b.node("Mul", [rem, b.const("i64_2", np.array(2, np.int64))], [r2], f"{base}_rem2")
    gt, eq, odd, oddb, tie, up, upi, q2, a2, sg, out = (b.tmp(f"{base}_{t}") for t in (
        "gt", "eq", "odd", "oddb", "tie", "up", "upi", "q2", "a2", "sign", "f32"))
    b.node("Greater", [r2, g], [gt], f"{base}_gt")
    b.node("Equal", [r2, g], [eq], f"{base}_eq")
    b.node("Mod", [q, b.const("i64_2", np.array(2, np.int64))], [odd], f"{base}_odd")
    b.node("Cast", [odd], [oddb], f"{base}_oddb", to=onnx.TensorProto.BOOL)
    b.node("And", [eq, oddb], [tie], f"{base}_tie")
    b.node("Or", [gt, tie], [up], f"{base}_up")
    b.node("Cast", [up], [upi], f"{base}_upi", to=I64)
    b.node("Add", [q, upi], [q2], f"{base}_q2")
    b.node("Mul", [q2, g], [a2], f"{base}_a2")
    b.node("Sign", [acc], [sg], f"{base}_sign")
    b.node("Mul", [a2, sg], [out], f"{base}_f32")
    ops += ["Gather", "Div", "Mul", "Sub", "Mul", "Greater", "Equal", "Mod", "Cast",
            "And", "Or", "Cast", "Add", "Mul", "Sign", "Mul"]
    return out, ops
