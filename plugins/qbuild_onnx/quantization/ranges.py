"""Saved tensor ranges for static quantization: read, check, hand to onnxruntime.

Owns reading a ``qbuild-calibration`` artifact (``calibration.json`` written by the
``calibrate`` rule), checking that it was computed on exactly the model file being
quantized (``model_sha256``), and building the ``TensorsData`` object that onnxruntime's
quantizers take in place of running a calibrator.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    from onnxruntime.quantization.calibrate import TensorsData

CALIBRATION_FORMAT = "qbuild-calibration"
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Calibration:
    """The parts of a calibration artifact quantization uses."""

    path: Path
    method: str
    model_sha256: str
    ranges: dict[str, tuple[float, float]]  # tensor name -> (lo, hi), sorted by name


def _bad(path: Path, what: str) -> OnnxError:
    return OnnxError(f"calibration file {path}: {what}", attr="calibration")


def _range(path: Path, name: str, entry: Any) -> tuple[float, float]:
    if not isinstance(entry, dict) or "range" not in entry:
        raise _bad(path, f"tensor {name!r} has no 'range'")
    pair = entry["range"]
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)):
        raise _bad(path, f"tensor {name!r}: 'range' must be [lo, hi], got {pair!r}")
    lo, hi = float(pair[0]), float(pair[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise _bad(path, f"tensor {name!r}: range [{lo}, {hi}] is not finite")
    if lo > hi:
        raise _bad(path, f"tensor {name!r}: range [{lo}, {hi}] has lo > hi")
    return lo, hi


def load_calibration(path: Path) -> Calibration:
    """Read and check a ``calibration.json``; raise ``OnnxError`` naming what is wrong."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _bad(path, "does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        raise _bad(path, f"is not a {CALIBRATION_FORMAT} artifact (no \"format\": "
                         f"\"{CALIBRATION_FORMAT}\")")
    if doc.get("version") != CALIBRATION_VERSION:
        raise _bad(path, f"has version {doc.get('version')!r}; this quantizer reads version "
                         f"{CALIBRATION_VERSION}")
    sha = doc.get("model_sha256")
    if not isinstance(sha, str) or len(sha) != 64:
        raise _bad(path, "has no valid model_sha256")
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict) or not tensors:
        raise _bad(path, "has no tensor ranges ('tensors' is empty or missing)")
    ranges = {name: _range(path, name, tensors[name]) for name in sorted(tensors)}
    return Calibration(path=path, method=str(doc.get("method", "minmax")), model_sha256=sha,
                       ranges=ranges)


def check_calibration_matches(calibration: Calibration, model_path: Path, model_sha: str) -> None:
    """Raise unless the calibration was computed on exactly this model file."""
    if calibration.model_sha256 != model_sha:
        raise OnnxError(
            f"calibration {calibration.path} was computed on a model with sha256 "
            f"{calibration.model_sha256[:16]}..., but the model to quantize, {model_path}, has "
            f"sha256 {model_sha[:16]}...; calibrate the same (pre-processed) model you quantize",
            attr="calibration",
        )


def tensors_data(calibration: Calibration, tensor_names: set[str]) -> TensorsData:
    """onnxruntime ``TensorsData`` holding the saved ranges of the tensors in the model.

    Ranges of tensors the model does not have are dropped (a pre-processed model can have
    fewer tensors than the one calibrated only if the hashes differ, which is checked
    before).
    """
    import numpy as np
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    methods = {"minmax": CalibrationMethod.MinMax, "mean_minmax": CalibrationMethod.MinMax,
               "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile,
               "distribution": CalibrationMethod.Distribution}
    data = {
        name: TensorData(lowest=np.array(lo, np.float32), highest=np.array(hi, np.float32))
        for name, (lo, hi) in calibration.ranges.items()
        if name in tensor_names
    }
    # The method is only metadata to the quantizers: every method ends in a [lo, hi] range.
    return TensorsData(methods.get(calibration.method, CalibrationMethod.MinMax), data)
