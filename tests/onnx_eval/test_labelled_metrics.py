"""Labelled metrics through ``evaluate``: COCO mAP of a real decoded-output detector
against hand-written COCO annotations of generated images (letterboxed, so boxes are
mapped back to the image), top-1 / top-5 of MNIST against a CSV of labels by file name,
``max_drop`` bars (a bar change reruns only the check), and one-line errors for bad
ground truth and options.

Fixtures are made by the tests: PNG images drawn here (black with red and green squares)
and a COCO file written by hand below; MNIST comes from testdata/models (see NOTICE).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_paths import IMAGES, MODELS
from grid_detector import grid_detector, save
from PIL import Image
from qbuild_onnx.rules import accuracy as rules_accuracy
from qbuild_onnx.rules import source as rules_source

# a.png 32 x 32: a red square (class 0, category 1) and a green one (class 1,
# category 2); b.png 64 wide x 32 high: a red 16 x 16 square. Letterboxed into 32 x 32
# (centred, pad 0), b is halved and moved down 8 rows: its square lands on the cell
# [8, 8, 16, 16] of the input, which the detector reports exactly.
TRUTH = {
    "images": [{"id": 1, "file_name": "a.png", "width": 32, "height": 32},
               {"id": 2, "file_name": "b.png", "width": 64, "height": 32}],
    "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "green"}],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 8, 8], "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [16, 24, 8, 8], "iscrowd": 0},
        {"id": 3, "image_id": 2, "category_id": 1, "bbox": [16, 0, 16, 16], "iscrowd": 0},
    ],
}

BUILD = """
[ref]
rule = "onnx_model"
src = "ref.onnx"

[shifted]
rule = "onnx_model"
src = "shifted.onnx"

[imgs]
rule = "image_dataset"
images = ["images"]
input = "images"
size = [32, 32]
resize = "letterbox"
pad_value = 0.0
interpolation = "nearest"

[ev]
rule = "evaluate"
models = [":shifted"]
reference = ":ref"
dataset = ":imgs"
task = "detection"
task_options = {{ decoder = "decoded"{options} }}
ground_truth = "truth.json"
max_drop = {{ {drop} }}
"""


def _png(path, width, height, squares):
    a = np.zeros((height, width, 3), np.uint8)
    for x1, y1, x2, y2, ch in squares:
        a[y1:y2, x1:x2, ch] = 255
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from qbuild.testing import Workspace

    root = tmp_path_factory.mktemp("labelled")
    w = Workspace(root / "ws", root / "cache")
    for plugin in (rules_source, rules_accuracy):
        w.register(plugin)
    save(grid_detector(), w.path("m/ref.onnx"))
    # every box one input pixel (two image pixels on b) to the right: IoU 56/72 = 0.78
    save(grid_detector(shift=1.0), w.path("m/shifted.onnx"))
    _png(w.path("m/images/a.png"), 32, 32, [(8, 8, 16, 16, 0), (16, 24, 24, 32, 1)])
    _png(w.path("m/images/b.png"), 64, 32, [(16, 0, 32, 16, 0)])
    w.write("m/truth.json", json.dumps(TRUTH))
    return w


def _report(r, label="//m:ev"):
    return json.loads(next(p for p in r.outputs(label) if p.name == "report.json")
                      .read_text())


IDS = ", category_ids = [1, 2]"  # model class 0 is category 1, class 1 category 2


def test_map_against_coco_annotations_and_max_drop(ws):
    ws.write("m/BUILD.toml", BUILD.format(options=IDS, drop="map50 = 0.0"))
    r = ws.build("//m:ev")
    assert r.ok, r.error
    rep = _report(r)
    ref = rep["reference_labelled"]
    # the reference finds every box exactly (b's through the letterbox): mAP 1
    assert (ref["map"], ref["map50"], ref["labelled_samples"], ref["boxes"]) == (1.0, 1.0,
                                                                                2, 3)
    assert ref["per_category"] == {"1": 1.0, "2": 1.0}
    got = rep["models"]["//m:shifted"]["labelled"]
    # IoU 0.78 for every box: a hit at thresholds 0.50 .. 0.75 (6 of 10), a miss above
    assert got["map"] == pytest.approx(0.6) and got["map50"] == 1.0
    assert got["drop"] == {"map": pytest.approx(0.4), "map50": 0.0,
                           "map75": pytest.approx(0.0)}
    # layout auto: two category ids, so 7 fields are 4 + objectness + 2 classes
    task = rep["models"]["//m:shifted"]["task"]
    assert task["layout"] == "xywh_obj_cls" and task["f1"] == 1.0  # agreement: IoU > 0.5
    html = next(p for p in r.outputs("//m:ev") if p.name == "report.html").read_text()
    assert "map (labels)" in html and "map drop" in html

    # a bar on mAP@[.5:.95]: changing it runs no model again (only the check)
    ws.write("m/BUILD.toml", BUILD.format(options=IDS, drop="map = 0.5"))
    loose = ws.build("//m:ev")
    assert loose.ok and loose.actions == {"//m:ev": {"Evaluate": "cached", "CheckBars": "ran"}}
    # missed, it fails the build, naming the target and the attribute
    ws.write("m/BUILD.toml", BUILD.format(options=IDS, drop="map = 0.3"))
    bad = ws.build("//m:ev")
    assert not bad.ok and bad.exit_code == 1
    assert "//m:ev" in bad.failed and "attribute 'max_drop'" in bad.error
    assert "map drops by 0.4000 from the float model (to 0.6) > 0.3" in bad.error


LAYOUT = ', layout = "xywh_obj_cls"'


def test_the_ground_truth_file_is_in_the_key(ws):
    ws.write("m/BUILD.toml", BUILD.format(options=LAYOUT, drop="map50 = 0.0"))
    assert ws.build("//m:ev").ok
    moved = json.loads(json.dumps(TRUTH))
    moved["annotations"][2]["bbox"] = [0, 0, 16, 16]  # b's box elsewhere: b's red missed
    ws.write("m/truth.json", json.dumps(moved))
    try:
        r = ws.build("//m:ev")
        assert r.ok and "//m:ev" in r.ran
        ref = _report(r)["reference_labelled"]
        assert ref["per_category"]["1"] < 1.0 and ref["per_category"]["2"] == 1.0
    finally:
        ws.write("m/truth.json", json.dumps(TRUTH))


@pytest.mark.parametrize("change, message", [
    (lambda t: (t["images"].pop(1), t["annotations"].pop(2)),
     "image 'b.png' of the dataset is not in the annotations' images"),
    (lambda t: t["images"][1].update(width=32),
     "image 'b.png' is 64x32 but the annotations say 32x32"),
    (lambda t: t["annotations"][0].update(bbox=[1, 2, 3]),
     "annotations[0]: bbox must be [x, y, width, height]"),
    (lambda t: t["annotations"][0].update(category_id=9),
     "annotations[0]: category_id 9 is not in 'categories'"),
    (lambda t: t["categories"].append({"id": 3, "name": "blue"}),
     "the model scores 2 classes but 3 category ids map them (the categories of "
     "truth.json, sorted by id): give task_options.category_ids"),
])
def test_bad_annotations_are_one_line_errors(ws, change, message):
    bad = json.loads(json.dumps(TRUTH))
    change(bad)
    ws.write("m/bad.json", json.dumps(bad))
    ws.write("m/BUILD.toml", BUILD.format(options=LAYOUT, drop="").replace(
        '"truth.json"', '"bad.json"'))
    r = ws.build("//m:ev")
    assert not r.ok and r.exit_code == 1
    text = r.error.replace("bad.json", "truth.json")
    assert message in text and "\n" not in r.error.strip() and "Traceback" not in r.error
    # the file as the user knows it (the annotations' faults) or the options, with the
    # target and the attribute
    where = ("target //m:ev, attribute 'task_options'" if "category_ids" in message else
             "m/truth.json, target //m:ev, attribute 'ground_truth'")
    assert where in text


def test_explicit_category_ids_and_box_units(ws):
    # the model's classes named by id: class 0 -> 1, class 1 -> 2 (as the default)
    ws.write("m/BUILD.toml", BUILD.format(options=", category_ids = [1, 2]",
                                          drop="map50 = 0.0"))
    r = ws.build("//m:ev")
    assert r.ok and _report(r)["reference_labelled"]["map"] == 1.0
    # swapped: red boxes scored as green and the other way round
    ws.write("m/BUILD.toml", BUILD.format(options=", category_ids = [2, 1]", drop=""))
    assert _report(ws.build("//m:ev"))["reference_labelled"]["map"] == 0.0
    # boxes in pixels declared normalized: the reference contradicts it
    ws.write("m/BUILD.toml", BUILD.format(options=LAYOUT + ', box_units = "normalized"',
                                          drop=""))
    r = ws.build("//m:ev")
    assert not r.ok and "they look like pixels" in r.error and \
        "attribute 'task_options'" in r.error


@pytest.mark.parametrize("attrs, message", [
    ('max_drop = { map = 0.01 }', "attribute 'max_drop': max_drop needs ground_truth"),
    ('ground_truth = "truth.json"\nmax_drop = { mAP = 0.01 }',
     "attribute 'max_drop': unknown metric 'mAP' (known: map, map50, map75, top1, top5)"),
    ('ground_truth = "truth.json"\nmax_drop = { map = 5 }',
     "max_drop.map: expected an absolute drop from 0 to 1"),
    ('ground_truth = "truth.json"\nmax_drop = { top1 = 0.01 }',
     "max_drop.top1 is a classification metric, and task 'detection' measures detection"),
])
def test_bad_max_drop_is_an_analysis_error(ws, attrs, message):
    ws.write("m/BUILD.toml", BUILD.split("[ev]")[0] + f"""
[ev]
rule = "evaluate"
models = [":shifted"]
reference = ":ref"
dataset = ":imgs"
task = "detection"
task_options = {{ decoder = "decoded", layout = "xywh_obj_cls" }}
{attrs}
""")
    r = ws.build("//m:ev")
    assert not r.ok and r.exit_code == 2
    assert "m/BUILD.toml" in r.error and "//m:ev" in r.error and message in r.error


def test_ground_truth_needs_a_labelled_task(ws):
    ws.write("m/BUILD.toml", BUILD.split("[ev]")[0] + """
[ev]
rule = "evaluate"
models = [":shifted"]
reference = ":ref"
dataset = ":imgs"
ground_truth = "truth.json"
""")
    r = ws.build("//m:ev")
    assert not r.ok and r.exit_code == 2 and "attribute 'ground_truth'" in r.error
    assert "not 'sqnr'" in r.error


CLS_BUILD = """
[fp]
rule = "onnx_model"
src = "mnist.onnx"

[biased]
rule = "onnx_model"
src = "biased.onnx"

[digits]
rule = "image_dataset"
images = ["photos"]
input = "Input3"
size = [28, 28]
color = "GRAY"

[ev]
rule = "evaluate"
models = [":biased"]
reference = ":fp"
dataset = ":digits"
task = "classification"
ground_truth = "labels.csv"
max_drop = {{ {drop} }}
"""


def test_top1_against_labels_by_file_name(tmp_path):
    import onnx
    import onnxruntime as ort
    from qbuild_onnx.source.datasets import open_dataset

    from qbuild.testing import Workspace

    ws = Workspace(tmp_path / "ws", tmp_path / "cache")
    for plugin in (rules_source, rules_accuracy):
        ws.register(plugin)
    ws.copy(MODELS / "mnist.onnx", "c/mnist.onnx")
    names = sorted(p.name for p in IMAGES.iterdir() if p.suffix in (".jpg", ".png"))
    for n in names:
        ws.copy(IMAGES / n, f"c/photos/{n}")
    # the candidate: MNIST with its output bias raised for class 3, so it says 3
    model = onnx.load(str(MODELS / "mnist.onnx"))
    out = model.graph.output[0].name
    add = next(n for n in model.graph.node if n.output[0] == out)
    init = {i.name: i for i in model.graph.initializer}
    bias_name = next(i for i in add.input if i in init)
    bias = onnx.numpy_helper.to_array(init[bias_name]).copy()
    bias.reshape(-1)[3] += 1e4
    init[bias_name].CopyFrom(onnx.numpy_helper.from_array(bias, bias_name))
    onnx.save_model(model, str(ws.path("c/biased.onnx")))

    ws.write("c/labels.csv", "file,label\n" + "".join(f"{n},0\n" for n in names))
    ws.write("c/BUILD.toml", CLS_BUILD.format(drop=""))
    first = ws.build("//c:digits")
    assert first.ok, first.error
    # the float model's own classes on the dataset, as evaluate feeds it
    data = open_dataset(first.output("//c:digits"))
    sess = ort.InferenceSession(str(MODELS / "mnist.onnx"), providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(None, {"Input3": data.read("Input3", k, k + 1)})[0]
                             for k in range(len(names))])
    pred = logits.argmax(axis=1)
    # labels: the float model is right on the first four images, wrong on the rest
    labels = [int(p) if i < 4 else int(p + 1) % 10 for i, p in enumerate(pred)]
    ws.write("c/labels.csv", "file,label\n" + "".join(
        f"{n},{k}\n" for n, k in zip(names, labels)))
    want_top5 = np.mean([lab in np.argsort(-row, kind="stable")[:5]
                         for row, lab in zip(logits, labels)])
    ws.write("c/BUILD.toml", CLS_BUILD.format(drop="top1 = 1.0"))
    r = ws.build("//c:ev")
    assert r.ok, r.error
    rep = _report(r, "//c:ev")
    ref, cand = rep["reference_labelled"], rep["models"]["//c:biased"]["labelled"]
    assert ref["top1"] == pytest.approx(4 / len(names), abs=1e-6)
    assert ref["labelled_samples"] == len(names)
    assert ref["top5"] == pytest.approx(want_top5, abs=1e-6)
    assert cand["top1"] == pytest.approx(labels.count(3) / len(names), abs=1e-6)
    assert cand["drop"]["top1"] == pytest.approx(ref["top1"] - cand["top1"])
    # beside it, the agreement with the float model, as before
    assert rep["models"]["//c:biased"]["task"]["top1_agreement"] == pytest.approx(
        float(np.mean(pred == 3)))
    # a tight bar fails when the candidate is worse on the labels
    ws.write("c/BUILD.toml", CLS_BUILD.format(drop="top1 = 0.005"))
    tight = ws.build("//c:ev")
    assert tight.ok == (cand["drop"]["top1"] <= 0.005)
    if not tight.ok:
        assert "attribute 'max_drop'" in tight.error and "top1 drops by" in tight.error
    # a label that is not a class of the model
    ws.write("c/labels.csv", f"{names[0]},12\n" + "".join(f"{n},1\n" for n in names[1:]))
    bad = ws.build("//c:ev")
    assert not bad.ok and "labels.csv: label 12 of '" in bad.error and \
        "attribute 'ground_truth'" in bad.error
    # a missing image
    ws.write("c/labels.csv", "".join(f"{n},1\n" for n in names[1:]))
    missing = ws.build("//c:ev")
    assert not missing.ok and f"no label for image '{names[0]}'" in missing.error


@pytest.mark.parametrize("resize, align", [("stretch", "center"), ("letterbox", "center"),
                                           ("letterbox", "topleft"), ("crop", "center")])
def test_boxes_map_back_through_the_datasets_geometry(tmp_path, resize, align):
    # a white 40 x 20 box in an 80 x 60 image goes through image_dataset's own pixel
    # pipeline; the box found in the model input, mapped back, is the box in the image
    from qbuild_onnx.accuracy.labelled import to_image
    from qbuild_onnx.source.images import ImageOptions, image_to_sample

    _png(tmp_path / "i.png", 80, 60, [(20, 16, 60, 36, 0), (20, 16, 60, 36, 1),
                                      (20, 16, 60, 36, 2)])
    opts = ImageOptions(height=32, width=48, resize=resize, align=align, pad_value=0.0,
                        interpolation="nearest")
    x = image_to_sample(tmp_path / "i.png", opts)[0]  # one channel, 32 x 48
    ys, xs = np.nonzero(x > 0.5)
    found = np.asarray([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float64)
    geometry = {"size": [32, 48], "resize": resize, "align": align}
    back = to_image(found, "pixels", geometry, (60, 80))[0]
    # nearest resampling moves an edge by at most one input pixel (here 80/48 image px)
    assert back == pytest.approx([20, 16, 60, 36], abs=80 / 48 + 1e-6)
    # the same box given as fractions of the input
    norm = found / np.asarray([48, 32, 48, 32])
    assert to_image(norm, "normalized", geometry, (60, 80))[0] == pytest.approx(back)
