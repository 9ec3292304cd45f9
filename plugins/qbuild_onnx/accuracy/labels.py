"""Ground truth for labelled metrics: reading a COCO-format annotations file (detection)
or a labels file (classification), checking it, and matching it to a dataset's samples.

* **COCO annotations** (a JSON object with ``images``, ``annotations`` and
  ``categories``): ``images[]`` has ``id``, ``file_name`` (matched to the dataset's images
  by base name) and optionally ``width`` / ``height`` (checked against the decoded image);
  ``annotations[]`` has ``image_id``, ``category_id`` (one of ``categories[].id``),
  ``bbox = [x, y, w, h]`` in the image's pixels and optionally ``iscrowd``.
* **Labels**: a JSON object ``{"file name": class index}``, a JSON list of class indices
  (one per sample, in dataset order), or CSV lines ``file name,class index`` (a first
  line whose second field is not an integer is a header). Class indices are the model's
  output indices.

Samples map to images through the dataset's ``dataset.json``: an ``image_dataset``
records its image names (sorted, as fed) and, for boxes, its geometry and every image's
decoded size. Samples past the image count are augmented copies: labels do not apply to
them, so they are left out of labelled metrics.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbuild_onnx_common.errors import OnnxError

from .coco_map import Truth

# The COCO 2017 category id of each of the 80 contiguous class indices that models
# trained on COCO output (ids 1..90 with 12, 26, 29, 30, 45, 66, 68, 69, 71, 83 unused).
COCO80 = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
          24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47,
          48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70,
          72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90)


@dataclass(frozen=True)
class CocoImage:
    """One annotated image: its declared size (None when not given) and boxes."""

    width: int | None
    height: int | None
    boxes: tuple[Truth, ...]


@dataclass(frozen=True)
class CocoTruth:
    """A COCO annotations file: images by base file name, and the category ids
    (sorted) with their names."""

    images: dict[str, CocoImage]
    categories: tuple[int, ...]
    names: dict[int, str]


@dataclass(frozen=True)
class SampleImages:
    """Which image each labelled sample is (the first ``len(names)`` samples), how many
    samples the dataset holds, and, when recorded, its geometry (``size`` [h, w],
    ``resize``, ``align``) and each image's decoded [h, w]."""

    names: tuple[str, ...]
    count: int
    geometry: dict[str, Any] | None
    sizes: tuple[tuple[int, int], ...] | None


def _bad(path: Path, message: str) -> OnnxError:
    return OnnxError(message, file=path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _bad(path, "not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise _bad(path, f"not valid JSON: {e.msg} at line {e.lineno}") from None


def is_coco(path: Path) -> bool:
    """Does the file look like COCO annotations (a JSON object with ``annotations``)?"""
    if path.suffix.lower() != ".json":
        return False
    doc = _read_json(path)
    return isinstance(doc, dict) and "annotations" in doc


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _categories(path: Path, doc: dict[str, Any]) -> dict[int, str]:
    cats = doc.get("categories")
    if not isinstance(cats, list) or not cats:
        raise _bad(path, "COCO annotations need a non-empty 'categories' list")
    names: dict[int, str] = {}
    for i, c in enumerate(cats):
        if not isinstance(c, dict) or not _int(c.get("id")):
            raise _bad(path, f"categories[{i}] needs an integer 'id'")
        if c["id"] in names:
            raise _bad(path, f"category id {c['id']} is listed twice")
        names[c["id"]] = str(c.get("name", c["id"]))
    return names


def _images(path: Path, doc: dict[str, Any]) -> dict[int, tuple[str, int | None, int | None]]:
    """image id -> (base file name, width, height)."""
    images = doc.get("images")
    if not isinstance(images, list):
        raise _bad(path, "COCO annotations need an 'images' list")
    out: dict[int, tuple[str, int | None, int | None]] = {}
    seen: set[str] = set()
    for i, im in enumerate(images):
        if not isinstance(im, dict) or not _int(im.get("id")) or not isinstance(
                im.get("file_name"), str):
            raise _bad(path, f"images[{i}] needs an integer 'id' and a 'file_name'")
        name = Path(im["file_name"]).name
        if name in seen:
            raise _bad(path, f"two images are named '{name}' (images match the dataset's "
                             "by base name)")
        seen.add(name)
        w, h = im.get("width"), im.get("height")
        out[im["id"]] = (name, w if _int(w) else None, h if _int(h) else None)
    return out


def _box(path: Path, i: int, a: dict[str, Any]) -> tuple[float, float, float, float]:
    bbox = a.get("bbox")
    if (not isinstance(bbox, list) or len(bbox) != 4 or not all(_number(v) for v in bbox)
            or bbox[2] < 0 or bbox[3] < 0):
        raise _bad(path, f"annotations[{i}]: bbox must be [x, y, width, height] with "
                         f"width, height >= 0, got {bbox!r}")
    x, y, w, h = (float(v) for v in bbox)
    return x, y, x + w, y + h


def load_coco(path: str | Path) -> CocoTruth:
    """Reads and checks a COCO annotations file (errors name the file and the entry)."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise _bad(path, "COCO annotations must be a JSON object")
    names = _categories(path, doc)
    images = _images(path, doc)
    anns = doc.get("annotations")
    if not isinstance(anns, list):
        raise _bad(path, "COCO annotations need an 'annotations' list")
    boxes: dict[int, list[Truth]] = {k: [] for k in images}
    for i, a in enumerate(anns):
        if not isinstance(a, dict):
            raise _bad(path, f"annotations[{i}] is not an object")
        if a.get("image_id") not in images:
            raise _bad(path, f"annotations[{i}]: image_id {a.get('image_id')!r} is not in "
                             "'images'")
        if a.get("category_id") not in names:
            raise _bad(path, f"annotations[{i}]: category_id {a.get('category_id')!r} is "
                             "not in 'categories'")
        crowd = a.get("iscrowd", 0)
        if crowd not in (0, 1) or isinstance(crowd, bool):
            raise _bad(path, f"annotations[{i}]: iscrowd must be 0 or 1")
        boxes[a["image_id"]].append(Truth(_box(path, i, a), a["category_id"], crowd == 1))
    return CocoTruth(
        images={n: CocoImage(w, h, tuple(boxes[k])) for k, (n, w, h) in images.items()},
        categories=tuple(sorted(names)), names=names)


def _csv_labels(path: Path, text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(f.strip() for f in r)]
    for n, row in enumerate(rows):
        if len(row) != 2:
            raise _bad(path, f"line {n + 1}: expected 'file name,class index', got "
                             f"{','.join(row)!r}")
        name, label = row[0].strip(), row[1].strip()
        if not label.lstrip("-").isdigit():
            if n == 0:
                continue  # a header
            raise _bad(path, f"line {n + 1}: class index {label!r} is not an integer")
        if name in out:
            raise _bad(path, f"'{name}' is labelled twice")
        out[name] = int(label)
    return out


def load_labels(path: str | Path) -> dict[str, int] | list[int]:
    """Class labels by file name (a JSON object or CSV) or by sample index (a JSON
    list); every label a non-negative integer."""
    path = Path(path)
    labels: dict[str, int] | list[int]
    if path.suffix.lower() == ".json":
        doc = _read_json(path)
        if isinstance(doc, list):
            labels = doc
        elif isinstance(doc, dict):
            labels = {Path(str(k)).name: v for k, v in doc.items()}
        else:
            raise _bad(path, "a labels file is a JSON object {file name: class} or a list "
                             "of classes")
    else:
        try:
            labels = _csv_labels(path, path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise _bad(path, "not UTF-8 text") from None
    values = labels if isinstance(labels, list) else list(labels.values())
    wrong = next((v for v in values if not _int(v) or v < 0), None)
    if wrong is not None or not values:
        raise _bad(path, f"class labels must be integers >= 0, got {wrong!r}" if values
                   else "no labels in the file")
    return labels


def sample_images(dataset_dir: str | Path) -> SampleImages | None:
    """The images behind a dataset's samples, or None when the dataset was not made
    from images (it then has no file names)."""
    from ..source.datasets import open_dataset

    ds = open_dataset(dataset_dir)
    source = ds.manifest.get("source") or {}
    if not isinstance(source, dict) or source.get("kind") != "images":
        return None
    names = tuple(str(n) for n in source.get("images") or ())
    sizes = source.get("sizes")
    return SampleImages(names=names, count=ds.count, geometry=source.get("geometry"),
                        sizes=tuple((int(h), int(w)) for h, w in sizes) if sizes else None)
