"""Opset and IR-version handling around quantization.

Owns deciding which ai.onnx opset the quantized model needs and upgrading the model to
it before onnxruntime's quantizer runs. onnxruntime 1.31 upgrades only for 16-bit types,
float8 and blocked quantization; it writes an invalid model for per-channel Q/DQ below
opset 13 (DequantizeLinear's ``axis`` appears in opset 13) and for any Q/DQ below opset 10.
Also owns the IR-version bump that lets new initializers exist without being graph inputs.
"""

from __future__ import annotations

import onnx

from .errors import QuantizeError

MIN_OPSET = 11  # QuantizeLinear is opset 10; DynamicQuantizeLinear and fusions need 11.
PER_AXIS_OPSET = 13  # QuantizeLinear/DequantizeLinear 'axis'
WIDE_TYPES_OPSET = 21  # int16/uint16/int4/uint4 and block_size in the standard domain
_WIDE = frozenset({"int16", "uint16", "int4", "uint4"})


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset version."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if len(versions) != 1:
        raise QuantizeError("the model does not import the ai.onnx domain exactly once",
                            attr="model")
    return versions[0]


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
        raise QuantizeError(
            f"the model has opset {current}, the quantized model needs opset {target}, and "
            f"onnx's version converter failed: {exc}", attr="model") from None
    bump_ir_version(converted)
    return converted


def bump_ir_version(model: onnx.ModelProto) -> None:
    """Raise the IR version to what the opset imports need, and at least 4.

    IR < 4 requires every initializer to be a graph input; the quantizer adds scale and
    zero-point initializers that must not become inputs.
    """
    need = max(4, onnx.helper.find_min_ir_version_for(list(model.opset_import), True))
    if model.ir_version < need:
        model.ir_version = need
