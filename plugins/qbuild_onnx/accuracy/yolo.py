"""YOLOX-style detector evaluation: letterbox input preparation, output decoding (grids and
strides), class-wise NMS, and detection F1 of a candidate model against a reference model's
own detections.

Conventions are those of YOLOX (Megvii) exports with ``decode_in_inference=False``: input
N×3×S×S, BGR, values 0..255, no normalisation, image resized by r = min(S/h, S/w) and
placed at the top-left of a canvas filled with 114; output N×A×(5+C) per anchor point =
(cx, cy, w, h) in grid units before decoding, objectness (sigmoid applied), C class scores
(sigmoid applied). Decoding: xy = (xy + grid) · stride, wh = exp(wh) · stride, grids laid out
row-major (x fastest) for strides 8, 16, 32 in that order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray
    from qbuild_onnx_common.arrays import Float32Array, Float64Array, FloatArray

DEFAULT_STRIDES = (8, 16, 32)
PAD_VALUE = 114.0


@dataclass(frozen=True)
class Detection:
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in input-canvas pixels
    score: float
    cls: int


def box_of(row: Iterable[Any]) -> tuple[float, float, float, float]:
    """An x1, y1, x2, y2 box from a row of four numbers."""
    x1, y1, x2, y2 = (float(v) for v in row)
    return x1, y1, x2, y2


def load_rgb(path: str | Path) -> NDArray[np.uint8]:
    """Loads an image as an H×W×3 uint8 RGB array (RGBA/greyscale/palette converted)."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except OSError as e:
        raise OnnxError(f"{path}: cannot read image: {e}") from e


def letterbox(rgb: NDArray[np.uint8], size: int = 416, pad: float = PAD_VALUE
              ) -> tuple[Float32Array, float]:
    """RGB H×W×3 uint8 → 1×3×size×size float32 BGR letterboxed top-left; returns (x, ratio)."""
    import numpy as np
    from PIL import Image

    h, w = rgb.shape[:2]
    r = min(size / h, size / w)
    nh, nw = max(1, int(h * r)), max(1, int(w * r))
    scaled = Image.fromarray(rgb).resize((nw, nh), Image.Resampling.BILINEAR)
    resized = np.asarray(scaled, dtype=np.float32)
    canvas = np.full((size, size, 3), pad, dtype=np.float32)
    canvas[:nh, :nw] = resized[:, :, ::-1]  # RGB -> BGR
    return canvas.transpose(2, 0, 1)[None].copy(), r


def augment(rgb: NDArray[np.uint8], index: int) -> NDArray[np.uint8]:
    """A deterministic augmentation of an RGB image, numbered 0..7: 0 = the image itself,
    1 = horizontal flip, 2..5 = the four 75 % corner crops, 6 = a 60 % centre crop,
    7 = horizontal flip of a 85 % centre crop."""
    h, w = rgb.shape[:2]
    if index == 0:
        return rgb
    y0, x0, ch, cw, flip = 0, 0, h, w, index in (1, 7)
    if 2 <= index <= 5:
        ch, cw = int(h * 0.75), int(w * 0.75)
        y0 = 0 if index in (2, 3) else h - ch
        x0 = 0 if index in (2, 4) else w - cw
    elif index in (6, 7):
        share = 0.6 if index == 6 else 0.85
        ch, cw = int(h * share), int(w * share)
        y0, x0 = (h - ch) // 2, (w - cw) // 2
    elif index != 1:
        raise OnnxError(f"augmentation index {index} out of range 0..7")
    crop: NDArray[np.uint8] = rgb[y0 : y0 + ch, x0 : x0 + cw]
    if flip:
        crop = crop[:, ::-1]
    copied: NDArray[np.uint8] = crop.copy()
    return copied


def image_inputs(paths: Sequence[str | Path], augmentations: Sequence[int] = (0,),
                 size: int = 416) -> list[Float32Array]:
    """Letterboxed model inputs for every (image, augmentation) pair, in the given order."""
    out = []
    for p in paths:
        rgb = load_rgb(p)
        for a in augmentations:
            out.append(letterbox(augment(rgb, a), size)[0])
    return out


def grids(size: int, strides: Sequence[int] = DEFAULT_STRIDES
          ) -> tuple[Float32Array, Float32Array]:
    """(A×2 grid offsets, A×1 strides) for a square input of ``size`` pixels."""
    import numpy as np

    gs, ss = [], []
    for s in strides:
        n = size // s
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        gs.append(np.stack((xv, yv), 2).reshape(-1, 2))
        ss.append(np.full((n * n, 1), s))
    return np.concatenate(gs).astype(np.float32), np.concatenate(ss).astype(np.float32)


def decode(raw: ArrayLike, size: int = 416, strides: Sequence[int] = DEFAULT_STRIDES
           ) -> tuple[Float32Array, Float32Array]:
    """Raw A×(5+C) (or 1×A×(5+C)) head output → (A×4 xyxy boxes, A×C scores = obj·cls)."""
    import numpy as np

    head = np.asarray(raw, dtype=np.float32)
    if head.ndim == 3:
        if head.shape[0] != 1:
            raise OnnxError(f"decode expects one image, got batch {head.shape[0]}")
        head = head[0]
    g, s = grids(size, strides)
    if head.ndim != 2 or head.shape[0] != g.shape[0] or head.shape[1] < 6:
        raise OnnxError(
            f"YOLO output shape {head.shape} does not match {g.shape[0]} anchor points "
            f"for a {size}×{size} input with strides {tuple(strides)}"
        )
    xy = (head[:, :2] + g) * s
    wh = np.exp(np.minimum(head[:, 2:4], 20.0)) * s
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)
    scores = head[:, 4:5] * head[:, 5:]
    return boxes, scores


def iou(a: ArrayLike, b: ArrayLike) -> Float64Array:
    """IoU matrix between N×4 and M×4 xyxy boxes."""
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: FloatArray, scores: FloatArray, iou_threshold: float) -> list[int]:
    """Greedy NMS; ties in score are broken by index so the result is deterministic."""
    import numpy as np

    if not len(scores):
        return []
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    keep: list[int] = []
    suppressed = np.zeros(len(scores), dtype=bool)
    ious = iou(boxes, boxes)
    for i in order:
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= ious[i] > iou_threshold
    return keep


def detect(
    raw: ArrayLike,
    score_threshold: float = 0.3,
    nms_threshold: float = 0.45,
    size: int = 416,
    strides: Sequence[int] = DEFAULT_STRIDES,
) -> list[Detection]:
    """Decoded, class-wise NMS'd detections with score ≥ ``score_threshold``, best first."""
    import numpy as np

    boxes, scores = decode(raw, size, strides)
    dets: list[Detection] = []
    for c in range(scores.shape[1]):
        idx = np.nonzero(scores[:, c] >= score_threshold)[0]
        if idx.size == 0:
            continue
        keep = nms(boxes[idx], scores[idx, c], nms_threshold)
        for k in keep:
            i = idx[k]
            dets.append(Detection(box_of(boxes[i]), float(scores[i, c]), c))
    dets.sort(key=lambda d: (-d.score, d.cls, d.box))
    return dets


def match(ref: Sequence[Detection], cand: Sequence[Detection], iou_threshold: float = 0.5) -> int:
    """Number of candidate detections matched one-to-one to a reference detection of the same
    class with IoU ≥ threshold (greedy by candidate score, then best IoU)."""
    import numpy as np

    if not ref or not cand:
        return 0
    m = iou([c.box for c in cand], [r.box for r in ref])
    used = np.zeros(len(ref), dtype=bool)
    tp = 0
    for i, c in enumerate(cand):  # cand is sorted best first
        best, best_j = iou_threshold, -1
        for j, r in enumerate(ref):
            if not used[j] and r.cls == c.cls and m[i, j] >= best:
                if best_j < 0 or m[i, j] > best:
                    best, best_j = m[i, j], j
        if best_j >= 0:
            used[best_j] = True
            tp += 1
    return tp


def detection_f1(
    ref_raw: Sequence[Any],
    cand_raw: Sequence[Any],
    score_threshold: float = 0.3,
    iou_threshold: float = 0.5,
    nms_threshold: float = 0.45,
    size: int = 416,
) -> dict[str, Any]:
    """Detection F1 of candidate raw outputs against the reference's own detections, pooled
    over all samples: precision = TP/|cand|, recall = TP/|ref|, F1 = 2TP/(|ref|+|cand|)."""
    if len(ref_raw) != len(cand_raw):
        raise OnnxError(f"sample count mismatch: {len(ref_raw)} vs {len(cand_raw)}")
    tp = n_ref = n_cand = 0
    per_sample = []
    for r, c in zip(ref_raw, cand_raw):
        dr = detect(r, score_threshold, nms_threshold, size)
        dc = detect(c, score_threshold, nms_threshold, size)
        t = match(dr, dc, iou_threshold)
        tp, n_ref, n_cand = tp + t, n_ref + len(dr), n_cand + len(dc)
        per_sample.append({"reference": len(dr), "candidate": len(dc), "matched": t})
    denom = n_ref + n_cand
    return {
        "f1": 1.0 if denom == 0 else 2.0 * tp / denom,
        "precision": 1.0 if n_cand == 0 else tp / n_cand,
        "recall": 1.0 if n_ref == 0 else tp / n_ref,
        "reference_detections": n_ref,
        "candidate_detections": n_cand,
        "matched": tp,
        "per_sample": per_sample,
    }


def load_class_names(path: str | Path) -> list[str]:
    return [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
