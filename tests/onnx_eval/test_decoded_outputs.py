"""Detection decoders on decoded outputs: real ONNX models (built in grid_detector, run by
onnxruntime) whose output is a decoded [1, boxes, 4+1+classes] tensor, read by the
``decoded`` decoder (declared or auto layout, either orientation, corner boxes), by
``fastestdet`` (a FastestDet-style [1, 484, 85] export, refused before) and by ``yolox``
with a declared layout; and the one-line errors when a layout cannot be read."""

from __future__ import annotations

import numpy as np
import pytest
from grid_detector import fastestdet_decoded, grid_detector, run
from qbuild_onnx.accuracy import tasks as et
from qbuild_onnx.accuracy.detection import DECODERS, detection_metrics, detections
from qbuild_onnx_common.errors import OnnxError


def _image(size: int, squares: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """[1, 3, size, size] black with (x1, y1, x2, y2, channel) squares at 1.0."""
    img = np.zeros((1, 3, size, size), np.float32)
    for x1, y1, x2, y2, ch in squares:
        img[0, ch, y1:y2, x1:x2] = 1.0
    return img


def _dets(outputs, options, thr=0.2):
    name = options.get("decoder", "decoded")
    return detections(*DECODERS[name](outputs, options), thr, 0.45)


@pytest.mark.parametrize("options", [
    {"layout": "xywh_obj_cls"},
    {"layout": "auto", "num_classes": 2},
])
def test_decoded_rows_give_the_cells_boxes(options):
    out = run(grid_detector(), _image(32, [(8, 8, 16, 16, 0), (16, 24, 24, 32, 1)]))
    assert out["dets"].shape == (1, 16, 7)
    found = _dets(out, {"decoder": "decoded", **options})
    assert [(d.box, d.cls) for d in found] == [((8.0, 8.0, 16.0, 16.0), 0),
                                               ((16.0, 24.0, 24.0, 32.0), 1)]
    assert found[0].score == pytest.approx(1 / 3, abs=1e-6)  # objectness x class


def test_transposed_and_corner_layouts():
    img = _image(32, [(0, 8, 8, 16, 0)])
    t = run(grid_detector(transposed=True), img)
    assert t["dets"].shape == (1, 7, 16)  # fields first, as Ultralytics writes
    assert [d.box for d in _dets(t, {"layout": "xywh_obj_cls"})] == [(0.0, 8.0, 8.0, 16.0)]
    c = run(grid_detector(corners=True), img)
    assert [d.box for d in _dets(c, {"layout": "xyxy_obj_cls"})] == [(0.0, 8.0, 8.0, 16.0)]
    # the same tensor read as centre boxes is a different (wrong) box: the layout matters
    assert [d.box for d in _dets(c, {"layout": "xywh_obj_cls"})] != [(0.0, 8.0, 8.0, 16.0)]


def test_a_fastestdet_decoded_export_is_read():
    model = fastestdet_decoded()
    img = np.zeros((1, 3, 22, 22), np.float32)
    img[0, 0, 5, 9] = 1.0  # a red pixel in cell (row 5, column 9)
    out = run(model, img)
    assert out["dets"].shape == (1, 484, 85)
    found = _dets(out, {"decoder": "fastestdet"})
    assert len(found) == 1 and found[0].cls == 16
    cx, cy = (9 + 0.5) / 22, (5 + 0.5) / 22
    assert found[0].box == pytest.approx((cx - 1.5 / 22, cy - 1.5 / 22, cx + 1.5 / 22,
                                          cy + 1.5 / 22), abs=1e-6)
    m = detection_metrics([out], [out], {"decoder": "fastestdet", "score_threshold": 0.2})
    assert (m["f1"], m["reference_detections"], m["layout"]) == (1.0, 1, "xywh_obj_cls")
    # the raw head of FastestDet is still read as before
    head = np.zeros((1, 8, 4, 4), np.float32)
    head[0, 0, 2, 1], head[0, 7, 2, 1] = 0.9, 0.95
    raw = detection_metrics([{"h": head}], [{"h": head}], {"decoder": "fastestdet"})
    assert raw["reference_detections"] == 1 and raw["layout"] == "raw"


def test_yolox_with_a_declared_decoded_layout():
    out = run(grid_detector(), _image(32, [(24, 0, 32, 8, 1)]))
    found = _dets(out, {"decoder": "yolox", "layout": "xywh_obj_cls"})
    assert [(d.box, d.cls) for d in found] == [((24.0, 0.0, 32.0, 8.0), 1)]


def test_layouts_that_cannot_be_read_are_one_line_errors():
    out = run(grid_detector(), _image(32, []))
    cases = [
        ({"decoder": "decoded"}, "cannot tell whether the output [16, 7] has an objectness "
                                 "field: set task_options.layout"),
        ({"decoder": "decoded", "num_classes": 80}, "layout auto with 80 classes needs 84 "
                                                    "or 85 fields on one axis, the output "
                                                    "is [16, 7]"),
        ({"decoder": "decoded", "layout": "xywh_obj_cls", "num_classes": 3},
         "needs 8 fields on one axis"),
        ({"decoder": "decoded", "layout": "xyxy"}, "unknown layout 'xyxy'"),
        ({"decoder": "fastestdet", "layout": "raw"}, "layout raw needs a [1, 5+C, H, W] "
                                                     "head, got [16, 7]"),
    ]
    for options, message in cases:
        with pytest.raises(OnnxError) as e:
            detection_metrics([out], [out], options)
        text = str(e.value)
        assert message in text and "\n" not in text, text
    narrow = {"dets": np.zeros((1, 16, 5), np.float32)}
    with pytest.raises(OnnxError, match=r"layout xywh_obj_cls needs at least 6 fields"):
        detection_metrics([narrow], [narrow], {"decoder": "decoded", "layout": "xywh_obj_cls"})
    four_d = {"dets": np.zeros((1, 3, 16, 7), np.float32)}
    with pytest.raises(OnnxError, match=r"needs a \[1, rows, fields\] or \[1, fields, rows\]"):
        detection_metrics([four_d], [four_d], {"decoder": "decoded", "layout": "xywh_cls"})


def test_new_task_options_are_typed_at_analysis():
    assert et.option_problem({"layout": "xywh_obj_cls", "num_classes": 80,
                              "category_ids": "coco80", "box_units": "pixels",
                              "map_score_threshold": 0.001}) is None
    assert et.option_problem({"category_ids": [1, 2, 3]}) is None
    assert "task_options.layout: 'xywh' is not one of raw, auto" in et.option_problem(
        {"layout": "xywh"})
    assert "task_options.box_units" in et.option_problem({"box_units": "px"})
    assert 'category_ids: expected a list of integers (one category id per class) or ' \
           '"coco80"' in et.option_problem({"category_ids": "coco"})
    assert "num_classes: expected an integer" in et.option_problem({"num_classes": 2.5})
