"""AdaRound: learned up/down rounding of a QDQ model's integer weights, layer by layer.

Nearest rounding of each weight is not what minimises a layer's output error. For every
Conv (2-D), Gemm and MatMul whose weight is a DequantizeLinear of an 8- or 16-bit
initializer, this keeps onnxruntime's scale and zero point and chooses, per weight,
floor(w / s) or floor(w / s) + 1, by minimising over calibration samples

    || W_float x_float  -  W_hat(V) x_quant ||^2  +  lam * sum(1 - |2 h(V) - 1|^beta)

with the rectified sigmoid h(V) = clip(sigmoid(V) (zeta - gamma) + gamma, 0, 1), beta
annealed from 20 to 2 (Nagel et al., "Up or Down? Adaptive Rounding for Post-Training
Quantization", ICML 2020, eq. 21-24). x_float is the float model's input to the same node
(matched by name); x_quant is x_float too by default (``float_inputs``): the paper's
"asymmetric" variant (x_quant = the QDQ model's input) needs the layers optimised in
sequence, and fitted independently it corrects upstream error twice. Layers are optimised
independently on one pass of data (not sequentially); rows of the layer's input (im2col
patches for Conv) are sampled at random, seeded, up to ``rows`` per layer, and only their
second moments are kept (x x^T and y x^T per group: the squared error of any rounding
follows from them, so an Adam step costs cout * d^2, not rows * d * cout). Plain numpy
with Adam. Every 4th sample is held out: a layer keeps nearest rounding unless the
learned rounding lowers its error on the held-out rows, and layers with fewer fitting rows
than twice their inputs per output keep it too (with few calibration samples, the late
layers of a CNN have few positions, and a rounding fitted to them does not carry over).
Last, the learned layers are applied one at a time and each is kept only if the whole
model's output SQNR on the held-out samples rises (``_accept``): on MobileNetV2 most
layers lowered their own error yet lowered the model's SQNR, so this check is what makes
the result never worse than nearest rounding on those samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.graph import GraphIndex, attr

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, TensorProto
    from qbuild_onnx_common.arrays import Array, Float32Array, Float64Array

    # a weight as stored <-> its canonical [G, cout_g, d] layout
    Relayout = Callable[[Array], Array]

ZETA, GAMMA = 1.1, -0.1
_INT_TYPES = (2, 3, 4, 5)  # TensorProto UINT8, INT8, UINT16, INT16


@dataclass
class _RowStats:
    """Sufficient statistics of a layer's sampled rows: H = sum x_q x_q^T [G, d, d],
    B = sum y_f x_q^T [G, cout_g, d], yy = sum |y_f|^2, rows = count; each kept apart
    for fitting (part 0) and for checking on held-out samples (part 1)."""

    h: Float64Array  # [2, G, d, d]
    b: Float64Array  # [2, G, cout_g, d]
    yy: list[float]
    rows: list[int]


@dataclass
class _Layer:
    node: NodeProto  # node of the QDQ model
    fnode: NodeProto  # same node in the float model
    kind: str  # "conv" or "dense"
    w: Float64Array  # float weight in canonical [G, cout_g, d] layout
    q_init: TensorProto  # the integer initializer behind the DequantizeLinear
    scale: Float64Array  # [G, cout_g, 1] (broadcast)
    zp: Float64Array  # same layout
    qmin: int
    qmax: int
    to_canonical: Relayout  # integer array as stored -> [G, cout_g, d]
    from_canonical: Relayout  # [G, cout_g, d] -> array as stored
    group: int = 1
    stats: _RowStats | None = None  # None until a row is added

    def add(self, xq: Array, yf: Array, part: int) -> None:
        import numpy as np

        xq, yf = xq.astype(np.float64), yf.astype(np.float64)
        if self.stats is None:
            d, c = xq.shape[2], yf.shape[2]
            self.stats = _RowStats(np.zeros((2, xq.shape[0], d, d)),
                                   np.zeros((2, xq.shape[0], c, d)), [0.0, 0.0], [0, 0])
        st = self.stats
        st.h[part] += np.matmul(xq.transpose(0, 2, 1), xq)
        st.b[part] += np.matmul(yf.transpose(0, 2, 1), xq)
        st.yy[part] += float((yf * yf).sum())
        st.rows[part] += xq.shape[1]


def _dq_of(index: GraphIndex, tensor: str) -> NodeProto | None:
    inits = index.initializers
    producer = index.producers.get(tensor)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    if any(i not in inits for i in producer.input if i):
        return None
    if attr(producer, "block_size", 0):
        return None  # blocked weights: not handled
    if inits[producer.input[0]].data_type not in _INT_TYPES:
        return None
    return producer


def _conv_layout(shape: tuple[int, ...], group: int, cg: int) -> tuple[Relayout, Relayout]:
    """A Conv weight [cout, cin/group, kh, kw] <-> [group, cout/group, rest]."""
    def to_c(a: Array) -> Array:
        return a.reshape(group, cg, -1)

    def from_c(a: Array) -> Array:
        return a.reshape(shape)

    return to_c, from_c


def _dense_layout(trans_b: bool) -> tuple[Relayout, Relayout]:
    """A MatMul/Gemm weight [d, cout] ([cout, d] when ``trans_b``) <-> [1, cout, d]."""
    def to_c(a: Array) -> Array:
        rows_first: Array = a if trans_b else a.T
        with_group_axis: Array = rows_first[None]
        return with_group_axis

    def from_c(a: Array) -> Array:
        stored: Array = a[0] if trans_b else a[0].T
        return stored

    return to_c, from_c


def _find_layers(qm: ModelProto, fm: ModelProto, op_types: Sequence[str]) -> list[_Layer]:
    import numpy as np
    from onnx import numpy_helper

    q_index = GraphIndex(qm.graph)
    q_inits, f_inits = q_index.initializers, GraphIndex(fm.graph).initializers
    f_nodes = {n.name: n for n in fm.graph.node if n.name}
    layers = []
    for node in qm.graph.node:
        if node.op_type not in op_types or len(node.input) < 2 or not node.name:
            continue
        fnode = f_nodes.get(node.name)
        if fnode is None or fnode.op_type != node.op_type or len(fnode.input) < 2 \
                or fnode.input[1] not in f_inits:
            continue
        dq = _dq_of(q_index, node.input[1])
        if dq is None:
            continue
        q_init = q_inits[dq.input[0]]
        q = numpy_helper.to_array(q_init)
        wf = numpy_helper.to_array(f_inits[fnode.input[1]]).astype(np.float64)
        if wf.shape != q.shape:
            continue
        scale = numpy_helper.to_array(q_inits[dq.input[1]]).astype(np.float64)
        zp = numpy_helper.to_array(q_inits[dq.input[2]]).astype(np.float64) \
            if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale)
        axis = int(attr(dq, "axis", 1))
        info = np.iinfo(q.dtype)
        per_axis = scale.ndim == 1 and scale.size > 1
        if node.op_type == "Conv":
            if q.ndim != 4:
                continue
            group = int(attr(node, "group", 1))
            cout = q.shape[0]
            if per_axis and axis != 0:
                continue
            cg = cout // group
            to_c, from_c = _conv_layout(q.shape, group, cg)
            sc = (scale.reshape(group, cg, 1) if per_axis
                  else np.full((group, cg, 1), float(scale)))
            z = (zp.reshape(group, cg, 1) if per_axis
                 else np.full((group, cg, 1), float(zp)))
            layers.append(_Layer(node, fnode, "conv", to_c(wf), q_init, sc, z, info.min,
                                 info.max, to_c, from_c, group))
            continue
        if q.ndim != 2:
            continue
        trans_b = node.op_type == "Gemm" and bool(attr(node, "transB", 0))
        if node.op_type == "Gemm" and attr(node, "transA", 0):
            continue
        out_axis = 0 if trans_b else 1  # the weight axis that indexes output channels
        if per_axis and axis != out_axis:
            continue
        to_c, from_c = _dense_layout(trans_b)
        cout = q.shape[out_axis]
        sc = scale.reshape(1, cout, 1) if per_axis else np.full((1, cout, 1), float(scale))
        z = zp.reshape(1, cout, 1) if per_axis else np.full((1, cout, 1), float(zp))
        layers.append(_Layer(node, fnode, "dense", to_c(wf), q_init, sc, z, info.min,
                             info.max, to_c, from_c, 1))
    return layers


def _conv_geometry(node: NodeProto, in_hw: Sequence[int], k_hw: Sequence[int]
                   ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(pads [top, left, bottom, right], strides, dilations, out_hw) of a 2-D Conv."""
    strides = list(attr(node, "strides", [1, 1]))
    dil = list(attr(node, "dilations", [1, 1]))
    auto = attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    pads = list(attr(node, "pads", [0, 0, 0, 0]))
    out = []
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0, 0, 0, 0]
        for i in range(2):
            o = -(-in_hw[i] // strides[i])
            total = max((o - 1) * strides[i] + (k_hw[i] - 1) * dil[i] + 1 - in_hw[i], 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    for i in range(2):
        span = (k_hw[i] - 1) * dil[i] + 1
        out.append((in_hw[i] + pads[i] + pads[i + 2] - span) // strides[i] + 1)
    return pads, strides, dil, out


def _conv_rows(x: Float32Array, node: NodeProto, group: int, k_hw: Sequence[int],
               pick: Callable[[int], Array]) -> Array:
    """im2col rows of a 2-D Conv input x [1, C, H, W] at the output positions chosen by
    ``pick(count) -> indices``: [group, rows, C/group * kh * kw]."""
    import numpy as np

    pads, strides, dil, out = _conv_geometry(node, x.shape[2:], k_hw)
    xp = np.pad(x[0], ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    idx = pick(out[0] * out[1])
    oh, ow = idx // out[1], idx % out[1]
    hh = oh[:, None] * strides[0] + np.arange(k_hw[0])[None] * dil[0]  # [P, kh]
    ww = ow[:, None] * strides[1] + np.arange(k_hw[1])[None] * dil[1]  # [P, kw]
    patches = xp[:, hh[:, :, None], ww[:, None, :]]  # [C, P, kh, kw]
    patches = np.moveaxis(patches, 1, 0)  # [P, C, kh, kw]
    p, c = patches.shape[0], patches.shape[1]
    by_group: Array = patches.reshape(p, group, (c // group) * k_hw[0] * k_hw[1])
    rows_by_group: Array = by_group.transpose(1, 0, 2)
    return rows_by_group


def _collect(layers: Sequence[_Layer], qm: ModelProto, fm: ModelProto,
             feeds: Sequence[Mapping[str, Any]], rows: int, seed: int,
             scratch: Path | None = None, float_inputs: bool = True) -> int:
    import numpy as np

    from .layer_data import session_with_outputs

    q_names = [] if float_inputs else sorted({lay.node.input[0] for lay in layers})
    f_names = sorted({lay.fnode.input[0] for lay in layers})
    qs = session_with_outputs(qm, q_names, scratch) if q_names else None
    fs = session_with_outputs(fm, f_names, scratch)
    feeds = list(feeds)
    per_sample = max(1, -(-rows // max(len(feeds), 1)))
    rng = np.random.default_rng(seed)
    for n, feed in enumerate(feeds):
        part = 1 if n % 4 == 3 else 0  # every 4th sample is held out
        xq = dict(zip(q_names, qs.run(q_names, dict(feed)))) if qs is not None else {}
        xf = dict(zip(f_names, fs.run(f_names, dict(feed))))
        for lay in layers:
            a_f = np.asarray(xf[lay.fnode.input[0]], dtype=np.float32)
            # The float input on both sides: layers are fitted independently, and fitting
            # each to its quantized input would correct the same upstream error twice
            # (measured on MobileNetV2: 42.9 dB -> 35.9 dB; with float inputs it improves).
            a_q = a_f if float_inputs else np.asarray(xq[lay.node.input[0]], dtype=np.float32)
            if a_q.shape != a_f.shape:
                continue
            if lay.kind == "conv":
                if a_q.ndim != 4:
                    continue
                k_hw = lay.from_canonical(lay.w).shape[2:]
                for b in range(a_q.shape[0]):
                    chosen: dict[str, Array] = {}

                    def pick(total: int, chosen: dict[str, Array] = chosen) -> Array:
                        chosen["i"] = rng.choice(total, size=min(per_sample, total),
                                                 replace=False)
                        return chosen["i"]

                    rq = _conv_rows(a_q[b:b + 1], lay.node, lay.group, k_hw, pick)
                    def picked(_total: int, chosen: dict[str, Array] = chosen) -> Array:
                        return chosen["i"]

                    rf = _conv_rows(a_f[b:b + 1], lay.node, lay.group, k_hw, picked)
                    lay.add(rq, np.matmul(rf.astype(np.float64), lay.w.transpose(0, 2, 1)),
                            part)
            else:
                d = lay.w.shape[2]
                if a_q.shape[-1] != d:
                    continue
                rq, rf = a_q.reshape(-1, d), a_f.reshape(-1, d)
                idx = rng.choice(rq.shape[0], size=min(per_sample, rq.shape[0]), replace=False)
                lay.add(rq[idx][None], (rf[idx].astype(np.float64) @ lay.w[0].T)[None], part)
    return len(feeds)


def _optimise(lay: _Layer, st: _RowStats, iterations: int, lr: float, lam: float,
              warmup: float) -> tuple[Float64Array, float, float]:
    """(integer weights in canonical layout, nearest loss, learned loss), both losses on
    the held-out samples (``st``: the layer's row statistics)."""
    import numpy as np

    def stats(part: int) -> tuple[Float64Array, Float64Array, float]:
        r = max(st.rows[part], 1)  # mean statistics of the rows
        return st.h[part] / r, st.b[part] / r, st.yy[part] / r

    hm, bm, yy = stats(0)
    s, z = lay.scale, lay.zp
    lo, hi = lay.qmin - z, lay.qmax - z  # bounds of the integer offset from the zero point
    wdiv = lay.w / s
    fl = np.floor(wdiv)
    rest = wdiv - fl

    def loss_of(q: Float64Array, part: int = 1) -> float:
        # mean over rows of |W_hat x - y|^2 = tr(W H W^T) - 2 <W, B> + yy
        h_, b_, y_ = stats(part)
        w_hat = s * q
        return float((np.matmul(w_hat, h_) * w_hat).sum() - 2 * (w_hat * b_).sum() + y_)

    nearest = np.clip(np.rint(wdiv), lo, hi)
    base = loss_of(nearest)
    p = np.clip((rest - GAMMA) / (ZETA - GAMMA), 1e-6, 1 - 1e-6)
    v = np.log(p / (1 - p))
    m1 = np.zeros_like(v)
    m2 = np.zeros_like(v)
    b1, b2, eps = 0.9, 0.999, 1e-8
    start = int(warmup * iterations)
    for t in range(1, iterations + 1):
        sig = 1.0 / (1.0 + np.exp(-v))
        hu = sig * (ZETA - GAMMA) + GAMMA
        h = np.clip(hu, 0.0, 1.0)
        qv = fl + h
        inside = (qv >= lo) & (qv <= hi)
        w_hat = s * np.clip(qv, lo, hi)
        g_w = 2.0 * (np.matmul(w_hat, hm) - bm)  # [G, cout_g, d]
        g_h = g_w * s * inside
        if t > start:
            frac = (t - start) / max(iterations - start, 1)
            beta = 20.0 + (2.0 - 20.0) * frac
            u = 2.0 * h - 1.0
            g_h = g_h - lam * beta * np.abs(u) ** (beta - 1.0) * np.sign(u) * 2.0
        g_v = g_h * (ZETA - GAMMA) * sig * (1.0 - sig) * ((hu > 0) & (hu < 1))
        m1 = b1 * m1 + (1 - b1) * g_v
        m2 = b2 * m2 + (1 - b2) * g_v * g_v
        v -= lr * (m1 / (1 - b1 ** t)) / (np.sqrt(m2 / (1 - b2 ** t)) + eps)
    hard = np.clip(fl + (v >= 0), lo, hi)  # h(V) >= 0.5 exactly when V >= 0
    learned = loss_of(hard)
    return hard, base, learned


def adaround(qdq_model: ModelProto, float_model: ModelProto,
             feeds: Sequence[Mapping[str, Any]], *,
             op_types: Sequence[str] = ("Conv", "Gemm", "MatMul"),
             rows: int = 1024, iterations: int = 500, lr: float = 0.01, lam: float = 0.01,
             warmup: float = 0.2, seed: int = 0, scratch: Path | None = None,
             log: Callable[[str], None] | None = None,
             float_inputs: bool = True) -> tuple[ModelProto, dict[str, Any]]:
    """Re-round the weights of ``qdq_model`` (ModelProto, copied) against ``float_model``
    on ``feeds``; returns (model, report)."""
    import onnx
    from onnx import numpy_helper

    log = log or (lambda _m: None)
    qm = onnx.ModelProto()
    qm.CopyFrom(qdq_model)
    layers = _find_layers(qm, float_model, op_types)
    if not layers:
        raise ValueError("no Conv/Gemm/MatMul with an 8- or 16-bit DequantizeLinear weight "
                         "that matches a node of the float model by name")
    n = _collect(layers, qm, float_model, feeds, rows, seed, scratch, float_inputs)
    if n == 0:
        raise ValueError("the dataset fed no sample")
    report: dict[str, Any] = {}
    candidates: list[tuple[_Layer, Array, Array]] = []
    for lay in layers:
        st = lay.stats
        if st is None:
            continue
        d = lay.w.shape[2]
        if st.rows[0] < 2 * d or st.rows[1] == 0:
            # fewer rows than twice the unknowns per output: the rounding would fit the
            # sample, not the layer (measured: MobileNetV2's late 1x1 layers)
            report[lay.node.name] = {"kept_nearest": True, "too_few_rows": st.rows[0],
                                     "inputs_per_output": d}
            continue
        hard, base, learned = _optimise(lay, st, iterations, lr, lam, warmup)
        kept = learned >= base
        entry = {"nearest_loss": round(base, 9), "learned_loss": round(learned, 9),
                 "kept_nearest": bool(kept)}
        if not kept:
            old = numpy_helper.to_array(lay.q_init)
            ints = lay.from_canonical(hard + lay.zp).astype(old.dtype)
            entry["flipped"] = int((ints != old).sum())
            candidates.append((lay, old, ints))
        report[lay.node.name] = entry
        log(f"adaround {lay.node.name}: held-out loss {base:.4g} -> {learned:.4g}"
            + (" (kept nearest)" if kept else ""))
    changed = _accept(qm, float_model, feeds, candidates, report, log)
    return qm, {"layers": len(report), "changed_layers": changed, "rows": rows,
                "iterations": iterations, "samples": n, "nodes": dict(sorted(report.items()))}


def _model_sqnr(model: ModelProto, feeds: Sequence[Mapping[str, Any]],
                refs: Sequence[Sequence[Array]]) -> float:
    import numpy as np
    from qbuild_onnx_common.ort import session as make_session

    sess = make_session(model.SerializeToString(), optimize=True)
    num = den = 0.0
    for feed, ref in zip(feeds, refs):
        for a, b in zip(ref, sess.run(None, dict(feed))):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            num += float((a * a).sum())
            den += float(((a - b) ** 2).sum())
    return 10 * np.log10(num / den) if den > 0 else float("inf")


def _accept(qm: ModelProto, fm: ModelProto, feeds: Sequence[Mapping[str, Any]],
            candidates: Sequence[tuple[_Layer, Array, Array]], report: dict[str, Any],
            log: Callable[[str], None]) -> int:
    """Apply the learned roundings one layer at a time, in graph order, keeping each only
    if the whole model's output SQNR against the float model on the held-out samples
    rises: a lower layer error does not always mean a better model (measured on
    MobileNetV2), so the result is never worse than nearest rounding on those samples."""
    from onnx import numpy_helper
    from qbuild_onnx_common.ort import session as make_session

    held = [f for i, f in enumerate(feeds) if i % 4 == 3] or list(feeds)
    fs = make_session(fm.SerializeToString(), optimize=True)
    refs = [fs.run(None, dict(f)) for f in held]
    best = _model_sqnr(qm, held, refs)
    changed = 0
    for lay, old, ints in candidates:
        lay.q_init.CopyFrom(numpy_helper.from_array(ints, lay.q_init.name))
        score = _model_sqnr(qm, held, refs)
        entry = report[lay.node.name]
        entry["model_sqnr_db"] = round(score, 4)
        if score > best:
            best, changed = score, changed + 1
        else:
            lay.q_init.CopyFrom(numpy_helper.from_array(old, lay.q_init.name))
            entry["kept_nearest"] = True
            entry["rejected_by_model_sqnr"] = True
    log(f"adaround: {changed} of {len(candidates)} learned layer(s) kept (held-out model "
        f"SQNR {best:.2f} dB)")
    return changed
