"""Feeding a dataset to a model for evaluation-style rules (``evaluate``, ``sensitivity``,
``bias_correction``, ``auto_quantize``), with the same conventions as ``calibrate``: a
dataset array of the model input's rank is fed along its sample axis, one sample per run
unless the model fixes the batch size; an array one rank higher holds whole model inputs
(streaming or multi-input models: one sample per run); scalar inputs are stored with a
leading sample axis and fed as 0-d arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qbuild_onnx_common.models import load_model


def model_feeds(dataset_dir: str | Path, model_path: str | Path, limit: int = 0
                ) -> list[dict[str, Any]]:
    """Feed dicts for ``model_path`` from the dataset in ``dataset_dir`` (at most ``limit``
    runs when > 0). Raises ``OnnxError`` naming the input that does not fit."""
    from qbuild_onnx_common.summary import model_info

    from ..source.datasets import FeedPlan, check_dataset_against_model, iter_feeds, open_dataset

    ds = open_dataset(dataset_dir)
    info = model_info(load_model(model_path, external_data=False))
    plan = check_dataset_against_model(ds.manifest, info)
    if not plan.fixed:
        plan = FeedPlan(batch_size=1)  # per-sample outputs (detections, top-1) need runs of 1
    feeds = []
    for feed in iter_feeds(ds, plan):
        feeds.append({k: v.copy() for k, v in feed.items()})
        if limit and len(feeds) >= limit:
            break
    return feeds
