"""Options of the static and dynamic quantization steps (and of pre-processing), and
their validation.

Owns the user-facing vocabulary (format and type names, override keys, which of
onnxruntime's ``extra_options`` may be passed through) and every check that can be made
on the options alone. Checks that need the model (node and tensor names) live in
``quantize_overrides``. Pure Python: nothing here imports onnx, onnxruntime or numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qbuild_onnx_common.errors import OnnxError

FORMATS = ("qdq", "qoperator")
#: Integer types by user-facing name; 4-bit types are for weights only.
INT_TYPES = ("int8", "uint8", "int16", "uint16", "int4", "uint4")
WEIGHT_TYPES = INT_TYPES
ACTIVATION_TYPES = ("int8", "uint8", "int16", "uint16")
DYNAMIC_WEIGHT_TYPES = ("int8", "uint8")
SIXTEEN_BIT = frozenset({"int16", "uint16"})
FOUR_BIT = frozenset({"int4", "uint4"})

# Operator types onnxruntime 1.31 can quantize; the static quantizer uses the union of its
# QDQ and QOperator registries whatever the format, as ``quantize_static`` does.
STATIC_OP_TYPES = (
    "Add", "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv",
    "ConvTranspose", "CumSum", "EmbedLayerNormalization", "Flatten", "Gather",
    "GatherElements", "Gemm", "GlobalAveragePool", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Pad", "Relu", "Reshape",
    "Resize", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose",
    "Unsqueeze", "Where",
)  # fmt: skip
DYNAMIC_OP_TYPES = (
    "Attention", "Conv", "EmbedLayerNormalization", "Gather", "LSTM", "MatMul", "Transpose",
)  # fmt: skip

#: Where Q/DQ pairs go (``placement``), named for the runtime that fuses them:
#: ``around_ops``: onnxruntime's own placement, the inputs and outputs of every operator
#: it can quantize (SiLU's Sigmoid and Mul each between a DQ and a Q, so onnxruntime
#: runs them as QLinearSigmoid / QLinearMul between QLinearConvs);
#: ``conv_inputs``: only the inputs (activation and weight) of the weighted operators
#: below, as NNCF places them: every elementwise op (SiLU, Add, Concat, ...) stays float
#: between int8 convolutions, which OpenVINO fuses into the convolution (onnxruntime
#: runs such a Conv in float between DQs: slower there).
PLACEMENTS = ("around_ops", "conv_inputs")
CONV_INPUT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")

#: Quantization presets (named as NNCF's): the symmetry they fix and the activation type
#: they give when ``activation_type`` is not set. ``symmetric``: symmetric int8
#: activations (zero point 0) and symmetric weights; ``mixed``: symmetric weights and
#: asymmetric activations (uint8 unless set).
PRESETS: dict[str, dict[str, Any]] = {
    "symmetric": {"activation_type": "int8", "activation_symmetric": True,
                  "weight_symmetric": True},
    "mixed": {"activation_type": "uint8", "activation_symmetric": False,
              "weight_symmetric": True},
}

# onnxruntime extra options that a rule attribute already covers: name the attribute.
_EXTRA_OWNED = {
    "ActivationSymmetric": "activation_symmetric",
    "WeightSymmetric": "weight_symmetric",
    "TensorQuantOverrides": "tensor_overrides",
}
# Options that only matter while calibrating; quantize never recalibrates. Each maps to
# what to do instead: the calibrate attribute that does it, or why there is none.
_EXTRA_CALIBRATION_INSTEAD = {
    "CalibTensorRangeSymmetric": "set symmetric = true on the calibrate target",
    "CalibMovingAverage": "set moving_average = true on the calibrate target",
    "CalibMovingAverageConstant": "set averaging_constant on the calibrate target (with "
                                  "moving_average = true)",
    "CalibPercentile": "set method = \"percentile\" and percentile on the calibrate target",
    "CalibMaxIntermediateOutputs": "calibrate already streams one batch at a time in "
                                   "bounded memory (its batch_size sets the batch)",
    "CalibStridedMinMax": "calibrate already streams one batch at a time in bounded memory "
                          "(its batch_size sets the batch)",
}
_SMOOTH_QUANT = ("SmoothQuant", "SmoothQuantAlpha", "SmoothQuantFolding")
_EXTRA_CALIBRATION = frozenset({*_EXTRA_CALIBRATION_INSTEAD, *_SMOOTH_QUANT})


def _calibration_hint(key: str) -> str:
    if key in _SMOOTH_QUANT:
        return (f"extra_options.{key}: SmoothQuant rewrites the float model before "
                "calibration, so it is not a quantize option: add an equalize target with "
                "method = \"smoothquant\" (and alpha, dataset) on the float model, then "
                "calibrate and quantize its output. Remove the option")
    return (f"extra_options.{key} is a calibration option: quantization reads saved ranges "
            f"and never recalibrates; {_EXTRA_CALIBRATION_INSTEAD[key]}")
STATIC_EXTRA_OPTIONS = frozenset({
    "extra.Sigmoid.nnapi", "ActivationRestrictedAsymmetric", "EnableSubgraph",
    "ForceQuantizeNoInputCheck", "MatMulConstBOnly", "AddQDQPairToWeight",
    "OpTypesToExcludeOutputQuantization", "DedicatedQDQPair",
    "QDQOpTypePerChannelSupportToAxis", "UseQDQContribOps", "MinimumRealRange",
    "QDQKeepRemovableActivations", "QDQDisableWeightAdjustForInt32Bias", "QuantizeBias",
    "BlockSize", "DefaultTensorType",
})  # fmt: skip
DYNAMIC_EXTRA_OPTIONS = frozenset({
    "extra.Sigmoid.nnapi", "ActivationRestrictedAsymmetric", "EnableSubgraph",
    "ForceQuantizeNoInputCheck", "MatMulConstBOnly", "DefaultTensorType",
})  # fmt: skip


@dataclass(frozen=True)
class StaticOptions:
    """Everything that shapes a static quantization, except the model and the ranges."""

    quant_format: str = "qdq"
    per_channel: bool = False
    weight_type: str = "int8"
    activation_type: str = "uint8"
    activation_symmetric: bool = False
    weight_symmetric: bool | None = None  # None: symmetric exactly for signed weight types
    reduce_range: bool = False
    op_types: tuple[str, ...] = ()
    nodes_to_quantize: tuple[str, ...] = ()
    nodes_to_exclude: tuple[str, ...] = ()
    tensor_overrides: Mapping[str, Any] = field(default_factory=dict)
    node_overrides: Mapping[str, Any] = field(default_factory=dict)
    extra_options: Mapping[str, Any] = field(default_factory=dict)
    preset: str | None = None  # recorded; its settings are already in the fields above
    placement: str = "around_ops"

    def quantized_op_types(self) -> list[str]:
        """The operator types onnxruntime's quantizer is asked to quantize."""
        default = CONV_INPUT_OPS if self.placement == "conv_inputs" else STATIC_OP_TYPES
        return sorted(self.op_types or default)


def apply_preset(preset: str | None, activation_type: str | None,
                 activation_symmetric: bool | None, weight_symmetric: bool | None
                 ) -> tuple[str, bool, bool | None]:
    """(activation_type, activation_symmetric, weight_symmetric) after ``preset``: it
    fills in what is unset; a symmetry set to the other value than the preset's is an
    error (the activation type is the user's to choose)."""
    if preset is None:
        return activation_type or "uint8", bool(activation_symmetric), weight_symmetric
    if preset not in PRESETS:
        raise OnnxError(f"preset = {preset!r} is not one of {', '.join(PRESETS)}",
                        attr="preset")
    fixed = PRESETS[preset]
    for attr, given in (("activation_symmetric", activation_symmetric),
                        ("weight_symmetric", weight_symmetric)):
        if given is not None and given != fixed[attr]:
            raise OnnxError(
                f"{attr} = {str(given).lower()} contradicts preset = {preset!r}, which sets "
                f"{attr} = {str(fixed[attr]).lower()}; drop one of the two", attr=attr)
    return (activation_type or str(fixed["activation_type"]),
            bool(fixed["activation_symmetric"]), bool(fixed["weight_symmetric"]))


@dataclass(frozen=True)
class DynamicOptions:
    """Everything that shapes a dynamic quantization, except the model."""

    per_channel: bool = False
    weight_type: str = "int8"
    reduce_range: bool = False
    op_types: tuple[str, ...] = ()
    nodes_to_quantize: tuple[str, ...] = ()
    nodes_to_exclude: tuple[str, ...] = ()
    extra_options: Mapping[str, Any] = field(default_factory=dict)


def _check_choice(value: str, choices: tuple[str, ...], attr: str) -> None:
    if value not in choices:
        raise OnnxError(
            f"{attr} = {value!r} is not one of {', '.join(choices)}", attr=attr
        )


def _check_names(names: tuple[str, ...], attr: str) -> None:
    for name in names:
        if not isinstance(name, str) or not name:
            raise OnnxError(f"{attr} holds {name!r}: expected non-empty node names", attr=attr)


def _check_op_types(op_types: tuple[str, ...], supported: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(op_types) - set(supported))
    if unknown:
        raise OnnxError(
            f"op_types holds {', '.join(unknown)}, which onnxruntime's {what} quantizer cannot "
            f"quantize; supported: {', '.join(supported)}",
            attr="op_types",
        )


def _check_node_lists(quantize: tuple[str, ...], exclude: tuple[str, ...]) -> None:
    _check_names(quantize, "nodes_to_quantize")
    _check_names(exclude, "nodes_to_exclude")
    both = sorted(set(quantize) & set(exclude))
    if both:
        raise OnnxError(
            f"node(s) {', '.join(both)} are both in nodes_to_quantize and nodes_to_exclude",
            attr="nodes_to_exclude",
        )


def _check_extra_options(extra: Mapping[str, Any], allowed: frozenset[str], what: str) -> None:
    if not isinstance(extra, Mapping):
        raise OnnxError("extra_options must be a table of onnxruntime options",
                            attr="extra_options")
    for key in sorted(extra):
        if key in _EXTRA_OWNED:
            raise OnnxError(
                f"extra_options.{key}: use the attribute {_EXTRA_OWNED[key]} instead",
                attr="extra_options",
            )
        if key in _EXTRA_CALIBRATION:
            raise OnnxError(_calibration_hint(key), attr="extra_options")
        if key not in allowed:
            raise OnnxError(
                f"extra_options.{key} is not an onnxruntime {what} quantization option; known: "
                f"{', '.join(sorted(allowed))}",
                attr="extra_options",
            )
    block = extra.get("BlockSize", 0)
    if block and (not isinstance(block, int) or isinstance(block, bool) or block < 16
                  or block & (block - 1)):
        raise OnnxError(
            f"extra_options.BlockSize = {block!r}: expected a power of two >= 16",
            attr="extra_options",
        )


def check_static_options(opts: StaticOptions) -> None:
    """Raise ``OnnxError`` for any static option (or combination) that cannot work."""
    _check_choice(opts.quant_format, FORMATS, "format")
    _check_choice(opts.weight_type, WEIGHT_TYPES, "weight_type")
    if opts.activation_type in FOUR_BIT:
        raise OnnxError(
            f"activation_type = {opts.activation_type!r}: 4-bit types are for weights only "
            f"(weight_type); activations can be {', '.join(ACTIVATION_TYPES)}",
            attr="activation_type",
        )
    _check_choice(opts.activation_type, ACTIVATION_TYPES, "activation_type")
    if opts.activation_type == "int8" and opts.weight_type == "uint8":
        raise OnnxError(
            "activation_type = 'int8' with weight_type = 'uint8' is not supported by onnxruntime; "
            "use int8 weights",
            attr="weight_type",
        )
    if opts.quant_format == "qoperator":
        wide = sorted({opts.weight_type, opts.activation_type} & (SIXTEEN_BIT | FOUR_BIT))
        if wide:
            raise OnnxError(
                f"format = 'qoperator' supports only 8-bit types, not {', '.join(wide)}; "
                f"use format = 'qdq'",
                attr="format",
            )
        if opts.extra_options.get("BlockSize"):
            raise OnnxError("extra_options.BlockSize (blocked quantization) needs "
                                "format = 'qdq'", attr="extra_options")
    if opts.quant_format == "qdq" and opts.per_channel and opts.weight_symmetric is False:
        raise OnnxError(
            "weight_symmetric = false cannot apply with per_channel = true: onnxruntime always "
            "quantizes per-channel weights symmetrically (QLinear kernels need one zero point "
            "per tensor); drop one of the two",
            attr="weight_symmetric",
        )
    _check_op_types(opts.op_types, STATIC_OP_TYPES, "static")
    _check_placement(opts)
    _check_node_lists(opts.nodes_to_quantize, opts.nodes_to_exclude)
    _check_extra_options(opts.extra_options, STATIC_EXTRA_OPTIONS, "static")
    for attr, table in (("tensor_overrides", opts.tensor_overrides),
                        ("node_overrides", opts.node_overrides)):
        if not isinstance(table, Mapping):
            raise OnnxError(f"{attr} must be a table keyed by name", attr=attr)


def _check_placement(opts: StaticOptions) -> None:
    _check_choice(opts.placement, PLACEMENTS, "placement")
    if opts.preset is not None:
        _check_choice(opts.preset, tuple(PRESETS), "preset")
    if opts.placement != "conv_inputs":
        return
    if opts.quant_format != "qdq":
        raise OnnxError("placement = 'conv_inputs' needs format = 'qdq' (QOperator "
                        "kernels quantize their outputs too)", attr="placement")
    others = sorted(set(opts.op_types) - set(CONV_INPUT_OPS))
    if others:
        raise OnnxError(f"op_types holds {', '.join(others)}, which placement = "
                        f"'conv_inputs' never quantizes (only {', '.join(CONV_INPUT_OPS)})",
                        attr="op_types")


def check_dynamic_options(opts: DynamicOptions) -> None:
    """Raise ``OnnxError`` for any dynamic option (or combination) that cannot work."""
    if opts.weight_type not in DYNAMIC_WEIGHT_TYPES:
        raise OnnxError(
            f"weight_type = {opts.weight_type!r}: dynamic quantization supports "
            f"{', '.join(DYNAMIC_WEIGHT_TYPES)} weights (activations are always uint8)",
            attr="weight_type",
        )
    _check_op_types(opts.op_types, DYNAMIC_OP_TYPES, "dynamic")
    _check_node_lists(opts.nodes_to_quantize, opts.nodes_to_exclude)
    _check_extra_options(opts.extra_options, DYNAMIC_EXTRA_OPTIONS, "dynamic")


@dataclass(frozen=True)
class PreprocessOptions:
    """``quant_pre_process`` options (same names and defaults as onnxruntime's)."""

    skip_optimization: bool = False
    skip_onnx_shape: bool = False
    skip_symbolic_shape: bool = False
    auto_merge: bool = False
    int_max: int = 2**31 - 1
    guess_output_rank: bool = False
    verbose: int = 0
