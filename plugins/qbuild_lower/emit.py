"""Building the lowered graph: new nodes and constants, plus the emitters both modes share
(data movement on quantized tensors, lookup tables, the integer requantization tail).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import fixedpoint as fp
from .graph import Graph, attr
from .groups import SCALE_MISMATCH, Group, Unsupported, need_act, same_params

#: Ops that only move or select elements: they run on the quantized codes unchanged when
#: input and output share scale and zero point. Value: index of the data input(s).
DATA_MOVEMENT = {
    "Reshape": (0,),
    "Transpose": (0,),
    "Flatten": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Slice": (0,),
    "Split": (0,),
    "Identity": (0,),
    "Expand": (0,),
    "Tile": (0,),
    "DepthToSpace": (0,),
    "SpaceToDepth": (0,),
    "Gather": (0,),
    "MaxPool": (0,),
    "Resize": (0,),
    "Pad": (0,),
    "Concat": None,  # every input
}

#: Elementwise ops of one quantized input: replaced by a 256-entry table (Gather).
LUT_OPS = {
    "Sigmoid", "Tanh", "Relu", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Elu",
    "Selu", "Softplus", "Softsign", "Exp", "Log", "Erf", "Neg", "Abs", "Sqrt", "Reciprocal",
    "Gelu", "Mish", "Sin", "Cos", "Celu", "ThresholdedRelu", "PRelu",
}


class Builder:
    """Collects the new nodes and initializers; hands out collision-free names."""

    def __init__(self, g: Graph, mode: str):
        self.g = g
        self.mode = mode
        self.nodes: list = []
        self.inits: list = []
        self.used = set(g.inits) | set(g.producer) | set(g.inputs) | set(g.outputs)
        self.used |= {n.name for n in g.nodes if n.name}
        self.luts: list = []  # (init name, group) filled in by lut.py at the end
        self.params: list = []  # fixed-point parameter records
        self._const_cache: dict = {}

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def const(self, base: str, value: np.ndarray) -> str:
        value = np.ascontiguousarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key in self._const_cache:
            return self._const_cache[key]
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(value, name))
        self._const_cache[key] = name
        return name

    def node(self, op: str, inputs: list, outputs: list, base: str, domain: str = "",
             **attrs) -> onnx.NodeProto:
        n = helper.make_node(op, inputs, outputs, name=self.fresh(base), domain=domain,
                             **attrs)
        self.nodes.append(n)
        return n

    def tmp(self, base: str) -> str:
        return self.fresh(base)


def copy_attrs(node, skip=()) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in skip}


def lower_data_movement(grp: Group, b: Builder) -> list[str]:
    """The op itself, on the quantized codes (scale and zero point unchanged)."""
    n = grp.node
    data_idx = DATA_MOVEMENT[n.op_type]
    if data_idx is None:
        data_idx = tuple(range(len(grp.ins)))
    if n.op_type == "Resize" and attr(n, "mode", b"nearest") != b"nearest":
        raise Unsupported("Resize with linear/cubic interpolation has no integer form here")
    ref = grp.outs[0].qp
    for o in grp.outs:
        same_params(o.qp, ref, f"{n.op_type} outputs")
    inputs = list(n.input)
    for k in data_idx:
        x = need_act(grp.ins[k], f"{n.op_type} input")
        same_params(x.qp, ref, f"{n.op_type} input {x.name!r} and output")
        inputs[k] = x.q
    for k, x in enumerate(grp.ins):
        if k in data_idx:
            continue
        if x.kind in ("act", "qconst"):
            raise Unsupported(f"{n.op_type} parameter input {x.name!r} is quantized")
    if n.op_type == "Pad":
        inputs = _pad_inputs(grp, b, inputs, ref)
    if n.op_type == "MaxPool" and float(ref.scale.ravel()[0]) <= 0:
        raise Unsupported("MaxPool on a non-positive scale", SCALE_MISMATCH)
    b.node(n.op_type, inputs, [o.q for o in grp.outs], n.name or n.op_type,
           domain=n.domain, **copy_attrs(n))
    return [n.op_type]


def _pad_inputs(grp: Group, b: Builder, inputs: list, qp) -> list:
    n = grp.node
    if attr(n, "mode", b"constant") != b"constant":
        return inputs
    s, z = float(qp.scale.ravel()[0]), int(qp.zero_point.ravel()[0])
    v = 0.0
    if len(grp.ins) > 2 and grp.ins[2].kind != "none":
        if grp.ins[2].kind != "fconst":
            raise Unsupported("Pad value is not a float constant")
        v = float(grp.ins[2].value(b.g).ravel()[0])
    code = int(np.rint(v / s)) + z
    lo, hi = fp.dtype_range(qp.dtype)
    if not lo <= code <= hi or np.float32(s) * np.float32(code - z) != np.float32(v):
        raise Unsupported(f"Pad value {v} is not exactly representable", SCALE_MISMATCH)
    inputs = inputs[:2] + [b.const("pad_value_q", np.array(code, dtype=qp.dtype))]
    return inputs + list(n.input[3:])


def lower_lut(grp: Group, b: Builder) -> list[str]:
    """Elementwise op of one 8-bit input: Cast (+128 for int8) then Gather in a table of
    the 256 output codes. The table is computed at build time (see ``lut.py``)."""
    n = grp.node
    x = need_act(grp.ins[0], f"{n.op_type} input", const_ok=False)
    for k, extra in enumerate(grp.ins[1:], 1):
        if extra.kind not in ("fconst", "none", "raw"):
            raise Unsupported(f"{n.op_type} input {k} ({extra.name!r}) is not constant")
    if len(grp.outs) != 1:
        raise Unsupported(f"{n.op_type} with several outputs")
    out = grp.outs[0]
    table = b.fresh(f"{n.name or n.op_type}_table")
    b.luts.append((table, grp))
    idx = b.tmp(f"{x.q}_i32")
    b.node("Cast", [x.q], [idx], f"{n.name or n.op_type}_cast", to=onnx.TensorProto.INT32)
    if x.qp.dtype == np.int8:
        shifted = b.tmp(f"{x.q}_idx")
        b.node("Add", [idx, b.const("lut_offset_128", np.array(128, np.int32))], [shifted],
               f"{n.name or n.op_type}_offset")
        idx = shifted
    b.node("Gather", [table, idx], [out.q], f"{n.name or n.op_type}_lut", axis=0)
    return ["Cast", "Gather"] if x.qp.dtype == np.uint8 else ["Cast", "Add", "Gather"]


def requant_tail(b: Builder, prod: str, shift, c_extra, zp: int, dtype, out: str,
                 base: str, shape=(-1,), prod_bound: int = fp.PRODUCT_LIMIT) -> list[str]:
    """int64 ``prod`` (already multiplied by M0) -> 8-bit ``out``:
    Add(2**(n-1) + 2**61 + c_extra) -> Div(2**n) -> Add(zp - 2**(61-n)) -> Clip -> Cast.

    The 2**61 bias keeps the dividend positive so that ONNX's truncating integer Div is a
    floor; ``c_extra`` carries folded constants (bias * M0, -zero point * M0)."""
    shift = np.asarray(shift, dtype=np.int64)
    # Split the folded constant into whole output steps (added after the division) and a
    # remainder in [0, 2**n) (added before it): exact, and keeps the dividend small.
    c_extra = np.asarray(c_extra, dtype=object)
    div_o = np.asarray(1, dtype=object) << shift.astype(object)
    whole, rest = np.floor_divide(c_extra, div_o), np.mod(c_extra, div_o)
    # onnxruntime 1.31's int64 Clip/Max mis-compare some values beyond the int32 range, so
    # the value reaching Clip must stay inside it. Limiting the folded whole steps to
    # +-lim changes nothing: beyond lim the output saturates either way.
    reach = (int(prod_bound) >> shift.astype(object)) + 2 + abs(int(zp)) + 256
    lim = (2**31 - 1) - reach
    clamp = lim > 2**20  # only where the accumulator's reach is known to be small
    whole = np.where(clamp, np.minimum(np.maximum(whole, -lim), lim), whole)
    big = 1 << fp.BIAS_BITS
    c = (div_o >> 1) + big + rest
    div = div_o
    off = zp + whole - big // div_o
    def shaped(a):
        a = np.asarray(np.asarray(a, dtype=object).astype(np.int64), dtype=np.int64)
        return a.reshape(shape) if a.size > 1 else a.reshape(())
    lo, hi = fp.dtype_range(dtype)
    t1, t2, t3, t4 = (b.tmp(f"{base}_{s}") for s in ("rnd", "shr", "zp", "clip"))
    b.node("Add", [prod, b.const(f"{base}_round", shaped(c))], [t1], f"{base}_round")
    b.node("Div", [t1, b.const(f"{base}_pow2", shaped(div))], [t2], f"{base}_shift")
    b.node("Add", [t2, b.const(f"{base}_offset", shaped(off))], [t3], f"{base}_zp")
    b.node("Clip", [t3, b.const(f"clip_lo_i64_{lo}", np.array(lo, np.int64)),
                    b.const(f"clip_hi_i64_{hi}", np.array(hi, np.int64))], [t4],
           f"{base}_clip")
    to = onnx.TensorProto.UINT8 if np.dtype(dtype) == np.uint8 else onnx.TensorProto.INT8
    b.node("Cast", [t4], [out], f"{base}_cast", to=to)
    return ["Add", "Div", "Add", "Clip", "Cast"]


def bias_codes(grp: Group, b: Builder, k: int, acc_scale: np.ndarray,
               beta: float = 1.0) -> np.ndarray | None:
    """The bias input ``k`` as int32 at the accumulator scale ``acc_scale`` (= S_x * S_w,
    per output channel), or None when absent. A bias already quantized at that scale is
    kept bit for bit; anything else is rescaled (rounded half to even)."""
    if k >= len(grp.ins) or grp.ins[k].kind == "none":
        return None
    x = grp.ins[k]
    acc_scale = np.asarray(acc_scale, dtype=np.float64)
    if x.kind == "qconst":
        q = x.value(b.g).astype(np.int64) - x.qp.zero_point.astype(np.int64)
        s = x.qp.scale.astype(np.float64)
        if beta == 1.0 and x.qp.dtype == np.int32 and np.array_equal(
            np.asarray(s, np.float32), np.asarray(acc_scale, np.float32) * np.ones_like(s)
        ):
            return q.astype(np.int32)
        real = q * s
    elif x.kind == "fconst":
        real = x.value(b.g).astype(np.float64)
    else:
        raise Unsupported(f"bias {x.name!r} is not a constant")
    codes = np.rint(beta * real / acc_scale)
    if np.any(np.abs(codes) > 2**31 - 1):
        raise Unsupported(f"bias {x.name!r} does not fit int32 at the accumulator scale")
    return codes.astype(np.int32)
