"""A numpy executor for ``fixed_point`` graphs, written from the ONNX operator semantics.

Integer ops are computed exactly (int64; integer ``Div`` truncates toward zero as ONNX
specifies). ConvInteger/MatMulInteger use float64 BLAS on the zero-point-corrected codes:
every product and partial sum is an integer below 2**53, so the result is exact (checked
per call). The boundary QuantizeLinear/DequantizeLinear follow the spec (round half to
even). Ops left in float by the lowering are delegated to ``onnx.reference``, and counted.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from qbuild_onnx_common.graph import attr, attrs, opset

from ..qdq.graph import toposort

_NP = {onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8,
       onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64,
       onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.BOOL: np.bool_}


_COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
            "GreaterOrEqual": np.greater_equal, "Equal": np.equal}


def _conv_integer(x, w, xz, wz, n):
    x = x.astype(np.float64) - float(xz)
    w = w.astype(np.float64) - float(wz)
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
    return np.rint(y).astype(np.int32).reshape(nb, m, *out_sp)


def _matmul_integer(a, b, az, bz):
    a = a.astype(np.float64) - np.asarray(az, np.float64)
    b = b.astype(np.float64) - np.asarray(bz, np.float64)
    if float(np.abs(a).max(initial=0)) * float(np.abs(b).sum(axis=-2).max(initial=0)) >= 2**53:
        raise OverflowError("MatMulInteger reference: partial sums may exceed 2**53")
    return np.rint(np.matmul(a, b)).astype(np.int32)


def _int_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)


def _quantize(x, s, z, axis):
    z = np.asarray(z)
    if np.ndim(s) and np.size(s) > 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = np.reshape(s, shape), np.reshape(z, shape)
    info = np.iinfo(z.dtype)
    y = np.rint(x.astype(np.float32) / np.float32(s)) + z.astype(np.int64)
    return np.clip(y, info.min, info.max).astype(z.dtype)


def _resize_nearest(x, n, inputs, vals):
    scales = vals.get(inputs[2]) if len(inputs) > 2 and inputs[2] else None
    sizes = vals.get(inputs[3]) if len(inputs) > 3 and inputs[3] else None
    if sizes is None:
        sizes = np.floor(np.array(x.shape) * scales).astype(np.int64)
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


def _maxpool(x, n):
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
    return win.max(axis=tuple(range(-nd, 0)))


def run(model: onnx.ModelProto, feeds: dict, stats: dict | None = None) -> dict:
    """Execute ``model`` on ``feeds``; returns every graph output."""
    vals = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    vals.update(feeds)
    version = opset(model)
    inputs = {i.name for i in model.graph.input}
    for n in toposort(list(model.graph.node), inputs):
        ins = [vals[t] if t else None for t in n.input]
        op = n.op_type
        if op == "QuantizeLinear":
            z = ins[2] if len(ins) > 2 and ins[2] is not None else np.uint8(0)
            out = [_quantize(ins[0], ins[1], z, attr(n, "axis", 1))]
        elif op == "DequantizeLinear":
            z = ins[2] if len(ins) > 2 and ins[2] is not None else 0
            s, zz = np.asarray(ins[1], np.float32), np.asarray(z).astype(np.int64)
            if s.size > 1:
                shape = [1] * ins[0].ndim
                shape[attr(n, "axis", 1)] = -1
                s, zz = s.reshape(shape), zz.reshape(shape)
            out = [((ins[0].astype(np.int64) - zz).astype(np.float32) * s).astype(np.float32)]
        elif op == "ConvInteger":
            xz = ins[2] if len(ins) > 2 and ins[2] is not None else 0
            wz = ins[3] if len(ins) > 3 and ins[3] is not None else 0
            out = [_conv_integer(ins[0], ins[1], xz, wz, n)]
        elif op == "MatMulInteger":
            az = ins[2] if len(ins) > 2 and ins[2] is not None else 0
            bz = ins[3] if len(ins) > 3 and ins[3] is not None else 0
            out = [_matmul_integer(ins[0], ins[1], az, bz)]
        elif op == "Cast":
            out = [ins[0].astype(_NP[attr(n, "to")])]
        elif op in ("Add", "Sub", "Mul"):
            f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
            out = [f(ins[0], ins[1]).astype(np.result_type(ins[0], ins[1]))]
        elif op == "Div":
            if ins[0].dtype.kind in "iu":
                out = [_int_div(ins[0], ins[1])]
            else:
                out = [(ins[0] / ins[1]).astype(ins[0].dtype)]
        elif op == "Abs":
            out = [np.abs(ins[0])]
        elif op == "Mod" and ins[0].dtype.kind in "iu" and not attr(n, "fmod", 0):
            out = [np.mod(ins[0], ins[1]).astype(ins[0].dtype)]  # sign of the divisor
        elif op in _COMPARE:
            out = [_COMPARE[op](ins[0], ins[1])]
        elif op == "Sign":
            out = [np.sign(ins[0]).astype(ins[0].dtype)]
        elif op in ("And", "Or"):
            out = [(np.logical_and if op == "And" else np.logical_or)(ins[0], ins[1])]
        elif op == "Not":
            out = [np.logical_not(ins[0])]
        elif op == "Clip":
            out = [np.clip(ins[0], ins[1], ins[2]).astype(ins[0].dtype)]
        elif op == "Gather":
            out = [np.take(ins[0], ins[1].astype(np.int64), axis=attr(n, "axis", 0))]
        elif op == "GatherElements":
            out = [np.take_along_axis(ins[0], ins[1].astype(np.int64),
                                      axis=attr(n, "axis", 0))]
        elif op == "Shape":
            out = [np.array(ins[0].shape, np.int64)]
        elif op == "Concat":
            out = [np.concatenate(ins, axis=attr(n, "axis"))]
        elif op == "Reshape":
            shape = [d if d != 0 else ins[0].shape[i] for i, d in enumerate(ins[1])]
            out = [ins[0].reshape(shape)]
        elif op == "Transpose":
            out = [np.transpose(ins[0], attr(n, "perm", None))]
        elif op == "Flatten":
            ax = attr(n, "axis", 1)
            out = [ins[0].reshape(int(np.prod(ins[0].shape[:ax])), -1)]
        elif op == "ReduceSum":
            axes = tuple(ins[1]) if version >= 13 and len(ins) > 1 else tuple(attr(n, "axes"))
            out = [ins[0].sum(axis=axes, keepdims=bool(attr(n, "keepdims", 1)),
                              dtype=ins[0].dtype)]
        elif op == "MaxPool":
            out = [_maxpool(ins[0], n)]
        elif op == "Resize" and attr(n, "mode", b"nearest") == b"nearest":
            out = [_resize_nearest(ins[0], n, list(n.input), vals)]
        elif op == "Slice" and version >= 10:
            x = ins[0]
            axes = ins[3] if len(ins) > 3 and ins[3] is not None else range(len(ins[1]))
            steps = ins[4] if len(ins) > 4 and ins[4] is not None else [1] * len(ins[1])
            sl = [slice(None)] * x.ndim
            for s, e, a, st in zip(ins[1], ins[2], axes, steps):
                sl[int(a)] = slice(int(s), int(e), int(st))
            out = [x[tuple(sl)]]
        elif op == "Identity":
            out = [ins[0]]
        elif op == "SpaceToDepth":
            b = attr(n, "blocksize")
            x = ins[0]
            nb, c, h, w = x.shape
            x = x.reshape(nb, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
            out = [x.reshape(nb, c * b * b, h // b, w // b)]
        else:
            out = _delegate(n, ins, version)
            if stats is not None:
                stats[op] = stats.get(op, 0) + 1
        for t, v in zip(n.output, out):
            vals[t] = np.asarray(v)
    return {o.name: vals[o.name] for o in model.graph.output}


def _delegate(n, ins, version):
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(ins))]
    node = helper.make_node(n.op_type, names, [f"o{k}" for k in range(len(n.output))],
                            domain=n.domain, **attrs(n))
    ev = ReferenceEvaluator(node, opsets={"": version})
    return ev.run(None, dict(zip(names, ins)))
