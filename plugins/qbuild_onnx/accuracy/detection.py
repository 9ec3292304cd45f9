"""Detection evaluation for several detector families: pluggable decoders from raw model
outputs to boxes and per-class scores, then class-wise NMS and F1 / AP50 of a candidate
model against the reference model's own detections.

A decoder is ``decoder(outputs: dict[name, array], options) -> (boxes N×4 xyxy, scores
N×C)`` for one image (a leading batch axis of 1 is removed). Boxes may be in any unit
(pixels or normalised): IoU does not depend on it (labelled metrics map them to the
image: ``BOX_UNITS`` gives each decoder's unit). Built-in decoders:

* ``yolox``: one N×A×(5+C) output, (cx, cy, w, h) in grid units, objectness, C class
  scores; decoded with grids and strides (see ``accuracy_yolo``). With ``layout`` set to
  a decoded layout (``decode_in_inference`` exports) it is read as ``decoded``.
* ``yolov8``: one [1, 4+C, A] output (Ultralytics YOLOv5u/v8/v11 exports): (cx, cy, w, h)
  in input pixels then C class probabilities, no objectness: the decoded layout
  ``xywh_cls``. A [1, A, 4+C] layout is recognised too (the axis of size 4+C is the
  smaller one); ``layout`` declares another.
* ``decoded``: one already decoded [1, boxes, fields] (or [1, fields, boxes]) output,
  with ``layout`` (``accuracy.decoded``: xywh_obj_cls, xyxy_obj_cls, xywh_cls, xyxy_cls,
  or auto from ``num_classes``); YOLOv5/v7 exports are ``xywh_obj_cls``.
* ``ssd``: two outputs, boxes [1, A, 4] (xyxy) and scores [1, A, C]; with
  ``background_class = true`` column 0 is dropped.
* ``fastestdet``: one [1, 5+C, H, W] head: objectness, 4 box regressions, C class
  probabilities per cell; centre = (tanh(r) + cell) / grid, size = sigmoid(r), score =
  obj^0.6 · cls^0.4 (the FastestDet convention). A decoded [1, H·W, 5+C] export is read
  as ``decoded`` with layout ``xywh_obj_cls`` unless ``layout`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.arrays import Float32Array, FloatArray
from qbuild_onnx_common.errors import OnnxError

from . import decoded
from .yolo import Detection, box_of

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

# (A x 4 xyxy boxes, A x C class scores) from one sample's outputs and the options
Decoder = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[FloatArray, FloatArray]]


def _one(a: ArrayLike) -> Float32Array:
    import numpy as np

    array = np.asarray(a, dtype=np.float32)
    if array.ndim >= 2 and array.shape[0] == 1:
        array = array[0]
    return array


def _single_output(outputs: Mapping[str, Any], options: Mapping[str, Any], decoder: str
                   ) -> Float32Array:
    name = options.get("output") or ""
    if name:
        if name not in outputs:
            raise OnnxError(f"{decoder} decoder: no output '{name}' "
                                f"(outputs: {', '.join(outputs)})")
        return _one(outputs[name])
    return _one(outputs[sorted(outputs)[0]] if len(outputs) > 1 else next(iter(outputs.values())))


def _num_classes(options: Mapping[str, Any]) -> int | None:
    n = options.get("num_classes")
    return int(n) if n else None


def decode_decoded(outputs: Mapping[str, Any], options: Mapping[str, Any]
                   ) -> tuple[FloatArray, FloatArray]:
    raw = _single_output(outputs, options, "decoded")
    return decoded.decode(raw, str(options.get("layout", decoded.AUTO)),
                          _num_classes(options), "decoded decoder")


def decode_yolox(outputs: Mapping[str, Any], options: Mapping[str, Any]
                 ) -> tuple[FloatArray, FloatArray]:
    from .yolo import DEFAULT_STRIDES, decode

    raw = _single_output(outputs, options, "yolox")
    layout = str(options.get("layout", "raw"))
    if layout != "raw":  # a decode_in_inference export
        return decoded.decode(raw, layout, _num_classes(options), "yolox decoder")
    return decode(raw, int(options.get("input_size", 416)),
                  tuple(options.get("strides", DEFAULT_STRIDES)))


def _xywh_to_xyxy(b: FloatArray) -> FloatArray:
    import numpy as np

    return np.concatenate([b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2], 1)


def decode_yolov8(outputs: Mapping[str, Any], options: Mapping[str, Any]
                  ) -> tuple[FloatArray, FloatArray]:
    raw = _single_output(outputs, options, "yolov8")
    return decoded.decode(raw, str(options.get("layout", "xywh_cls")),
                          _num_classes(options), "yolov8 decoder")


def decode_ssd(outputs: Mapping[str, Any], options: Mapping[str, Any]
               ) -> tuple[FloatArray, FloatArray]:
    arrays = {k: _one(v) for k, v in outputs.items()}
    boxes_name = options.get("boxes_output") or next(
        (k for k, v in sorted(arrays.items()) if v.ndim == 2 and v.shape[-1] == 4), None)
    scores_name = options.get("scores_output") or next(
        (k for k, v in sorted(arrays.items()) if k != boxes_name and v.ndim == 2), None)
    if boxes_name is None or scores_name is None:
        raise OnnxError("ssd decoder: needs a boxes output [1, A, 4] and a scores output "
                            f"[1, A, C] (outputs: "
                            f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in arrays.items())})")
    boxes, scores = arrays[boxes_name], arrays[scores_name]
    if boxes.shape[0] != scores.shape[0]:
        raise OnnxError(f"ssd decoder: {boxes.shape[0]} boxes but {scores.shape[0]} scores")
    if options.get("background_class", False):
        scores = scores[:, 1:]
    return boxes, scores


def decode_fastestdet(outputs: Mapping[str, Any], options: Mapping[str, Any]
                      ) -> tuple[FloatArray, FloatArray]:
    import numpy as np

    raw = _single_output(outputs, options, "fastestdet")
    layout = str(options.get("layout", "raw" if raw.ndim == 3 else "xywh_obj_cls"))
    if layout != "raw":  # decoded in the graph: [1, H·W, 5+C] rows
        return decoded.decode(raw, layout, _num_classes(options), "fastestdet decoder")
    if raw.ndim != 3 or raw.shape[0] < 6:
        raise OnnxError(f"fastestdet decoder: layout raw needs a [1, 5+C, H, W] head, got "
                        f"[{', '.join(str(d) for d in raw.shape)}]")
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
    "decoded": decode_decoded,
    "ssd": decode_ssd,
    "fastestdet": decode_fastestdet,
}

# The unit of each decoder's boxes (``box_units`` overrides): input pixels, or
# fractions of the input's width and height.
BOX_UNITS = {"yolox": "pixels", "yolov8": "pixels", "decoded": "pixels",
             "ssd": "normalized", "fastestdet": "normalized"}


def decoder_of(options: Mapping[str, Any]) -> tuple[str, Decoder]:
    """The ``decoder`` option's name and function (default yolox)."""
    name = str(options.get("decoder", "yolox"))
    found = DECODERS.get(name)
    if found is None:
        raise OnnxError(f"unknown detection decoder '{name}' (known: "
                        f"{', '.join(sorted(DECODERS))})")
    return name, found


def layout_of(name: str, sample: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The layout the decoder ``name`` reads ``sample``'s output as (for reports)."""
    if name == "ssd":
        return "boxes+scores"
    raw = _single_output(sample, options, name)
    default = {"yolox": "raw", "yolov8": "xywh_cls", "decoded": decoded.AUTO,
               "fastestdet": "raw" if raw.ndim == 3 else "xywh_obj_cls"}[name]
    layout = str(options.get("layout", default))
    if layout == "raw":
        return layout
    return decoded.resolve(tuple(int(d) for d in raw.shape), layout,
                           _num_classes(options), f"{name} decoder")[0]


# As in common YOLO post-processing: at most this many candidates enter NMS and this many
# detections leave it per image. A badly quantized model can push every anchor over the
# threshold; without the cap NMS would cost (anchors²) per class.
MAX_CANDIDATES = 3000
MAX_DETECTIONS = 300


def _greedy_nms(boxes: FloatArray, scores: FloatArray, threshold: float) -> list[int]:
    """Greedy NMS computing one IoU row per kept box (memory O(n)); ties in score are
    broken by index, as in ``accuracy_yolo.nms``."""
    import numpy as np

    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores, np.float64)))
    b = np.asarray(boxes, np.float64)
    area = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    alive = np.ones(len(scores), dtype=bool)
    keep = []
    for i in order:
        if not alive[i]:
            continue
        keep.append(int(i))
        tl = np.maximum(b[i, :2], b[:, :2])
        br = np.minimum(b[i, 2:], b[:, 2:])
        inter = np.prod(np.clip(br - tl, 0, None), axis=1)
        union = area[i] + area - inter
        iou_row = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
        alive &= ~(iou_row > threshold)
    return keep


def detections(boxes: FloatArray, scores: FloatArray, score_threshold: float,
               nms_threshold: float) -> list[Detection]:
    """Class-wise NMS'd detections with score ≥ threshold, best first (deterministic),
    at most MAX_CANDIDATES into NMS and MAX_DETECTIONS out."""
    import numpy as np

    rows, cols = np.nonzero(scores >= score_threshold)
    if rows.size > MAX_CANDIDATES:
        vals = scores[rows, cols]
        top = np.lexsort((rows, -vals))[:MAX_CANDIDATES]
        rows, cols = rows[top], cols[top]
    dets: list[Detection] = []
    for c in np.unique(cols):
        idx = rows[cols == c]
        for k in _greedy_nms(boxes[idx], scores[idx, c], nms_threshold):
            i = idx[k]
            dets.append(Detection(box_of(boxes[i]), float(scores[i, c]), int(c)))
    dets.sort(key=lambda d: (-d.score, d.cls, d.box))
    return dets[:MAX_DETECTIONS]


def _matched_flags(ref: Sequence[Detection], cand: Sequence[Detection],
                   iou_threshold: float) -> list[bool]:
    """Per candidate (best first): matched one-to-one to an unused reference detection of
    the same class with IoU >= threshold (the best such IoU, lowest index on ties)."""
    import numpy as np

    from .yolo import iou

    if not ref or not cand:
        return [False] * len(cand)
    m = iou([c.box for c in cand], [r.box for r in ref])
    same = np.array([[r.cls == c.cls for r in ref] for c in cand])
    m = np.where(same & (m >= iou_threshold), m, -1.0)
    flags = []
    for i in range(len(cand)):
        j = int(np.argmax(m[i]))
        if m[i, j] < 0:
            flags.append(False)
            continue
        flags.append(True)
        m[:, j] = -1.0
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


BOOTSTRAP_ROUNDS = 2000
LOWER_QUANTILE = 0.10  # f1_lower: the one-sided 90 % lower confidence bound


def f1_lower_bound(per_sample: Sequence[tuple[int, int, int]]) -> float:
    """The one-sided 90 % lower confidence bound of the pooled F1, by a seeded bootstrap
    over samples (``per_sample``: matched, reference and candidate detections of each).

    A pooled F1 over a few images with few detections moves in large steps; a trial
    that only just meets a bar on one selection set often misses it on the next. A bar
    on this bound (``min_f1_lower``) asks that it would still be met on most resamplings
    of the selection set. Deterministic: the same counts give the same bound."""
    import numpy as np

    if not per_sample:
        return 1.0
    counts = np.asarray(per_sample, dtype=np.float64)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(counts), size=(BOOTSTRAP_ROUNDS, len(counts)))
    sums = counts[picks].sum(axis=1)  # rounds x (tp, n_ref, n_cand)
    denom = sums[:, 1] + sums[:, 2]
    f1 = np.where(denom > 0, 2.0 * sums[:, 0] / np.maximum(denom, 1.0), 1.0)
    return round(float(np.quantile(f1, LOWER_QUANTILE, method="lower")), 6)


def detection_metrics(ref_outputs: Sequence[Mapping[str, Any]],
                      cand_outputs: Sequence[Mapping[str, Any]],
                      options: Mapping[str, Any]) -> dict[str, Any]:
    """F1 (and its bootstrap lower bound ``f1_lower``), precision, recall and AP50 of the
    candidate's detections against the reference's, pooled over samples. ``options``:
    decoder, score_threshold, nms_threshold, iou_threshold and the decoder's own options."""
    name, decoder = decoder_of(options)
    thr = float(options.get("score_threshold", 0.3))
    nms_thr = float(options.get("nms_threshold", 0.45))
    iou_thr = float(options.get("iou_threshold", 0.5))
    tp = n_ref = n_cand = 0
    scored: list[tuple[float, bool]] = []
    per_sample: list[tuple[int, int, int]] = []
    for r, c in zip(ref_outputs, cand_outputs, strict=True):
        dr = detections(*decoder(r, options), thr, nms_thr)
        dc = detections(*decoder(c, options), thr, nms_thr)
        flags = _matched_flags(dr, dc, iou_thr)  # the same greedy matching as match()
        tp, n_ref, n_cand = tp + sum(flags), n_ref + len(dr), n_cand + len(dc)
        per_sample.append((sum(flags), len(dr), len(dc)))
        scored.extend(zip((d.score for d in dc), flags))
    denom = n_ref + n_cand
    return {
        "f1_lower": f1_lower_bound(per_sample),
        "score": 1.0 if denom == 0 else 2.0 * tp / denom,
        "f1": 1.0 if denom == 0 else 2.0 * tp / denom,
        "precision": 1.0 if n_cand == 0 else tp / n_cand,
        "recall": 1.0 if n_ref == 0 else tp / n_ref,
        "ap50": average_precision(scored, n_ref),
        "reference_detections": n_ref,
        "candidate_detections": n_cand,
        "matched": tp,
        "decoder": name,
        "layout": layout_of(name, ref_outputs[0], options) if ref_outputs else None,
    }
