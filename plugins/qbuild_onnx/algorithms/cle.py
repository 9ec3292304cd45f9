"""Cross-layer equalization (CLE) of a float model: Conv -> [activation] -> Conv chains.

For a pair (A, B) where A's output channel i feeds B's input channel i through a
positively homogeneous activation f (f(x / s) = f(x) / s for s > 0: none, Relu,
LeakyRelu, PRelu with one slope), dividing A's output channel i (weights and bias) by
s_i and multiplying B's input channel i by s_i leaves the model's function unchanged.
With r1_i the range (max |w|) of A's output channel i and r2_i that of B's input
channel i, s_i = sqrt(r1_i / r2_i) makes both ranges sqrt(r1_i * r2_i): per-tensor (and
per-channel activation) quantization then loses less on the channels with small ranges
(Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", ICCV 2019, section 4.1). Chains of three or more convolutions (MobileNet's
1x1 -> depthwise -> 1x1) are equalized by sweeping the pairs until the scales settle.

``Clip`` (ReLU6) is not homogeneous: ``clip = "skip"`` leaves such pairs alone (exact),
``clip = "relu"`` replaces the Clip(0, c) of an equalized pair by Relu, as AIMET and
the paper do for ReLU6 networks; that changes the float model wherever the activation
went above c, and the report counts the replaced nodes. High-bias absorption is not
done (bias_correction covers the bias shift after quantization).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.graph import GraphIndex, attr

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, TensorProto
    from qbuild_onnx_common.arrays import Float64Array

HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu")
CLIP_POLICIES = ("skip", "relu")


@dataclass
class _Pair:
    a: NodeProto  # producer Conv
    act: NodeProto | None  # activation between them (None: direct)
    b: NodeProto  # consumer Conv


def _clip_bounds(node: NodeProto, inits: Mapping[str, TensorProto]
                 ) -> tuple[float | None, float | None]:
    from onnx import numpy_helper

    lo = attr(node, "min")
    hi = attr(node, "max")
    if len(node.input) > 1 and node.input[1]:
        t = inits.get(node.input[1])
        lo = float(numpy_helper.to_array(t)) if t is not None else None
    if len(node.input) > 2 and node.input[2]:
        t = inits.get(node.input[2])
        hi = float(numpy_helper.to_array(t)) if t is not None else None
    return lo, hi


def _is_equalizable_activation(node: NodeProto, inits: Mapping[str, TensorProto], clip: str
                               ) -> bool:
    if node.op_type in ("Relu", "LeakyRelu"):
        return True
    if node.op_type == "PRelu":
        slope = inits.get(node.input[1]) if len(node.input) > 1 else None
        return slope is not None and _size(slope) == 1
    if node.op_type == "Clip" and clip == "relu":
        lo, hi = _clip_bounds(node, inits)
        return lo == 0.0 and hi is not None and hi > 0
    return False


def _size(tensor: TensorProto) -> int:
    n = 1
    for d in tensor.dims:
        n *= d
    return n


def _conv_ok(node: NodeProto, index: GraphIndex) -> bool:
    inits = index.initializers
    if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in inits:
        return False
    if index.use_count(node.input[1]) != 1:  # shared weight: scaling would change the other user
        return False
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in inits or index.use_count(node.input[2]) != 1:
            return False
    return len(inits[node.input[1]].dims) >= 3


def find_pairs(model: ModelProto, clip: str = "skip") -> list[_Pair]:
    """Conv pairs CLE can equalize, in graph order."""
    index = GraphIndex(model.graph)
    inits, cons, outs = index.initializers, index.consumers, index.outputs
    pairs = []
    for a in model.graph.node:
        if not _conv_ok(a, index) or a.output[0] in outs:
            continue
        nxt = cons.get(a.output[0], [])
        if len(nxt) != 1:
            continue
        act, b = None, nxt[0]
        if b.op_type != "Conv":
            if not _is_equalizable_activation(b, inits, clip) or b.output[0] in outs:
                continue
            act = b
            after = cons.get(act.output[0], [])
            if len(after) != 1:
                continue
            b = after[0]
        if b.op_type != "Conv" or b.input[0] != (act or a).output[0]:
            continue
        if not _conv_ok(b, index):
            continue
        pairs.append(_Pair(a, act, b))
    return pairs


def _input_channel_view(w: Float64Array, group: int) -> list[Float64Array]:
    """(Cin, rest) view of a Conv weight [Cout, Cin/group, k...] by input channel."""
    import numpy as np

    cout, cin_g = w.shape[0], w.shape[1]
    cout_g = cout // group
    parts = []
    for g in range(group):
        block = w[g * cout_g:(g + 1) * cout_g]  # [cout_g, cin_g, k...]
        parts.append(np.moveaxis(block, 1, 0).reshape(cin_g, -1))
    return parts  # list of [cin_g, cout_g * k] per group, input channels g*cin_g + j


def _scale_input_channels(w: Float64Array, group: int, s: Float64Array) -> Float64Array:
    """w with input channel c multiplied by s[c] (grouped convolutions too)."""
    cout, cin_g = w.shape[0], w.shape[1]
    cout_g = cout // group
    out: Float64Array = w.copy()
    shape = (1, cin_g) + (1,) * (w.ndim - 2)
    for g in range(group):
        out[g * cout_g:(g + 1) * cout_g] *= s[g * cin_g:(g + 1) * cin_g].reshape(shape)
    return out


def equalize(model: ModelProto, clip: str = "skip", max_sweeps: int = 20, tol: float = 1e-3
             ) -> tuple[ModelProto, dict[str, Any]]:
    """Equalize ``model`` (a ModelProto, edited in place and returned) and a report."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if clip not in CLIP_POLICIES:
        raise ValueError(f"clip = {clip!r}: expected one of {', '.join(CLIP_POLICIES)}")
    pairs = find_pairs(model, clip)
    inits = GraphIndex(model.graph).initializers
    arrays: dict[str, Float64Array] = {}

    def get(name: str) -> Float64Array:
        if name not in arrays:
            arrays[name] = numpy_helper.to_array(inits[name]).astype(np.float64)
        return arrays[name]

    usable = []
    for p in pairs:
        wa, wb = get(p.a.input[1]), get(p.b.input[1])
        group = int(attr(p.b, "group", 1))
        if wa.shape[0] != wb.shape[1] * group:
            continue  # channel counts do not line up (should not happen in a valid model)
        usable.append(p)
    sweeps, worst = 0, 0.0
    for sweeps in range(1, max_sweeps + 1):  # noqa: B007 (the count is reported)
        worst = 0.0
        for p in usable:
            wa, wb = get(p.a.input[1]), get(p.b.input[1])
            group = int(attr(p.b, "group", 1))
            r1 = np.abs(wa.reshape(wa.shape[0], -1)).max(axis=1)
            r2 = np.concatenate([np.abs(v).max(axis=1) for v in _input_channel_view(wb, group)])
            ok = (r1 > 0) & (r2 > 0)
            s = np.ones_like(r1)
            s[ok] = np.sqrt(r1[ok] / r2[ok])
            s = np.clip(s, 1e-4, 1e4)
            arrays[p.a.input[1]] = wa / s.reshape((-1,) + (1,) * (wa.ndim - 1))
            if len(p.a.input) > 2 and p.a.input[2]:
                arrays[p.a.input[2]] = get(p.a.input[2]) / s
            arrays[p.b.input[1]] = _scale_input_channels(wb, group, s)
            worst = max(worst, float(np.abs(np.log(s)).max()))
        if worst < tol:
            break
    for name, arr in arrays.items():
        old = inits[name]
        dtype = numpy_helper.to_array(old).dtype if old.data_type != onnx.TensorProto.FLOAT \
            else np.float32
        old.CopyFrom(numpy_helper.from_array(arr.astype(dtype), name))
    replaced = []
    for p in usable:
        if p.act is not None and p.act.op_type == "Clip":
            act = p.act
            replaced.append(act.name or act.output[0])
            new = onnx.helper.make_node("Relu", [act.input[0]], list(act.output), name=act.name)
            act.CopyFrom(new)
    report = {
        "pairs": len(usable),
        "sweeps": sweeps if usable else 0,
        "final_max_abs_log_scale": round(worst, 6),
        "clip": clip,
        "clips_replaced_by_relu": replaced,
        "skipped_clip_pairs": 0 if clip == "relu" else len(find_pairs(model, "relu")) - len(
            find_pairs(model, "skip")),
        "equalized": [f"{p.a.name or p.a.output[0]} -> {p.b.name or p.b.output[0]}"
                      for p in usable],
    }
    return model, report
