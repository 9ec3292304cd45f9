"""Marks a transform leaves in a float model for the quantizer: nodes that must stay float.

SmoothQuant's inserted ``Mul(x, 1/s)`` only helps when x itself is not quantized (x still
holds the outliers): the transform lists such nodes under the model metadata key
``qbuild.keep_float_nodes`` (a JSON list of node names) and ``quantize`` adds them to
``nodes_to_exclude``, so x stays float and the Mul's smoothed output is what gets
quantized.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import ModelProto

KEEP_FLOAT_KEY = "qbuild.keep_float_nodes"


def keep_float_nodes(model: ModelProto) -> list[str]:
    """Node names the model asks to keep float (empty when it does not say)."""
    for p in model.metadata_props:
        if p.key == KEEP_FLOAT_KEY:
            try:
                names = json.loads(p.value)
            except ValueError:
                return []
            return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    return []


def mark_keep_float(model: ModelProto, names: list[str]) -> None:
    """Add ``names`` to the model's keep-float list."""
    merged = list(dict.fromkeys([*keep_float_nodes(model), *names]))
    kept = [p for p in model.metadata_props if p.key != KEEP_FLOAT_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if merged:
        entry = model.metadata_props.add()
        entry.key, entry.value = KEEP_FLOAT_KEY, json.dumps(merged)
