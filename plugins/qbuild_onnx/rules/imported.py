"""Rules that bring artifacts made elsewhere into a build, typed: a saved qbuild dataset
folder (``saved_dataset``), calibration statistics (``calibration_table``) and a
precision-override document (``precision_overrides``).

A ``filegroup`` gives only files (``DefaultInfo``), so rules that ask for a dataset, a
calibration or overrides refuse it at analysis; these rules check the files once, copy
them into the target's outputs and give the provider their dependents ask for, each in
one action (rule API v2). (A model file is brought in with ``onnx_model``.)
"""

from __future__ import annotations

import json
import shutil

from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.providers import CalibrationInfo, DatasetInfo
from qbuild_onnx_common.rule import OnnxRule

from qbuild import AnalysisContext, Rule, RunContext, attr

from ..providers import OverridesInfo
from .datasets import dataset_provider, dataset_summary


class SavedDataset(OnnxRule):
    kind = "saved_dataset"
    version = 1
    doc = ("A dataset folder written earlier (dataset.json plus one .npy per input, as every "
           "dataset rule writes it): checked and passed on as a dataset.")
    outputs = ["data/"]
    provides = (DatasetInfo,)
    attrs = {
        "srcs": attr.files(doc="The folder's files (e.g. [\"ds/*\"]); one is dataset.json.",
                           required=True, folders=[]),
    }

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(saved_dataset, inputs=["srcs"], outputs=["data/"], mnemonic="Dataset")


def saved_dataset(ctx: RunContext) -> DatasetInfo:
    """``saved_dataset``'s action: copy the folder's files, read dataset.json."""
    srcs = ctx.inputs["srcs"]
    if not any(p.name == "dataset.json" for p in srcs):
        raise ctx.fail("no dataset.json among the files", attr="srcs")
    out = ctx.output("data/")
    out.mkdir(parents=True, exist_ok=True)
    for path in srcs:
        shutil.copyfile(path, out / path.name)
    try:
        info = dataset_summary(out)
    except OnnxError as e:
        raise ctx.fail(e.message, attr="srcs") from None
    return dataset_provider(out, info)


class CalibrationTable(OnnxRule):
    kind = "calibration_table"
    version = 1
    doc = ("Calibration statistics saved earlier (a calibrate target's calibration.json): "
           "checked and passed on; quantize still refuses them for any other model file.")
    attrs = {"src": attr.file(doc="The calibration.json file.", required=True)}
    outputs = ["calibration.json"]
    provides = (CalibrationInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(calibration_table, inputs=["src"], outputs=["calibration.json"],
                   mnemonic="Calibration")


def calibration_table(ctx: RunContext) -> CalibrationInfo:
    """``calibration_table``'s action: check and copy calibration.json."""
    from ..calibration.calibrate import load_calibration

    try:
        doc = load_calibration(ctx.inputs["src"])
    except OnnxError as e:
        raise ctx.fail(e.message, attr="src") from None
    out = ctx.output("calibration.json")
    shutil.copyfile(ctx.inputs["src"], out)
    return CalibrationInfo(table=out, method=str(doc.get("method", "unknown")),
                           samples=int(doc.get("num_samples") or 0))


class PrecisionOverrides(OnnxRule):
    kind = "precision_overrides"
    version = 1
    doc = ("A precision-override document written by hand or earlier (a JSON object with "
           "'tensors' and/or 'nodes_to_exclude', as mixed_precision writes it), for "
           "quantize's overrides attribute.")
    attrs = {"src": attr.file(doc="The overrides .json file.", required=True)}
    outputs = ["overrides.json"]
    provides = (OverridesInfo,)

    def analyze(self, ctx: AnalysisContext) -> None:
        ctx.action(precision_overrides, inputs=["src"], outputs=["overrides.json"],
                   mnemonic="Overrides")


def precision_overrides(ctx: RunContext) -> OverridesInfo:
    """``precision_overrides``'s action: check and copy the document."""
    src = ctx.inputs["src"]
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ctx.fail(f"{src.name} is not valid JSON: {e}", attr="src") from None
    if not isinstance(doc, dict) or not ({"tensors", "nodes_to_exclude"} & set(doc)):
        raise ctx.fail(f"{src.name} must be a JSON object with 'tensors' and/or "
                       "'nodes_to_exclude'", attr="src")
    out = ctx.output("overrides.json")
    shutil.copyfile(src, out)
    return OverridesInfo(overrides=out)


RULES: list[type[Rule]] = [SavedDataset, CalibrationTable, PrecisionOverrides]
