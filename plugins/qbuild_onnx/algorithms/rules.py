"""The rules of the algorithms subpackage: ``equalize`` (CLE or SmoothQuant on a float
model, before calibration), ``adaround`` (learned weight rounding of a QDQ model) and
``quantize_weights_int4`` (blocked low-bit MatMul weights with onnxruntime's MatMulNBits
quantizer). Thin wrappers (rule API v2: one action each, the model and its report come
from one run); the dependencies' labels, named in messages, are params. onnx,
onnxruntime and numpy are imported inside the actions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import AllocationRefused, check_model
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.providers import (
    DatasetInfo,
    OnnxModelInfo,
    QuantizedModelInfo,
    dataset_path,
    model_path,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, ConfigError, Rule, RunContext, attr, hookimpl

if TYPE_CHECKING:
    from onnx import ModelProto

_MAX_PROTO = 2**31 - 1


def _model_file(ctx: RunContext, attr_name: str) -> Path:
    """The model file of ``attr_name``, once no tensor of it is over the allocation
    bound (these rules run it, layer by layer or whole)."""
    try:
        path = model_path(ctx.inputs[attr_name])
    except ValueError as e:
        raise ctx.fail(f"{ctx.params['labels'][attr_name]} {e}", attr=attr_name) from None
    try:
        check_model(path)
    except AllocationRefused as e:
        e.file = ctx.workspace_path(path)
        raise e.located(attr=attr_name) from None
    return path


def _feeds(ctx: RunContext, attr_name: str, model: Path, limit: int) -> list[dict[str, Any]]:
    from ..accuracy.feeds import model_feeds

    label = ctx.params["labels"][attr_name]
    root = dataset_path(ctx.inputs[attr_name])
    if root.name == "dataset.json":
        root = root.parent
    if not (root / "dataset.json").is_file():
        raise ctx.fail(f"{label} is not a dataset (no dataset.json)", attr=attr_name)
    try:
        return model_feeds(root, model, limit)
    except OnnxError as e:
        raise ctx.fail(f"{label}: {e.message}", attr=attr_name) from None


def _action(ctx: AnalysisContext, function: Callable[[RunContext], Any],
            deps: tuple[str, ...], mnemonic: str) -> None:
    """A rule's one action: its value attributes, the labels of its dependencies (for
    messages) and the model's output name as params."""
    a = ctx.attrs
    params = {k: v for k, v in a.items() if k not in deps}
    params.update(labels={k: a[k] for k in deps}, out=ctx.output("{name}.onnx"))
    ctx.action(function, inputs=list(deps), outputs=ctx.outputs, params=params,
               mnemonic=mnemonic)


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_model(proto: ModelProto, out: Path, external_data: bool) -> list[str]:
    """Save ``proto`` to ``out``; with ``external_data`` every tensor over 1 KiB goes to
    ``<out name>.data`` (always written, so the declared outputs exist). Returns the data
    file names."""
    import onnx

    if not external_data:
        if proto.ByteSize() > _MAX_PROTO:
            raise ValueError("the model is over 2 GB: set external_data = true")
        onnx.save(proto, str(out))
        return []
    name = out.name + ".data"
    (out.parent / name).unlink(missing_ok=True)
    onnx.save(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
              location=name, size_threshold=1024)
    if not (out.parent / name).exists():
        (out.parent / name).write_bytes(b"")
    return [name]


def _model_outputs(name: str, attrs: Mapping[str, Any]) -> list[str]:
    outs = [f"{name}.onnx", "report.json"]
    if attrs.get("external_data"):
        outs.insert(1, f"{name}.onnx.data")
    return outs


_EXTERNAL = attr.bool(default=False, doc="Write the weights to {name}.onnx.data (needed for "
                      "models over 2 GB).")


class Equalize(OnnxRule):
    kind = "equalize"
    machine_dependent = True  # smoothquant runs the model
    version = 1
    heavy = True
    doc = ("Equalizes a float model before calibration, keeping its function: method "
           "\"cle\" (cross-layer equalization of Conv -> Relu/LeakyRelu/PRelu -> Conv "
           "chains; data-free; clip = \"relu\" also equalizes across Clip(0, c), i.e. "
           "ReLU6, by replacing it with Relu) or \"smoothquant\" (per-channel activation "
           "ranges of MatMul/Gemm inputs migrated into the weights with `alpha`, measured "
           "on `dataset`). Outputs the model and report.json; calibrate and quantize the "
           "result, and evaluate it against the original.")
    attrs = {
        "model": attr.label(doc="The float model (usually quant_preprocess).", required=True,
                            providers=[OnnxModelInfo]),
        "method": attr.enum(["cle", "smoothquant"], default="cle", doc="Which equalization."),
        "clip": attr.enum(["skip", "relu"], default="skip", doc="cle: pairs joined by "
                          "Clip(0, c) (ReLU6) are left alone (skip) or equalized with the "
                          "Clip replaced by Relu (changes the float model where activations "
                          "exceeded c).", when={"method": ["cle"]}),
        "dataset": attr.label(doc="smoothquant: samples to measure activation ranges on.",
                              providers=[DatasetInfo]),
        "alpha": attr.float(default=0.5, doc="smoothquant: migration strength in [0, 1] "
                            "(0: nothing moves to the weights).",
                            when={"method": ["smoothquant"]}),
        "fold": attr.bool(default=True, doc="smoothquant: fold 1/s into a LayerNormalization "
                          "that produces the activation instead of inserting a Mul.",
                          when={"method": ["smoothquant"]}),
        "max_samples": attr.int(default=0, doc="smoothquant: use at most this many samples "
                                "(0: all).", when={"method": ["smoothquant"]}),
        "external_data": _EXTERNAL,
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        return _model_outputs(name, attrs)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        if attrs["method"] == "smoothquant":
            if attrs.get("dataset") is None:
                raise ConfigError("method = \"smoothquant\" needs a dataset", attr="dataset")
            if not 0.0 <= attrs["alpha"] <= 1.0:
                raise ConfigError(f"alpha = {attrs['alpha']}: expected a value in [0, 1]",
                                  attr="alpha")

    def analyze(self, ctx: AnalysisContext) -> None:
        _action(ctx, equalize_model, ("model", "dataset"), "Equalize")


def equalize_model(ctx: RunContext) -> OnnxModelInfo:
    """``equalize``'s action: the equalized model and report.json."""

    from qbuild_onnx_common.models import file_uses_external_data, lean_load

    a = ctx.params
    src = _model_file(ctx, "model")
    external = a["method"] == "smoothquant" and file_uses_external_data(src)
    # smoothquant on external weights measures with the weights on disk (loaded later)
    model = lean_load(src) if external else load_model(src)
    if a["method"] == "cle":
        from .cle import equalize

        model, rep = equalize(model, a["clip"])
        ctx.log(f"cle: {rep['pairs']} Conv pair(s) equalized in {rep['sweeps']} sweep(s)"
                + (f", {len(rep['clips_replaced_by_relu'])} Clip -> Relu"
                   if rep["clips_replaced_by_relu"] else ""))
        if rep["pairs"] == 0:
            ctx.warn("cle found no Conv -> [Relu] -> Conv pair to equalize: the model "
                     "is unchanged" + (f" ({rep['skipped_clip_pairs']} pair(s) joined "
                                       "by Clip: set clip = \"relu\")"
                                       if rep["skipped_clip_pairs"] else ""))
    else:
        from .smoothquant import smooth

        feeds = _feeds(ctx, "dataset", src, a["max_samples"])
        try:
            model, rep = smooth(model, feeds, a["alpha"], a["fold"], scratch=ctx.scratch,
                                source=src if external else None)
        except ValueError as e:
            raise ctx.fail(str(e), attr="dataset") from None
        ctx.log(f"smoothquant: {rep['smoothed']} activation(s) smoothed "
                f"({rep['folded']} folded, {rep['inserted_mul']} Mul inserted)")
        if rep["smoothed"] == 0:
            ctx.warn("smoothquant found no MatMul/Gemm with a constant 2-D weight: the "
                     "model is unchanged")
    out = ctx.output(a["out"])
    try:
        save_model(model, out, a["external_data"])
    except ValueError as e:
        raise ctx.fail(str(e), attr="external_data") from None
    _write_json(ctx.output("report.json"), {"method": a["method"], **rep})
    return onnx_model_info(out, model)


class AdaRound(OnnxRule):
    kind = "adaround"
    machine_dependent = True  # runs the models: results follow the CPU kernels
    version = 1
    heavy = True
    doc = ("Learned weight rounding (AdaRound) of a QDQ model: for every Conv/Gemm/MatMul "
           "with an 8- or 16-bit DequantizeLinear weight, keeps the scale and chooses each "
           "integer's rounding direction to minimise the layer's output error against the "
           "float model on `dataset` (numpy, layer by layer). Outputs the model and "
           "report.json (per-layer loss before and after).")
    attrs = {
        "model": attr.label(doc="The QDQ model (a quantize target).", required=True,
                            providers=[OnnxModelInfo, QuantizedModelInfo]),
        "reference": attr.label(doc="The float model it was quantized from.", required=True,
                                providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="Calibration samples.", required=True,
                              providers=[DatasetInfo]),
        "max_samples": attr.int(default=16, doc="Samples used (0: all)."),
        "rows": attr.int(default=1024, doc="Input rows (im2col patches) sampled per layer."),
        "iterations": attr.int(default=400, doc="Adam steps per layer."),
        "learning_rate": attr.float(default=0.01, doc="Adam step size."),
        "regularization": attr.float(default=0.01, doc="Rounding regularizer weight (lambda)."),
        "seed": attr.int(default=0, doc="Seed of the row sampling."),
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo, QuantizedModelInfo)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        for key in ("rows", "iterations"):
            if attrs[key] < 1:
                raise ConfigError(f"{key} must be >= 1", attr=key)

    def analyze(self, ctx: AnalysisContext) -> None:
        _action(ctx, adaround_model, ("model", "reference", "dataset"), "AdaRound")


def adaround_model(ctx: RunContext) -> list[Any]:
    """``adaround``'s action: the re-rounded model and report.json."""

    from .adaround import adaround

    a = ctx.params
    ref = _model_file(ctx, "reference")
    src = _model_file(ctx, "model")
    feeds = _feeds(ctx, "dataset", ref, a["max_samples"])
    try:
        qm, rep = adaround(load_model(src), load_model(ref), feeds,
                           rows=a["rows"], iterations=a["iterations"],
                           lr=a["learning_rate"], lam=a["regularization"], seed=a["seed"],
                           scratch=ctx.scratch, log=ctx.log)
    except ValueError as e:
        raise ctx.fail(str(e), attr="model") from None
    out = ctx.output(a["out"])
    save_model(qm, out, False)
    _write_json(ctx.output("report.json"), rep)
    ctx.log(f"adaround: {rep['changed_layers']} of {rep['layers']} layer(s) re-rounded")
    # re-rounding keeps the format, the types, the float nodes and the promoted tensors
    # of the model given
    given = ctx.inputs["model"]
    quantized = dataclasses.replace(given[QuantizedModelInfo], model=out)
    return [onnx_model_info(out, qm, promoted=given[OnnxModelInfo].promoted,
                            float_joins=given[OnnxModelInfo].float_joins), quantized]


class QuantizeWeightsInt4(OnnxRule):
    kind = "quantize_weights_int4"
    requires = (*OnnxRule.requires, "onnx-ir")
    env_libs = ("onnx-ir",)
    machine_dependent = False
    version = 1
    heavy = True
    doc = ("Blocked low-bit MatMul weights with onnxruntime's MatMulNBits quantizer: "
           "algorithm rtn (onnxruntime's kernel; 2/4/8 bits; MatMulNBits or QDQ), gptq "
           "(needs `dataset`), k_quant, or hqq (needs torch installed). Activations stay "
           "float. Outputs the model and report.json.")
    attrs = {
        "model": attr.label(doc="The float model.", required=True, providers=[OnnxModelInfo]),
        "algorithm": attr.enum(["rtn", "gptq", "k_quant", "hqq"], default="rtn",
                               doc="Weight-only quantization algorithm."),
        "bits": attr.int(default=4, doc="Bits per weight (rtn: 2, 4 or 8; others: 4)."),
        "block_size": attr.int(default=128, doc="Weights per block along K (power of two "
                               ">= 16)."),
        "symmetric": attr.bool(default=True, doc="Symmetric blocks (no zero points)."),
        "accuracy_level": attr.int(default=0, doc="MatMulNBits accuracy_level: 0 unset, "
                                   "1 fp32, 2 fp16, 3 bf16, 4 int8 compute."),
        "format": attr.enum(["qoperator", "qdq"], default="qoperator",
                            doc="MatMulNBits (qoperator) or DequantizeLinear -> MatMul (qdq, "
                                "rtn only)."),
        "dataset": attr.label(doc="gptq: calibration samples.", providers=[DatasetInfo]),
        "max_samples": attr.int(default=0, doc="gptq: samples used (0: all)."),
        "nodes_to_exclude": attr.string_list(default=[], doc="MatMul nodes kept float (by "
                                             "name)."),
        "external_data": _EXTERNAL,
    }
    outputs = ["{name}.onnx", "report.json"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        return _model_outputs(name, attrs)

    def validate(self, attrs: Mapping[str, Any]) -> None:
        from .int4 import Int4Error, check_options

        try:
            check_options(attrs["algorithm"], attrs["bits"], attrs["block_size"],
                          attrs["format"], attrs["accuracy_level"],
                          attrs.get("dataset") is not None)
        except Int4Error as e:
            raise ConfigError(str(e), attr=e.attr) from None

    def analyze(self, ctx: AnalysisContext) -> None:
        _action(ctx, quantize_weights_int4, ("model", "dataset"), "QuantizeWeights")


def quantize_weights_int4(ctx: RunContext) -> OnnxModelInfo:
    """``quantize_weights_int4``'s action: the model and report.json."""
    from ..ort_logs import ort_output_to_log
    from .int4 import Int4Error, quantize_int4

    a = ctx.params
    src = _model_file(ctx, "model")
    feeds = None
    if ctx.inputs["dataset"] is not None:
        feeds = _feeds(ctx, "dataset", src, a["max_samples"])
    out = ctx.output(a["out"])
    try:
        with ort_output_to_log(ctx.log, ctx.warn):
            rep = quantize_int4(src, out, algorithm=a["algorithm"], bits=a["bits"],
                                block_size=a["block_size"], symmetric=a["symmetric"],
                                accuracy_level=a["accuracy_level"],
                                quant_format=a["format"],
                                nodes_to_exclude=a["nodes_to_exclude"], feeds=feeds,
                                external_data=a["external_data"], log=ctx.log)
    except Int4Error as e:
        raise ctx.fail(str(e), attr=e.attr) from None
    if rep["quantized_matmuls"] == 0:
        ctx.warn("no MatMul with a constant 2-D weight was quantized: the model is "
                 "unchanged")
    rep["model_bytes"] = out.stat().st_size + sum(
        (out.parent / n).stat().st_size for n in
        ([out.name + ".data"] if a["external_data"] else []))
    rep["float_model_bytes"] = src.stat().st_size + sum(
        f.stat().st_size for f in ctx.inputs["model"].files if f.name.endswith(".onnx.data")
        or f.suffix == ".data")
    _write_json(ctx.output("report.json"), rep)
    return onnx_model_info(out)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [Equalize, AdaRound, QuantizeWeightsInt4]
