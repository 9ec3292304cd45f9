"""Issue 25 point 2: a set too small to decide is said, on the console (one line naming
the target) and on the page, with its counts. Real YOLOX-Nano on the shipped photographs
(testdata/photos) for ``evaluate``; MNIST for ``auto_quantize``'s selection set; and the
arithmetic of the rule of three on its own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_paths import MODELS, ROOT, digits
from qbuild_onnx.accuracy.evidence import RULE_OF_THREE, needed, problems, tolerated

PHOTOS = ROOT / "testdata" / "photos"
YOLOX = ROOT / "examples" / "yolo" / "yolox_nano.onnx"
# five photographs with one YOLOX-Nano detection each (person, cat, dog, bird, cup)
FIVE = ["dav2_grand_hall.jpg", "winml_cat.jpg", "winml_puppy.jpg", "winml_hummingbird.jpg",
        "triton_mug.jpg"]

EVALUATE = """
[fp32]
rule = "onnx_model"
src = "yolox_nano.onnx"

[photos]
rule = "image_dataset"
images = ["photos"]
input = "images"
size = [416, 416]
resize = "letterbox"
align = "topleft"
color = "BGR"
scale = 1.0
split = "{split}"

[ev]
rule = "evaluate"
reference = ":fp32"
models = [":fp32"]
dataset = ":photos"
task = "yolo"
min_f1 = {min_f1}
"""


def _workspace(ws, names, split="all", min_f1=0.95):
    ws.copy(YOLOX, "d/yolox_nano.onnx")
    for name in names:
        ws.copy(PHOTOS / name, f"d/photos/{name}")
    ws.write("d/BUILD.toml", EVALUATE.format(split=split, min_f1=min_f1))
    return ws


def _page_and_report(ws_outputs):
    outs = {p.name: p for p in ws_outputs}
    return outs["report.html"].read_text(), json.loads(outs["report.json"].read_text())


def _warnings(console: str) -> list[str]:
    return [line for line in console.splitlines() if "too small to decide" in line]


def test_a_five_detection_set_is_too_small_on_the_console_and_the_page(qbuild_workspace):
    ws = _workspace(qbuild_workspace, FIVE)
    run = ws.cli("build", "//d:ev")  # the real command line's console
    assert run.code == 0, run.stdout + run.stderr
    (line,) = _warnings(run.stdout + run.stderr)
    assert line.startswith("WARNING: //d:ev: the evaluation set is too small to decide: ")
    assert "only 5 reference detections (fewer than 30)" in line
    assert "only 5 distinct images (fewer than 10)" in line
    assert "(5 samples from 5 distinct images; 5 reference detections of 5 of 80 " \
        "classes)" in line
    r = ws.build("//d:ev")  # cached: the page and the report
    page, report = _page_and_report(r.outputs("//d:ev"))
    assert report["evaluation_set"] == {"samples": 5, "images": 5, "reference_detections": 5,
                                        "classes_seen": 5, "classes": 80}
    assert 'id="set-warning"' in page and "only 5 reference detections" in page
    assert "5 samples from 5 distinct images; 5 reference detections of 5 of 80 classes" in page


def test_the_evaluation_split_of_the_photographs_is_large_enough(qbuild_workspace):
    names = sorted(p.name for p in PHOTOS.iterdir() if p.suffix in (".jpg", ".png"))
    ws = _workspace(qbuild_workspace, names, split="evaluation")
    r = ws.build("//d:ev")
    assert r.ok, r.error
    assert not _warnings(r.log), r.log
    page, report = _page_and_report(r.outputs("//d:ev"))
    counts = report["evaluation_set"]
    assert counts["samples"] == counts["images"] == 31
    assert counts["reference_detections"] >= 60
    assert 'id="set-warning"' not in page
    assert f"{counts['reference_detections']} reference detections of " in page
    # a stricter bar on the same set: one miss would decide it; only the check reruns
    ws.write("d/BUILD.toml", EVALUATE.format(split="evaluation", min_f1=0.99))
    r = ws.build("//d:ev")
    assert r.ok, r.error
    assert r.actions["//d:ev"] == {"Evaluate": "cached", "CheckBars": "ran"}
    (line,) = _warnings(r.log)
    assert "min_f1 = 0.99 allows 1 missed detection among" in line
    assert "fewer than 3 (rule of three: 152 reference detections would allow 3)" in line
    page, _ = _page_and_report(r.outputs("//d:ev"))
    assert "min_f1 = 0.99 allows 1 missed detection" in page


SEARCH = """
[fp]
rule = "onnx_model"
src = "mnist.onnx"

[calib_data]
rule = "numpy_dataset"
files = ["calib.npy"]
mapping = { Input3 = "calib.npy" }

[select_data]
rule = "numpy_dataset"
files = ["select.npy"]
mapping = { Input3 = "select.npy" }

[auto]
rule = "auto_quantize"
model = ":fp"
calibration_data = ":calib_data"
evaluation_data = ":select_data"
task = "classification"
bar = { max_top1_drop = 0.2 }
objective = "size"
latency_runs = 0
steps = ["per_channel"]
"""


@pytest.mark.parametrize(("samples", "warns"), [(5, True), (40, False)])
def test_a_search_says_once_when_its_selection_set_is_too_small(qbuild_workspace, samples,
                                                                warns):
    ws = qbuild_workspace
    ws.copy(MODELS / "mnist.onnx", "m/mnist.onnx")
    np.save(ws.path("m/calib.npy"), digits(0, 12))
    np.save(ws.path("m/select.npy"), digits(1, samples))
    ws.write("m/BUILD.toml", SEARCH)
    r = ws.build("//m:auto")
    assert r.ok, r.error
    outs = {p.name: p for p in r.outputs("//m:auto")}
    result = json.loads(outs["report.json"].read_text())
    assert result["selection_set"]["predictions"] == samples
    page = outs["report.html"].read_text()
    assert f"{samples} samples; {samples} predictions of " in page
    lines = _warnings(r.log)
    if not warns:
        assert not lines and "warning" not in result["selection_set"]
        return
    (line,) = lines  # one line for the search, none per trial
    assert line.startswith("WARNING: //m:auto: the selection set is too small to decide: ")
    assert "only 5 predictions (fewer than 30)" in line
    assert "max_top1_drop = 0.2 allows 1 disagreement among 5, fewer than 3" in line
    assert 'id="set-warning"' in page and "only 5 predictions" in page


def test_the_rule_of_three():
    # min_f1 = b on n detections allows floor(2n(1-b)/(2-b)) misses; needed() is the
    # smallest n that allows three
    for bar in ("min_f1", "min_f1_lower", "min_ap50", "max_top1_drop",
                "min_top1_agreement"):
        for value in (0.9, 0.95, 0.97, 0.99):
            v = 1 - value if bar == "max_top1_drop" else value
            n = needed(bar, v)
            assert tolerated(bar, v, n) == RULE_OF_THREE, (bar, v)
            assert tolerated(bar, v, n - 1) < RULE_OF_THREE, (bar, v)
    assert tolerated("min_f1", 0.97, 40) == 2 and needed("min_f1", 0.97) == 52
    assert tolerated("max_top1_drop", 0.05, 31) == 1 and needed("max_top1_drop", 0.05) == 60
    # a bar that asks for no miss on purpose is not a set-size problem; SQNR counts nothing
    assert tolerated("max_top1_drop", 0.0, 100) is None
    assert tolerated("min_sqnr_db", 30.0, 100) is None
    big = {"samples": 200, "images": 200, "reference_detections": 500, "classes_seen": 40,
           "classes": 80}
    assert problems(big, {"min_f1": 0.95, "min_sqnr_db": 30}) == []
    few_classes = {"samples": 60, "images": 60, "predictions": 60, "classes_seen": 1,
                   "classes": 2}
    assert problems(few_classes, {}) == ["the reference finds 1 of the task's 2 classes"]
    crops = {"samples": 64, "images": 4, "reference_detections": 200}
    (why,) = problems(crops, {})
    assert why.startswith("its 64 samples come from 4 distinct images (fewer than 10")
