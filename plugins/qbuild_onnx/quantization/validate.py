"""Validation of a quantized model before it is written.

Owns the three checks every quantized model passes: the full ONNX checker (strict shape
and type inference, which catches what the plain checker misses, e.g. a QuantizeLinear
``output_dtype`` that disagrees with its zero point), creating an onnxruntime CPU session
at the default optimisation level (which catches opset and fusion problems), and graph
inputs and outputs keeping their names and dtypes, and a graph output that a Relu or Clip
produced still being clamped.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import GraphIndex, real_inputs
from qbuild_onnx_common.ort import session
from qbuild_onnx_common.summary import describe_values


def check_onnx(model: onnx.ModelProto | Path) -> None:
    """Run ``onnx.checker.check_model(full_check=True)`` on a model or a saved file (read
    by onnx's C++ side alone: no Python copy); raise ``OnnxError`` if invalid."""
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model,
                                 full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise OnnxError(f"the quantized model is not valid ONNX: {exc}") from None


def check_onnxruntime(model: bytes | Path) -> None:
    """Load the serialized (or saved) model in an onnxruntime CPU session; raise if it does
    not load. Weights are not pre-packed: the session only proves the model loads and
    optimises, and pre-packed copies of every weight would double its memory."""
    # the one core the rule is granted (Rule.cpu)
    session(model, what="the quantized model", config={"session.disable_prepacking": "1"})


def check_interface(original: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    """Graph inputs and outputs keep their names and dtypes (shapes may gain detail)."""
    for what, before, after in (
        ("input", real_inputs(original), real_inputs(quantized)),
        ("output", original.graph.output, quantized.graph.output),
    ):
        old = [(v["name"], v["dtype"]) for v in describe_values(before)]
        new = [(v["name"], v["dtype"]) for v in describe_values(after)]
        if old != new:
            raise OnnxError(f"quantization changed the graph {what}s: {old} -> {new}")


_CLAMPS = ("Relu", "Clip")


def check_clamped_outputs(original: onnx.ModelProto, quantized: onnx.ModelProto) -> None:
    """A graph output produced by Relu/Clip must still come from a clamp or a Q/DQ pair.

    onnxruntime 1.31 removes such activations (the uint8 zero point clamps instead), but
    with ``DedicatedQDQPair`` it exports the unclamped float tensor as the graph output.
    """
    def producer_ops(model: onnx.ModelProto) -> dict[str, str]:
        return {t: n.op_type for t, n in GraphIndex(model.graph).producers.items()}

    before, after = producer_ops(original), producer_ops(quantized)
    for out in quantized.graph.output:
        if before.get(out.name) in _CLAMPS:
            now = after.get(out.name, "")
            if now not in (*_CLAMPS, "DequantizeLinear") and not now.startswith("QLinear"):
                raise OnnxError(
                    f"graph output {out.name!r} was produced by {before[out.name]} and is now "
                    f"produced by {now or 'nothing'}: its values would no longer be clamped")
