"""Running onnxruntime's ``quantize_static`` (QDQ format) on in-memory calibration samples for
accuracy trials, and translating qbuild's JSON precision overrides into onnxruntime's
``TensorQuantOverrides`` / ``nodes_to_exclude`` options.

The JSON override document (written by the mixed-precision and range tools, consumed by
the ``quantize`` rule) looks like::

    {"tensors": {"1177": {"quant_type": "uint16"}, "686": {"rmin": -0.3, "rmax": 6.1}},
     "nodes_to_exclude": ["Conv_41"]}

``quant_type`` is spelled as in the ``quantize`` rule: uint8, int8, uint16, int16, uint4, int4.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    from onnxruntime.quantization import QuantType

QUANT_TYPE_NAMES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16",
                    "uint4": "QUInt4", "int4": "QInt4"}


def quant_type(name: str) -> QuantType:
    """onnxruntime QuantType from its member name."""
    from onnxruntime.quantization import QuantType

    if name not in QUANT_TYPE_NAMES:
        raise OnnxError(
            f"unknown quant_type '{name}' (expected one of {', '.join(QUANT_TYPE_NAMES)})")
    return getattr(QuantType, QUANT_TYPE_NAMES[name])


def empty_overrides() -> dict[str, Any]:
    return {"tensors": {}, "nodes_to_exclude": []}


def merge_overrides(*docs: Mapping[str, Any]) -> dict[str, Any]:
    """Merges override documents left to right (later keys win per tensor and per key)."""
    out = empty_overrides()
    for d in docs:
        for t, o in (d.get("tensors") or {}).items():
            out["tensors"].setdefault(t, {}).update(o)
        excl = set(out["nodes_to_exclude"]) | set(d.get("nodes_to_exclude") or [])
        out["nodes_to_exclude"] = sorted(excl)
    out["tensors"] = {t: dict(sorted(out["tensors"][t].items())) for t in sorted(out["tensors"])}
    return out


def load_overrides(path: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise OnnxError(f"{path}: cannot read precision overrides: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("tensors", {}), dict):
        raise OnnxError(f"{path}: precision overrides must be an object with a 'tensors' table")
    return merge_overrides(doc)


def to_ort_tensor_overrides(doc: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """qbuild overrides → onnxruntime ``TensorQuantOverrides`` (per-tensor entries)."""
    import numpy as np

    out: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(doc.get("tensors") or {}):
        o = dict(doc["tensors"][name])
        if "quant_type" in o:
            o["quant_type"] = quant_type(o["quant_type"])
        for k in ("rmin", "rmax", "scale"):  # onnxruntime needs numpy scalars here
            if k in o:
                o[k] = np.float32(o[k])
        out[name] = [o]
    return out


class FeedReader:
    """A ``CalibrationDataReader`` over a list of feed dicts (re-iterable via ``rewind``)."""

    def __init__(self, feeds: Sequence[Mapping[str, Any]]):
        self.feeds = list(feeds)
        self.i = 0

    def get_next(self) -> dict[str, Any] | None:
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return dict(self.feeds[self.i - 1])

    def rewind(self) -> None:
        self.i = 0


def quantize_qdq(
    model_in: str | Path,
    model_out: str | Path,
    feeds: Sequence[Mapping[str, Any]],
    *,
    activation_type: str = "uint8",
    weight_type: str = "int8",
    per_channel: bool = True,
    method: str = "minmax",
    percentile: float = 99.999,
    overrides: Mapping[str, Any] | None = None,
    extra_options: Mapping[str, Any] | None = None,
    op_types: Sequence[str] | None = None,
) -> Path:
    """Static QDQ quantization of ``model_in`` calibrated on ``feeds``; returns ``model_out``."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
        "distribution": CalibrationMethod.Distribution,
    }
    if method not in methods:
        raise OnnxError(f"unknown calibration method '{method}'")
    doc = merge_overrides(overrides or {})
    extra = dict(copy.deepcopy(dict(extra_options or {})))
    extra.setdefault("CalibPercentile", percentile)
    tq = to_ort_tensor_overrides(doc)
    if tq:
        extra["TensorQuantOverrides"] = tq
    # onnxruntime's calibrator runs every tensor as an output: none over the bound
    check_model(model_in, inputs={k: getattr(v, "shape", ()) for k, v in
                                  (feeds[0] if feeds else {}).items()})
    quantize_static(
        str(model_in),
        str(model_out),
        FeedReader(feeds),
        quant_format=QuantFormat.QDQ,
        activation_type=quant_type(activation_type),
        weight_type=quant_type(weight_type),
        per_channel=per_channel,
        calibrate_method=methods[method],
        nodes_to_exclude=list(doc["nodes_to_exclude"]),
        op_types_to_quantize=list(op_types) if op_types else None,
        extra_options=extra,
    )
    return Path(model_out)
