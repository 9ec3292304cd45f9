"""Detector outputs that are already decoded: one tensor of rows, each a box, perhaps an
objectness score, then one score per class (YOLOv5/v7 and FastestDet exports with their
post-processing in the graph, YOLOX with ``decode_in_inference``, Ultralytics v8/v11).

A **layout** names the row: ``xywh_obj_cls`` (cx, cy, w, h, objectness, C classes),
``xyxy_obj_cls`` (x1, y1, x2, y2, objectness, classes), ``xywh_cls`` and ``xyxy_cls``
(no objectness). A class's score is objectness × class score when there is an
objectness field. ``auto`` decides what the shape decides: with ``num_classes`` = C
known, 4 + C fields is a layout without objectness and 5 + C one with it; the box is
taken as cx, cy, w, h (what those exports write), so corner boxes must be declared
(``xyxy_...``): values cannot tell the two apart reliably (a large box near the top
left is valid either way).

The tensor is [1, rows, fields] or [1, fields, rows] (the batch axis of 1 removed, or
absent). The fields axis is the one of size 4 (+1) + C when C is known, else the smaller
one. Anything else is refused with one line naming the output, its shape and what the
layout needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from qbuild_onnx_common.errors import OnnxError

if TYPE_CHECKING:
    from qbuild_onnx_common.arrays import FloatArray

# layout -> (corner box, objectness field)
LAYOUTS: dict[str, tuple[bool, bool]] = {
    "xywh_obj_cls": (False, True),
    "xyxy_obj_cls": (True, True),
    "xywh_cls": (False, False),
    "xyxy_cls": (True, False),
}
AUTO = "auto"


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fields_axis(shape: Sequence[int], wanted: Sequence[int], where: str, what: str) -> int:
    """The axis (0 or 1) holding the fields: the one of a ``wanted`` size when given
    (the last axis first), else the smaller (the last on a tie)."""
    if len(shape) != 2:
        raise OnnxError(f"{where}: {what} needs a [1, rows, fields] or [1, fields, rows] "
                        f"output, got {_shape(shape)}")
    if wanted:
        for axis in (1, 0):
            if shape[axis] in wanted:
                return axis
        raise OnnxError(f"{where}: {what} needs {' or '.join(map(str, wanted))} fields on "
                        f"one axis, the output is {_shape(shape)}")
    return 0 if shape[0] < shape[1] else 1


def resolve(shape: Sequence[int], layout: str, num_classes: int | None, where: str
            ) -> tuple[str, int]:
    """(concrete layout, fields axis) for a 2-D output ``shape`` (batch removed)."""
    if layout != AUTO and layout not in LAYOUTS:
        raise OnnxError(f"{where}: unknown layout '{layout}' (known: auto, "
                        f"{', '.join(LAYOUTS)})", attr="task_options")
    if layout == AUTO:
        if not num_classes:
            raise OnnxError(f"{where}: cannot tell whether the output {_shape(shape)} has "
                            "an objectness field: set task_options.layout (xywh_obj_cls, "
                            "xyxy_obj_cls, xywh_cls, xyxy_cls) or num_classes")
        axis = _fields_axis(shape, (4 + num_classes, 5 + num_classes), where,
                            f"layout auto with {num_classes} classes")
        return ("xywh_obj_cls" if shape[axis] == 5 + num_classes else "xywh_cls"), axis
    corner, obj = LAYOUTS[layout]
    need = 4 + obj
    axis = _fields_axis(shape, (need + num_classes,) if num_classes else (), where,
                        f"layout {layout}" + (f" with {num_classes} classes"
                                              if num_classes else ""))
    if shape[axis] < need + 1:
        raise OnnxError(f"{where}: layout {layout} needs at least {need + 1} fields (4 box"
                        f"{', objectness' if obj else ''} and a class), the output is "
                        f"{_shape(shape)}")
    return layout, axis


def decode(raw: FloatArray, layout: str, num_classes: int | None, where: str
           ) -> tuple[FloatArray, FloatArray]:
    """(rows × 4 xyxy boxes, rows × C scores) of a decoded output (batch removed)."""
    import numpy as np

    concrete, axis = resolve(tuple(int(d) for d in raw.shape), layout, num_classes, where)
    rows = raw if axis == 1 else raw.T
    corner, obj = LAYOUTS[concrete]
    box = rows[:, :4]
    if not corner:
        box = np.concatenate([box[:, :2] - box[:, 2:4] / 2, box[:, :2] + box[:, 2:4] / 2], 1)
    scores = rows[:, 5:] * rows[:, 4:5] if obj else rows[:, 4:]
    return box, scores
