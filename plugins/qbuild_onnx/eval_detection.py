"""Detection evaluation for several detector families: pluggable decoders from raw model
outputs to boxes and per-class scores, then class-wise NMS and F1 / AP50 of a candidate
model against the reference model's own detections.

A decoder is ``decoder(outputs: dict[name, array], options) -> (boxes N×4 xyxy, scores
N×C)`` for one image (a leading batch axis of 1 is removed). Boxes may be in any unit
(pixels or normalised): IoU does not depend on it. Built-in decoders:

* ``yolox``: one N×A×(5+C) output, (cx, cy, w, h) in grid units, objectness, C class
  scores; decoded with grids and strides (see ``accuracy_yolo``).
* ``yolov8``: one [1, 4+C, A] output (Ultralytics YOLOv5u/v8/v11 exports): (cx, cy, w, h)
  in input pixels then C class probabilities, no objectness. A [1, A, 4+C] layout is
  recognised too (the axis of size 4+C is the smaller one).
* ``ssd``: two outputs, boxes [1, A, 4] (xyxy) and scores [1, A, C]; with
  ``background_class = true`` column 0 is dropped.
* ``fastestdet``: one [1, 5+C, H, W] head: objectness, 4 box regressions, C class
  probabilities per cell; centre = (tanh(r) + cell) / grid, size = sigmoid(r), score =
  obj^0.6 · cls^0.4 (the FastestDet convention).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .accuracy_metrics import AccuracyError
from .accuracy_yolo import Detection, match, nms

Decoder = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, Any]]


def _one(a):
    import numpy as np

    a = np.asarray(a, dtype=np.float32)
    if a.ndim >= 2 and a.shape[0] == 1:
        a = a[0]
    return a


def _single_output(outputs: Mapping[str, Any], options: Mapping[str, Any], decoder: str):
    name = options.get("output") or ""
    if name:
        if name not in outputs:
            raise AccuracyError(f"{decoder} decoder: no output '{name}' "
                                f"(outputs: {', '.join(outputs)})")
        return _one(outputs[name])
    return _one(outputs[sorted(outputs)[0]] if len(outputs) > 1 else next(iter(outputs.values())))


def decode_yolox(outputs: Mapping[str, Any], options: Mapping[str, Any]):
    from .accuracy_yolo import DEFAULT_STRIDES, decode

    raw = _single_output(outputs, options, "yolox")
    return decode(raw, int(options.get("input_size", 416)),
                  tuple(options.get("strides", DEFAULT_STRIDES)))


def _xywh_to_xyxy(b):
    import numpy as np

    return np.concatenate([b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2], 1)


def decode_yolov8(outputs: Mapping[str, Any], options: Mapping[str, Any]):
    raw = _single_output(outputs, options, "yolov8")
    if raw.ndim != 2 or min(raw.shape) < 5:
        raise AccuracyError(f"yolov8 decoder: expected a [1, 4+C, A] output, got shape "
                            f"{tuple(raw.shape)}")
    if raw.shape[0] > raw.shape[1]:
        raw = raw.T  # [A, 4+C] layout
    raw = raw.T  # A × (4+C)
    return _xywh_to_xyxy(raw[:, :4]), raw[:, 4:]


def decode_ssd(outputs: Mapping[str, Any], options: Mapping[str, Any]):
    arrays = {k: _one(v) for k, v in outputs.items()}
    boxes_name = options.get("boxes_output") or next(
        (k for k, v in sorted(arrays.items()) if v.ndim == 2 and v.shape[-1] == 4), None)
    scores_name = options.get("scores_output") or next(
        (k for k, v in sorted(arrays.items()) if k != boxes_name and v.ndim == 2), None)
    if boxes_name is None or scores_name is None:
        raise AccuracyError("ssd decoder: needs a boxes output [1, A, 4] and a scores output "
                            f"[1, A, C] (outputs: "
                            f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in arrays.items())})")
    boxes, scores = arrays[boxes_name], arrays[scores_name]
    if boxes.shape[0] != scores.shape[0]:
        raise AccuracyError(f"ssd decoder: {boxes.shape[0]} boxes but {scores.shape[0]} scores")
    if options.get("background_class", False):
        scores = scores[:, 1:]
    return boxes, scores


def decode_fastestdet(outputs: Mapping[str, Any], options: Mapping[str, Any]):
    import numpy as np

    raw = _single_output(outputs, options, "fastestdet")
    if raw.ndim != 3 or raw.shape[0] < 6:
        raise AccuracyError(f"fastestdet decoder: expected a [1, 5+C, H, W] output, got "
                            f"{tuple(raw.shape)}")
    _, h, w = raw.shape
    cells = raw.reshape(raw.shape[0], -1).T.astype(np.float64)  # (H·W) × (5+C)
    gy, gx = np.divmod(np.arange(h * w), w)
    cx = (np.tanh(cells[:, 1]) + gx) / w
    cy = (np.tanh(cells[:, 2]) + gy) / h
    bw = 1.0 / (1.0 + np.exp(-cells[:, 3]))
    bh = 1.0 / (1.0 + np.exp(-cells[:, 4]))
    obj = np.clip(cells[:, :1], 0, None)
    cls = np.clip(cells[:, 5:], 0, None)
    scores = obj ** 0.6 * cls ** 0.4
    boxes = _xywh_to_xyxy(np.stack([cx, cy, bw, bh], 1))
    return boxes.astype(np.float32), scores.astype(np.float32)


DECODERS: dict[str, Decoder] = {
    "yolox": decode_yolox,
    "yolov8": decode_yolov8,
    "ssd": decode_ssd,
    "fastestdet": decode_fastestdet,
}


def detections(boxes, scores, score_threshold: float, nms_threshold: float) -> list[Detection]:
    """Class-wise NMS'd detections with score ≥ threshold, best first (deterministic)."""
    import numpy as np

    dets: list[Detection] = []
    for c in range(scores.shape[1]):
        idx = np.nonzero(scores[:, c] >= score_threshold)[0]
        if idx.size == 0:
            continue
        for k in nms(boxes[idx], scores[idx, c], nms_threshold):
            i = idx[k]
            dets.append(Detection(tuple(float(v) for v in boxes[i]), float(scores[i, c]), c))
    dets.sort(key=lambda d: (-d.score, d.cls, d.box))
    return dets


def _matched_flags(ref: Sequence[Detection], cand: Sequence[Detection],
                   iou_threshold: float) -> list[bool]:
    flags = []
    used: set[int] = set()
    from .accuracy_yolo import iou

    if not ref:
        return [False] * len(cand)
    m = iou([c.box for c in cand], [r.box for r in ref]) if cand else None
    for i, c in enumerate(cand):
        best, best_j = iou_threshold, -1
        for j, r in enumerate(ref):
            if j not in used and r.cls == c.cls and m[i, j] >= best:
                if best_j < 0 or m[i, j] > best:
                    best, best_j = m[i, j], j
        if best_j >= 0:
            used.add(best_j)
        flags.append(best_j >= 0)
    return flags


def average_precision(scored: list[tuple[float, bool]], n_ref: int) -> float:
    """All-point interpolated AP of candidates (score, is_true_positive) against ``n_ref``
    reference detections."""
    if n_ref == 0:
        return 1.0 if not scored else 0.0
    scored = sorted(scored, key=lambda t: -t[0])
    tp = fp = 0
    points = []
    for _, ok in scored:
        tp, fp = tp + ok, fp + (not ok)
        points.append((tp / n_ref, tp / (tp + fp)))
    ap, prev_r = 0.0, 0.0
    for i, (r, _) in enumerate(points):
        p_interp = max(p for _, p in points[i:])
        ap += (r - prev_r) * p_interp
        prev_r = r
    return ap


def detection_metrics(ref_outputs: Sequence[Mapping[str, Any]],
                      cand_outputs: Sequence[Mapping[str, Any]],
                      options: Mapping[str, Any]) -> dict[str, Any]:
    """F1, precision, recall and AP50 of the candidate's detections against the
    reference's, pooled over samples. ``options``: decoder, score_threshold,
    nms_threshold, iou_threshold and the decoder's own options."""
    name = options.get("decoder", "yolox")
    decoder = DECODERS.get(name)
    if decoder is None:
        raise AccuracyError(f"unknown detection decoder '{name}' (known: "
                            f"{', '.join(sorted(DECODERS))})")
    thr = float(options.get("score_threshold", 0.3))
    nms_thr = float(options.get("nms_threshold", 0.45))
    iou_thr = float(options.get("iou_threshold", 0.5))
    tp = n_ref = n_cand = 0
    scored: list[tuple[float, bool]] = []
    for r, c in zip(ref_outputs, cand_outputs, strict=True):
        dr = detections(*decoder(r, options), thr, nms_thr)
        dc = detections(*decoder(c, options), thr, nms_thr)
        t = match(dr, dc, iou_thr)
        tp, n_ref, n_cand = tp + t, n_ref + len(dr), n_cand + len(dc)
        scored.extend(zip((d.score for d in dc), _matched_flags(dr, dc, iou_thr)))
    denom = n_ref + n_cand
    return {
        "score": 1.0 if denom == 0 else 2.0 * tp / denom,
        "f1": 1.0 if denom == 0 else 2.0 * tp / denom,
        "precision": 1.0 if n_cand == 0 else tp / n_cand,
        "recall": 1.0 if n_ref == 0 else tp / n_ref,
        "ap50": average_precision(scored, n_ref),
        "reference_detections": n_ref,
        "candidate_detections": n_cand,
        "matched": tp,
        "decoder": name,
    }
