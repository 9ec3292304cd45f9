"""Shared fixtures for the accuracy-tool tests: repository paths and small real inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))

IMAGES = ROOT / "testdata" / "images"
MODELS = ROOT / "testdata" / "models"


@pytest.fixture(scope="session")
def mnist_feeds():
    """Real digit-like inputs for mnist.onnx: crops of the test images, greyscale, 28×28."""
    import numpy as np
    from PIL import Image

    feeds = []
    for name in sorted(p.name for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png")):
        with Image.open(IMAGES / name) as im:
            g = im.convert("L")
            w, h = g.size
            for i, box in enumerate([(0, 0, w // 2, h // 2), (w // 2, h // 2, w, h),
                                     (w // 4, h // 4, 3 * w // 4, 3 * h // 4)]):
                a = np.asarray(g.crop(box).resize((28, 28), Image.BILINEAR), np.float32)
                if i == 1:
                    a = a[:, ::-1]
                feeds.append({"Input3": (a / 255.0)[None, None].copy()})
    return feeds


@pytest.fixture(scope="session")
def mobilenet_feeds():
    """MobileNetV2 (128×128, NCHW) inputs from the test images: whole image and crops."""
    import numpy as np
    from PIL import Image

    feeds = []
    for name in sorted(p.name for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png")):
        with Image.open(IMAGES / name) as im:
            rgb = im.convert("RGB")
            w, h = rgb.size
            for box in [(0, 0, w, h), (0, 0, w * 2 // 3, h * 2 // 3),
                        (w // 3, h // 3, w, h)]:
                a = np.asarray(rgb.crop(box).resize((128, 128), Image.BILINEAR), np.float32)
                feeds.append({"input_1:0": (a / 127.5 - 1.0).transpose(2, 0, 1)[None].copy()})
    return feeds
