"""COCO-style mean average precision of detections against ground-truth boxes.

The definition is COCO's detection evaluation (bbox, area range "all"), written here
from its published description:

* IoU thresholds 0.50, 0.55, ..., 0.95; at most ``max_dets`` (100) detections per image
  and category, the highest-scoring ones.
* Per image, category and threshold, detections are taken best score first; each takes
  the unmatched ground-truth box of its category with the highest IoU at or above the
  threshold (a true positive), or none (a false positive). A crowd box (``iscrowd``)
  never counts as a miss; a detection that only overlaps one (intersection over the
  *detection's* area at or above the threshold) is ignored, neither true nor false.
* Per category and threshold, the detections of every image are ranked by score;
  precision is made non-increasing in recall (the envelope from the right) and read at
  the 101 recall points 0, 0.01, ..., 1 (the first rank reaching each; 0 past the last
  recall reached). AP is the mean of those 101 values.
* A category with no (non-crowd) ground-truth box in the evaluated images has no AP and
  is left out of the mean, whatever was detected for it. mAP@[.5:.95] is the mean over
  categories of the mean over thresholds; mAP@.5 / mAP@.75 the mean at one threshold.

Boxes are x1, y1, x2, y2 in one coordinate system (areas are w·h, no +1). Ties in score
keep the given order (image order, then rank in the image), so results are
deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qbuild_onnx_common.arrays import Float64Array

IOU_THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
RECALL_POINTS = tuple(i / 100 for i in range(101))
MAX_DETS = 100

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Truth:
    """A ground-truth box of one image."""

    box: Box
    category: int
    crowd: bool = False


@dataclass(frozen=True)
class Scored:
    """A detection of one image, in the ground truth's category ids."""

    box: Box
    score: float
    category: int


@dataclass
class _Category:
    """One category's detections over all images: their scores, and per detection and
    threshold (N x T) whether it is a true positive and whether it is ignored (it only
    overlaps a crowd box)."""

    positives: int = 0
    scores: list[float] = field(default_factory=list)
    tp: list[Any] = field(default_factory=list)  # one bool array (n x T) per image
    ignored: list[Any] = field(default_factory=list)


def _overlaps(dets: Sequence[Box], gts: Sequence[Box], crowd: Any) -> Float64Array:
    """D x G: IoU, or intersection over the detection's area where ``crowd`` (G bools)
    marks a crowd box."""
    import numpy as np

    d = np.asarray(dets, np.float64).reshape(-1, 4)
    g = np.asarray(gts, np.float64).reshape(-1, 4)
    tl = np.maximum(d[:, None, :2], g[None, :, :2])
    br = np.minimum(d[:, None, 2:], g[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area_d = np.prod(np.clip(d[:, 2:] - d[:, :2], 0, None), axis=1)[:, None]
    area_g = np.prod(np.clip(g[:, 2:] - g[:, :2], 0, None), axis=1)[None, :]
    union = np.where(np.asarray(crowd, bool)[None, :], area_d, area_d + area_g - inter)
    out: Float64Array = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
    return out


def _match_image(dets: Sequence[Scored], gts: Sequence[Truth], into: _Category) -> None:
    """Adds one image's detections of one category (best first) to ``into``, matched
    against that image's ground truth of the category at every threshold."""
    import numpy as np

    crowd = np.asarray([g.crowd for g in gts], bool)
    into.positives += int((~crowd).sum())
    if not dets:
        return
    ious = _overlaps([d.box for d in dets], [g.box for g in gts], crowd)
    tp = np.zeros((len(dets), len(IOU_THRESHOLDS)), bool)
    ignored = np.zeros_like(tp)
    for k, t in enumerate(IOU_THRESHOLDS):
        used = np.zeros(len(gts), bool)
        for i in range(len(dets)):
            open_ = ~crowd & ~used & (ious[i] >= t)
            if open_.any():
                j = int(np.argmax(np.where(open_, ious[i], -1.0)))  # best IoU, first on ties
                used[j] = tp[i, k] = True
            else:
                ignored[i, k] = bool((crowd & (ious[i] >= t)).any())
    into.tp.append(tp)
    into.ignored.append(ignored)
    into.scores.extend(d.score for d in dets)


def _ap(cat: _Category) -> list[float]:
    """101-point interpolated AP of one category at every threshold."""
    import numpy as np

    if not cat.scores:
        return [0.0] * len(IOU_THRESHOLDS)
    order = np.argsort(-np.asarray(cat.scores, np.float64), kind="stable")
    tp = np.concatenate(cat.tp)[order]
    ignored = np.concatenate(cat.ignored)[order]
    points = np.asarray(RECALL_POINTS)
    out = []
    for k in range(len(IOU_THRESHOLDS)):
        hits = tp[~ignored[:, k], k]
        if not hits.size:
            out.append(0.0)
            continue
        ctp = np.cumsum(hits)
        precision = ctp / np.arange(1, hits.size + 1)
        recall = ctp / cat.positives
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        at = np.searchsorted(recall, points, side="left")
        reached = at < hits.size
        values = np.zeros(points.size)
        values[reached] = envelope[at[reached]]
        out.append(float(values.mean()))
    return out


def coco_map(images: Sequence[tuple[Sequence[Scored], Sequence[Truth]]],
             max_dets: int = MAX_DETS) -> dict[str, Any]:
    """mAP@[.5:.95], mAP@.5 and mAP@.75 over ``images`` (each: its detections and its
    ground truth), with the AP of each category (``per_category``: category id as a
    string -> mAP@[.5:.95] of that category) and how many were averaged."""
    cats: dict[int, _Category] = {}
    for dets, gts in images:
        for c in sorted({g.category for g in gts} | {d.category for d in dets}):
            mine = sorted((d for d in dets if d.category == c), key=lambda d: -d.score)
            _match_image(mine[:max_dets], [g for g in gts if g.category == c and not g.crowd]
                         + [g for g in gts if g.category == c and g.crowd],
                         cats.setdefault(c, _Category()))
    per = {c: _ap(cat) for c, cat in sorted(cats.items()) if cat.positives}
    if not per:
        return {"map": None, "map50": None, "map75": None, "per_category": {},
                "categories": 0}
    n = len(per)
    return {
        "map": sum(sum(v) / len(v) for v in per.values()) / n,
        "map50": sum(v[0] for v in per.values()) / n,
        "map75": sum(v[IOU_THRESHOLDS.index(0.75)] for v in per.values()) / n,
        "per_category": {str(c): round(sum(v) / len(v), 6) for c, v in per.items()},
        "categories": n,
    }
