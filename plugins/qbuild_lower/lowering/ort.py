"""Mode ``ort``: DQ -> op -> Q groups become integer operators onnxruntime runs.

QLinearConv and QLinearMatMul (ai.onnx), the com.microsoft QLinear* family, QGemm, and the
data-movement and lookup-table emitters of ``emit.quantized``. Scales and zero points stay float
and 8-bit initializers as those operators expect; no float tensor flows between them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from qbuild_onnx_common.graph import attrs

from ..emit.builder import Builder, Handler
from ..emit.quantized import DATA_MOVEMENT, LUT_OPS, lower_data_movement, lower_lut
from ..emit.requantize import bias_codes
from ..qdq.graph import QParams, onnx_opset
from ..qdq.groups import DTYPE, Group, Quantized, Unsupported, is_8bit, need_act

MS = "com.microsoft"


def _sz(b: Builder, qp: QParams) -> tuple[str, str]:
    """(scale name, zero point name) for a per-tensor/per-axis QParams, materialising a zero
    point initializer when the source elided it."""
    zp = qp.zp_name or b.const("zp_" + str(qp.dtype), qp.zero_point)
    return qp.scale_name, zp


def _weight(grp: Group, k: int, axis: int | None, what: str) -> Quantized:
    x = grp.ins[k]
    # not a quantized constant: need_act raises with the right reason, or it is an
    # activation (any axis)
    w = x.quantized() if x.kind == "qconst" else need_act(x, what, per_tensor=False)
    if not is_8bit(w.qp):
        raise Unsupported(f"{what} {w.name!r} is {w.qp.dtype}, not 8-bit", DTYPE)
    if not w.qp.per_tensor and w.qp.axis != axis:
        raise Unsupported(f"{what} {w.name!r} is quantized along axis {w.qp.axis}", DTYPE)
    return w


def conv(grp: Group, b: Builder) -> list[str]:
    x = need_act(grp.ins[0], "Conv input", const_ok=False)
    w = _weight(grp, 1, 0, "Conv weight")
    out = grp.outs[0]
    acc_scale = x.qp.scale.astype(np.float64) * w.qp.scale.astype(np.float64)
    bias = bias_codes(grp, b, 2, acc_scale)
    ins = [x.q, *_sz(b, x.qp), w.q, *_sz(b, w.qp), *_sz(b, out.qp)]
    if bias is not None:
        ins.append(b.const(f"{grp.node.name or 'conv'}_bias_i32", bias))
    b.node("QLinearConv", ins, [out.q], grp.node.name or "QLinearConv", **attrs(grp.node))
    return ["QLinearConv"]


def matmul(grp: Group, b: Builder) -> list[str]:
    a = need_act(grp.ins[0], "MatMul input A")
    if grp.ins[1].kind == "qconst":
        bb = _weight(grp, 1, 1, "MatMul input B")
    else:
        bb = need_act(grp.ins[1], "MatMul input B")
    out = grp.outs[0]
    ins = [a.q, *_sz(b, a.qp), bb.q, *_sz(b, bb.qp), *_sz(b, out.qp)]
    b.node("QLinearMatMul", ins, [out.q], grp.node.name or "QLinearMatMul")
    return ["QLinearMatMul"]


def gemm(grp: Group, b: Builder) -> list[str]:
    a = need_act(grp.ins[0], "Gemm input A")
    trans_b = grp.attr("transB", 0)
    wb = _weight(grp, 1, 0 if trans_b else 1, "Gemm input B")
    out = grp.outs[0]
    acc_scale = a.qp.scale.astype(np.float64) * wb.qp.scale.astype(np.float64)
    bias = bias_codes(grp, b, 2, acc_scale, beta=float(grp.attr("beta", 1.0)))
    ins = [a.q, *_sz(b, a.qp), wb.q, *_sz(b, wb.qp)]
    ins.append(b.const(f"{grp.node.name or 'gemm'}_bias_i32", bias) if bias is not None else "")
    ins += list(_sz(b, out.qp))
    b.node("QGemm", ins, [out.q], grp.node.name or "QGemm", domain=MS,
           alpha=float(grp.attr("alpha", 1.0)), transA=int(grp.attr("transA", 0)),
           transB=int(trans_b))
    return ["QGemm"]


def binary(op: str) -> Handler:
    def lower(grp: Group, b: Builder) -> list[str]:
        xa = need_act(grp.ins[0], f"{grp.node.op_type} input A")
        xb = need_act(grp.ins[1], f"{grp.node.op_type} input B")
        if xa.qp.dtype != xb.qp.dtype:
            raise Unsupported(f"{op} inputs of different 8-bit types", DTYPE)
        out = grp.outs[0]
        ins = [xa.q, *_sz(b, xa.qp), xb.q, *_sz(b, xb.qp), *_sz(b, out.qp)]
        b.node(op, ins, [out.q], grp.node.name or op, domain=MS)
        return [op]

    return lower


def concat(grp: Group, b: Builder) -> list[str]:
    out = grp.outs[0]
    xs = [need_act(x, "Concat input") for x in grp.ins]
    if all(x.qp.same_as(out.qp) for x in xs):
        return lower_data_movement(grp, b)
    ins = list(_sz(b, out.qp))
    for x in xs:
        ins += [x.q, *_sz(b, x.qp)]
    b.node("QLinearConcat", ins, [out.q], grp.node.name or "QLinearConcat", domain=MS,
           axis=int(grp.attr("axis")))
    return ["QLinearConcat"]


def unary(op: str, **fixed: Any) -> Handler:
    def lower(grp: Group, b: Builder) -> list[str]:
        x = need_act(grp.ins[0], f"{grp.node.op_type} input", const_ok=False)
        out = grp.outs[0]
        kw = dict(fixed)
        n = grp.node
        if n.op_type == "LeakyRelu":
            kw["alpha"] = float(grp.attr("alpha", 0.01))
        if n.op_type == "AveragePool":
            kw.update(attrs(n))
        if n.op_type == "Softmax":
            kw["axis"] = int(grp.attr("axis", -1))
            kw["opset"] = onnx_opset(b.g.model)
        b.node(op, [x.q, *_sz(b, x.qp), *_sz(b, out.qp)], [out.q], n.name or op, domain=MS,
               **kw)
        return [op]

    return lower


def handler(op_type: str) -> Handler | None:
    if op_type in HANDLERS:
        return HANDLERS[op_type]
    if op_type in DATA_MOVEMENT:
        return lower_data_movement
    if op_type in LUT_OPS:
        return lower_lut
    return None


HANDLERS: dict[str, Handler] = {
    "Conv": conv,
    "MatMul": matmul,
    "Gemm": gemm,
    "Add": binary("QLinearAdd"),
    "Mul": binary("QLinearMul"),
    "Concat": concat,
    "Sigmoid": unary("QLinearSigmoid"),
    "LeakyRelu": unary("QLinearLeakyRelu"),
    "AveragePool": unary("QLinearAveragePool", channels_last=0),
    "GlobalAveragePool": unary("QLinearGlobalAveragePool", channels_last=0),
    "Softmax": unary("QLinearSoftmax"),
}
