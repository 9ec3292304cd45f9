"""YOLO decoding and detection F1 on the real YOLOX-Nano model."""

from __future__ import annotations

import numpy as np
import pytest
from acc_paths import IMAGES, ROOT
from qbuild_onnx.accuracy import yolo as ay
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.ort import session

YOLO = ROOT / "examples" / "yolo" / "yolox_nano.onnx"


@pytest.fixture(scope="module")
def dog_output():
    x, _ = ay.letterbox(ay.load_rgb(IMAGES / "dog.jpg"))
    return session(YOLO).run(None, {"images": x})[0]


def test_letterbox_layout():
    rgb = np.zeros((100, 200, 3), np.uint8)
    rgb[..., 0] = 255  # pure red
    x, r = ay.letterbox(rgb, 416)
    assert x.shape == (1, 3, 416, 416) and r == pytest.approx(2.08)
    assert x[0, 2, 0, 0] == 255 and x[0, 0, 0, 0] == 0  # BGR: red is channel 2
    assert x[0, 1, 415, 0] == 114  # padding below the image


def test_pineapple_rgba_png_loads_as_rgb():
    assert ay.load_rgb(IMAGES / "pineapple.jpg").shape[2] == 3


def test_grids_cover_all_strides():
    g, s = ay.grids(416)
    assert g.shape == (3549, 2) and s.shape == (3549, 1)
    assert tuple(g[1]) == (1, 0) and tuple(g[52]) == (0, 1)  # x varies fastest
    assert s[0, 0] == 8 and s[-1, 0] == 32


def test_dog_image_detections(dog_output):
    names = ay.load_class_names(ROOT / "examples" / "yolo" / "coco_classes.txt")
    dets = ay.detect(dog_output)
    found = {names[d.cls] for d in dets}
    assert {"dog", "bicycle"} <= found
    assert found & {"car", "truck"}
    dog = next(d for d in dets if names[d.cls] == "dog")
    # the dog sits in the lower-left half of the 768×576 image (scaled by 416/768)
    assert dog.box[0] < 208 and dog.box[3] > 208


def test_detection_f1_identical_and_degraded(dog_output):
    same = ay.detection_f1([dog_output], [dog_output.copy()])
    assert same["f1"] == 1.0 and same["matched"] == same["reference_detections"] >= 3
    worse = dog_output.copy()
    worse[..., 4] *= 0.2  # objectness collapses: everything falls below 0.3
    res = ay.detection_f1([dog_output], [worse])
    assert res["f1"] == 0.0 and res["recall"] == 0.0


def test_match_requires_same_class_and_iou():
    ref = [ay.Detection((0, 0, 10, 10), 0.9, 1)]
    assert ay.match(ref, [ay.Detection((1, 1, 10, 10), 0.8, 1)]) == 1
    assert ay.match(ref, [ay.Detection((1, 1, 10, 10), 0.8, 2)]) == 0
    assert ay.match(ref, [ay.Detection((6, 6, 16, 16), 0.8, 1)]) == 0


def test_nms_suppresses_overlaps():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], float)
    assert ay.nms(boxes, np.array([0.9, 0.8, 0.7]), 0.45) == [0, 2]


def test_decode_rejects_wrong_shape():
    with pytest.raises(OnnxError, match="3549 anchor points"):
        ay.decode(np.zeros((1, 100, 85), np.float32))
