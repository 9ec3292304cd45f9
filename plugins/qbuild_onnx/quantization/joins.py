"""Detection-safe quantization: finding joins of tensors with very different ranges.

A Concat that joins, say, box coordinates in pixels (0..640) with class probabilities
(0..1) gets one 8-bit scale for its output in a QDQ model: the scale is set by the boxes
(2.5 per step) and every probability rounds to zero. The model then scores well on
SQNR and cosine yet detects nothing. This module finds such joins from the calibrated
ranges of their inputs and names the nodes to keep in float: the Concat itself and the
data-movement nodes (Reshape, Transpose, ...) between it and a graph output or the next
compute node, which onnxruntime would otherwise quantize with the Concat's output range.
Each input keeps its own scale (the producers stay quantized); only the join is float.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.graph import consumers

if TYPE_CHECKING:
    from onnx import ModelProto

# Ops onnxruntime quantizes with their input's scale (data movement, no arithmetic).
_PASSTHROUGH = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                "Slice", "Gather", "Split", "Expand", "Tile"}
DEFAULT_RATIO = 32.0


@dataclass(frozen=True)
class MixedJoin:
    """A Concat whose inputs' ranges differ by ``ratio`` and the nodes kept float for it."""

    node: str
    ratio: float
    widths: tuple[float, ...]
    float_nodes: tuple[str, ...]
    reaches_output: bool


def _width(r: Any) -> float | None:
    try:
        lo, hi = float(r[0]), float(r[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return hi - lo


def find_mixed_joins(model: ModelProto, ranges: Mapping[str, Any], ratio: float = DEFAULT_RATIO
                     ) -> list[MixedJoin]:
    """Concats whose calibrated input ranges (``ranges``: tensor -> (min, max)) differ in
    width by at least ``ratio``, in graph order. Nodes must be named (see ``name_nodes``)."""
    if ratio <= 0:
        return []
    readers = consumers(model.graph)
    outputs = {o.name for o in model.graph.output}
    found = []
    for node in model.graph.node:
        if node.op_type != "Concat":
            continue
        widths = [w for w in (_width(ranges[i]) if i in ranges else None for i in node.input)
                  if w is not None]
        if len(widths) < 2 or min(widths) <= 0:
            continue
        r = max(widths) / min(widths)
        if r < ratio:
            continue
        chain = [node.name]
        reaches = node.output[0] in outputs
        frontier = list(node.output)
        while frontier:
            t = frontier.pop()
            for c in readers.get(t, []):
                if c.op_type in _PASSTHROUGH and c.name not in chain:
                    chain.append(c.name)
                    reaches = reaches or any(o in outputs for o in c.output)
                    frontier.extend(c.output)
        found.append(MixedJoin(node.name, round(r, 3), tuple(round(w, 6) for w in widths),
                               tuple(chain), reaches))
    return found


def name_nodes(model: ModelProto) -> int:
    """Give every unnamed node a stable name (op type and first output); returns how many
    were named. The quantizer's exclusions address nodes by name."""
    taken = {n.name for n in model.graph.node if n.name}
    count = 0
    for n in model.graph.node:
        if n.name:
            continue
        base = f"{n.op_type}_{n.output[0] if n.output else count}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        n.name = name
        taken.add(name)
        count += 1
    return count
