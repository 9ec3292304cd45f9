"""Shared fixtures for the lowering tests: QDQ models made with onnxruntime's quantizer
from real models calibrated on real test images (cached per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted(p for p in (ROOT / "testdata" / "images").glob("*") if p.suffix in (".jpg", ".png"))
MOBILENET = ROOT / "testdata" / "models" / "mobilenet_v2_128_0.5.onnx"
YOLOX = ROOT / "examples" / "yolo" / "yolox_nano.onnx"


@pytest.fixture(scope="session")
def qdq_models(tmp_path_factory):
    """Factory: (model, kind, size, activation) -> path of a cached QDQ model."""
    from qbuild_lower.qdq.source import image_batches, make_qdq

    cache: dict = {}
    root = tmp_path_factory.mktemp("qdq")

    def get(model: Path, kind: str, size: int, activation: str = "uint8") -> Path:
        key = (model, activation)
        if key not in cache:
            out = root / f"{model.stem}_{activation}.onnx"
            make_qdq(model, out, image_batches(IMAGES[:4], (size, size), kind), activation,
                     scratch=root)
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session")
def image_feeds():
    from qbuild_lower.qdq.source import image_batches

    def get(name: str, kind: str, size: int, count: int = 6):
        return [{name: x} for x in image_batches(IMAGES[:count], (size, size), kind)]

    return get
