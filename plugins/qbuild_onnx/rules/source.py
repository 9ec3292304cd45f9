"""Rules for source models and data: ``onnx_model``, ``image_dataset``, ``numpy_dataset``,
``synthetic_dataset``, ``dataset`` (custom readers), ``quant_preprocess``, ``calibrate``.

Thin wrappers (rule API v2): ``analyze`` maps attributes to the params of module-level
actions over the functions of ``source`` (models, datasets, images),
``quantization.preprocess`` and ``calibration``. A dataset rule given a ``model`` checks
the dataset against it in an action of its own, so changing only the model reruns the
check, never the decoding. Heavy libraries are imported inside the actions only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.models import load_model
from qbuild_onnx_common.providers import (
    CalibrationInfo,
    DatasetInfo,
    OnnxModelInfo,
    onnx_model_info,
)
from qbuild_onnx_common.rule import OnnxRule

from qbuild import (
    AnalysisContext,
    ConfigError,
    Dep,
    Rule,
    RuleError,
    RunContext,
    attr,
    hookimpl,
)

from .datasets import dataset_provider, dataset_summary
from .imported import RULES as IMPORTED

if TYPE_CHECKING:
    import pluggy

    from ..calibration.calibrate import CalibrationOptions

# What a folder in image_dataset's `images` stands for (source.images.IMAGE_SUFFIXES,
# repeated so loading the rules does not import the image code).
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                   ".pgm", ".pbm")


def _model_inputs(model: Dep) -> dict[str, Any]:
    """A model dependency's inputs as ``check_dataset_against_model`` reads them."""
    return {"inputs": list(model[OnnxModelInfo].inputs)}


def _check_against(data: Path, model: Dep) -> None:
    from qbuild_onnx_common.errors import OnnxError

    from ..source.datasets import check_dataset_against_model

    try:
        check_dataset_against_model(dataset_summary(data), _model_inputs(model), None)
    except OnnxError as e:
        raise e.located(attr="model") from None


def _at_model(ctx: RunContext, error: RuleError, attr: str = "model") -> RuleError:
    """``error`` about the model given as ``attr``: located there, and named by the
    model file as the user knows it (qbuild-out/...)."""
    error.file = ctx.workspace_path(error.file or ctx.inputs[attr][OnnxModelInfo].model)
    error.located(attr=attr)
    return error


def check_dataset(ctx: RunContext) -> None:
    """The second action of a dataset rule given a ``model``: the dataset fits it."""
    _check_against(ctx.inputs["data/"], ctx.inputs["model"])


def _dataset_actions(ctx: AnalysisContext, build: Callable[[RunContext], Any],
                     inputs: list[str], params: dict[str, Any]) -> None:
    """A dataset rule's actions: ``build`` writes data/ and gives DatasetInfo; with a
    ``model``, a light second action checks the dataset against it."""
    ctx.action(build, inputs=inputs, outputs=["data/"], params=params, mnemonic="Dataset")
    if ctx.attrs.get("model") is not None:
        ctx.action(check_dataset, inputs=["data/", "model"], outputs=[],
                   mnemonic="CheckModel", heavy=False)


class OnnxModel(OnnxRule):
    kind = "onnx_model"
    version = 2
    heavy = True
    doc = ("A source ONNX model: checked with onnx.checker (full_check, by path), external "
           "data kept inside the model's folder, then passed on with its opsets, IR version, "
           "inputs and outputs as OnnxModelInfo. List external data files in 'data'.")
    attrs = {
        "src": attr.file(doc="The .onnx file.", required=True),
        "data": attr.files(doc="External data files the model references (same folder)."),
    }
    outputs = ["{name}.onnx"]
    provides = (OnnxModelInfo,)

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        outs = [f"{name}.onnx"]
        src = attrs.get("src")
        for d in attrs.get("data") or []:
            rel = os.path.relpath(str(d), os.path.dirname(str(src))) if src else Path(d).name
            outs.append(Path(rel).as_posix() if not rel.startswith("..") else Path(d).name)
        return outs

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(stage_onnx_model, inputs=["src", "data"], outputs=ctx.outputs,
                   params={"model": ctx.output("{name}.onnx"), "src": ctx.attrs["src"]},
                   mnemonic="StageModel")


def _regroup(ctx: RunContext, names: tuple[str, ...]) -> list[Path]:
    """The files of the file attributes ``names`` together again at their paths in the
    package (the model and its external data must share a folder), moved into the
    scratch folder: onnx refuses external data behind a link, and a copy of gigabytes
    of weights costs time (moving a staged input away is allowed; editing it is not)."""
    paths = []
    for name in names:
        given = ctx.inputs[name]
        files = [] if given is None else given if isinstance(given, list) else [given]
        for path, (_index, rel) in zip(files, ctx.origins.get(name, []), strict=True):
            dest = ctx.scratch / "package" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
            paths.append(dest)
    return paths


def stage_onnx_model(ctx: RunContext) -> OnnxModelInfo:
    """``onnx_model``'s action: check the model, copy it and its external data."""
    from qbuild_onnx_common.errors import OnnxError

    from ..source.model import stage_model

    src, *data = _regroup(ctx, ("src", "data"))
    out = ctx.output(ctx.params["model"])
    try:
        stage_model(src, out, data)
    except OnnxError as e:
        if e.file is not None and Path(e.file) == src:  # the scratch copy means nothing
            e.file = ctx.params["src"]
        raise e.located(attr="src") from None
    _note_model_shape(ctx, out)
    return onnx_model_info(out)


def _note_model_shape(ctx: RunContext, model: Path) -> None:
    """Tell the user now about shapes later rules refuse or fix (already quantized,
    compute inside If/Loop, initializers listed as inputs)."""

    from ..source.model_checks import summary

    shape = summary(load_model(model, external_data=False))
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
    "split": attr.enum(["all", "calibration", "selection", "evaluation"], default="all",
                       doc="Keep one set of a disjoint split of the images: each image goes "
                           "to calibration, selection or evaluation by a hash of its "
                           "content and split_seed (never its name or place), so the sets "
                           "never share an image, on any machine; all: every image."),
    "split_fractions": attr.float_list(default=[0.3, 0.35, 0.35],
                                       doc="Expected shares of calibration, selection and "
                                           "evaluation (sum 1; actual sizes vary around "
                                           "them, and report.json records them).",
                                       when={"split": ["calibration", "selection",
                                                       "evaluation"]}),
    "split_seed": attr.int(default=0, doc="Another seed, another split.",
                           when={"split": ["calibration", "selection", "evaluation"]}),
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
           "seeded augmentation to get more samples than images; `split` keeps one set "
           "of a disjoint calibration / selection / evaluation split of the images, by "
           "content.")
    attrs = {
        **_IMAGE_ATTRS,
        "variants": attr.mapping(default={}, doc="Other datasets with these settings: "
                                 "name -> table of attributes to change (images, count, "
                                 "seed, ...); each is the target <this target>.<name>."),
    }

    @staticmethod
    def expand_targets(name: str, raw: dict[str, Any]
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """Each of ``variants`` as an ordinary image_dataset target ``<name>.<variant>``:
        this target's table with the variant's attributes in place."""
        variants = raw.pop("variants", None) or {}
        if not isinstance(variants, dict):
            raise ConfigError("expected a table of variants, e.g. variants = { eval = "
                              '{ images = ["eval"] } }', attr="variants")
        shared = {k: v for k, v in raw.items() if k not in ("tags",)}
        tables: dict[str, dict[str, Any]] = {}
        for variant, changes in variants.items():
            if not isinstance(changes, dict):
                raise ConfigError(f"variant '{variant}': expected a table of attributes "
                                  "to change", attr="variants")
            if "variants" in changes or "rule" in changes:
                raise ConfigError(f"variant '{variant}' may change attributes, not "
                                  f"'{'rule' if 'rule' in changes else 'variants'}'",
                                  attr="variants")
            tables[f"{name}.{variant}"] = {**shared, **changes, "rule": "image_dataset"}
        return tables, raw

    def validate(self, attrs: Mapping[str, Any]) -> None:
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
        if attrs["split"] != "all":
            from ..source.splits import check_fractions

            problem = check_fractions(attrs["split_fractions"])
            if problem:
                raise ConfigError(problem, attr="split_fractions")

    def analyze(self, ctx: AnalysisContext) -> None:
        params = {k: v for k, v in ctx.attrs.items()
                  if k not in ("images", "model", "variants")}
        _dataset_actions(ctx, build_images, ["images"], params)


def build_images(ctx: RunContext) -> DatasetInfo:
    """``image_dataset``'s first action: decode and transform the images into data/."""
    from qbuild_onnx_common.errors import OnnxError

    from ..source.images import ImageOptions, build_image_dataset

    a = ctx.params
    opts = ImageOptions(
        height=a["size"][0], width=a["size"][1], resize=a["resize"], align=a["align"],
        pad_value=a["pad_value"], color=a["color"], scale=a["scale"],
        mean=tuple(a["mean"]), std=tuple(a["std"]), layout=a["layout"], dtype=a["dtype"],
        background=tuple(a["background"]), interpolation=a["interpolation"],
        count=a["count"] or None, seed=a["seed"], flip=a["flip"], min_scale=a["min_scale"])
    out = ctx.output("data/")
    try:
        build_image_dataset(out, ctx.inputs["images"], a["input"], opts,
                            batch_size=a["batch_size"], split=a["split"],
                            split_fractions=a["split_fractions"], split_seed=a["split_seed"])
    except OnnxError as e:
        if e.file is not None:  # a staged image: named as the user knows it
            e.file = ctx.workspace_path(e.file)
        raise e.located(attr="images") from None
    return dataset_provider(out)


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

    def analyze(self, ctx: AnalysisContext) -> None:
        params = {k: ctx.attrs[k] for k in ("mapping", "batch_size", "cast", "limit")}
        _dataset_actions(ctx, build_arrays, ["files"], params)


def build_arrays(ctx: RunContext) -> DatasetInfo:
    """``numpy_dataset``'s first action: map the arrays to model inputs in data/."""
    from qbuild_onnx_common.errors import OnnxError

    from ..source.datasets import build_numpy_dataset

    a = ctx.params
    out = ctx.output("data/")
    try:
        build_numpy_dataset(out, ctx.inputs["files"], a["mapping"], a["batch_size"], a["cast"],
                            a["limit"] or None)
    except OnnxError as e:
        raise e.located(attr="mapping") from None
    return dataset_provider(out)


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

    def analyze(self, ctx: AnalysisContext) -> None:
        # The samples follow the model's inputs, so the model is an input of the one
        # action (checking the data against it as well costs nothing).
        ctx.action(build_synthetic, inputs=["model"], outputs=["data/"], mnemonic="Dataset",
                   params={k: v for k, v in ctx.attrs.items() if k != "model"})


def build_synthetic(ctx: RunContext) -> DatasetInfo:
    """``synthetic_dataset``'s action: seeded random samples shaped like the inputs."""
    from qbuild_onnx_common.allocation import AllocationRefused
    from qbuild_onnx_common.errors import OnnxError

    from ..source.datasets import build_synthetic_dataset

    a = ctx.params
    ctx.warn("this target is SYNTHETIC random data: fine for smoke tests, but calibrating "
             "on it ruins quantized accuracy; use real samples (image_dataset, "
             "numpy_dataset, dataset) for anything you ship")
    out = ctx.output("data/")
    try:
        build_synthetic_dataset(out, _model_inputs(ctx.inputs["model"]), a["count"],
                                a["seed"], a["dims"], a["low"], a["high"], a["batch_size"])
    except AllocationRefused as e:
        raise _at_model(ctx, e) from None
    except OnnxError as e:
        raise e.located(attr="model") from None
    _check_against(out, ctx.inputs["model"])
    return dataset_provider(out)


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

    def code(self, attrs: Mapping[str, Any]) -> list[str]:
        # The reader's code decides the samples: key it like the rule's own code.
        reader = attrs["reader"]
        return [*super().code(attrs),
                reader if ":" in reader else "hook:qbuild_dataset_readers"]

    def analyze(self, ctx: AnalysisContext) -> None:
        params = {k: ctx.attrs[k] for k in ("reader", "options", "batch_size", "limit")}
        _dataset_actions(ctx, build_from_reader, ["files"], params)


def build_from_reader(ctx: RunContext) -> DatasetInfo:
    """``dataset``'s first action: the reader's samples into data/."""
    from qbuild_onnx_common.errors import OnnxError

    from ..source.datasets import build_reader_dataset, find_reader

    a = ctx.params
    out = ctx.output("data/")
    try:
        reader = find_reader(a["reader"], None if ":" in a["reader"]
                             else ctx.hooks.pluginmanager)
        build_reader_dataset(out, reader, ctx.inputs["files"] or [], a["options"],
                             a["batch_size"], a["limit"] or None, name=a["reader"])
    except OnnxError as e:
        raise e.located(attr="reader") from None
    return dataset_provider(out)


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

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        outs = [f"{name}.onnx"]
        if attrs.get("external_data"):
            outs.append(f"{name}.onnx.data")
        return outs

    def analyze(self, ctx: AnalysisContext) -> None:
        params = {k: v for k, v in ctx.attrs.items() if k != "model"}
        ctx.action(preprocess, inputs=["model"], outputs=ctx.outputs, mnemonic="Preprocess",
                   params={**params, "out": ctx.output("{name}.onnx")})


def preprocess(ctx: RunContext) -> OnnxModelInfo:
    """``quant_preprocess``'s action; the model it gives records the nodes it removed."""
    from qbuild_onnx_common.allocation import AllocationRefused
    from qbuild_onnx_common.errors import OnnxError

    from ..ort_logs import ort_output_to_log
    from ..quantization.options import PreprocessOptions
    from ..quantization.preprocess import preprocess_model

    a = ctx.params
    opts = PreprocessOptions(
        skip_optimization=a["skip_optimization"], skip_onnx_shape=a["skip_onnx_shape"],
        skip_symbolic_shape=a["skip_symbolic_shape"], auto_merge=a["auto_merge"],
        int_max=a["int_max"], guess_output_rank=a["guess_output_rank"])
    out = ctx.output(a["out"])
    try:
        with ort_output_to_log(ctx.log, ctx.warn):
            info = preprocess_model(ctx.inputs["model"][OnnxModelInfo].model, out, opts,
                                    external_data=a["external_data"], log=ctx.log)
    except AllocationRefused as e:
        raise _at_model(ctx, e) from None
    except OnnxError as e:
        raise e.located(attr="model") from None
    return onnx_model_info(out, rewrites=info["preprocess_rewrites"])


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
        "method": attr.enum(["minmax", "mean_minmax", "entropy", "percentile",
                             "distribution"],
                            default="minmax", doc="How ranges are chosen: minmax (global "
                            "min/max), mean_minmax (the mean over samples of each sample's "
                            "min and max, as NNCF's MEAN_MINMAX; one sample per run), or a "
                            "histogram method."),
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

    def resources(self, attrs: Mapping[str, Any]) -> tuple[int, int]:
        return max(1, attrs["threads"]), 0

    def validate(self, attrs: Mapping[str, Any]) -> None:
        from qbuild_onnx_common.errors import OnnxError

        try:
            _calibration_options(attrs, 1).check()
        except OnnxError as exc:
            raise ConfigError(exc.message, attr=exc.attr) from None

    def declared_outputs(self, name: str, attrs: Mapping[str, Any]) -> list[str]:
        if attrs.get("method", "minmax") in ("entropy", "percentile", "distribution"):
            return ["calibration.json", "histograms.npz"]
        return ["calibration.json"]

    def analyze(self, ctx: AnalysisContext) -> None:
        params = {k: v for k, v in ctx.attrs.items() if k not in ("model", "dataset")}
        ctx.action(calibrate, inputs=["model", "dataset"], outputs=ctx.outputs,
                   mnemonic="Calibrate", params=params)


def _calibration_options(a: Mapping[str, Any], threads: int) -> CalibrationOptions:
    from ..calibration.calibrate import CalibrationOptions

    return CalibrationOptions(
        method=a["method"], symmetric=a["symmetric"], moving_average=a["moving_average"],
        averaging_constant=a["averaging_constant"], num_bins=a["num_bins"],
        num_quantized_bins=a["num_quantized_bins"], percentile=a["percentile"],
        scenario=a["scenario"], op_types=tuple(a["op_types"]),
        batch_size=a["batch_size"] or None, threads=threads)


def calibrate(ctx: RunContext) -> CalibrationInfo:
    """``calibrate``'s action: run the model over the dataset with ``ctx.threads``
    onnxruntime threads; ranges (and histograms) next to calibration.json."""
    from qbuild_onnx_common.allocation import AllocationRefused

    from ..calibration.calibrate import calibrate as run_calibration
    from ..ort_logs import ort_output_to_log
    from ..source.datasets import InputNamesMismatch

    opts = _calibration_options(ctx.params, ctx.threads)
    try:
        with ort_output_to_log(ctx.log, ctx.warn):
            info = run_calibration(ctx.inputs["model"][OnnxModelInfo].model,
                                   ctx.inputs["dataset"][DatasetInfo].path,
                                   ctx.output("calibration.json").parent, opts, log=ctx.log,
                                   scratch=ctx.scratch, progress=ctx.progress)
    except InputNamesMismatch as e:
        raise blame_dataset(ctx, "dataset", e) from None
    except AllocationRefused as e:
        raise _at_model(ctx, e) from None
    except RuleError as e:
        raise e.located(attr="dataset") from None
    return CalibrationInfo(table=ctx.output("calibration.json"), method=info["method"],
                           samples=info["num_samples"])


def blame_dataset(ctx: RunContext, name: str, error: RuleError) -> RuleError:
    """An input-name mismatch between the dataset given as ``name`` and the model: for
    an image dataset the mistake is its ``input``, so the error names that target."""
    from ..source.datasets import is_image_dataset

    if is_image_dataset(ctx.inputs[name][DatasetInfo].path):
        return ctx.fail_at(name, f"{error.message} (set `input` to the model's input "
                           "name)", attr="input")
    return ctx.fail(error.message, attr=name)


@hookimpl
def qbuild_rule_types() -> list[type[Rule]]:
    return [OnnxModel, ImageDataset, NumpyDataset, SyntheticDataset, CustomDataset,
            QuantPreprocess, Calibrate, *IMPORTED]


@hookimpl
def qbuild_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    from .. import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
