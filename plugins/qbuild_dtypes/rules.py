"""The dtype plugin's rules: ``qdq_retarget`` and ``requantize_weights`` (rule API v2).

Each declares one action at analysis, a thin wrapper over :mod:`qbuild_dtypes.conversion.pipeline`:
it reads the model from the ``model`` dependency's ``OnnxModelInfo``, resolves the
target (built-in or added by a plugin through the ``qbuild_dtype_targets`` hook), turns
``OnnxError`` into a ``RuleError`` naming the attribute, and gives the written model as
``OnnxModelInfo``. onnx, onnxruntime and numpy are imported only inside the actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import AllocationRefused, check_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import OnnxModelInfo, model_path, onnx_model_info
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, ConfigError, Rule, RunContext, attr, hookimpl

from .runtime.targets import BUILTIN_TARGETS, FORMS, DtypeTarget, get_target

if TYPE_CHECKING:
    import pluggy

_BUILTIN_NAMES = ", ".join(t.name for t in BUILTIN_TARGETS)

_COMMON = {
    "model": attr.label(doc="The model: a target with one .onnx output (a QDQ model for "
                            "qdq_retarget; float or QDQ for requantize_weights).",
                        required=True, providers=[OnnxModelInfo]),
    "target": attr.string(default="onnxruntime-cpu",
                          doc=f"Runtime the model is written for: {_BUILTIN_NAMES}, or one "
                              "a plugin adds through the qbuild_dtype_targets hook."),
    "form": attr.enum(["auto", *FORMS], default="auto",
                      doc="QDQ form: output_dtype (opset >= 21, all-zero zero points elided "
                          "where legal), zero_point (explicit zero points, no output_dtype), "
                          "or auto (the target's preferred form); target policies on top."),
    "input_dims": attr.mapping(default={}, doc="Values for symbolic input dimensions in the "
                               "load-and-run check, e.g. {sequence = 512} (others: 1)."),
    "run_check": attr.bool(default=True, doc="Load and run the written model once in the "
                           "target's runtime (onnxruntime or onnx's reference evaluator)."),
}


def _plugin_distributions() -> str:
    """Every distribution with a ``qbuild`` entry point, with its version: any of them may
    add dtype targets through the hook, so upgrading one must rerun these rules."""
    from importlib import metadata

    found = set()
    for ep in metadata.entry_points(group="qbuild"):
        dist = getattr(ep, "dist", None)
        if dist is not None:
            found.add(f"{dist.metadata['name']}=={dist.version}")
    return ",".join(sorted(found))


class _DtypeRule(OnnxRule):
    """Keyed also on ml_dtypes and on every plugin that may add dtype targets."""

    env_libs = ("ml_dtypes",)

    def env(self) -> dict[str, str]:
        return {**super().env(), "target_plugins": _plugin_distributions()}

    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        return [*super().code(attrs), *_target_code(attrs)]


def _model_file(ctx: RunContext) -> Path:
    """The model file, once no tensor of it is over the allocation bound (the checks
    run it in onnxruntime and onnx's reference evaluator)."""
    try:
        path = model_path(ctx.inputs["model"])
    except ValueError as e:
        raise ctx.fail(f"{ctx.params['source']} {e}", attr="model") from None
    try:
        check_model(path)
    except AllocationRefused as e:
        e.file = ctx.workspace_path(path)
        raise e.located(attr="model") from None
    return path


def _target(ctx: RunContext, name: str) -> DtypeTarget:
    # A plugin's target comes from the qbuild_dtype_targets implementers the engine
    # resolved (and keyed, see _target_code), whatever process runs the action.
    pm = None if name in _BUILTIN_SET else ctx.hooks.pluginmanager
    try:
        return get_target(name, pm)
    except OnnxError as e:
        raise ctx.fail(e.message, attr="target") from None


_BUILTIN_SET = frozenset(t.name for t in BUILTIN_TARGETS)


def _target_code(attrs: Mapping[str, Any]) -> list[str]:
    return [] if attrs.get("target") in _BUILTIN_SET else ["hook:qbuild_dtype_targets"]


def _guess_attr(message: str, default: str) -> str:
    for key in ("policy", "tensors", "min_elements", "target", "form"):
        if message.startswith(f"{key}.") or message.startswith(f"{key}:"):
            return key
    return default


class QdqRetarget(_DtypeRule):
    kind = "qdq_retarget"
    version = 2
    doc = ("Convert a QDQ model between the zero-point form and the opset-21 output_dtype "
           "form for a target runtime: raises the opset to 21 where needed (never above "
           "what the target loads), elides all-zero zero points where legal, and applies the "
           "target's policies (onnxruntime CPU: 8-bit activations keep explicit zero points "
           "so QLinearConv fusion survives; never output_dtype next to an int8 zero point, "
           "onnxruntime issue 25526). Every output passes onnx's full checker, an "
           "equivalence check (each dequantized initializer and each Q/DQ's parameters "
           "unchanged) and a load-and-run in the target's runtime. Outputs the model and "
           "report.json (sizes, tensor counts per dtype, conversion counters, fused ops).")
    heavy = True
    attrs = dict(_COMMON)
    outputs = ["{name}.onnx", "report.json"]

    provides = (OnnxModelInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(qdq_retarget, inputs=["model"], outputs=ctx.outputs, mnemonic="QdqRetarget",
                   params=_params(ctx, ()))


def _params(ctx: AnalysisContext, extra: tuple[str, ...]) -> dict[str, Any]:
    a = ctx.attrs
    return {"source": a["model"], "model_out": f"{ctx.name}.onnx",
            **{k: a[k] for k in ("target", "form", "input_dims", "run_check", *extra)}}


def qdq_retarget(ctx: RunContext) -> OnnxModelInfo:
    """The action of ``qdq_retarget``."""
    from .conversion.pipeline import retarget_file

    p = ctx.params
    src = _model_file(ctx)
    target = _target(ctx, p["target"])
    out = ctx.output(p["model_out"])
    try:
        report = retarget_file(src, out, target, p["form"],
                               report_path=ctx.output("report.json"),
                               input_dims=p["input_dims"], run=p["run_check"])
    except OnnxError as e:
        raise ctx.fail(f"{src.name}: {e.message}",
                       attr=_guess_attr(e.message, "model")) from None
    ctx.log(f"{src.name} -> {out.name}: {report['conversion']}")
    return onnx_model_info(out)


class RequantizeWeights(_DtypeRule):
    kind = "requantize_weights"
    version = 1
    doc = ("Quantize or re-quantize weights to int2/int4/int8/int16 (signed or unsigned) or "
           "float8 e4m3fn/e5m2 (saturating, no zero point), per tensor, per channel or "
           "blocked, from a per-op policy with per-tensor overrides, then write the QDQ form "
           "the target wants (as qdq_retarget). Float weights get a DequantizeLinear "
           "(weight-only quantization); DequantizeLinear(constant) weights are re-quantized "
           "in place. Scales take the weight's float type; block_size is validated against "
           "the spec. Default policy: MatMul int4 blocked (32), Conv and Gemm int8 per "
           "channel. Outputs the model and report.json (per-weight SQNR, sizes, dtype counts).")
    heavy = True
    attrs = {
        **_COMMON,
        "policy": attr.mapping(default={}, doc="Per op type: {dtype, granularity "
                               "(per_tensor|per_channel|blocked), block_size, symmetric, "
                               "axis}, or \"float\" to leave that op's weights alone; e.g. "
                               "{MatMul = {dtype = \"int4\", granularity = \"blocked\", "
                               "block_size = 32}}. Empty: the default policy."),
        "tensors": attr.mapping(default={}, doc="Per weight name, overriding the policy "
                                "(same entries)."),
        "min_elements": attr.int(default=16, doc="Weights with fewer elements stay as they "
                                 "are."),
    }
    outputs = ["{name}.onnx", "report.json"]

    def validate(self, attrs: Mapping[str, Any]) -> None:
        if attrs["min_elements"] < 0:
            raise ConfigError("min_elements must be >= 0", attr="min_elements")

    provides = (OnnxModelInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(requantize_weights, inputs=["model"], outputs=ctx.outputs,
                   mnemonic="RequantizeWeights",
                   params=_params(ctx, ("policy", "tensors", "min_elements")))


def requantize_weights(ctx: RunContext) -> OnnxModelInfo:
    """The action of ``requantize_weights``."""
    from .conversion.pipeline import requantize_file

    p = ctx.params
    src = _model_file(ctx)
    target = _target(ctx, p["target"])
    out = ctx.output(p["model_out"])
    try:
        report = requantize_file(src, out, target, p["form"], policy=p["policy"] or None,
                                 tensors=p["tensors"], min_elements=p["min_elements"],
                                 report_path=ctx.output("report.json"),
                                 input_dims=p["input_dims"], run=p["run_check"])
    except OnnxError as e:
        raise ctx.fail(f"{src.name}: {e.message}",
                       attr=_guess_attr(e.message, "model")) from None
    n = len(report["requantization"]["weights"])
    ctx.log(f"{src.name} -> {out.name}: {n} weights; {report['conversion']}")
    return onnx_model_info(out)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [QdqRetarget, RequantizeWeights]


@hookimpl
def qbuild_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
