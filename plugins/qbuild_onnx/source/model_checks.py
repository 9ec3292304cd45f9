"""Models as they come: recognising the model shapes quantization cannot take as they are,
so rules refuse them with one clear line or apply a known workaround.

Owns: telling already-quantized models apart (QDQ, QOperator, dynamic integer ops),
finding compute hidden in control-flow subgraphs (If/Loop/Scan), initializers also
listed as graph inputs (IR < 4 exports), and the nodes onnxruntime's quantizer is known
to fail on (per-channel grouped ConvTranspose with a bias: "operands could not be
broadcast together"; per-channel Gemm with a [1, N] bias: "The truth value of an array
with more than one element is ambiguous", onnxruntime 1.31).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto

_QOPERATOR = {"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearConcat",
              "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
              "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax", "QLinearWhere",
              "QAttention", "MatMulNBits"}
_DYNAMIC = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul",
            "MatMulIntegerToFloat", "DynamicQuantizeLSTM"}
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
_COMPUTE = {"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "Attention"}
_CONTROL = {"If", "Loop", "Scan"}


def quantized_form(model: ModelProto) -> tuple[str, dict[str, int]] | None:
    """('QOperator' | 'dynamic' | 'QDQ', op counts) if the model is already quantized."""
    ops = Counter(n.op_type for n in model.graph.node)
    for form, kinds in (("QOperator", _QOPERATOR), ("dynamic", _DYNAMIC), ("QDQ", _QDQ)):
        found = {k: ops[k] for k in sorted(kinds) if ops[k]}
        if found:
            return form, found
    return None


def describe_quantized(model: ModelProto, action: str) -> str | None:
    """The one-line refusal for an already-quantized model, or None."""
    q = quantized_form(model)
    if q is None:
        return None
    form, ops = q
    counts = ", ".join(f"{v} {k}" for k, v in ops.items())
    route = {"QDQ": "lower it with lower_integer, retarget its dtypes, or quantize its float "
                    "source model",
             "QOperator": "quantize its float source model instead",
             "dynamic": "quantize its float source model instead (static quantization of "
                        "a ConvInteger/MatMulInteger graph is not possible)"}[form]
    return f"the model is already quantized ({form}: {counts}); {action} needs a float " \
           f"model: {route}"


def _subgraph_compute(graph: GraphProto) -> int:
    count = 0
    for n in graph.node:
        if n.op_type in _COMPUTE:
            count += 1
        for a in n.attribute:
            if a.g is not None and a.g.node:
                count += _subgraph_compute(a.g)
            for g in a.graphs:
                count += _subgraph_compute(g)
    return count


def control_flow_compute(model: ModelProto) -> list[tuple[str, str, int]]:
    """(node name, op type, compute nodes inside) of top-level If/Loop/Scan nodes whose
    subgraphs hold Conv/MatMul/Gemm/... nodes."""
    found = []
    for n in model.graph.node:
        if n.op_type not in _CONTROL:
            continue
        inner = sum(_subgraph_compute(a.g) for a in n.attribute if a.g is not None and a.g.node)
        inner += sum(_subgraph_compute(g) for a in n.attribute for g in a.graphs)
        if inner:
            found.append((n.name or n.output[0], n.op_type, inner))
    return found


def top_level_compute(model: ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type in _COMPUTE)


def initializer_inputs(model: ModelProto) -> list[str]:
    """Names of initializers also listed as graph inputs."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name in inits]


def drop_initializer_inputs(model: ModelProto) -> int:
    """Remove initializers from the graph inputs (they become constants, so BatchNorm
    folding and per-channel axes see them); returns how many were removed."""
    inits = {i.name for i in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in inits]
    dropped = len(model.graph.input) - len(kept)
    if dropped:
        del model.graph.input[:]
        model.graph.input.extend(kept)
        # IR < 4 requires every initializer to be a graph input; 4 is the first IR that
        # allows constants, and it changes nothing else a model of that age uses.
        model.ir_version = max(model.ir_version, 4)
    return dropped


def grouped_conv_transposes_with_bias(model: ModelProto) -> list[str]:
    """ConvTranspose nodes with group > 1 and a bias: onnxruntime's per-channel QDQ
    quantizer fails on them (its bias scale has the per-group weight channel count)."""
    from qbuild_onnx_common.graph import attr

    out = []
    for n in model.graph.node:
        if n.op_type != "ConvTranspose" or len(n.input) < 3 or not n.input[2]:
            continue
        group = attr(n, "group", 1)
        if group > 1:
            out.append(n.name)
    return out


def summary(model: ModelProto) -> dict[str, Any]:
    """What ``onnx_model`` reports about these shapes (for its info)."""
    q = quantized_form(model)
    return {"already_quantized": q[0] if q else None,
            "initializer_inputs": len(initializer_inputs(model)),
            "control_flow_compute": [list(c) for c in control_flow_compute(model)]}


def flatten_gemm_biases(model: ModelProto) -> list[str]:
    """Reshape [1, N] Gemm biases (what onnxruntime's MatMul+Add fusion leaves) to [N]:
    the same broadcast, and the shape onnxruntime's per-channel int32-bias adjustment
    handles. Only initializers read by that one node are changed; returns the nodes."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    readers = Counter(i for n in model.graph.node for i in n.input)
    changed = []
    for n in model.graph.node:
        if n.op_type != "Gemm" or len(n.input) < 3 or n.input[2] not in inits:
            continue
        b = inits[n.input[2]]
        if len(b.dims) == 2 and b.dims[0] == 1 and readers[b.name] == 1:
            arr = numpy_helper.to_array(b).reshape(-1)
            b.CopyFrom(numpy_helper.from_array(arr, b.name))
            changed.append(n.name or n.output[0])
    return changed
