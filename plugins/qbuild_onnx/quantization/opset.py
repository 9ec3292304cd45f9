"""Opset and IR-version handling around quantization.

Owns deciding which ai.onnx opset the quantized model needs and upgrading the model to
it before onnxruntime's quantizer runs. onnxruntime 1.31 upgrades only for 16-bit types,
float8 and blocked quantization; it writes an invalid model for per-channel Q/DQ below
opset 13 (DequantizeLinear's ``axis`` appears in opset 13) and for any Q/DQ below opset 10.
The IR-version bump that lets new initializers exist without being graph inputs is
``qbuild_onnx_common.graph.bump_ir_version``.
"""

from __future__ import annotations

import onnx
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.graph import bump_ir_version, opset

MIN_OPSET = 11  # QuantizeLinear is opset 10; DynamicQuantizeLinear and fusions need 11.
PER_AXIS_OPSET = 13  # QuantizeLinear/DequantizeLinear 'axis'
WIDE_TYPES_OPSET = 21  # int16/uint16/int4/uint4 and block_size in the standard domain
_WIDE = frozenset({"int16", "uint16", "int4", "uint4"})


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset version."""
    version = opset(model)
    if version is None:
        raise OnnxError("the model does not import the ai.onnx domain", attr="model")
    return version


def required_opset(current: int, *, per_axis: bool, types: set[str], block_size: int = 0,
                   contrib_qdq: bool = False) -> int:
    """The lowest ai.onnx opset >= ``current`` at which the quantized model is valid."""
    need = max(current, MIN_OPSET)
    if per_axis:
        need = max(need, PER_AXIS_OPSET)
    if block_size or (types & _WIDE and not contrib_qdq):
        need = max(need, WIDE_TYPES_OPSET)
    return need


def upgrade(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``model`` converted to ai.onnx opset ``target`` (the same object if already there)."""
    current = ai_onnx_opset(model)
    if current >= target:
        return model
    try:
        converted = onnx.version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises bare RuntimeErrors and ValueErrors
        raise OnnxError(
            f"the model has opset {current}, the quantized model needs opset {target}, and "
            f"onnx's version converter failed: {exc}", attr="model") from None
    bump_ir_version(converted)
    return converted
