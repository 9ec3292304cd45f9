"""Data-movement chains without QDQ between them: YOLOX's Focus (space-to-depth by four
Slice -> Slice chains and a Concat).

The source runs ``x -> Slice -> Slice -> QuantizeLinear`` four times on the float input and
concatenates the quantized results. QuantizeLinear commutes with data movement, so when
the four QuantizeLinear nodes share scale and zero point the whole pattern equals one
QuantizeLinear of ``x`` followed by SpaceToDepth (and a Gather reordering the channel
blocks) on the codes: bit-exact, one QuantizeLinear at the input, and faster in
onnxruntime (8-bit Slice and 6-D Transpose kernels are slower than float Slice, but
SpaceToDepth + Gather together cost less than the float chains).

The same pattern left in float (a model whose stem is kept in float, as the YOLO recipe's
is) becomes SpaceToDepth + Gather on the float tensor: pure data movement, so the values
are the same bit for bit, and onnxruntime runs it in a fraction of the six Slices' time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import numpy_helper
from qbuild_onnx_common.graph import attr

BIG = 2**30  # an end at or beyond this is "to the end of the axis"

#: A QuantizeLinear's constants and attributes, comparable.
ParamsKey = tuple[tuple[tuple[str, tuple[int, ...], bytes] | None, ...], tuple[bytes, ...]]


def _const(inits: dict[str, onnx.TensorProto], name: str) -> NDArray[Any] | None:
    t = inits.get(name)
    return None if t is None else np.asarray(numpy_helper.to_array(t))


def _slice_offsets(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]
                   ) -> dict[int, int] | None:
    """{axis: start} of a Slice taking every 2nd element from start 0/1 to the end on
    axes 2/3 only, or None."""
    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.input) < 4:
        return None
    starts, ends, axes = (_const(inits, t) for t in node.input[1:4])
    steps = _const(inits, node.input[4]) if len(node.input) > 4 and node.input[4] else None
    if starts is None or ends is None or axes is None or (steps is None and len(node.input) > 4
                                                          and node.input[4]):
        return None
    steps = np.ones_like(starts) if steps is None else steps
    out = {}
    for s, e, a, st in zip(starts.ravel(), ends.ravel(), axes.ravel(), steps.ravel()):
        if int(a) not in (2, 3, -1, -2) or int(st) != 2 or int(s) not in (0, 1) or e < BIG:
            return None
        out[int(a) % 4 if a < 0 else int(a)] = int(s)
    return out


def _params_key(q: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> ParamsKey | None:
    """Scale, zero point and attributes of a QuantizeLinear (constants) as a hashable key."""
    vals: list[tuple[str, tuple[int, ...], bytes] | None] = []
    for t in q.input[1:]:
        a = _const(inits, t) if t else None
        if t and a is None:
            return None
        vals.append(None if a is None else (a.dtype.str, a.shape, a.tobytes()))
    return tuple(vals), tuple(sorted(a.SerializeToString() for a in q.attribute))


@dataclass
class _Nodes:
    """The node list being rewritten, by tensor, with the model's constants and shapes."""

    inits: dict[str, onnx.TensorProto]
    producer: dict[str, onnx.NodeProto]
    readers: dict[str, list[onnx.NodeProto]]
    shapes: dict[str, onnx.TypeProto.Tensor]

    @classmethod
    def index(cls, nodes: list[onnx.NodeProto], model: onnx.ModelProto) -> _Nodes:
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for t in n.input:
                readers.setdefault(t, []).append(n)
        return cls(inits={t.name: t for t in model.graph.initializer},
                   producer={t: n for n in nodes for t in n.output if t},
                   readers=readers,
                   shapes={v.name: v.type.tensor_type for v in list(model.graph.input)
                           + list(model.graph.value_info)})


@dataclass
class _Focus:
    """One Focus found: a Concat of four Slice -> Slice chains of ``root`` (``quantized``:
    each through a QuantizeLinear, the ``ends``), taking the blocks at ``offsets``."""

    concat: onnx.NodeProto
    ends: list[onnx.NodeProto]  # the Concat's producers: QuantizeLinear or Slice nodes
    quantized: bool
    root: str
    channels: int
    offsets: list[tuple[int, int]]
    chain: list[onnx.NodeProto]  # the Slice nodes


def _concat_ends(cat: onnx.NodeProto, index: _Nodes, protected: set[str]
                 ) -> tuple[list[onnx.NodeProto], bool] | None:
    """A 4-input channel Concat whose inputs all come from QuantizeLinear nodes sharing
    their parameters (quantized) or from Slice nodes, each read by it alone: (those
    producers, quantized), else None."""
    if cat.op_type != "Concat" or len(cat.input) != 4:
        return None
    if attr(cat, "axis") not in (1, -3):
        return None
    found = [index.producer.get(t) for t in cat.input]
    ends = [q for q in found if q is not None]
    if len(ends) != len(found):
        return None
    quantized = all(q.op_type == "QuantizeLinear" for q in ends)
    if not quantized and not all(q.op_type == "Slice" for q in ends):
        return None
    if any(len(index.readers.get(t, [])) != 1 or t in protected for t in cat.input):
        return None
    if quantized:
        params = {_params_key(q, index.inits) for q in ends}
        if None in params or len(params) != 1:
            return None
    return ends, quantized


def _slice_chains(cat: onnx.NodeProto, ends: list[onnx.NodeProto], quantized: bool,
                  index: _Nodes) -> tuple[str, list[tuple[int, int]], list[onnx.NodeProto]] | None:
    """(root, (h, w) offset of each chain, the Slice nodes) when every input of the Concat
    is a Slice -> Slice chain of one root taking a distinct 2x2 block, else None."""
    roots: set[str] = set()
    offsets: list[tuple[int, int]] = []
    chain: list[onnx.NodeProto] = []
    for q, leaf in zip(ends, cat.input):
        t, ok = (q.input[0] if quantized else leaf), True
        off: dict[int, int] = {}
        while t in index.producer and index.producer[t].op_type == "Slice":
            s = index.producer[t]
            o = _slice_offsets(s, index.inits)
            if o is None or set(o) & set(off):
                ok = False
                break
            off.update(o)
            chain.append(s)
            t = s.input[0]
        if not ok or set(off) != {2, 3}:
            break
        roots.add(t)
        offsets.append((off[2], off[3]))
    if len(roots) != 1 or len(offsets) != 4 or len(set(offsets)) != 4:
        return None
    return roots.pop(), offsets, chain


def _match(cat: onnx.NodeProto, index: _Nodes, protected: set[str]) -> _Focus | None:
    """The Focus whose Concat is ``cat``, if it is one and can be rewritten."""
    found = _concat_ends(cat, index, protected)
    if found is None:
        return None
    ends, quantized = found
    chains = _slice_chains(cat, ends, quantized, index)
    if chains is None:
        return None
    root, offsets, chain = chains
    tt = index.shapes.get(root)
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim] if tt else []
    if len(dims) != 4 or not dims[1]:
        return None
    inside = {id(x) for x in chain} | {id(cat)}
    if not quantized and any(
            s.output[0] in protected
            or any(id(r) not in inside for r in index.readers.get(s.output[0], []))
            for s in chain):
        return None  # a Slice read elsewhere: the float chain must stay
    return _Focus(cat, ends, quantized, root, dims[1], offsets, chain)


def _space_to_depth(focus: _Focus, fresh: Callable[[str], str],
                    const: Callable[[str, NDArray[Any]], str]) -> list[onnx.NodeProto]:
    """The nodes replacing the Concat: [QuantizeLinear,] SpaceToDepth[, Gather]."""
    cat, root, c = focus.concat, focus.root, focus.channels
    q0 = focus.ends[0]
    s2d = fresh(f"{cat.output[0]}_s2d")
    emitted = []
    src = root
    if focus.quantized:
        src = fresh(f"{root}_quantized")
        emitted.append(onnx.helper.make_node("QuantizeLinear", [root, *q0.input[1:]],
                                             [src], name=fresh(f"{root}_QuantizeLinear"),
                                             domain=q0.domain))
    emitted.append(onnx.helper.make_node("SpaceToDepth", [src], [s2d],
                                         name=fresh(f"{cat.name or 'Focus'}_SpaceToDepth"),
                                         blocksize=2))
    # SpaceToDepth puts block (h, w) at channels (2h + w) * C ..; Concat wants the
    # blocks in the order of its inputs.
    perm = [(2 * h + w) * c + k for h, w in focus.offsets for k in range(c)]
    if perm == list(range(4 * c)):
        emitted[-1].output[0] = cat.output[0]
    else:
        idx = const("focus_channel_order", np.array(perm, np.int64))
        emitted.append(onnx.helper.make_node("Gather", [s2d, idx], [cat.output[0]],
                                             name=fresh(f"{cat.name or 'Focus'}_order"),
                                             axis=1))
    return emitted


def focus_space_to_depth(nodes: list[onnx.NodeProto], model: onnx.ModelProto,
                         fresh: Callable[[str], str],
                         const: Callable[[str, NDArray[Any]], str], protected: set[str]
                         ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto],
                                    list[onnx.NodeProto]]:
    """Rewrite every Focus pattern in ``nodes``. ``fresh(base)`` names a tensor/node,
    ``const(base, array)`` adds an initializer; ``protected`` are tensors that must keep
    their value (graph outputs). Returns (nodes, the source Slice nodes the quantized
    rewrite replaced, those the float rewrite replaced; they are dead code unless
    something else reads them)."""
    index = _Nodes.index(nodes, model)
    replaced: list[onnx.NodeProto] = []
    replaced_float: list[onnx.NodeProto] = []
    drop: set[int] = set()
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for cat in nodes:
        focus = _match(cat, index, protected)
        if focus is None:
            continue
        new_nodes[id(cat)] = _space_to_depth(focus, fresh, const)
        if focus.quantized:
            drop.update(id(q) for q in focus.ends)
            replaced.extend(focus.chain)
        else:
            replaced_float.extend(focus.chain)
    if not new_nodes:
        return nodes, [], []
    out = []
    for n in nodes:
        if id(n) in drop:
            continue
        out.extend(new_nodes.get(id(n), [n]))
    return out, replaced, replaced_float
