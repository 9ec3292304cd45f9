"""A numpy executor for ``fixed_point`` graphs, written from the ONNX operator semantics.

Integer ops are computed exactly (int64; integer ``Div`` truncates toward zero as ONNX
specifies). ConvInteger/MatMulInteger use float64 BLAS on the zero-point-corrected codes:
every product and partial sum is an integer below 2**53, so the result is exact (checked
per call). The boundary QuantizeLinear/DequantizeLinear follow the spec (round half to
even). Ops left in float by the lowering are delegated to ``onnx.reference``, and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import helper, numpy_helper
from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.arrays import Array
from qbuild_onnx_common.graph import attr, attrs

from ..qdq.graph import onnx_opset, toposort

#: Every tensor's value so far, by name.
Values = dict[str, Array]

_NP = {onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8,
       onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64,
       onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.BOOL: np.bool_}


_COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
            "GreaterOrEqual": np.greater_equal, "Equal": np.equal}
_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def _conv_integer(xq: Array, wq: Array, xz: Array | int, wz: Array | int,
                  n: onnx.NodeProto) -> NDArray[np.int32]:
    x = xq.astype(np.float64) - float(xz)
    w = wq.astype(np.float64) - float(wz)
    k = list(attr(n, "kernel_shape", w.shape[2:]))
    nd = len(k)
    strides = list(attr(n, "strides", [1] * nd))
    dil = list(attr(n, "dilations", [1] * nd))
    pads = list(attr(n, "pads", [0] * 2 * nd))
    if attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        raise NotImplementedError("ConvInteger auto_pad SAME in the reference")
    group = attr(n, "group", 1)
    # zero-point-corrected input: padding value 0 == the zero point, as ConvInteger pads
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    nb, c = x.shape[:2]
    out_sp = [(x.shape[2 + i] - dil[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    win = np.lib.stride_tricks.sliding_window_view(
        x, [(k[i] - 1) * dil[i] + 1 for i in range(nd)], axis=tuple(range(2, 2 + nd)))
    sl = tuple(slice(None, None, strides[i]) for i in range(nd))
    win = win[(slice(None), slice(None)) + sl]
    win = win[(Ellipsis,) + tuple(slice(None, None, dil[i]) for i in range(nd))]
    win = win[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp)]
    # win: N, C, *out, *k  ->  N, G, Cg*K, L
    cg, m = c // group, w.shape[0]
    ksz, l_ = int(np.prod(k)), int(np.prod(out_sp))
    cols = np.moveaxis(win, list(range(2, 2 + nd)), list(range(2 + nd, 2 + 2 * nd)))
    cols = cols.reshape(nb, group, cg * ksz, l_)
    wm = w.reshape(group, m // group, cg * ksz)
    bound = float(np.abs(x).max(initial=0)) * float(np.abs(w).reshape(m, -1).sum(1).max())
    if bound >= 2**53:
        raise OverflowError("ConvInteger reference: partial sums may exceed 2**53")
    y = np.matmul(wm[None], cols)  # N, G, M/G, L
    return np.asarray(np.rint(y), np.int32).reshape(nb, m, *out_sp)


def _matmul_integer(aq: Array, bq: Array, az: Array | int, bz: Array | int
                    ) -> NDArray[np.int32]:
    a = aq.astype(np.float64) - np.asarray(az, np.float64)
    b = bq.astype(np.float64) - np.asarray(bz, np.float64)
    if float(np.abs(a).max(initial=0)) * float(np.abs(b).sum(axis=-2).max(initial=0)) >= 2**53:
        raise OverflowError("MatMulInteger reference: partial sums may exceed 2**53")
    return np.asarray(np.rint(np.matmul(a, b)), np.int32)


def _int_div(a: Array, b: Array) -> Array:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)


def _quantize(x: Array, scale: Array, zero_point: Array | np.uint8, axis: int) -> Array:
    s, z = np.asarray(scale), np.asarray(zero_point)
    if np.ndim(s) and np.size(s) > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = np.reshape(s, shape), np.reshape(z, shape)
    info = np.iinfo(z.dtype)
    y = np.rint(x.astype(np.float32) / s.astype(np.float32)) + z.astype(np.int64)
    return np.asarray(np.clip(y, info.min, info.max), z.dtype)


def _resize_nearest(x: Array, n: onnx.NodeProto, inputs: list[str], vals: Values) -> Array:
    scales = vals.get(inputs[2]) if len(inputs) > 2 and inputs[2] else None
    sizes = vals.get(inputs[3]) if len(inputs) > 3 and inputs[3] else None
    if sizes is None:
        sizes = np.floor(np.array(x.shape) * np.asarray(scales)).astype(np.int64)
        sc = np.asarray(scales, np.float64)
    else:
        sc = np.asarray(sizes, np.float64) / np.array(x.shape)
    ctm = attr(n, "coordinate_transformation_mode", b"half_pixel")
    nm = attr(n, "nearest_mode", b"round_prefer_floor")
    out = x
    for ax in range(x.ndim):
        if sizes[ax] == x.shape[ax]:
            continue
        o = np.arange(sizes[ax], dtype=np.float64)
        if ctm == b"asymmetric":
            src = o / sc[ax]
        elif ctm == b"align_corners":
            src = o * (x.shape[ax] - 1) / max(sizes[ax] - 1, 1)
        elif ctm == b"pytorch_half_pixel" and sizes[ax] == 1:
            src = np.zeros_like(o)
        else:
            src = (o + 0.5) / sc[ax] - 0.5
        if nm == b"floor":
            idx = np.floor(src)
        elif nm == b"ceil":
            idx = np.ceil(src)
        elif nm == b"round_prefer_ceil":
            idx = np.floor(src + 0.5)
        else:
            idx = np.ceil(src - 0.5)
        idx = np.clip(idx, 0, x.shape[ax] - 1).astype(np.int64)
        out = np.take(out, idx, axis=ax)
    return out


def _maxpool(x: Array, n: onnx.NodeProto) -> Array:
    k = list(attr(n, "kernel_shape"))
    nd = len(k)
    strides = list(attr(n, "strides", [1] * nd))
    pads = list(attr(n, "pads", [0] * 2 * nd))
    if attr(n, "ceil_mode", 0) or attr(n, "dilations", None) not in (None, [1] * nd):
        raise NotImplementedError("MaxPool ceil_mode/dilations in the reference")
    lo = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)],
                constant_values=lo)
    win = np.lib.stride_tricks.sliding_window_view(xp, k, axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    return np.asarray(win.max(axis=tuple(range(-nd, 0))))


class _Inputs:
    """A node's input values: ``ins[k]`` requires input k, ``optional(k)`` may be absent
    (an empty name or fewer inputs)."""

    def __init__(self, node: onnx.NodeProto, values: list[Array | None]) -> None:
        self.node = node
        self.values = values

    def __getitem__(self, k: int) -> Array:
        v = self.values[k]
        if v is None:
            raise ValueError(f"{self.node.op_type} {self.node.name!r}: input {k} is missing")
        return v

    def __len__(self) -> int:
        return len(self.values)

    def optional(self, k: int) -> Array | None:
        return self.values[k] if k < len(self.values) else None


@dataclass
class _Run:
    """What a kernel may read besides its inputs: every value so far, the opset."""

    values: Values
    version: int


#: Computes one node's outputs; None: not computed here (delegated to onnx.reference).
Kernel = Callable[[onnx.NodeProto, _Inputs, _Run], "list[Array] | None"]


def _quantize_linear(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    z = ins.optional(2)
    return [_quantize(ins[0], ins[1], np.uint8(0) if z is None else z, attr(n, "axis", 1))]


def _dequantize_linear(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    z = ins.optional(2)
    s = np.asarray(ins[1], np.float32)
    zz = np.asarray(0 if z is None else z).astype(np.int64)
    if s.size > 1:
        shape = [1] * ins[0].ndim
        shape[attr(n, "axis", 1)] = -1
        s, zz = s.reshape(shape), zz.reshape(shape)
    return [((ins[0].astype(np.int64) - zz).astype(np.float32) * s).astype(np.float32)]


def _or_zero(v: Array | None) -> Array | int:
    return 0 if v is None else v


def _conv_integer_node(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [_conv_integer(ins[0], ins[1], _or_zero(ins.optional(2)), _or_zero(ins.optional(3)),
                          n)]


def _matmul_integer_node(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [_matmul_integer(ins[0], ins[1], _or_zero(ins.optional(2)),
                            _or_zero(ins.optional(3)))]


def _arithmetic(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    f = _ARITHMETIC[n.op_type]
    return [f(ins[0], ins[1]).astype(np.result_type(ins[0], ins[1]))]


def _div(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    if ins[0].dtype.kind in "iu":
        return [_int_div(ins[0], ins[1])]
    return [(ins[0] / ins[1]).astype(ins[0].dtype)]


def _mod(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array] | None:
    if ins[0].dtype.kind in "iu" and not attr(n, "fmod", 0):
        return [np.mod(ins[0], ins[1]).astype(ins[0].dtype)]  # sign of the divisor
    return None


def _compare(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [_COMPARE[n.op_type](ins[0], ins[1])]


def _logical(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [(np.logical_and if n.op_type == "And" else np.logical_or)(ins[0], ins[1])]


def _clip(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [np.clip(ins[0], ins.optional(1), ins.optional(2)).astype(ins[0].dtype)]


def _gather(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [np.take(ins[0], ins[1].astype(np.int64), axis=attr(n, "axis", 0))]


def _gather_elements(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [np.take_along_axis(ins[0], ins[1].astype(np.int64), axis=attr(n, "axis", 0))]


def _concat(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    return [np.concatenate([ins[k] for k in range(len(ins))], axis=attr(n, "axis"))]


def _reshape(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    shape = [d if d != 0 else ins[0].shape[i] for i, d in enumerate(ins[1])]
    return [ins[0].reshape(shape)]


def _flatten(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    ax = attr(n, "axis", 1)
    return [ins[0].reshape(int(np.prod(ins[0].shape[:ax])), -1)]


def _reduce_sum(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    axes = (tuple(ins[1]) if run.version >= 13 and len(ins) > 1
            else tuple(attr(n, "axes")))
    return [ins[0].sum(axis=axes, keepdims=bool(attr(n, "keepdims", 1)), dtype=ins[0].dtype)]


def _resize(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array] | None:
    if attr(n, "mode", b"nearest") != b"nearest":
        return None
    return [_resize_nearest(ins[0], n, list(n.input), run.values)]


def _slice(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array] | None:
    if run.version < 10:
        return None
    x = ins[0]
    axes = ins.optional(3)
    steps = ins.optional(4)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(ins[1], ins[2], range(len(ins[1])) if axes is None else axes,
                           [1] * len(ins[1]) if steps is None else steps):
        sl[int(a)] = slice(int(s), int(e), int(st))
    return [x[tuple(sl)]]


def _space_to_depth(n: onnx.NodeProto, ins: _Inputs, run: _Run) -> list[Array]:
    b = attr(n, "blocksize")
    nb, c, h, w = ins[0].shape
    x = ins[0].reshape(nb, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return [x.reshape(nb, c * b * b, h // b, w // b)]


_KERNELS: dict[str, Kernel] = {
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "ConvInteger": _conv_integer_node,
    "MatMulInteger": _matmul_integer_node,
    "Cast": lambda n, ins, run: [ins[0].astype(_NP[attr(n, "to")])],
    **dict.fromkeys(_ARITHMETIC, _arithmetic),
    "Div": _div,
    "Abs": lambda n, ins, run: [np.abs(ins[0])],
    "Mod": _mod,
    **dict.fromkeys(_COMPARE, _compare),
    "Sign": lambda n, ins, run: [np.sign(ins[0]).astype(ins[0].dtype)],
    "And": _logical,
    "Or": _logical,
    "Not": lambda n, ins, run: [np.logical_not(ins[0])],
    "Clip": _clip,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Shape": lambda n, ins, run: [np.array(ins[0].shape, np.int64)],
    "Concat": _concat,
    "Reshape": _reshape,
    "Transpose": lambda n, ins, run: [np.transpose(ins[0], attr(n, "perm", None))],
    "Flatten": _flatten,
    "ReduceSum": _reduce_sum,
    "MaxPool": lambda n, ins, run: [_maxpool(ins[0], n)],
    "Resize": _resize,
    "Slice": _slice,
    "Identity": lambda n, ins, run: [ins[0]],
    "SpaceToDepth": _space_to_depth,
}


def run(model: onnx.ModelProto, feeds: dict[str, Array],
        stats: dict[str, int] | None = None) -> dict[str, Array]:
    """Execute ``model`` on ``feeds``; returns every graph output. ``stats`` counts, by op
    type, the nodes delegated to ``onnx.reference``. A model with a tensor over the
    allocation bound at these feeds' shapes is refused before anything is computed."""
    check_model(model, inputs={k: np.shape(v) for k, v in feeds.items()})
    vals: Values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    vals.update(feeds)
    context = _Run(vals, onnx_opset(model))
    inputs = {i.name for i in model.graph.input}
    for n in toposort(list(model.graph.node), inputs):
        ins = _Inputs(n, [vals[t] if t else None for t in n.input])
        kernel = _KERNELS.get(n.op_type)
        out = kernel(n, ins, context) if kernel is not None else None
        if out is None:
            out = _delegate(n, ins.values, context.version)
            if stats is not None:
                stats[n.op_type] = stats.get(n.op_type, 0) + 1
        for t, v in zip(n.output, out):
            vals[t] = np.asarray(v)
    return {o.name: vals[o.name] for o in model.graph.output}


def _delegate(n: onnx.NodeProto, ins: list[Array | None], version: int) -> list[Array]:
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(ins))]
    node = helper.make_node(n.op_type, names, [f"o{k}" for k in range(len(n.output))],
                            domain=n.domain, **attrs(n))
    ev = ReferenceEvaluator(node, opsets={"": version})
    return [np.asarray(v) for v in ev.run(None, dict(zip(names, ins)))]
