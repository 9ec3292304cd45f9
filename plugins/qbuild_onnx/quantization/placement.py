"""Q/DQ placement ``conv_inputs``: quantized activations reach only weighted operators.

onnxruntime's QDQ quantizer, asked to quantize only Conv/ConvTranspose/Gemm/MatMul and
not their outputs, puts one Q/DQ pair on each activation those operators read, but then
points *every* reader of that activation at the pair's DequantizeLinear: a residual Add
or a Concat that shares the tensor with a Conv would compute on rounded values, and a
graph output that also feeds a Conv would become DQ(Q(x)). NNCF (and this placement)
quantize the edge into the weighted operator only, so this module points every other
reader back at the float tensor, and gives a graph output its float producer back.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx

# Which inputs of a weighted operator are its quantized activations (MatMul: both).
_ACTIVATION_INPUTS = {"Conv": (0,), "ConvTranspose": (0,), "Gemm": (0,), "MatMul": (0, 1)}


def _reads_quantized(node: onnx.NodeProto, index: int, op_types: Collection[str]) -> bool:
    return node.op_type in op_types and index in _ACTIVATION_INPUTS.get(node.op_type, ())


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _rename(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in model.graph.node:
        for i, t in enumerate(node.input):
            if t == old:
                node.input[i] = new
        for i, t in enumerate(node.output):
            if t == old:
                node.output[i] = new
    for vi in model.graph.value_info:
        if vi.name == old:
            vi.name = new


def keep_float_readers(model: onnx.ModelProto, op_types: Collection[str]) -> int:
    """Point every reader of a quantized activation that is not a quantized input of a
    node of ``op_types`` at the float tensor; returns how many inputs were re-pointed
    (graph outputs given back their float value count as one each). Edits ``model``."""
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    taken = ({t for n in graph.node for t in (*n.input, *n.output)} | inits
             | {i.name for i in graph.input} | outputs)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, t in enumerate(node.input):
            readers.setdefault(t, []).append((node, i))
    moved = 0
    for q in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        src = q.input[0]
        if src in inits:
            continue
        for dq, _ in readers.get(q.output[0], []):
            if dq.op_type != "DequantizeLinear":
                continue
            out = dq.output[0]
            for node, i in readers.get(out, []):
                if not _reads_quantized(node, i, op_types):
                    node.input[i] = src
                    moved += 1
            if out in outputs:
                # the graph output keeps its name and becomes the float tensor again
                renamed = _fresh(f"{out}_DequantizeLinear_Output", taken)
                _rename(model, out, renamed)
                _rename(model, src, out)
                src = out
                moved += 1
    return moved
