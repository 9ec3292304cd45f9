"""Validation of a quantized model before it is written.

Owns the three checks every quantized model passes: the full ONNX checker (strict shape
and type inference, which catches what the plain checker misses, e.g. a QuantizeLinear
``output_dtype`` that disagrees with its zero point), creating an onnxruntime CPU session
at the default optimisation level (which catches opset and fusion problems), and graph
inputs and outputs keeping their names and dtypes, and a graph output that a Relu or Clip
produced still being clamped.
"""

from __future__ import annotations

import onnx

from .errors import QuantizeError
from .report import describe_values, graph_inputs


def check_onnx(model: onnx.ModelProto) -> None:
    """Run ``onnx.checker.check_model(full_check=True)``; raise ``QuantizeError`` if invalid."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise QuantizeError(f"the quantized model is not valid ONNX: {exc}") from None


def check_onnxruntime(data: bytes) -> None:
    """Load the serialized model in an onnxruntime CPU session; raise if it does not load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1  # the one core the rule is granted (Rule.cpu)
    options.inter_op_num_threads = 1
    try:
        ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise QuantizeError(f"onnxruntime cannot load the quantized model: {exc}") from None


def check_interface(original: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    """Graph inputs and outputs keep their names and dtypes (shapes may gain detail)."""
    for what, before, after in (
        ("input", graph_inputs(original), graph_inputs(quantized)),
        ("output", original.graph.output, quantized.graph.output),
    ):
        old = [(v["name"], v["dtype"]) for v in describe_values(before)]
        new = [(v["name"], v["dtype"]) for v in describe_values(after)]
        if old != new:
            raise QuantizeError(f"quantization changed the graph {what}s: {old} -> {new}")


_CLAMPS = ("Relu", "Clip")


def check_clamped_outputs(original: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    """A graph output produced by Relu/Clip must still come from a clamp or a Q/DQ pair.

    onnxruntime 1.31 removes such activations (the uint8 zero point clamps instead), but
    with ``DedicatedQDQPair`` it exports the unclamped float tensor as the graph output.
    """
    def producers(model):
        return {o: n.op_type for n in model.graph.node for o in n.output}

    before, after = producers(original), producers(quantized)
    for out in quantized.graph.output:
        if before.get(out.name) in _CLAMPS:
            now = after.get(out.name, "")
            if now not in (*_CLAMPS, "DequantizeLinear") and not now.startswith("QLinear"):
                raise QuantizeError(
                    f"graph output {out.name!r} was produced by {before[out.name]} and is now "
                    f"produced by {now or 'nothing'}: its values would no longer be clamped")
