"""Fixtures for the dtype plugin's tests: QDQ models made once per session with onnxruntime's
quantize_static on the real images in testdata/images."""

from __future__ import annotations

from pathlib import Path

import dtypes_testlib as lib
import pytest


@pytest.fixture(scope="session")
def qdq_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dtypes_qdq")


@pytest.fixture(scope="session")
def mobilenet_u8(qdq_dir) -> Path:
    """MobileNetV2 QDQ: per-channel int8 weights, uint8 activations (opset 15)."""
    return lib.make_qdq(lib.MODELS / "mobilenet_v2_128_0.5.onnx", qdq_dir / "mb_u8.onnx",
                        "mobilenet", "uint8")


@pytest.fixture(scope="session")
def mobilenet_s8(qdq_dir) -> Path:
    """MobileNetV2 QDQ: per-channel int8 weights, int8 activations (opset 15)."""
    return lib.make_qdq(lib.MODELS / "mobilenet_v2_128_0.5.onnx", qdq_dir / "mb_s8.onnx",
                        "mobilenet", "int8")


@pytest.fixture(scope="session")
def yolo_u8(qdq_dir) -> Path:
    """YOLOX-Nano QDQ: per-channel int8 weights, uint8 activations (opset 13)."""
    return lib.make_qdq(lib.YOLO, qdq_dir / "yolo_u8.onnx", "yolo", "uint8")
