"""SmoothQuant for MatMul / Gemm layers with constant weights (a float-to-float transform).

For an activation X feeding Y = X W (X's last axis is W's input axis k), per-channel
smoothing factors s_k = max|X_k|^alpha / max|W_k|^(1 - alpha) give Y = (X / s)(s W):
outlier channels of X shrink, the matching weight rows grow, and both become easier to
quantize to 8 bits (Xiao et al., "SmoothQuant", ICML 2023, section 4). max|X_k| is
measured on a dataset with the float model. All smoothable consumers of one X share one
s (max|W_k| over all of them). 1 / s is folded into a LayerNormalization that produces X
when X has no other reader (``fold``), else applied by an inserted Mul; either way the
float model's function is unchanged up to rounding. An inserted Mul is marked to stay
float (see ``markers``): quantizing its input would keep the outliers it removes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.graph import GraphIndex, attr

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto
    from qbuild_onnx_common.arrays import Float32Array

# activation tensor -> [(consumer node, the axis of its weight that meets X's last axis)]
Groups = dict[str, list[tuple["NodeProto", int]]]


def _weight_axis(node: NodeProto, index: GraphIndex) -> int | None:
    """The axis of node's constant weight that runs along X's last axis, or None."""
    inits = index.initializers
    if len(node.input) < 2 or node.input[1] not in inits or node.input[0] in inits:
        return None
    w = inits[node.input[1]]
    if len(w.dims) != 2 or index.use_count(node.input[1]) != 1:
        return None
    if node.op_type == "MatMul":
        return 0
    if node.op_type == "Gemm":
        if attr(node, "transA", 0):
            return None
        return 1 if attr(node, "transB", 0) else 0
    return None


def find_groups(model: ModelProto, op_types: Sequence[str] = ("MatMul", "Gemm")) -> Groups:
    """Activation tensor -> [(consumer node, weight axis)] of smoothable consumers."""
    index = GraphIndex(model.graph)
    groups: Groups = {}
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        axis = _weight_axis(node, index)
        if axis is not None:
            groups.setdefault(node.input[0], []).append((node, axis))
    return groups


def channel_absmax(model: ModelProto, names: Sequence[str], feeds: Iterable[Mapping[str, Any]],
                   scratch: Path | None = None, source: Path | None = None
                   ) -> dict[str, Float32Array]:
    """Per-channel (last axis) max |x| of each named tensor over the feeds."""
    import numpy as np

    from .layer_data import session_with_outputs, stream_tensors

    sess = session_with_outputs(model, names, scratch, source)
    found: dict[str, Float32Array] = {}

    def sink(_i: int, arrays: dict[str, Any]) -> None:
        for n, array in arrays.items():
            a = np.abs(np.asarray(array, dtype=np.float32))
            m = a.reshape(-1, a.shape[-1]).max(axis=0) if a.ndim else a.reshape(1)
            found[n] = m if n not in found else np.maximum(found[n], m)

    count = stream_tensors(sess, names, feeds, sink)
    if count == 0:
        raise ValueError("the dataset fed no sample")
    return found


def smooth(model: ModelProto, feeds: Iterable[Mapping[str, Any]], alpha: float = 0.5,
           fold: bool = True, op_types: Sequence[str] = ("MatMul", "Gemm"),
           scratch: Path | None = None, source: Path | None = None
           ) -> tuple[ModelProto, dict[str, Any]]:
    """Smooth ``model`` (ModelProto, edited in place and returned); also a report. With
    ``source``, ``model`` is lean (``external_data.lean_load(source)``): the statistics
    are measured with the weights on disk, then loaded once to be rescaled."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha = {alpha}: expected a value in [0, 1]")
    g = model.graph
    groups = find_groups(model, op_types)
    if not groups:
        if source is not None:
            from qbuild_onnx_common.models import fill

            fill(model, source.parent)
        return model, {"smoothed": 0, "folded": 0, "inserted_mul": 0, "alpha": alpha,
                       "tensors": {}}
    xmax = channel_absmax(model, sorted(groups), feeds, scratch, source)
    if source is not None:
        from qbuild_onnx_common.models import fill

        fill(model, source.parent)
    graph_index = GraphIndex(g)
    inits, cons, outs = graph_index.initializers, graph_index.consumers, graph_index.outputs
    report: dict[str, Any] = {}
    new_nodes: list[tuple[int, Any]] = []
    folded = inserted = 0
    for x, members in groups.items():
        ws = [numpy_helper.to_array(inits[n.input[1]]).astype(np.float64) for n, _ in members]
        k = ws[0].shape[members[0][1]]
        if any(w.shape[ax] != k for w, (_, ax) in zip(ws, members)) or x not in xmax \
                or xmax[x].shape[0] != k:
            continue
        wmax = np.max([np.abs(w).max(axis=1 - ax) for w, (_, ax) in zip(ws, members)], axis=0)
        xm = xmax[x].astype(np.float64)
        s = np.ones(k)
        ok = (xm > 0) & (wmax > 0)
        s[ok] = xm[ok] ** alpha / wmax[ok] ** (1.0 - alpha)
        s = np.clip(s, 1e-5, 1e5)
        for w, (node, ax) in zip(ws, members):
            shape = (-1, 1) if ax == 0 else (1, -1)
            name = node.input[1]
            dtype = numpy_helper.to_array(inits[name]).dtype
            inits[name].CopyFrom(numpy_helper.from_array((w * s.reshape(shape)).astype(dtype),
                                                         name))
        how = None
        prod = graph_index.producers.get(x)
        readers = cons.get(x, [])
        if fold and prod is not None and prod.op_type == "LayerNormalization" \
                and x not in outs and len(readers) == len(members) \
                and int(attr(prod, "axis", -1)) == -1 \
                and all(i in inits and graph_index.use_count(i) == 1
                        for i in prod.input[1:] if i):
            for i in prod.input[1:]:
                if i:
                    v = numpy_helper.to_array(inits[i])
                    inits[i].CopyFrom(numpy_helper.from_array(
                        (v.astype(np.float64) / s).astype(v.dtype), i))
            how = f"folded into LayerNormalization '{prod.name}'"
            folded += 1
        else:
            inv_name = graph_index.unique_name(f"{x}_smooth_inv_scale")
            y_name = graph_index.unique_name(f"{x}_smoothed")
            g.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32),
                                                         inv_name))
            mul = onnx.helper.make_node("Mul", [x, inv_name], [y_name],
                                        name=graph_index.unique_name(f"{x}_smooth_mul"))
            first = min(list(g.node).index(n) for n, _ in members)
            new_nodes.append((first, mul))
            for node, _ in members:
                node.input[0] = y_name
            how = "Mul inserted"
            inserted += 1
        report[x] = {"consumers": [n.name or n.output[0] for n, _ in members], "how": how,
                     "x_absmax_max": round(float(xm.max()), 6),
                     "max_scale": round(float(s.max()), 6),
                     "min_scale": round(float(s.min()), 6)}
    for index, mul in sorted(new_nodes, key=lambda t: -t[0]):
        g.node.insert(index, mul)
    if new_nodes:
        from .markers import mark_keep_float

        mark_keep_float(model, [mul.name for _, mul in new_nodes])
    return model, {"smoothed": len(report), "folded": folded, "inserted_mul": inserted,
                   "alpha": alpha, "tensors": dict(sorted(report.items()))}
