"""Repository paths and small inputs used by the evaluation tests (a uniquely named
module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "testdata" / "images"
MODELS = ROOT / "testdata" / "models"


def digits(seed: int, n: int) -> Any:
    """``n`` 28x28 grey crops of the test images as [n, 1, 28, 28] float32 (digit-like
    enough to calibrate and evaluate the MNIST model)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = sorted(p for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
    out = []
    for i in range(n):
        with Image.open(paths[i % len(paths)]) as im:
            g = im.convert("L")
            w, h = g.size
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            a = np.asarray(g.crop((x0, y0, x0 + w // 2, y0 + h // 2)).resize((28, 28)),
                           np.float32)
        out.append((a / 255.0)[None])
    return np.stack(out).astype(np.float32)
