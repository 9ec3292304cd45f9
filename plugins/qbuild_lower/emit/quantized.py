"""Emitters both modes share that work on the 8-bit codes themselves: data movement with
scale and zero point unchanged, and element-wise ops as lookup tables indexed by the codes.
"""

from __future__ import annotations

import numpy as np
import onnx
from qbuild_onnx_common.graph import attr, attrs

from ..arithmetic import fixedpoint as fp
from ..arithmetic.tables import TableRequest
from ..qdq.graph import QParams, onnx_opset
from ..qdq.groups import SCALE_MISMATCH, Group, Unsupported, need_act, same_params
from .builder import Builder

#: Ops that only move or select elements: they run on the quantized codes unchanged when
#: input and output share scale and zero point. Value: index of the data input(s).
DATA_MOVEMENT: dict[str, tuple[int, ...] | None] = {
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
    for k, other in enumerate(grp.ins):
        if k in data_idx:
            continue
        if other.kind in ("act", "qconst"):
            raise Unsupported(f"{n.op_type} parameter input {other.name!r} is quantized")
    if n.op_type == "Pad":
        inputs = _pad_inputs(grp, b, inputs, ref)
    if n.op_type == "MaxPool" and float(ref.scale.ravel()[0]) <= 0:
        raise Unsupported("MaxPool on a non-positive scale", SCALE_MISMATCH)
    b.node(n.op_type, inputs, [o.q for o in grp.outs], n.name or n.op_type,
           domain=n.domain, **attrs(n))
    return [n.op_type]


def _pad_inputs(grp: Group, b: Builder, inputs: list[str], qp: QParams) -> list[str]:
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
    the 256 output codes. The table is computed at build time (``arithmetic.tables``)."""
    n = grp.node
    x = need_act(grp.ins[0], f"{n.op_type} input", const_ok=False)
    for k, extra in enumerate(grp.ins[1:], 1):
        if extra.kind not in ("fconst", "none", "raw"):
            raise Unsupported(f"{n.op_type} input {k} ({extra.name!r}) is not constant")
    if len(grp.outs) != 1:
        raise Unsupported(f"{n.op_type} with several outputs")
    out = grp.outs[0]
    table = b.fresh(f"{n.name or n.op_type}_table")
    b.luts.append(TableRequest(table, grp, "unary"))
    return gather_codes(b, x.q, x.qp, table, out.q, n.name or n.op_type)


def gather_codes(b: Builder, codes: str, qp: QParams, table: str, out: str,
                 name: str) -> list[str]:
    """``out = table[codes]`` (``codes`` quantized as ``qp``): Cast to int32 (+128 for
    int8 codes), then GatherElements on the flattened codes and a Reshape back to their
    shape.

    GatherElements rather than Gather: onnxruntime 1.31's Gather copies one element per
    call (about 8-17 ns per element on this project's machine), GatherElements runs
    about 1.5-1.9 ns (``bench/bench_tables.py``). Below opset 11 (no GatherElements) it
    is a Gather."""
    idx = b.tmp(f"{name}_idx")
    b.node("Cast", [codes], [idx], f"{name}_cast", to=onnx.TensorProto.INT32)
    ops = ["Cast"]
    if qp.dtype == np.int8:
        shifted = b.tmp(f"{name}_idx128")
        b.node("Add", [idx, b.const("lut_offset_128", np.array(128, np.int32))], [shifted],
               f"{name}_offset")
        idx = shifted
        ops.append("Add")
    if onnx_opset(b.g.model) < 11:
        b.node("Gather", [table, idx], [out], f"{name}_lut", axis=0)
        return ops + ["Gather"]
    flat, got, shape = (b.tmp(f"{name}_{s}") for s in ("flat", "lut", "shape"))
    b.node("Reshape", [idx, b.const("lut_flat_shape", np.array([-1], np.int64))], [flat],
           f"{name}_flatten")
    b.node("GatherElements", [table, flat], [got], f"{name}_lut", axis=0)
    b.node("Shape", [codes], [shape], f"{name}_shape")
    b.node("Reshape", [got, shape], [out], f"{name}_unflatten")
    return ops + ["Reshape", "GatherElements", "Shape", "Reshape"]


