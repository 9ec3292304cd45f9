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

import numpy as np
import onnx
from onnx import numpy_helper
from qbuild_onnx_common.graph import attr

BIG = 2**30  # an end at or beyond this is "to the end of the axis"


def _const(inits: dict, name: str):
    t = inits.get(name)
    return None if t is None else numpy_helper.to_array(t)


def _slice_offsets(node, inits: dict) -> dict | None:
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


def _params_key(q, inits: dict):
    """Scale, zero point and attributes of a QuantizeLinear (constants) as a hashable key."""
    vals = []
    for t in q.input[1:]:
        a = _const(inits, t) if t else None
        if t and a is None:
            return None
        vals.append(None if a is None else (a.dtype.str, a.shape, a.tobytes()))
    return tuple(vals), tuple(sorted(a.SerializeToString() for a in q.attribute))


def focus_space_to_depth(nodes: list, model: onnx.ModelProto, fresh, const,
                         protected: set) -> tuple[list, list, list]:
    """Rewrite every Focus pattern in ``nodes``. ``fresh(base)`` names a tensor/node,
    ``const(base, array)`` adds an initializer; ``protected`` are tensors that must keep
    their value (graph outputs). Returns (nodes, the source Slice nodes the quantized
    rewrite replaced, those the float rewrite replaced; they are dead code unless
    something else reads them)."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {t: n for n in nodes for t in n.output if t}
    readers: dict = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    shapes = {v.name: v.type.tensor_type for v in list(model.graph.input)
              + list(model.graph.value_info)}
    replaced, replaced_float, drop, new_nodes = [], [], set(), {}
    for cat in nodes:
        if cat.op_type != "Concat" or len(cat.input) != 4:
            continue
        axis = attr(cat, "axis")
        if axis not in (1, -3):
            continue
        qs = [producer.get(t) for t in cat.input]
        if any(q is None for q in qs):
            continue
        quantized = all(q.op_type == "QuantizeLinear" for q in qs)
        if not quantized and not all(q.op_type == "Slice" for q in qs):
            continue
        if any(len(readers.get(t, [])) != 1 or t in protected for t in cat.input):
            continue
        if quantized:
            params = {_params_key(q, inits) for q in qs}
            if None in params or len(params) != 1:
                continue
        roots, offsets, chain = set(), [], []
        for q, leaf in zip(qs, cat.input):
            t, off, ok = (q.input[0] if quantized else leaf), {}, True
            while t in producer and producer[t].op_type == "Slice":
                s = producer[t]
                o = _slice_offsets(s, inits)
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
            continue
        root = roots.pop()
        tt = shapes.get(root)
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim] if tt else []
        if len(dims) != 4 or not dims[1]:
            continue
        inside = {id(x) for x in chain} | {id(cat)}
        if not quantized and any(
                s.output[0] in protected
                or any(id(r) not in inside for r in readers.get(s.output[0], []))
                for s in chain):
            continue  # a Slice read elsewhere: the float chain must stay
        c = dims[1]
        q0 = qs[0]
        s2d = fresh(f"{cat.output[0]}_s2d")
        emitted = []
        src = root
        if quantized:
            src = fresh(f"{root}_quantized")
            emitted.append(onnx.helper.make_node("QuantizeLinear", [root, *q0.input[1:]],
                                                 [src], name=fresh(f"{root}_QuantizeLinear"),
                                                 domain=q0.domain))
        emitted.append(onnx.helper.make_node("SpaceToDepth", [src], [s2d],
                                             name=fresh(f"{cat.name or 'Focus'}_SpaceToDepth"),
                                             blocksize=2))
        # SpaceToDepth puts block (h, w) at channels (2h + w) * C ..; Concat wants the
        # blocks in the order of its inputs.
        perm = [(2 * h + w) * c + k for h, w in offsets for k in range(c)]
        if perm == list(range(4 * c)):
            emitted[-1].output[0] = cat.output[0]
        else:
            idx = const("focus_channel_order", np.array(perm, np.int64))
            emitted.append(onnx.helper.make_node("Gather", [s2d, idx], [cat.output[0]],
                                                 name=fresh(f"{cat.name or 'Focus'}_order"),
                                                 axis=1))
        new_nodes[id(cat)] = emitted
        if quantized:
            drop.update(id(q) for q in qs)
            replaced.extend(chain)
        else:
            replaced_float.extend(chain)
    if not new_nodes:
        return nodes, [], []
    out = []
    for n in nodes:
        if id(n) in drop:
            continue
        out.extend(new_nodes.get(id(n), [n]))
    return out, replaced, replaced_float
