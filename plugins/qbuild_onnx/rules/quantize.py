"""The ``quantize`` (static, from saved ranges) and ``quantize_dynamic`` rules.

Thin wrappers over ``qbuild_onnx.quantization.quantize`` (rule API v2): ``analyze``
passes the attributes and the dependencies' labels (for messages) as params to one
action, which picks the model and calibration files out of its inputs and turns
``OnnxError`` into an error naming the attribute. The model and report.json come from
one quantizer run, so they are one action. The static rule reads only its declared
inputs, so changing a quantize attribute reruns neither pre-processing nor calibration.
onnx, onnxruntime and numpy are imported only inside the actions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import (
    CalibrationInfo,
    OnnxModelInfo,
    QuantizedModelInfo,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, ConfigError, Dep, Rule, RunContext, attr, hookimpl

from ..providers import OverridesInfo
from ..quantization.options import (
    ACTIVATION_TYPES,
    DYNAMIC_WEIGHT_TYPES,
    FORMATS,
    FOUR_BIT,
    PLACEMENTS,
    PRESETS,
    WEIGHT_TYPES,
    DynamicOptions,
    StaticOptions,
    apply_preset,
    check_dynamic_options,
    check_static_options,
)

OptionsT = TypeVar("OptionsT", StaticOptions, DynamicOptions)

_COMMON = {
    "model": attr.label(
        doc="The float model to quantize: a target with one .onnx output (for static "
            "quantization, the exact pre-processed model the calibration ran on).",
        required=True, providers=[OnnxModelInfo]),
    "per_channel": attr.bool(default=False, doc="Quantize Conv/Gemm/MatMul weights per "
                             "output channel."),
    "reduce_range": attr.bool(default=False, doc="7-bit weights (helps non-VNNI x86 CPUs)."),
    "op_types": attr.string_list(default=[], doc="Operator types to quantize; empty: all "
                                 "that onnxruntime supports."),
    "nodes_to_quantize": attr.string_list(default=[], doc="If set, quantize only these "
                                          "nodes (by name)."),
    "nodes_to_exclude": attr.string_list(default=[], doc="Nodes kept in float: names or "
                                         "stable selectors (globs, 'op:TYPE', 'upto:TENSOR', "
                                         "'after:TENSOR', 'first:N', 'last:N'; "
                                         "docs/selectors.md)."),
    "extra_options": attr.mapping(default={}, doc="onnxruntime quantizer extra options, "
                                  "passed through (e.g. QDQKeepRemovableActivations = true)."),
}


def _load_overrides(ctx: RunContext, dep: Dep, label: str) -> dict[str, Any]:
    """The precision-override document of a ``mixed_precision`` target (overrides.json)."""
    import json

    path = dep[OverridesInfo].overrides
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ctx.fail(f"{label}: cannot read {path.name}: {exc}", attr="overrides") from None
    tensors = doc.get("tensors", {}) if isinstance(doc, dict) else None
    nodes = doc.get("nodes_to_exclude", []) if isinstance(doc, dict) else None
    if not isinstance(tensors, dict) or not isinstance(nodes, list) or \
            not all(isinstance(n, str) for n in nodes):
        raise ctx.fail(f"{label}: {path.name} is not a precision-override document (an "
                       "object with a 'tensors' table and a 'nodes_to_exclude' list)",
                       attr="overrides")
    promoted = doc.get("promoted")
    if not isinstance(promoted, list):
        promoted = sorted(set(tensors) | set(nodes))
    return {"tensors": tensors, "nodes_to_exclude": nodes, "promoted": promoted}


def merge_label_overrides(a: dict[str, Any], doc: dict[str, Any]) -> tuple[dict[str, Any],
                                                                            list[str]]:
    """Attributes with an overrides document merged in. Inline values win: a tensor set in
    ``tensor_overrides`` keeps its inline table whole (returned as the shadowed names);
    ``nodes_to_exclude`` is the union, inline names first."""
    merged = dict(a)
    inline = a["tensor_overrides"] or {}
    shadowed = sorted(t for t in doc["tensors"] if t in inline)
    merged["tensor_overrides"] = {**doc["tensors"], **inline}
    merged["nodes_to_exclude"] = list(dict.fromkeys([*a["nodes_to_exclude"],
                                                     *doc["nodes_to_exclude"]]))
    return merged, shadowed


def _static_options(a: Mapping[str, Any]) -> StaticOptions:
    """The options of a ``quantize`` target (raises ``OnnxError`` for a preset that
    contradicts an attribute)."""
    activation_type, activation_symmetric, weight_symmetric = apply_preset(
        a["preset"], a["activation_type"], a["activation_symmetric"], a["weight_symmetric"])
    return StaticOptions(
        quant_format=a["format"], per_channel=a["per_channel"], weight_type=a["weight_type"],
        activation_type=activation_type, activation_symmetric=activation_symmetric,
        weight_symmetric=weight_symmetric, reduce_range=a["reduce_range"],
        op_types=tuple(a["op_types"]), nodes_to_quantize=tuple(a["nodes_to_quantize"]),
        nodes_to_exclude=tuple(a["nodes_to_exclude"]), tensor_overrides=a["tensor_overrides"],
        node_overrides=a["node_overrides"], extra_options=a["extra_options"],
        preset=a["preset"], placement=a["placement"])


def _dynamic_options(a: Mapping[str, Any]) -> DynamicOptions:
    return DynamicOptions(
        per_channel=a["per_channel"], weight_type=a["weight_type"],
        reduce_range=a["reduce_range"], op_types=tuple(a["op_types"]),
        nodes_to_quantize=tuple(a["nodes_to_quantize"]),
        nodes_to_exclude=tuple(a["nodes_to_exclude"]), extra_options=a["extra_options"])


def _rewrites(dep: Dep) -> dict[str, Any] | None:
    """The node renames of the pre-processing that made ``dep``'s model, if it says."""
    rewrites = dep[OnnxModelInfo].rewrites
    return rewrites if isinstance(rewrites, dict) else None


def _validate(check: Callable[[OptionsT], None], options: Callable[[], OptionsT]) -> None:
    try:
        check(options())
    except OnnxError as exc:
        raise ConfigError(exc.message, attr=exc.attr) from None


def _run(ctx: RunContext, work: Callable[[], dict[str, Any]], inputs: dict[Path, str]
         ) -> dict[str, Any]:
    try:
        return work()
    except OnnxError as exc:
        message = exc.message
        for path, label in inputs.items():  # staged paths mean nothing to the user
            message = message.replace(str(path), f"{label} ({path.name})")
        raise ctx.fail(message, attr=exc.attr) from None


def _quantize_action(ctx: AnalysisContext, function: Callable[[RunContext], Any],
                     deps: tuple[str, ...]) -> None:
    """The one action of a quantize rule: value attributes and the labels of the
    dependencies (named in messages) as params."""
    a = ctx.attrs
    params = {k: v for k, v in a.items() if k not in deps}
    params["labels"] = {k: a[k] for k in deps}
    params["out"] = ctx.output("{name}.onnx")
    ctx.action(function, inputs=[d for d in deps if a[d] is not None], outputs=ctx.outputs,
               params=params, mnemonic="Quantize")


class Quantize(OnnxRule):
    """Static quantization from a calibration artifact."""

    kind = "quantize"
    version = 3
    heavy = True
    doc = ("Static quantization with onnxruntime's QDQ or QOperator quantizer, from the "
           "tensor ranges of a `calibrate` target (never recalibrates). The calibration must "
           "have been computed on exactly the `model` file (sha256 checked). Per-channel "
           "models below opset 13 are upgraded (DequantizeLinear needs `axis`); the output "
           "is checked with onnx's full checker and an onnxruntime session. `preset` "
           "(NNCF's symmetric / mixed) and `placement` (around_ops for onnxruntime, "
           "conv_inputs for OpenVINO) choose symmetry and where Q/DQ go. `overrides` "
           "merges a mixed_precision target's overrides.json (inline values win). Outputs "
           "the model and report.json (Q/DQ counts, quantized ops, dtypes, size).")
    attrs = {
        **_COMMON,
        "calibration": attr.label(doc="The calibrate target (its calibration.json).",
                                  required=True, providers=[CalibrationInfo]),
        "format": attr.enum(list(FORMATS), default="qdq", doc="QDQ (QuantizeLinear/"
                            "DequantizeLinear pairs) or QOperator (QLinear* operators)."),
        "weight_type": attr.enum(list(WEIGHT_TYPES), default="int8", doc="Weight type; "
                                 "int4/uint4 and 16-bit types need format = 'qdq'."),
        "activation_type": attr.enum(list(ACTIVATION_TYPES + tuple(sorted(FOUR_BIT))),
                                     doc="Activation type; unset: the preset's, else uint8 "
                                     "(uint8 fuses into QLinear kernels on x86 CPUs; int8 "
                                     "does not)."),
        "activation_symmetric": attr.bool(doc="Symmetric activation ranges; unset: the "
                                          "preset's, else false."),
        "weight_symmetric": attr.bool(doc="Symmetric weights; unset: the preset's, else "
                                      "symmetric for signed weight types. Per-channel "
                                      "weights are always symmetric."),
        "preset": attr.enum(list(PRESETS), doc="NNCF's presets: 'symmetric' (symmetric "
                            "int8 activations and symmetric weights) or 'mixed' (symmetric "
                            "weights, asymmetric activations, uint8 unless activation_type "
                            "is set). It fills in activation_type, activation_symmetric and "
                            "weight_symmetric where unset; a symmetry set otherwise is an "
                            "error."),
        "placement": attr.enum(list(PLACEMENTS), default="around_ops", doc="Where Q/DQ "
                               "go, named for the runtime that fuses them: 'around_ops' "
                               "(onnxruntime's: inputs and outputs of every operator it "
                               "quantizes, SiLU's Sigmoid and Mul each between DQ and Q) or "
                               "'conv_inputs' (NNCF's, for OpenVINO: only the activation and "
                               "weight inputs of Conv, ConvTranspose, Gemm and MatMul; "
                               "elementwise ops stay float between them). docs/quantize-rules.md"),
        "tensor_overrides": attr.mapping(default={}, doc="Per-tensor settings: tensor name -> "
                                         "table (quant_type, symmetric, rmin, rmax, scale, "
                                         "zero_point, reduce_range, convert) or, per channel, "
                                         "a list of tables, the first with axis."),
        "node_overrides": attr.mapping(default={}, doc="Node name -> table applied to every "
                                       "output tensor of that node (as tensor_overrides)."),
        "per_channel": attr.bool(default=True, doc="Quantize Conv/Gemm/MatMul weights per "
                                 "output channel (the default: per-tensor weights wreck most "
                                 "CNNs)."),
        "float_joins_ratio": attr.float(default=32.0, doc="Keep in float every Concat whose "
                                        "inputs' calibrated ranges differ by this factor or "
                                        "more (pixel boxes beside scores), with the Reshape/"
                                        "Transpose after it; each input keeps its own scale. "
                                        "0 disables."),
        "overrides": attr.label(doc="A mixed_precision target: its overrides.json 'tensors' "
                                "are merged into tensor_overrides (an inline entry for the "
                                "same tensor wins whole) and its 'nodes_to_exclude' into "
                                "nodes_to_exclude (union).", providers=[OverridesInfo]),
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo, QuantizedModelInfo)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        _validate(check_static_options, lambda: _static_options(attrs))

    def analyze(self, ctx: AnalysisContext) -> None:
        _quantize_action(ctx, quantize_static, ("model", "calibration", "overrides"))


class QuantizeDynamic(OnnxRule):
    """Dynamic quantization: int8 weights now, uint8 activations computed at run time."""

    kind = "quantize_dynamic"
    version = 2
    heavy = True
    doc = ("Dynamic quantization with onnxruntime's integer-ops quantizer: weights are "
           "quantized now, activations at run time (DynamicQuantizeLinear), so no calibration "
           "is needed. Suits MatMul-heavy models (transformers, RNNs). onnxruntime quantizes "
           "Conv weights per-tensor here even with per_channel. Outputs the model and "
           "report.json.")
    attrs = {
        **_COMMON,
        "weight_type": attr.enum(list(DYNAMIC_WEIGHT_TYPES), default="int8",
                                 doc="Weight type."),
        "latency_check": attr.bool(default=False, doc="Record in report.json when the result "
                                   "is clearly slower than the float model (1 thread, "
                                   "synthetic input, both timed interleaved, CPU time; makes "
                                   "the report machine-dependent). A warning says so in any "
                                   "case."),
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo, QuantizedModelInfo)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        _validate(check_dynamic_options, lambda: _dynamic_options(attrs))

    def analyze(self, ctx: AnalysisContext) -> None:
        _quantize_action(ctx, quantize_dynamic, ("model",))


def quantize_static(ctx: RunContext) -> list[Any]:
    """``quantize``'s action: the quantized model and report.json."""
    from ..quantization.quantize import quantize_static_model

    a, labels = ctx.params, ctx.params["labels"]
    model = ctx.inputs["model"][OnnxModelInfo].model
    calibration = ctx.inputs["calibration"][CalibrationInfo].table
    inputs = {model: labels["model"], calibration: labels["calibration"]}
    promoted = None
    if labels["overrides"] is not None:
        doc = _load_overrides(ctx, ctx.inputs["overrides"], labels["overrides"])
        a, shadowed = merge_label_overrides(a, doc)
        promoted = doc["promoted"]
        ctx.log(f"overrides from {labels['overrides']}: {len(doc['tensors'])} "
                f"tensor(s), {len(doc['nodes_to_exclude'])} excluded node(s)")
        if shadowed:
            ctx.log(f"inline tensor_overrides win for: {', '.join(shadowed)}")
    options = _static_options(a)
    if promoted is not None:
        try:
            check_static_options(options)
        except OnnxError as exc:
            raise ctx.fail(f"with the overrides of {labels['overrides']}: {exc.message}",
                           attr="overrides") from None
    out = ctx.output(a["out"])
    info = _run(ctx, lambda: quantize_static_model(
        model, calibration, out, options, report_path=ctx.output("report.json"),
        log=ctx.log, warn=ctx.warn, rewrites=_rewrites(ctx.inputs["model"]),
        float_joins_ratio=a["float_joins_ratio"]), inputs)
    return _providers(out, info, promoted or [])


def quantize_dynamic(ctx: RunContext) -> list[Any]:
    """``quantize_dynamic``'s action: the quantized model and report.json."""
    from ..quantization.quantize import quantize_dynamic_model

    a = ctx.params
    model = ctx.inputs["model"][OnnxModelInfo].model
    out = ctx.output(a["out"])
    info = _run(ctx, lambda: quantize_dynamic_model(
        model, out, _dynamic_options(a), report_path=ctx.output("report.json"),
        log=ctx.log, warn=ctx.warn, rewrites=_rewrites(ctx.inputs["model"]),
        latency_in_report=a["latency_check"]), {model: a["labels"]["model"]})
    return _providers(out, info, [])


def _providers(out: Path, info: dict[str, Any], promoted: list[str]) -> list[Any]:
    """The quantized model as dependents read it: the model (with the tensors the
    overrides promoted and the joins kept float), and how it was quantized
    (float_nodes: the nodes kept in float around mixed-range joins)."""
    joins = info.get("float_joins") or []
    kept = sorted({n for j in joins for n in j["float_nodes"]})
    return [onnx_model_info(out, promoted=tuple(promoted),
                            float_joins=tuple(j["node"] for j in joins)),
            QuantizedModelInfo(model=out, format=info["format"],
                               weight_type=info["weight_type"],
                               activation_type=info["activation_type"],
                               float_nodes=tuple(kept))]


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Quantize, QuantizeDynamic]
