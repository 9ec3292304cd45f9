"""Labelled metrics: a model's outputs scored against ground truth (COCO-style mAP of its
detections against annotated boxes, ``coco_map``; top-1 / top-5 of its classes against
labels) on the samples that have ground truth, and each candidate's drop from the float
reference on the same samples (what ``max_drop`` bars).

Detections are decoded as the ``detection`` task decodes them (``decoder`` and its
options), kept down to ``map_score_threshold`` (0.001, as detector validation scripts
do: mAP integrates over every confidence) after class-wise NMS at ``nms_threshold``.
Their boxes are mapped from the model input back to the image (``box_units`` pixels or
normalized, default by decoder; then the dataset's recorded stretch, letterbox placement
or centre crop undone; clipped to the image), their classes to category ids: model class
i is ``category_ids[i]`` when given (``"coco80"``: the 80 COCO classes to the 91 COCO ids),
else the i-th category of the annotations sorted by id (right for a full COCO file,
whose 80 used ids sorted are the 80 classes). A detection mapped to a category the
annotations do not list is not scored (COCO evaluates the file's categories only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.errors import OnnxError

from qbuild import ConfigError

from .coco_map import Truth

if TYPE_CHECKING:
    from qbuild_onnx_common.arrays import Float64Array, FloatArray

    from .labels import CocoTruth, SampleImages

# metric -> the kind of task that measures it
METRICS = {"map": "detection", "map50": "detection", "map75": "detection",
           "top1": "classification", "top5": "classification"}
TASK_KINDS = {"detection": "detection", "yolo": "detection",
              "classification": "classification"}
MAP_SCORE_THRESHOLD = 0.001
BOX_UNITS = ("pixels", "normalized")


@dataclass(frozen=True)
class LabelledSet:
    """The ground truth of the samples that have one: sample indices, their image
    names (empty when labelled by index), and per kind the labels, or the boxes with
    each image's size, the dataset's geometry and the model class -> category map."""

    kind: str
    source: str  # the ground-truth file's name, for messages
    count: int  # samples in the dataset
    samples: tuple[int, ...]
    names: tuple[str, ...] = ()
    labels: tuple[int, ...] = ()
    truth: tuple[tuple[Truth, ...], ...] = ()
    sizes: tuple[tuple[int, int], ...] = ()
    geometry: Mapping[str, Any] | None = None
    category_ids: tuple[int, ...] = ()


def check_attrs(attrs: Mapping[str, Any]) -> None:
    """Analysis checks of ``ground_truth`` and ``max_drop`` (evaluate, auto_quantize):
    one ConfigError naming the attribute."""
    truth, drops, task = attrs.get("ground_truth"), attrs.get("max_drop") or {}, attrs["task"]
    kind = TASK_KINDS.get(task)
    if truth and kind is None:
        raise ConfigError(f"ground truth is scored by task = \"classification\" (a labels "
                          f"file) or \"detection\" (COCO annotations), not '{task}'",
                          attr="ground_truth")
    for key, value in drops.items():
        if key not in METRICS:
            raise ConfigError(f"unknown metric '{key}' (known: {', '.join(METRICS)})",
                              attr="max_drop")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 <= value <= 1):
            raise ConfigError(f"max_drop.{key}: expected an absolute drop from 0 to 1 "
                              f"(0.01 = one point), got {value!r}", attr="max_drop")
        if not truth:
            raise ConfigError("max_drop needs ground_truth (COCO annotations or a labels "
                              "file): drops are measured against labels", attr="max_drop")
        if METRICS[key] != kind:
            raise ConfigError(f"max_drop.{key} is a {METRICS[key]} metric, and task "
                              f"'{task}' measures {kind}", attr="max_drop")


def _names(images: SampleImages | None, path: Path, what: str) -> tuple[str, ...]:
    """The image names of the labelled samples (those before any augmented copy)."""
    if images is None:
        raise OnnxError(f"{what} match samples by image file name: the dataset needs to "
                        "be an image_dataset" + (" (or give a JSON list, one class per "
                                                 "sample)" if what.startswith("labels")
                                                 else ""), file=path)
    names = images.names[:images.count]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise OnnxError(f"the dataset has two images named '{dup}': ground truth matches "
                        "images by name", file=path)
    return names


def _classification(path: Path, images: SampleImages | None, count: int) -> LabelledSet:
    from .labels import is_coco, load_labels

    if is_coco(path):
        raise OnnxError("COCO annotations are ground truth for detection; task "
                        "classification takes a labels file (CSV or JSON: file name -> "
                        "class index)", file=path)
    labels = load_labels(path)
    if isinstance(labels, list):
        if len(labels) != count:
            raise OnnxError(f"{len(labels)} labels for the dataset's {count} samples (a "
                            "JSON list gives one class per sample)", file=path)
        return LabelledSet("classification", path.name, count, tuple(range(count)),
                           labels=tuple(labels))
    names = _names(images, path, "labels by file name")
    missing = [n for n in names if n not in labels]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise OnnxError(f"no label for image '{missing[0]}'{more}", file=path)
    return LabelledSet("classification", path.name, count, tuple(range(len(names))), names,
                       labels=tuple(labels[n] for n in names))


def category_map(options: Mapping[str, Any], truth: CocoTruth, path: Path
                 ) -> tuple[int, ...]:
    """Model class index -> COCO category id (see the module docstring)."""
    from .labels import COCO80

    given = options.get("category_ids")
    ids = COCO80 if given == "coco80" else tuple(given) if given else truth.categories
    if len(set(ids)) != len(ids):
        raise OnnxError("task_options.category_ids: a category id is listed twice",
                        attr="task_options")
    if not set(ids) & set(truth.names):
        raise OnnxError(f"no category id of the model's classes ({ids[0]}, ...) is among "
                        f"the annotations' categories: set task_options.category_ids",
                        file=path)
    return ids


def _detection(path: Path, images: SampleImages | None, count: int,
               options: Mapping[str, Any]) -> LabelledSet:
    from .labels import is_coco, load_coco

    if not is_coco(path):
        raise OnnxError("task detection takes COCO annotations (a JSON object with "
                        "images, annotations and categories)", file=path)
    truth = load_coco(path)
    names = _names(images, path, "COCO annotations")
    assert images is not None  # _names refuses a dataset without images
    if images.geometry is None or images.sizes is None:
        raise OnnxError("the dataset records no image geometry (made before labelled "
                        "metrics existed?): rebuild it", attr="dataset")
    boxes = []
    for name, (h, w) in zip(names, images.sizes):
        image = truth.images.get(name)
        if image is None:
            raise OnnxError(f"image '{name}' of the dataset is not in the annotations' "
                            "images", file=path)
        if image.width is not None and (image.width, image.height) != (w, h):
            raise OnnxError(f"image '{name}' is {w}x{h} but the annotations say "
                            f"{image.width}x{image.height}", file=path)
        boxes.append(image.boxes)
    if not any(not b.crowd for bs in boxes for b in bs):
        raise OnnxError("the annotations have no box on the dataset's images", file=path)
    return LabelledSet("detection", path.name, count, tuple(range(len(names))), names,
                       truth=tuple(boxes), sizes=images.sizes[:len(names)],
                       geometry=images.geometry,
                       category_ids=category_map(options, truth, path))


def prepare(task: str, truth_path: str | Path, dataset_dir: str | Path,
            options: Mapping[str, Any]) -> LabelledSet:
    """The labelled samples of a dataset for ``task`` (errors name the file)."""
    from ..source.datasets import open_dataset
    from .labels import sample_images

    path = Path(truth_path)
    images = sample_images(dataset_dir)
    count = images.count if images else open_dataset(dataset_dir).count
    if TASK_KINDS[task] == "classification":
        return _classification(path, images, count)
    return _detection(path, images, count, options)


def to_image(boxes: FloatArray, units: str, geometry: Mapping[str, Any],
             size: tuple[int, int]) -> Float64Array:
    """N x 4 xyxy boxes on the model input -> on the image of ``size`` (h, w): the
    geometry ``images`` applied, undone, then clipped to the image."""
    import numpy as np

    height, width = (int(v) for v in geometry["size"])
    h0, w0 = size
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    if units == "normalized":
        b = b * np.asarray([width, height, width, height], np.float64)
    mode = geometry.get("resize", "stretch")
    # the image occupies nw x nh input pixels from (x0, y0) (negative: cropped off)
    if mode == "letterbox":
        r = min(height / h0, width / w0)
        nh, nw = max(1, min(height, round(h0 * r))), max(1, min(width, round(w0 * r)))
        y0, x0 = (((height - nh) // 2, (width - nw) // 2)
                  if geometry.get("align", "center") == "center" else (0, 0))
    elif mode == "crop":
        r = max(height / h0, width / w0)
        nh, nw = max(height, round(h0 * r)), max(width, round(w0 * r))
        y0, x0 = -((nh - height) // 2), -((nw - width) // 2)
    else:
        nh, nw, y0, x0 = height, width, 0, 0
    out = (b - np.asarray([x0, y0, x0, y0])) * np.asarray([w0 / nw, h0 / nh, w0 / nw,
                                                           h0 / nh])
    clipped: Float64Array = np.clip(out, 0, np.asarray([w0, h0, w0, h0], np.float64))
    return clipped


def _check_units(units: str, largest: float | None, geometry: Mapping[str, Any]) -> None:
    """Refuse a box unit the reference's confident detections contradict."""
    if largest is None or max(int(v) for v in geometry["size"]) < 32:
        return
    if units == "pixels" and largest <= 1.5:
        raise OnnxError("the reference's confident boxes all lie within 0..1.5 of a "
                        f"{geometry['size'][1]}x{geometry['size'][0]} input: they look "
                        "normalized; set task_options.box_units = \"normalized\"",
                        attr="task_options")
    if units == "normalized" and largest > 2.0:
        raise OnnxError(f"the reference's boxes reach {largest:.1f}: they look like "
                        "pixels, not fractions of the input; set task_options.box_units "
                        "= \"pixels\"", attr="task_options")


def _measure_detection(ls: LabelledSet, outputs: Sequence[Mapping[str, Any]],
                       options: Mapping[str, Any], reference: bool) -> dict[str, Any]:
    import numpy as np

    from .coco_map import Scored, coco_map
    from .detection import BOX_UNITS as DEFAULT_UNITS
    from .detection import decoder_of, detections
    from .yolo import box_of

    name, decoder = decoder_of(options)
    units = str(options.get("box_units") or DEFAULT_UNITS[name])
    thr = float(options.get("map_score_threshold", MAP_SCORE_THRESHOLD))
    confident = float(options.get("score_threshold", 0.3))
    nms = float(options.get("nms_threshold", 0.45))
    assert ls.geometry is not None  # a detection set always has one
    images, largest = [], None
    for k, gts, size in zip(ls.samples, ls.truth, ls.sizes, strict=True):
        boxes, scores = decoder(outputs[k], options)
        if scores.shape[1] != len(ls.category_ids):
            given = ("task_options.category_ids" if options.get("category_ids") else
                     f"the categories of {ls.source}, sorted by id")
            raise OnnxError(
                f"the model scores {scores.shape[1]} classes but {len(ls.category_ids)} "
                f"category ids map them ({given}): give task_options.category_ids, one "
                "COCO category id per model class (\"coco80\": the 80-class COCO mapping)",
                attr="task_options")
        dets = detections(boxes, scores, thr, nms)
        sure = [max(d.box) for d in dets if d.score >= confident]
        if sure:
            largest = max(largest or 0.0, *sure)
        mapped = to_image(np.asarray([d.box for d in dets], np.float64), units,
                          ls.geometry, size)
        images.append(([Scored(box_of(b), d.score, ls.category_ids[d.cls])
                        for b, d in zip(mapped, dets)], gts))
    if reference:
        _check_units(units, largest, ls.geometry)
    found = coco_map(images)
    return {"map": found["map"], "map50": found["map50"], "map75": found["map75"],
            "per_category": found["per_category"], "categories": found["categories"],
            "labelled_samples": len(ls.samples),
            "boxes": sum(1 for g in ls.truth for b in g if not b.crowd),
            "box_units": units}


def _measure_classification(ls: LabelledSet, outputs: Sequence[Mapping[str, Any]],
                            options: Mapping[str, Any]) -> dict[str, Any]:
    import numpy as np

    from .tasks import logits

    top1 = top5 = 0
    for i, (k, label) in enumerate(zip(ls.samples, ls.labels, strict=True)):
        scores = logits(outputs[k], str(options.get("output", "")))
        if scores.shape[0] != 1:
            raise OnnxError(f"the output holds {scores.shape[0]} rows of scores per "
                            "sample; class labels need one", attr="task_options")
        if label >= scores.shape[1]:
            who = f"'{ls.names[i]}'" if ls.names else f"sample {k}"
            raise OnnxError(f"{ls.source}: label {label} of {who} is not a class of the "
                            f"model ({scores.shape[1]} classes)", attr="ground_truth")
        order = np.argsort(-scores[0], kind="stable")
        top1 += int(order[0] == label)
        top5 += int(label in order[:5])
    n = len(ls.samples)
    return {"top1": top1 / n, "top5": top5 / n, "labelled_samples": n}


def measure(ls: LabelledSet, outputs: Sequence[Mapping[str, Any]],
            options: Mapping[str, Any], reference: bool = False) -> dict[str, Any]:
    """The labelled metrics of one model's outputs (one per dataset sample); with
    ``reference`` the box unit is also checked against its confident detections."""
    if len(outputs) != ls.count:
        raise OnnxError(f"labelled metrics need one run per sample: {len(outputs)} runs "
                        f"for {ls.count} samples (does the model fix a batch size?)")
    if ls.kind == "classification":
        return _measure_classification(ls, outputs, options)
    return _measure_detection(ls, outputs, options, reference)


def drops(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict[str, float]:
    """Reference minus candidate for every labelled metric both have (positive: the
    candidate is worse)."""
    out = {}
    for key in METRICS:
        r, c = reference.get(key), candidate.get(key)
        if isinstance(r, (int, float)) and isinstance(c, (int, float)):
            out[key] = round(float(r) - float(c), 6)
    return out
