"""Rules for source models and data: ``onnx_model``, ``image_dataset``, ``numpy_dataset``,
``synthetic_dataset``, ``dataset`` (custom readers), ``quant_preprocess``, ``calibrate``.

Thin wrappers: attributes in, the functions of ``source`` (models, datasets, images),
``quantization.preprocess`` and ``calibration`` out. Heavy libraries are imported inside
``run`` only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qbuild_onnx_common.providers import (
    CalibrationInfo,
    DatasetInfo,
    OnnxModelInfo,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import (
    ActionContext,
    ConfigError,
    Dep,
    Rule,
    RuleError,
    attr,
    hookimpl,
)

# What a folder in image_dataset's `images` stands for (source.images.IMAGE_SUFFIXES,
# repeated so loading the rules does not import the image code).
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                   ".pgm", ".pbm")


def _located(ctx: ActionContext, err: RuleError, attr_name: str | None = None) -> RuleError:
    return err.located(target=ctx.label, attr=err.attr or attr_name)


def _check_against(ctx: ActionContext, info: dict[str, Any], model: Dep | None) -> None:
    if model is None:
        return
    from qbuild_onnx_common.errors import OnnxError

    from ..source.datasets import check_dataset_against_model

    try:
        check_dataset_against_model(info, _model_inputs(model), None)
    except OnnxError as e:
        raise _located(ctx, e, "model") from None


def _model_inputs(model: Dep) -> dict[str, Any]:
    """A model dependency's inputs as ``check_dataset_against_model`` reads them."""
    return {"inputs": list(model[OnnxModelInfo].inputs)}


def _finish_dataset(ctx: ActionContext, out: Path, model: Dep | None) -> list[Any]:
    from ..source.datasets import dataset_info

    info = dataset_info(out)
    _check_against(ctx, info, model)
    inputs = tuple({"name": k, **v} for k, v in sorted(info["inputs"].items()))
    return [DatasetInfo(path=out, samples=info["count"], inputs=inputs,
                        batch_size=info["batch_size"]), info]


class OnnxModel(OnnxRule):
    kind = "onnx_model"
    version = 2
    heavy = True
    doc = ("A source ONNX model: checked with onnx.checker (full_check, by path), external "
           "data kept inside the model's folder, then passed on with its opsets, IR version, "
           "inputs and outputs as info. List external data files in 'data'.")
    attrs = {
        "src": attr.file(doc="The .onnx file.", required=True),
        "data": attr.files(doc="External data files the model references (same folder)."),
    }
    outputs = ["{name}.onnx"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: dict[str, Any]) -> list[str]:
        outs = [f"{name}.onnx"]
        src = attrs.get("src")
        for d in attrs.get("data") or []:
            rel = os.path.relpath(str(d), os.path.dirname(str(src))) if src else Path(d).name
            outs.append(Path(rel).as_posix() if not rel.startswith("..") else Path(d).name)
        return outs

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..source.model import stage_model

        out = ctx.output("{name}.onnx")
        try:
            info = stage_model(ctx.attrs["src"], out, ctx.attrs.get("data") or [])
        except OnnxError as e:
            raise _located(ctx, e, "src") from None
        info["model_file"] = out.name
        _note_model_shape(ctx, info)
        return [onnx_model_info(out), info]


def _note_model_shape(ctx: ActionContext, info: dict[str, Any]) -> None:
    """Tell the user now about shapes later rules refuse or fix (already quantized,
    compute inside If/Loop, initializers listed as inputs); record them in the info."""
    import onnx

    from ..source.model_checks import summary

    shape = summary(onnx.load(str(ctx.output("{name}.onnx")), load_external_data=False))
    info["model_checks"] = shape
    if shape["already_quantized"]:
        ctx.warn(f"the model is already quantized ({shape['already_quantized']}): quantize, "
                 "quantize_dynamic and quant_preprocess refuse it")
    if shape["control_flow_compute"]:
        ctx.warn("compute inside If/Loop/Scan subgraphs: "
                 + ", ".join(f"{op} '{n}'" for n, op, _ in shape["control_flow_compute"]))


# Attributes every dataset rule shares.
_DATASET_COMMON = {
    "batch_size": attr.int(default=1, doc="Default batch size for consumers."),
    "model": attr.label(doc="Optional model target to check the dataset against.",
                        providers=[OnnxModelInfo]),
}

_IMAGE_ATTRS = {
    "images": attr.files(doc="Image files or folders (globs allowed; a folder stands for the "
                              "images directly in it; all sorted).", required=True,
                         folders=_IMAGE_SUFFIXES),
    "input": attr.string(doc="The model input the images feed.", required=True),
    "size": attr.int_list(doc="[height, width] of the model input.", required=True),
    "resize": attr.enum(["stretch", "letterbox", "crop"], default="stretch",
                        doc="stretch; letterbox (keep aspect, pad); crop (cover, centre-crop)."),
    "align": attr.enum(["center", "topleft"], default="center", doc="Letterbox placement."),
    "pad_value": attr.float(default=114.0, doc="Letterbox fill, in 0..255 pixel units."),
    "color": attr.enum(["RGB", "BGR", "GRAY"], default="RGB", doc="Channel order."),
    "scale": attr.float(default=1.0 / 255.0, doc="value = (pixel * scale - mean) / std."),
    "mean": attr.float_list(default=[0.0], doc="Per channel (or one value)."),
    "std": attr.float_list(default=[1.0], doc="Per channel (or one value)."),
    "layout": attr.enum(["NCHW", "NHWC"], default="NCHW", doc="Array layout."),
    "dtype": attr.enum(["float32", "float16", "uint8", "int8"], default="float32",
                       doc="Element type."),
    "background": attr.float_list(default=[255.0, 255.0, 255.0],
                                  doc="RGB colour transparent pixels are composited onto."),
    "interpolation": attr.enum(["bilinear", "bicubic", "nearest", "lanczos"],
                               default="bilinear", doc="Resampling filter."),
    "count": attr.int(default=0, doc="Number of samples (0: one per image); more than the "
                                     "images adds seeded augmented copies (crops, flips)."),
    "seed": attr.int(default=0, doc="Augmentation seed."),
    "flip": attr.bool(default=True, doc="Augmentation may flip horizontally."),
    "min_scale": attr.float(default=0.5, doc="Smallest crop area fraction in augmentation."),
    **_DATASET_COMMON,
}


class _DatasetRule(OnnxRule):
    """What every dataset rule shares: a ``data/`` directory output (dataset.json plus
    one .npy per input) and the library versions in the key."""

    outputs = ["data/"]
    provides = (DatasetInfo,)


class ImageDataset(_DatasetRule):
    kind = "image_dataset"
    requires = (*OnnxRule.requires, "Pillow")
    env_libs = ("Pillow",)
    version = 1
    heavy = True
    doc = ("A dataset from images: decode (alpha, greyscale, palette, 16-bit handled), "
           "resize/letterbox/crop, colour order, scale/mean/std, layout and dtype; optional "
           "seeded augmentation to get more samples than images.")
    attrs = _IMAGE_ATTRS

    def validate(self, attrs: Any) -> None:
        if len(attrs["size"]) != 2:
            raise ConfigError(f"size must be [height, width] (2 integers), got {attrs['size']}",
                              attr="size")
        if any(v < 1 for v in attrs["size"]):
            raise ConfigError(f"size values must be >= 1, got {attrs['size']}", attr="size")
        if len(attrs["background"]) != 3:
            raise ConfigError("background must be 3 values (R, G, B)", attr="background")
        for name in ("mean", "std"):
            if len(attrs[name]) not in (1, 1 if attrs["color"] == "GRAY" else 3):
                raise ConfigError(f"{name} must be one value or one per channel, got "
                                  f"{attrs[name]}", attr=name)

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..source.images import ImageOptions, build_image_dataset

        a = ctx.attrs
        if len(a["size"]) != 2:
            raise ctx.fail(f"size must be [height, width], got {a['size']}", attr="size")
        if len(a["background"]) != 3:
            raise ctx.fail("background must be 3 values (R, G, B)", attr="background")
        opts = ImageOptions(
            height=a["size"][0], width=a["size"][1], resize=a["resize"], align=a["align"],
            pad_value=a["pad_value"], color=a["color"], scale=a["scale"],
            mean=tuple(a["mean"]), std=tuple(a["std"]), layout=a["layout"], dtype=a["dtype"],
            background=tuple(a["background"]), interpolation=a["interpolation"],
            count=a["count"] or None, seed=a["seed"], flip=a["flip"], min_scale=a["min_scale"])
        out = ctx.output("data/")
        try:
            build_image_dataset(out, a["images"], a["input"], opts, batch_size=a["batch_size"])
        except OnnxError as e:
            raise _located(ctx, e, "images") from None
        return _finish_dataset(ctx, out, a.get("model"))


class NumpyDataset(_DatasetRule):
    kind = "numpy_dataset"
    version = 1
    heavy = True
    doc = ("A dataset from .npy/.npz arrays (axis 0 = samples), mapped to model inputs: "
           "mapping = {input = \"file.npy\" or \"file.npz:key\"}.")
    attrs = {
        "files": attr.files(doc=".npy / .npz files.", required=True),
        "mapping": attr.mapping(default={}, doc="Input name -> file or file.npz:key."),
        "cast": attr.mapping(default={}, doc="Input name -> dtype to convert to."),
        "limit": attr.int(default=0, doc="Keep only the first N samples (0: all)."),
        **_DATASET_COMMON,
    }

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..source.datasets import build_numpy_dataset

        a = ctx.attrs
        out = ctx.output("data/")
        try:
            build_numpy_dataset(out, a["files"], a["mapping"], a["batch_size"], a["cast"],
                                a["limit"] or None)
        except OnnxError as e:
            raise _located(ctx, e, "mapping") from None
        return _finish_dataset(ctx, out, a.get("model"))


class SyntheticDataset(_DatasetRule):
    kind = "synthetic_dataset"
    version = 1
    heavy = True
    doc = ("Seeded random data shaped like a model's inputs, for smoke tests only: random "
           "calibration data ruins accuracy (a warning says so on every build).")
    attrs = {
        "model": attr.label(doc="The model whose inputs to imitate.", required=True,
                            providers=[OnnxModelInfo]),
        "count": attr.int(default=8, doc="Number of samples."),
        "seed": attr.int(default=0, doc="Random seed."),
        "dims": attr.mapping(default={}, doc="Values for symbolic dims (default 1)."),
        "low": attr.float(default=0.0, doc="Lower bound of the uniform values."),
        "high": attr.float(default=1.0, doc="Upper bound of the uniform values."),
        "batch_size": attr.int(default=1, doc="Default batch size for consumers."),
    }

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..source.datasets import build_synthetic_dataset

        a = ctx.attrs
        ctx.warn(f"{ctx.label} is SYNTHETIC random data: fine for smoke tests, but calibrating "
                 "on it ruins quantized accuracy; use real samples (image_dataset, "
                 "numpy_dataset, dataset) for anything you ship")
        out = ctx.output("data/")
        try:
            build_synthetic_dataset(out, _model_inputs(a["model"]), a["count"], a["seed"],
                                    a["dims"], a["low"], a["high"], a["batch_size"])
        except OnnxError as e:
            raise _located(ctx, e, "model") from None
        return _finish_dataset(ctx, out, a["model"])


class CustomDataset(_DatasetRule):
    kind = "dataset"
    version = 1
    heavy = True
    doc = ("A dataset from a custom reader: a plugin's qbuild_dataset_readers hook (by name) "
           "or 'package.module:function'. The reader yields samples (input -> array).")
    attrs = {
        "reader": attr.string(doc="Reader name or module:function.", required=True),
        "files": attr.files(doc="Files handed to the reader."),
        "options": attr.mapping(default={}, doc="Options handed to the reader."),
        "limit": attr.int(default=0, doc="Keep only the first N samples (0: all)."),
        **_DATASET_COMMON,
    }

    def code(self, attrs: dict[str, Any]) -> list[str]:
        # The reader's code decides the samples: key it like the rule's own code.
        reader = attrs["reader"]
        return [*super().code(attrs),
                reader if ":" in reader else "hook:qbuild_dataset_readers"]

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..source.datasets import build_reader_dataset, find_reader

        a = ctx.attrs
        out = ctx.output("data/")
        try:
            reader = find_reader(a["reader"], None if ":" in a["reader"]
                                 else ctx.hooks.pluginmanager)
            build_reader_dataset(out, reader, a["files"] or [], a["options"], a["batch_size"],
                                 a["limit"] or None, name=a["reader"])
        except OnnxError as e:
            raise _located(ctx, e, "reader") from None
        return _finish_dataset(ctx, out, a.get("model"))


class QuantPreprocess(OnnxRule):
    kind = "quant_preprocess"
    version = 3
    heavy = True
    doc = ("onnxruntime's quantization pre-processing (symbolic shape inference, graph "
           "optimisation, ONNX shape inference) as its own cached step.")
    attrs = {
        "model": attr.label(doc="The model target (onnx_model).", required=True,
                            providers=[OnnxModelInfo]),
        "skip_optimization": attr.bool(default=False, doc="Skip ORT graph optimisation."),
        "skip_onnx_shape": attr.bool(default=False, doc="Skip ONNX shape inference."),
        "skip_symbolic_shape": attr.bool(default=False, doc="Skip symbolic shape inference."),
        "auto_merge": attr.bool(default=False, doc="Symbolic inference: merge conflicting dims."),
        "int_max": attr.int(default=2**31 - 1, doc="Symbolic inference: largest int."),
        "guess_output_rank": attr.bool(default=False, doc="Guess unknown ops' output rank."),
        "external_data": attr.bool(default=False,
                                   doc="Write weights to {name}.onnx.data (models > 2 GB)."),
    }
    outputs = ["{name}.onnx"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: dict[str, Any]) -> list[str]:
        outs = [f"{name}.onnx"]
        if attrs.get("external_data"):
            outs.append(f"{name}.onnx.data")
        return outs

    def run(self, ctx: ActionContext) -> list[Any]:
        from qbuild_onnx_common.errors import OnnxError

        from ..quantization.preprocess import PreprocessOptions, preprocess_model

        a = ctx.attrs
        opts = PreprocessOptions(
            skip_optimization=a["skip_optimization"], skip_onnx_shape=a["skip_onnx_shape"],
            skip_symbolic_shape=a["skip_symbolic_shape"], auto_merge=a["auto_merge"],
            int_max=a["int_max"], guess_output_rank=a["guess_output_rank"])
        from ..ort_logs import ort_output_to_log

        out = ctx.output("{name}.onnx")
        try:
            with ort_output_to_log(ctx.log, ctx.warn):
                info = preprocess_model(a["model"][OnnxModelInfo].model, out, opts,
                                        external_data=a["external_data"], log=ctx.log)
        except OnnxError as e:
            raise _located(ctx, e, "model") from None
        info["model_file"] = out.name
        return [onnx_model_info(out), info]


class Calibrate(OnnxRule):
    kind = "calibrate"
    machine_dependent = True  # runs the model: results follow the CPU kernels
    version = 1
    heavy = True
    doc = ("Runs a model over a dataset and writes calibration.json (per-tensor min, max and "
           "the chosen range, with the model and dataset sha256) and, for histogram methods, "
           "histograms.npz. Streams one batch at a time; ranges do not depend on batching.")
    attrs = {
        "model": attr.label(doc="The model to calibrate (usually quant_preprocess).",
                            required=True, providers=[OnnxModelInfo]),
        "dataset": attr.label(doc="A dataset target.", required=True,
                              providers=[DatasetInfo]),
        "method": attr.enum(["minmax", "entropy", "percentile", "distribution"],
                            default="minmax", doc="How ranges are chosen."),
        "symmetric": attr.bool(default=False, doc="Make every range symmetric about 0."),
        "moving_average": attr.bool(default=False,
                                    doc="minmax: EMA of per-batch min/max (batch dependent).",
                                    when={"method": ["minmax"]}),
        "averaging_constant": attr.float(default=0.01, doc="minmax: EMA smoothing factor.",
                                         when={"method": ["minmax"], "moving_average": [True]}),
        "num_bins": attr.int(default=2048, doc="Histogram bins (histogram methods).",
                             when={"method": ["entropy", "percentile", "distribution"]}),
        "num_quantized_bins": attr.int(default=128, doc="entropy: target bins.",
                                       when={"method": ["entropy"]}),
        "percentile": attr.float(default=99.999, doc="percentile: kept percentage.",
                                 when={"method": ["percentile"]}),
        "scenario": attr.enum(["same", "p3"], default="same", doc="distribution: scenario.",
                              when={"method": ["distribution"]}),
        "op_types": attr.string_list(default=[], doc="Calibrate only these node types."),
        "batch_size": attr.int(default=0, doc="Samples per run (0: the dataset's)."),
        "threads": attr.int(default=1, doc="onnxruntime intra-op threads wanted (granted "
                                           "up to --local_resources cpu)."),
    }
    outputs = ["calibration.json"]
    provides = (CalibrationInfo,)

    def resources(self, attrs: dict[str, Any]) -> tuple[int, int]:
        return max(1, attrs["threads"]), 0

    def declared_outputs(self, name: str, attrs: dict[str, Any]) -> list[str]:
        if attrs.get("method", "minmax") in ("entropy", "percentile", "distribution"):
            return ["calibration.json", "histograms.npz"]
        return ["calibration.json"]

    def run(self, ctx: ActionContext) -> list[Any]:
        from ..calibration.calibrate import CalibrationOptions, calibrate

        a = ctx.attrs
        opts = CalibrationOptions(
            method=a["method"], symmetric=a["symmetric"], moving_average=a["moving_average"],
            averaging_constant=a["averaging_constant"], num_bins=a["num_bins"],
            num_quantized_bins=a["num_quantized_bins"], percentile=a["percentile"],
            scenario=a["scenario"], op_types=tuple(a["op_types"]),
            batch_size=a["batch_size"] or None, threads=ctx.threads)
        from ..ort_logs import ort_output_to_log

        try:
            with ort_output_to_log(ctx.log, ctx.warn):
                info = calibrate(a["model"][OnnxModelInfo].model,
                                 a["dataset"][DatasetInfo].path,
                                 ctx.output("calibration.json").parent, opts, log=ctx.log,
                                 scratch=ctx.scratch)
        except RuleError as e:
            raise _located(ctx, e, "dataset") from None
        return [CalibrationInfo(table=ctx.output("calibration.json"), method=info["method"],
                                samples=info["num_samples"]), info]


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    from .imported import RULES as IMPORTED

    return [OnnxModel, ImageDataset, NumpyDataset, SyntheticDataset, CustomDataset,
            QuantPreprocess, Calibrate, *IMPORTED]


@hookimpl
def qbuild_addhooks(pluginmanager) -> None:
    from .. import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
