"""Mode ``fixed_point``: standard ONNX integer operators only, no float arithmetic.

Conv/MatMul/Gemm accumulate with ConvInteger/MatMulInteger in int32; every rescale is
``Cast(int64) -> Mul(M0) -> requant_tail`` (see ``emit.requantize``,
``arithmetic.fixedpoint`` and ``accumulator``); Add/Mul/Concat rescale each input the same
way; average pools sum with ConvInteger/ReduceSum; elementwise non-linearities become
256-entry tables (Gather). Each lowered layer also yields a parameter record for
``fixed_point_params.json`` (``records``).
"""

from __future__ import annotations

import numpy as np
import onnx
from numpy.typing import NDArray
from qbuild_onnx_common.allocation import check_shape
from qbuild_onnx_common.graph import attrs

from ..arithmetic import fixedpoint as fp
from ..arithmetic.tables import Chained, ConcatInput, TableRequest
from ..emit.builder import Builder, Handler
from ..emit.quantized import DATA_MOVEMENT, LUT_OPS, gather_codes, lower_data_movement, lower_lut
from ..emit.requantize import bias_codes, requant_tail
from ..qdq.graph import Graph, QParams, Shape, onnx_opset
from ..qdq.groups import DTYPE, Group, Out, Quantized, Unsupported, is_8bit, need_act
from .accumulator import (
    I64,
    accumulator,
    check_range,
    choose_rounding,
    f32_ratio,
    span,
)
from .records import half_up_note, record_layer, rounding_note


def prepare(g: Graph, b: Builder) -> None:
    """Shapes of every tensor (average pools need channel and window counts)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(g.model)
    except Exception:  # shape inference is a convenience; ops that need it will say so
        inferred = g.model
    shapes: dict[str, Shape] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value")
                           else (d.dim_param or None) for d in dims]
    g.shapes = shapes


def _zp_name(b: Builder, qp: QParams) -> str:
    return qp.zp_name or b.const("zp_" + str(qp.dtype), qp.zero_point)


def _shape(b: Builder, x: Quantized) -> Shape | None:
    return b.g.shapes.get(x.name) or b.g.shapes.get(x.q)


def _pair_table(grp: Group, b: Builder, xa: Quantized, xb: Quantized,
                name: str) -> list[str] | None:
    """Rounding onnxruntime: an elementwise op of two 8-bit activations of one shape as a
    65,536-entry table computed by onnxruntime (index a * 256 + b); None when the inputs
    do not qualify (constants, broadcasting, unknown shapes)."""
    if xa.kind != "act" or xb.kind != "act":
        return None
    chained = _chained_table(grp, b, xa, xb, name)
    if chained:
        return chained
    sa, sb = _shape(b, xa), _shape(b, xb)
    if not sa or sa != sb or any(d is None for d in sa):
        return None
    table = b.fresh(f"{name}_table")
    b.luts.append(TableRequest(table, grp, "pair"))
    i32 = onnx.TensorProto.INT32
    ia, ib, hi, idx, idx2 = (b.tmp(f"{name}_{t}") for t in ("ia", "ib", "hi", "idx", "idx2"))
    b.node("Cast", [xa.q], [ia], f"{name}_cast_a", to=i32)
    b.node("Cast", [xb.q], [ib], f"{name}_cast_b", to=i32)
    b.node("Mul", [ia, b.const("i32_256", np.array(256, np.int32))], [hi], f"{name}_row")
    b.node("Add", [hi, ib], [idx], f"{name}_index")
    offset = (128 if xa.qp.dtype == np.int8 else 0) * 256 + (128 if xb.qp.dtype == np.int8 else 0)
    ops = ["Cast", "Cast", "Mul", "Add"]
    if offset:
        b.node("Add", [idx, b.const(f"i32_{offset}", np.array(offset, np.int32))], [idx2],
               f"{name}_offset")
        idx = idx2
        ops.append("Add")
    b.node("Gather", [table, idx], [grp.outs[0].q], f"{name}_lut", axis=0)
    record_layer(b, grp, "lookup_table_2d", [xa, xb], grp.outs[0], None, None, None,
                 rounding="onnxruntime", table_initializer=table)
    return ops + ["Gather"]


def _chained_table(grp: Group, b: Builder, xa: Quantized, xb: Quantized,
                   name: str) -> list[str] | None:
    """``op(x, f(x))`` with ``f`` a lookup table lowered earlier (SiLU: ``x * Sigmoid(x)``)
    is a function of the codes of ``x`` alone: one 256-entry table, computed by onnxruntime
    running both groups, replaces the 65,536-entry one."""
    for request in b.luts:
        if request.kind != "unary":
            continue
        ugrp = request.group
        src, dst = ugrp.ins[0].q, ugrp.outs[0].q
        for j, (x, fx) in enumerate(((xa, xb), (xb, xa))):
            if fx.q == dst and x.q == src:
                lut_input = 1 - j  # the pair input the unary table produces
                new = b.fresh(f"{name}_table")
                b.luts.append(TableRequest(new, grp, Chained(lut_input, ugrp)))
                ops = gather_codes(b, x.q, x.qp, new, grp.outs[0].q, name)
                record_layer(b, grp, "lookup_table", [x], grp.outs[0], None, None, None,
                             rounding="onnxruntime", composed_with=ugrp.node.name or "",
                             table_name=new)
                return ops
    return None


def conv(grp: Group, b: Builder) -> list[str]:
    x = need_act(grp.ins[0], "Conv input", const_ok=False)
    if grp.ins[1].kind != "qconst":
        raise Unsupported(f"Conv weight {grp.ins[1].name!r} is not a quantized constant")
    w = grp.ins[1].quantized()
    if not is_8bit(w.qp):
        raise Unsupported(f"Conv weight is {w.qp.dtype}, not 8-bit", DTYPE)
    wz = np.unique(w.qp.zero_point)
    if wz.size != 1:
        raise Unsupported(
            "Conv weight zero points differ per channel (ConvInteger takes one)", DTYPE
        )
    out = grp.outs[0]
    wv = w.value(b.g)
    cout = wv.shape[0]
    ws = np.broadcast_to(w.qp.scale.astype(np.float32), (cout,))
    real = f32_ratio(np.float32(x.qp.scale.ravel()[0]) * ws, out.qp.scale.ravel()[0])
    m0, shift = fp.decompose_all(real)
    acc_scale = x.qp.scale.astype(np.float64).ravel()[0] * ws.astype(np.float64)
    bias_i32 = bias_codes(grp, b, 2, acc_scale)
    bias = np.zeros(cout, np.int64) if bias_i32 is None else bias_i32.astype(np.int64)
    wabs = np.abs(wv.astype(np.int64) - int(wz[0])).reshape(cout, -1).sum(axis=1)
    check_range(wabs * span(x.qp), m0, "Conv")
    bound = int((wabs * span(x.qp) + np.abs(bias)).max())
    rounding, why, round_acc = choose_rounding(b, m0, shift, real, bound)
    name = grp.node.name or "Conv"
    ins = [x.q, w.q, _zp_name(b, x.qp)]
    if int(wz[0]) != 0:
        ins.append(b.const(f"{name}_wzp", np.array(wz[0], dtype=w.qp.dtype)))
    acc, acc64, prod = b.tmp(f"{name}_acc"), b.tmp(f"{name}_acc64"), b.tmp(f"{name}_prod")
    b.node("ConvInteger", ins, [acc], name, **attrs(grp.node))
    b.node("Cast", [acc], [acc64], f"{name}_cast", to=I64)
    shape = (cout,) + (1,) * (wv.ndim - 2)
    acc64, acc_ops, folded_bias = accumulator(b, acc64, bias, shape, bound, round_acc, name)
    b.node(
        "Mul",
        [acc64, b.const(f"{name}_m0", m0.reshape(shape) if cout > 1 else m0.reshape(()))],
        [prod],
        f"{name}_m0",
    )
    ops = acc_ops + requant_tail(
        b,
        prod,
        shift,
        folded_bias.astype(object) * m0.astype(object),
        int(out.qp.zero_point.ravel()[0]),
        out.qp.dtype,
        out.q,
        name,
        shape,
        prod_bound=int((wabs * span(x.qp) * m0).max()),
        rounding=rounding,
    )
    record_layer(
        b,
        grp,
        "conv",
        [x],
        out,
        m0,
        shift,
        real,
        bias=[int(v) for v in bias],
        weight_zero_point=int(wz[0]),
        rounding=rounding,
        **rounding_note(why),
    )
    return ["ConvInteger", "Cast", "Mul", *ops]


def _matmul_like(grp: Group, b: Builder, trans_b: bool, alpha: float, beta: float,
                 bias_k: int | None) -> list[str]:
    a = need_act(grp.ins[0], f"{grp.node.op_type} input A")
    out = grp.outs[0]
    name = grp.node.name or grp.node.op_type
    bs: NDArray[np.float32]
    babs: NDArray[np.int64] | None
    if grp.ins[1].kind == "qconst":
        wb = grp.ins[1].quantized()
        if not is_8bit(wb.qp):
            raise Unsupported(f"{grp.node.op_type} B is {wb.qp.dtype}, not 8-bit", DTYPE)
        bv = wb.value(b.g)
        if bv.ndim != 2:
            raise Unsupported(f"{grp.node.op_type} B of rank {bv.ndim}")
        if not wb.qp.per_tensor and wb.qp.axis != (0 if trans_b else 1):
            raise Unsupported(f"{grp.node.op_type} B quantized along the reduction axis", DTYPE)
        bz = np.asarray(wb.qp.zero_point)
        if trans_b:
            bv = bv.T
        n = bv.shape[1]
        b_name = b.const(f"{name}_B", np.ascontiguousarray(bv)) if trans_b else wb.q
        bs = np.broadcast_to(wb.qp.scale.astype(np.float32), (n,))
        bzv = np.broadcast_to(bz, (n,))
        bz_name = b.const(
            f"{name}_bzp", np.ascontiguousarray(bzv) if bz.size > 1 else bz.reshape(())
        )
        babs = np.abs(bv.astype(np.int64) - bzv.astype(np.int64)).sum(axis=0)
    else:
        if trans_b:
            raise Unsupported("Gemm with transB on an activation")
        wb = need_act(grp.ins[1], f"{grp.node.op_type} input B")
        n = 1
        bs = wb.qp.scale.astype(np.float32).ravel()
        b_name, bz_name = wb.q, _zp_name(b, wb.qp)
        babs = None
    real = (f32_ratio(np.float32(a.qp.scale.ravel()[0]) * bs, out.qp.scale.ravel()[0])
            .astype(np.float64) * alpha)
    m0, shift = fp.decompose_all(real)
    bias = np.zeros(n, np.int64)
    if bias_k is not None:
        acc_scale = a.qp.scale.astype(np.float64).ravel()[0] * bs.astype(np.float64)
        bc = bias_codes(grp, b, bias_k, acc_scale, beta=beta / alpha if alpha else beta)
        if bc is not None:
            bias = bc.astype(np.int64)
    if babs is not None:
        check_range(babs * span(a.qp), m0, grp.node.op_type)
        bound = int((babs * span(a.qp) + np.abs(bias)).max())
    else:  # activation B: the reduction length bounds the accumulator
        k_dim = (_shape(b, a) or [None])[-1]
        bound = (int(k_dim) * span(a.qp) * span(wb.qp) + int(np.abs(bias).max())
                 if k_dim else fp.FLOAT32_EXACT)
    rounding, why, round_acc = choose_rounding(b, m0, shift, real, bound, exact_op=alpha == 1.0)
    acc, acc64, prod = b.tmp(f"{name}_acc"), b.tmp(f"{name}_acc64"), b.tmp(f"{name}_prod")
    b.node("MatMulInteger", [a.q, b_name, _zp_name(b, a.qp), bz_name], [acc], name)
    b.node("Cast", [acc], [acc64], f"{name}_cast", to=I64)
    m0c = m0 if m0.size > 1 else m0.reshape(())
    acc64, acc_ops, folded_bias = accumulator(b, acc64, bias, (n,), bound, round_acc, name)
    b.node("Mul", [acc64, b.const(f"{name}_m0", m0c)], [prod], f"{name}_m0")
    ops = acc_ops + requant_tail(
        b,
        prod,
        shift,
        folded_bias.astype(object) * m0.astype(object),
        int(out.qp.zero_point.ravel()[0]),
        out.qp.dtype,
        out.q,
        name,
        (n,) if n > 1 else (),
        rounding=rounding,
    )
    record_layer(b, grp, "matmul", [a], out, m0, shift, real, bias=[int(v) for v in bias],
                 rounding=rounding, **rounding_note(why))
    return ["MatMulInteger", "Cast", "Mul", *ops]


def matmul(grp: Group, b: Builder) -> list[str]:
    return _matmul_like(grp, b, False, 1.0, 1.0, None)


def gemm(grp: Group, b: Builder) -> list[str]:
    if grp.attr("transA", 0):
        raise Unsupported("Gemm with transA")
    return _matmul_like(
        grp,
        b,
        bool(grp.attr("transB", 0)),
        float(grp.attr("alpha", 1.0)),
        float(grp.attr("beta", 1.0)),
        2,
    )


def _scaled(b: Builder, x: Quantized, m0: int, base: str
            ) -> tuple[str | None, fp.Int64s | np.int64]:
    """(int64 tensor q*M0, constant -zp*M0); a quantized constant folds entirely."""
    z = int(x.qp.zero_point.ravel()[0])
    if x.kind == "qconst":
        v = (x.value(b.g).astype(np.int64) - z) * np.int64(m0)
        return None, v
    c64, p = b.tmp(f"{base}_i64"), b.tmp(f"{base}_scaled")
    b.node("Cast", [x.q], [c64], f"{base}_cast", to=I64)
    b.node("Mul", [c64, b.const(f"{base}_m0", np.array(m0, np.int64))], [p], f"{base}_m0")
    return p, np.int64(-z * m0)


def add(grp: Group, b: Builder) -> list[str]:
    xa = need_act(grp.ins[0], "Add input A")
    xb = need_act(grp.ins[1], "Add input B")
    out = grp.outs[0]
    name = grp.node.name or "Add"
    if b.rounding == "onnxruntime":
        table_ops = _pair_table(grp, b, xa, xb, name)
        if table_ops:
            return table_ops
    ys = out.qp.scale.ravel()[0]
    reals = [f32_ratio(xa.qp.scale.ravel()[0], ys), f32_ratio(xb.qp.scale.ravel()[0], ys)]
    m0s, shift = fp.shared_shift(reals)
    check_range(np.array([span(xa.qp) + span(xb.qp)]), np.array([int(m0s.max())]), "Add")
    pa, ca = _scaled(b, xa, int(m0s[0]), f"{name}_a")
    pb, cb = _scaled(b, xb, int(m0s[1]), f"{name}_b")
    tensors = [t for t in (pa, pb) if t is not None]
    if not tensors:
        raise Unsupported("Add of two constants")
    extra: fp.Int64s | np.int64
    if len(tensors) == 2:
        s = b.tmp(f"{name}_sum")
        b.node("Add", tensors, [s], f"{name}_sum")
        extra = np.int64(ca + cb)
        ops = ["Cast", "Mul", "Cast", "Mul", "Add"]
    else:  # the constant input folds into the rounding constant
        s = tensors[0]
        const = cb if pa is not None else ca
        extra = (ca if pa is not None else cb) + np.asarray(const, np.int64)
        ops = ["Cast", "Mul"]
    ops += requant_tail(
        b,
        s,
        shift,
        extra,
        int(out.qp.zero_point.ravel()[0]),
        out.qp.dtype,
        out.q,
        name,
        np.shape(extra) or (),
    )
    record_layer(b, grp, "add", [xa, xb], out, m0s, shift, np.array(reals).ravel(),
                 **half_up_note(b, "a constant or broadcast input has no table"))
    return ops


def mul(grp: Group, b: Builder) -> list[str]:
    xa = need_act(grp.ins[0], "Mul input A")
    xb = need_act(grp.ins[1], "Mul input B")
    out = grp.outs[0]
    name = grp.node.name or "Mul"
    if b.rounding == "onnxruntime":
        table_ops = _pair_table(grp, b, xa, xb, name)
        if table_ops:
            return table_ops
    real = f32_ratio(
        np.float32(xa.qp.scale.ravel()[0]) * np.float32(xb.qp.scale.ravel()[0]),
        out.qp.scale.ravel()[0],
    )
    mm = fp.decompose(float(real))
    check_range(np.array([span(xa.qp) * span(xb.qp)]), np.array([mm.m0]), "Mul")
    ops: list[str] = []

    def centered(x: Quantized, base: str) -> str:
        z = int(x.qp.zero_point.ravel()[0])
        if x.kind == "qconst":
            return b.const(f"{base}_c", x.value(b.g).astype(np.int64) - z)
        c64 = b.tmp(f"{base}_i64")
        b.node("Cast", [x.q], [c64], f"{base}_cast", to=I64)
        ops.append("Cast")
        if z == 0:
            return c64
        d = b.tmp(f"{base}_centered")
        b.node("Sub", [c64, b.const(f"{base}_zp", np.array(z, np.int64))], [d], f"{base}_zp")
        ops.append("Sub")
        return d

    ca, cb = centered(xa, f"{name}_a"), centered(xb, f"{name}_b")
    p, pm = b.tmp(f"{name}_prod"), b.tmp(f"{name}_prodm")
    b.node("Mul", [ca, cb], [p], f"{name}_mul")
    b.node("Mul", [p, b.const(f"{name}_m0", np.array(mm.m0, np.int64))], [pm], f"{name}_m0")
    ops += ["Mul", "Mul"]
    ops += requant_tail(
        b, pm, mm.shift, 0, int(out.qp.zero_point.ravel()[0]), out.qp.dtype, out.q, name, ()
    )
    record_layer(b, grp, "mul", [xa, xb], out, [mm.m0], mm.shift, [float(real)],
                 **half_up_note(b, "a constant or broadcast input has no table"))
    return ops


def _rescale(b: Builder, x: Quantized, out: Out, base: str
             ) -> tuple[str, list[str], tuple[fp.Multiplier, NDArray[np.float32]]]:
    """Requantize one tensor to the output parameters: q -> zy + round((q - zx) * M)."""
    real = f32_ratio(x.qp.scale.ravel()[0], out.qp.scale.ravel()[0])
    mm = fp.decompose(float(real))
    zx = int(x.qp.zero_point.ravel()[0])
    check_range(np.array([span(x.qp)]), np.array([mm.m0]), "rescale")
    c64, p, y = b.tmp(f"{base}_i64"), b.tmp(f"{base}_scaled"), b.tmp(f"{base}_rq")
    b.node("Cast", [x.q], [c64], f"{base}_cast", to=I64)
    b.node("Mul", [c64, b.const(f"{base}_m0", np.array(mm.m0, np.int64))], [p], f"{base}_m0")
    ops = ["Cast", "Mul"] + requant_tail(
        b, p, mm.shift, -zx * mm.m0, int(out.qp.zero_point.ravel()[0]), out.qp.dtype, y, base, ()
    )
    return y, ops, (mm, real)


def concat(grp: Group, b: Builder) -> list[str]:
    out = grp.outs[0]
    xs = [need_act(x, "Concat input") for x in grp.ins]
    if all(x.qp.same_as(out.qp) for x in xs):
        return lower_data_movement(grp, b)
    name = grp.node.name or "Concat"
    names: list[str] = []
    ops: list[str] = []
    for k, x in enumerate(xs):
        if x.qp.same_as(out.qp):
            names.append(x.q)
            continue
        if b.rounding == "onnxruntime":
            y = b.tmp(f"{name}_in{k}_rq")
            table = b.fresh(f"{name}_in{k}_table")
            b.luts.append(TableRequest(table, grp, ConcatInput(k)))
            ops += gather_codes(b, x.q, x.qp, table, y, f"{name}_in{k}")
            names.append(y)
            record_layer(b, grp, "lookup_table", [x], out, None, None, None, input_index=k,
                         rounding="onnxruntime", table_name=table)
            continue
        y, o, (mm, real) = _rescale(b, x, out, f"{name}_in{k}")
        names.append(y)
        ops += o
        record_layer(b, grp, "rescale", [x], out, [mm.m0], mm.shift, [float(real)], input_index=k)
    b.node("Concat", names, [out.q], name, axis=int(grp.attr("axis")))
    return ops + ["Concat"]


def average_pool(grp: Group, b: Builder) -> list[str]:
    x = need_act(grp.ins[0], "AveragePool input", const_ok=False)
    out = grp.outs[0]
    n = grp.node
    k = list(grp.attr("kernel_shape"))
    pads = list(grp.attr("pads", [0] * (2 * len(k))))
    if grp.attr("ceil_mode", 0):
        raise Unsupported("AveragePool with ceil_mode (windows of varying size)")
    if any(pads) and not grp.attr("count_include_pad", 0):
        raise Unsupported("AveragePool with padding excluded from the count (varying divisor)")
    if grp.attr("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        raise Unsupported("AveragePool with SAME auto padding")
    shape = b.g.shapes.get(grp.ins[0].name)
    if not shape or shape[1] is None:
        raise Unsupported("AveragePool: channel count unknown (shape inference failed)")
    c = int(shape[1])
    count = int(np.prod(k))
    real = f32_ratio(
        x.qp.scale.ravel()[0], np.float32(out.qp.scale.ravel()[0]) * np.float32(count)
    )
    mm = fp.decompose(float(real))
    check_range(np.array([count * span(x.qp)]), np.array([mm.m0]), "AveragePool")
    name = n.name or "AveragePool"
    # the kernel's size comes from the model's attributes: bounded before it is made
    check_shape(f"the summing kernel of AveragePool node '{name}'", [c, 1, *k], np.uint8)
    ones = b.const(f"{name}_ones", np.ones([c, 1, *k], dtype=np.uint8))
    acc, acc64, prod = b.tmp(f"{name}_sum"), b.tmp(f"{name}_sum64"), b.tmp(f"{name}_prod")
    kw = {
        a: grp.attr(a)
        for a in ("strides", "pads", "dilations", "auto_pad")
        if grp.attr(a) is not None
    }
    b.node(
        "ConvInteger", [x.q, ones, _zp_name(b, x.qp)], [acc], name, group=c, kernel_shape=k, **kw
    )
    b.node("Cast", [acc], [acc64], f"{name}_cast", to=I64)
    b.node("Mul", [acc64, b.const(f"{name}_m0", np.array(mm.m0, np.int64))], [prod], f"{name}_m0")
    ops = requant_tail(
        b, prod, mm.shift, 0, int(out.qp.zero_point.ravel()[0]), out.qp.dtype, out.q, name, ()
    )
    record_layer(b, grp, "average_pool", [x], out, [mm.m0], mm.shift, [float(real)], window=count,
                 **half_up_note(b, "onnxruntime's QLinearAveragePool is not reproduced"))
    return ["ConvInteger", "Cast", "Mul", *ops]


def global_average_pool(grp: Group, b: Builder) -> list[str]:
    x = need_act(grp.ins[0], "GlobalAveragePool input", const_ok=False)
    out = grp.outs[0]
    shape = b.g.shapes.get(grp.ins[0].name)
    if not shape or any(d is None for d in shape[2:]):
        raise Unsupported("GlobalAveragePool: spatial size unknown (shape inference failed)")
    count = int(np.prod([int(d) for d in shape[2:] if d is not None]))
    if b.rounding == "onnxruntime":  # onnxruntime's order: float32(float32(Sx / N) / Sy)
        real = f32_ratio(f32_ratio(x.qp.scale.ravel()[0], count), out.qp.scale.ravel()[0])
    else:
        real = f32_ratio(
            x.qp.scale.ravel()[0], np.float32(out.qp.scale.ravel()[0]) * np.float32(count)
        )
    mm = fp.decompose(float(real))
    check_range(np.array([count * span(x.qp)]), np.array([mm.m0]), "GlobalAveragePool")
    rounding, why, _ = choose_rounding(b, [mm.m0], [mm.shift], [real], count * span(x.qp))
    name = grp.node.name or "GlobalAveragePool"
    axes = list(range(2, len(shape)))
    c32, s, s64, prod = (b.tmp(f"{name}_{t}") for t in ("i32", "sum", "sum64", "prod"))
    b.node("Cast", [x.q], [c32], f"{name}_cast32", to=onnx.TensorProto.INT32)
    if onnx_opset(b.g.model) >= 13:
        b.node(
            "ReduceSum",
            [c32, b.const(f"{name}_axes", np.array(axes, np.int64))],
            [s],
            name,
            keepdims=1,
        )
    else:
        b.node("ReduceSum", [c32], [s], name, axes=axes, keepdims=1)
    b.node("Cast", [s], [s64], f"{name}_cast64", to=I64)
    b.node("Mul", [s64, b.const(f"{name}_m0", np.array(mm.m0, np.int64))], [prod], f"{name}_m0")
    zx = int(x.qp.zero_point.ravel()[0])
    ops = requant_tail(
        b,
        prod,
        mm.shift,
        -count * zx * mm.m0,
        int(out.qp.zero_point.ravel()[0]),
        out.qp.dtype,
        out.q,
        name,
        (),
        rounding=rounding,
    )
    record_layer(b, grp, "global_average_pool", [x], out, [mm.m0], mm.shift, [float(real)],
                 window=count, rounding=rounding, **rounding_note(why))
    return ["Cast", "ReduceSum", "Cast", "Mul", *ops]


def lut(grp: Group, b: Builder) -> list[str]:
    ops = lower_lut(grp, b)
    table = b.luts[-1].name
    record_layer(b, grp, "lookup_table", [grp.ins[0].quantized()], grp.outs[0], None, None, None,
                 table_name=table)
    return ops


def handler(op_type: str) -> Handler | None:
    if op_type in HANDLERS:
        return HANDLERS[op_type]
    if op_type in DATA_MOVEMENT:
        return lower_data_movement
    if op_type in LUT_OPS:
        return lut
    return None


HANDLERS: dict[str, Handler] = {
    "Conv": conv,
    "MatMul": matmul,
    "Gemm": gemm,
    "Add": add,
    "Mul": mul,
    "Concat": concat,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
}
