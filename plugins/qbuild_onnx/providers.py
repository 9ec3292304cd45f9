"""Providers only qbuild_onnx's own rules give and ask for: a sensitivity ranking, a
precision-override document and an evaluation report. (Models, datasets, calibrations
and quantized models are ``qbuild_onnx_common.providers``.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qbuild import Provider


@dataclass(frozen=True)
class SensitivityInfo(Provider):
    """A ``sensitivity`` ranking of a QDQ model's quantization sites."""

    ranking: Path  # sensitivity.json


@dataclass(frozen=True)
class OverridesInfo(Provider):
    """A precision-override document for ``quantize``'s ``overrides`` attribute: a
    ``tensors`` table (tensor_overrides) and a ``nodes_to_exclude`` list."""

    overrides: Path  # overrides.json


@dataclass(frozen=True)
class EvaluationInfo(Provider):
    """An ``evaluate`` report: every model's scores on one dataset, by model label."""

    report: Path  # report.json
