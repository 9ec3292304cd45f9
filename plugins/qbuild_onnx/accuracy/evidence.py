"""Is an evaluation set large enough to decide? The counts behind a score (samples,
distinct source images, the reference's detections or predictions and the classes they
cover) and the reasons a set is too small to decide, for ``evaluate`` (its report and
page) and ``auto_quantize`` (its selection set).

A set is too small to decide when:

* the reference makes fewer than ``MIN_DECISIONS`` detections (detection tasks) or
  predictions (classification) on it: a score over a handful of them moves in steps
  larger than the differences it is meant to show;
* its samples come from fewer than ``MIN_IMAGES`` distinct images (crops and flips of
  one photograph are not independent samples);
* the task has few enough classes that the set could cover them all (at least
  ``SAMPLES_PER_CLASS`` decisions per class) and the reference finds fewer;
* a bar tolerates fewer than ``RULE_OF_THREE`` wrong decisions on it. By the rule of
  three, a clean run of n decisions only bounds the error rate below 3/n (95 %
  confidence), so a bar that allows fewer than 3 misses cannot be shown met: one miss
  decides it. ``min_f1 = b`` on n reference detections allows 2n(1 - b)/(2 - b) missed
  detections; ``max_top1_drop = d`` on n predictions allows d·n disagreements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MIN_DECISIONS = 30
MIN_IMAGES = 10
RULE_OF_THREE = 3
SAMPLES_PER_CLASS = 10
_DETECTION = ("detection", "yolo")
_F1_BARS = ("min_f1", "min_f1_lower")
_RATE_BARS = ("max_top1_drop", "min_top1_agreement")


def distinct_images(dataset_dir: Path) -> int | None:
    """How many distinct source images an image dataset's samples come from (None for
    other datasets)."""
    from ..source.datasets import open_dataset

    source = open_dataset(dataset_dir).manifest.get("source") or {}
    if not isinstance(source, dict) or source.get("kind") != "images":
        return None
    digests = source.get("image_sha256")
    return len(set(digests)) if isinstance(digests, list) else len(source.get("images") or [])


def _detection_counts(ref: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
                      decoder_name: str) -> dict[str, Any]:
    from .detection import DECODERS, detections

    decoder = DECODERS.get(decoder_name)
    if decoder is None:
        return {}
    n, seen, classes = 0, set(), 0
    thr = float(options.get("score_threshold", 0.3))
    nms = float(options.get("nms_threshold", 0.45))
    for sample in ref:
        boxes, scores = decoder(sample, options)
        classes = int(scores.shape[-1]) if scores.ndim == 2 else classes
        found = detections(boxes, scores, thr, nms)
        n += len(found)
        seen |= {d.cls for d in found}
    return {"reference_detections": n, "classes_seen": len(seen), "classes": classes}


def _classification_counts(ref: Sequence[Mapping[str, Any]], output: str
                           ) -> dict[str, Any]:
    import numpy as np

    n, seen, classes = 0, set(), 0
    for sample in ref:
        if output and output not in sample:
            return {}
        a = np.asarray(sample[output] if output else next(iter(sample.values())))
        if a.ndim == 0:
            return {}
        logits = a.reshape(-1, a.shape[-1])
        classes = int(logits.shape[1])
        picks = logits.argmax(axis=1)
        n += len(picks)
        seen |= {int(c) for c in picks}
    return {"predictions": n, "classes_seen": len(seen), "classes": classes}


def set_counts(task: str, options: Mapping[str, Any], ref: Sequence[Mapping[str, Any]],
               dataset_dir: Path) -> dict[str, Any]:
    """The counts of an evaluation set: ``samples``, ``images`` (distinct source images,
    image datasets only) and, for detection and classification tasks, the reference's
    ``reference_detections`` or ``predictions`` and ``classes_seen`` of ``classes``."""
    counts: dict[str, Any] = {"samples": len(ref)}
    images = distinct_images(dataset_dir)
    if images is not None:
        counts["images"] = images
    if task in _DETECTION:
        decoder = "yolox" if task == "yolo" else str(options.get("decoder", "yolox"))
        counts.update(_detection_counts(ref, options, decoder))
    elif task == "classification":
        counts.update(_classification_counts(ref, str(options.get("output", ""))))
    return counts


def _decisions(counts: Mapping[str, Any]) -> tuple[int | None, str]:
    if "reference_detections" in counts:
        return counts["reference_detections"], "reference detection"
    if "predictions" in counts:
        return counts["predictions"], "prediction"
    return None, ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def tolerated(bar: str, value: float, n: int) -> int | None:
    """How many wrong decisions among ``n`` the bar allows (None: not a count bar, or a
    bar that asks for none on purpose)."""
    if bar in _F1_BARS or bar == "min_ap50":
        if value >= 1.0:
            return None
        allowed = 2 * n * (1 - value) / (2 - value) if bar in _F1_BARS else n * (1 - value)
    elif bar in _RATE_BARS:
        drop = value if bar == "max_top1_drop" else 1 - value
        if drop <= 0:
            return None
        allowed = drop * n
    else:
        return None
    return math.floor(allowed + 1e-6)


def needed(bar: str, value: float) -> int:
    """The fewest decisions on which the bar tolerates ``RULE_OF_THREE`` wrong ones."""
    if bar in _F1_BARS:
        return math.ceil(RULE_OF_THREE * (2 - value) / (2 * (1 - value)) - 1e-6)
    rate = 1 - value if bar in ("min_ap50", "min_top1_agreement") else value
    return math.ceil(RULE_OF_THREE / rate - 1e-6)


def _bar_problem(bar: str, value: float, counts: Mapping[str, Any]) -> str | None:
    n, word = _decisions(counts)
    detection_bar = bar in _F1_BARS or bar == "min_ap50"
    if n is None or detection_bar != (word == "reference detection"):
        return None
    allowed = tolerated(bar, value, n)
    if allowed is None or allowed >= RULE_OF_THREE:
        return None
    what = "missed detection" if detection_bar else "disagreement"
    return (f"{bar} = {value:g} allows {_plural(allowed, what)} among {n}, fewer than "
            f"{RULE_OF_THREE} (rule of three: {needed(bar, value)} {word}s would allow "
            f"{RULE_OF_THREE})")


def problems(counts: Mapping[str, Any], bars: Mapping[str, float]) -> list[str]:
    """Why the set is too small to decide (empty: it is not)."""
    out = []
    n, word = _decisions(counts)
    if n is not None and n < MIN_DECISIONS:
        out.append(f"only {_plural(n, word)} (fewer than {MIN_DECISIONS})")
    images = counts.get("images")
    if images is not None and images < MIN_IMAGES and counts["samples"] > images:
        out.append(f"its {_plural(counts['samples'], 'sample')} come from "
                   f"{_plural(images, 'distinct image')} (fewer than {MIN_IMAGES}; crops "
                   "and flips of one photograph are not independent)")
    elif images is not None and images < MIN_IMAGES:
        out.append(f"only {_plural(images, 'distinct image')} (fewer than {MIN_IMAGES})")
    classes, seen = counts.get("classes") or 0, counts.get("classes_seen") or 0
    if n is not None and classes and seen < classes <= n // SAMPLES_PER_CLASS:
        out.append(f"the reference finds {seen} of the task's {classes} classes")
    for bar, value in sorted(bars.items()):
        problem = _bar_problem(bar, float(value), counts)
        if problem:
            out.append(problem)
    return out


def counts_text(counts: Mapping[str, Any]) -> str:
    """'31 samples from 31 distinct images; 90 reference detections of 21 of 80 classes'."""
    text = _plural(counts["samples"], "sample")
    if counts.get("images") is not None:
        text += f" from {_plural(counts['images'], 'distinct image')}"
    n, word = _decisions(counts)
    if n is not None:
        text += f"; {_plural(n, word)}"
        if counts.get("classes"):
            text += f" of {counts['classes_seen']} of {counts['classes']} classes"
    return text


def set_summary(counts: Mapping[str, Any], bars: Mapping[str, float], role: str
                ) -> dict[str, Any]:
    """The counts, their text and, when the set is too small to decide, the one-line
    warning (``warning``), as report.json and the pages hold them. ``role``:
    'evaluation' or 'selection'."""
    found = problems(counts, bars)
    summary = {**counts, "text": counts_text(counts)}
    if found:
        summary["warning"] = (f"the {role} set is too small to decide: "
                              f"{'; '.join(found)} ({summary['text']})")
    return summary
