"""The records of ``fixed_point_params.json``: per lowered layer its input and output
quantization, multiplier, shift and rounding (or the table it indexes), and why a layer
rounds half up when rounding ``onnxruntime`` was asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import numpy as np
from numpy.typing import ArrayLike

from ..arithmetic import fixedpoint as fp
from ..arithmetic.tables import Codes
from ..emit.builder import Builder, ParamRecord, RecordExtras, TensorParams
from ..qdq.graph import QParams
from ..qdq.groups import Group, Out, Quantized

if TYPE_CHECKING:
    from typing_extensions import Unpack


def tensor_params(tensor: str, qp: QParams) -> TensorParams:
    return {"tensor": tensor, "dtype": str(qp.dtype),
            "zero_point": int(qp.zero_point.ravel()[0]), "scale": float(qp.scale.ravel()[0])}


def record_layer(b: Builder, grp: Group, kind: str, ins: list[Quantized], out: Out,
                 m0: ArrayLike | None, right_shift: ArrayLike | None, real: ArrayLike | None,
                 **extra: Unpack[RecordExtras]) -> None:
    """Add the layer's parameter record (``m0`` None: a table, no multiplier)."""
    lo, hi = fp.dtype_range(out.qp.dtype)
    core: ParamRecord = {
        "node": grp.node.name or grp.node.op_type,
        "op_type": grp.node.op_type,
        "kind": kind,
        "inputs": [tensor_params(x.q, x.qp) for x in ins],
        "output": tensor_params(out.q, out.qp),
        "clamp": [lo, hi],
        "rounding": "half_up" if m0 is not None else "table",
    }
    if m0 is not None and right_shift is not None and real is not None:
        core["multiplier"] = [int(v) for v in np.ravel(m0)]
        shifts = np.ravel(right_shift)
        core["shift"] = [int(v) for v in shifts] if shifts.size > 1 else int(shifts[0])
        core["real_multiplier"] = [float(v) for v in np.ravel(real)]
    b.params.append({**core, **extra})


class RoundingNote(TypedDict, total=False):
    """Why a layer does not round as onnxruntime does, when it was asked to."""

    rounding_note: str


def rounding_note(why: str | None) -> RoundingNote:
    return {"rounding_note": why} if why else {}


def half_up_note(b: Builder, why: str) -> RoundingNote:
    """For layers that always round half up: say why, when onnxruntime was asked for."""
    return rounding_note(why if b.rounding == "onnxruntime" else None)


def region_record(b: Builder, xqp: QParams, x: str, yqp: QParams, y: str, table: Codes,
                  op_types: list[str], nodes: list[str]) -> None:
    """The parameter record of an element-wise chain lowered as one table
    (``patterns.fuse``)."""
    b.params.append({"node": nodes[-1], "op_type": "+".join(op_types), "kind": "lookup_table",
                     "inputs": [tensor_params(x, xqp)], "output": tensor_params(y, yqp),
                     "clamp": list(fp.dtype_range(yqp.dtype)), "rounding": "table",
                     "composed_of": nodes, "table": [int(v) for v in table]})
