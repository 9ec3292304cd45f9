"""Builds QDQ models the way the ``quantize`` rule does, for tests and the benchmark.

onnxruntime's ``quant_pre_process`` then ``quantize_static`` (QDQ format, per-channel int8
weights, uint8 or int8 activations, MinMax) calibrated on a few real images. Also owns the
image pre-processing shared by the tests, the check step's fallback inputs and the bench.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from qbuild_onnx_common.allocation import check_model
from qbuild_onnx_common.arrays import Float32Array
from qbuild_onnx_common.models import load_model

from .graph import onnx_opset

#: Images as a float32 NCHW batch.
ImageBatch = Float32Array

#: Per-model image pre-processing: (channel order, value mapping).
_PREP: dict[str, tuple[str, Callable[[ImageBatch], ImageBatch]]] = {
    "mobilenet": ("RGB", lambda a: a / 127.5 - 1.0),
    "yolox": ("BGR", lambda a: a),
}


def load_image(path: Path, shape: tuple[int, int], kind: str) -> ImageBatch:
    """One image as a float32 NCHW batch of 1, resized to ``shape`` (height, width)."""
    from PIL import Image as PilImage

    order, scale = _PREP[kind]
    with PilImage.open(path) as im:
        rgb = im.convert("RGB").resize((shape[1], shape[0]), PilImage.Resampling.BILINEAR)
        a = np.asarray(rgb, dtype=np.float32)
    if order == "BGR":
        a = a[:, :, ::-1]
    a = scale(a).astype(np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])


def image_batches(images: list[Path], shape: tuple[int, int], kind: str) -> list[ImageBatch]:
    return [load_image(p, shape, kind) for p in sorted(images)]


class _Reader:
    def __init__(self, name: str, batches: list[ImageBatch]):
        self._it = iter([{name: b} for b in batches])

    def get_next(self) -> dict[str, ImageBatch] | None:
        return next(self._it, None)


def make_qdq(
    model: Path,
    out: Path,
    batches: list[ImageBatch],
    activation: str = "uint8",
    scratch: Path | None = None,
) -> Path:
    """Quantize ``model`` to QDQ (per-channel int8 weights, ``activation`` activations)."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    scratch = Path(scratch or out.parent)
    check_model(model)  # pre-processing and calibration run it: nothing over the bound
    m = load_model(model)
    version = onnx_opset(m)
    src = model
    inits = {t.name for t in m.graph.initializer}
    if any(i.name in inits for i in m.graph.input):
        # Old exporters list weights as graph inputs; onnxruntime then treats them as
        # overridable and folds nothing (UltraFace keeps its BatchNormalization in float).
        keep = [i for i in m.graph.input if i.name not in inits]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        src = scratch / (out.stem + "_weights_not_inputs.onnx")
        onnx.save(m, str(src))
    if version < 13:  # per-channel DequantizeLinear needs `axis` (opset 13)
        m = version_converter.convert_version(m, 13)
        src = scratch / (out.stem + "_op13.onnx")
        onnx.save(m, str(src))
    pre = scratch / (out.stem + "_pre.onnx")
    quant_pre_process(str(src), str(pre))
    name = m.graph.input[0].name

    class Reader(_Reader, CalibrationDataReader):  # type: ignore[misc]  # untyped base
        pass

    quantize_static(
        str(pre),
        str(out),
        Reader(name, batches),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return out
