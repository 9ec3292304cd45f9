"""The check step: a lowered model against its QDQ source, both run in onnxruntime.

For every output element the difference is measured in LSB of that output's final
DequantizeLinear scale. The result gives the share of elements within +-1 LSB, the share
that is bit-exact and the largest error; ``passed`` compares the share with a threshold.
The inputs are the caller's (``feeds``: a dataset, or seeded random codes).
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import onnx
from qbuild_onnx_common.arrays import Feed
from qbuild_onnx_common.ort import session

from ..qdq.graph import Graph
from ..qdq.groups import is_dq


class _Tally(TypedDict):
    elements: int
    within_1lsb: int
    exact: int
    max_lsb: float


class OutputAgreement(TypedDict):
    """One output's agreement: shares of its elements within 1 LSB and equal."""

    elements: int
    within_1lsb: float
    exact: float
    max_lsb: float


class _CheckCore(TypedDict):
    samples: int
    elements: int
    within_1lsb: float
    exact: float
    max_error_lsb: float
    min_agreement: float
    passed: bool
    per_output: dict[str, OutputAgreement]


class CheckResult(_CheckCore, total=False):
    """report.json["check"]: the agreement of a lowered model with its source."""

    inputs: str  # "dataset" or "synthetic", added by the rule


def output_scales(model: onnx.ModelProto) -> dict[str, float]:
    g = Graph.from_model(model)
    scales = {}
    for o in model.graph.output:
        p = g.producer_node(o.name)
        if p is not None and is_dq(p):
            qp = g.qparams(p)
            if qp.per_tensor:
                scales[o.name] = float(qp.scale.ravel()[0])
    return scales


def compare(source: onnx.ModelProto, lowered: onnx.ModelProto, feeds: list[Feed],
            min_agreement: float = 0.999) -> CheckResult:
    s_src, s_low = session(source), session(lowered)
    scales = output_scales(lowered) or output_scales(source)
    names = [o.name for o in s_src.get_outputs()]
    per: dict[str, _Tally] = {n: {"elements": 0, "within_1lsb": 0, "exact": 0, "max_lsb": 0.0}
                              for n in names}
    for feed in feeds:
        ra = dict(zip(names, s_src.run(names, feed)))
        rb = dict(zip(names, s_low.run(names, feed)))
        for n in names:
            scale = scales.get(n)
            a, b = ra[n].astype(np.float64), rb[n].astype(np.float64)
            d = np.abs(a - b) / scale if scale else np.abs(a - b)
            d = np.rint(d * 1e4) / 1e4  # float noise of the dequantize is not an LSB
            st = per[n]
            st["elements"] += d.size
            st["within_1lsb"] += int((d <= 1).sum())
            st["exact"] += int((d == 0).sum())
            st["max_lsb"] = max(st["max_lsb"], float(d.max()) if d.size else 0.0)
    total = sum(p["elements"] for p in per.values())
    within = sum(p["within_1lsb"] for p in per.values())
    exact = sum(p["exact"] for p in per.values())
    share = within / total if total else 1.0
    return {
        "samples": len(feeds),
        "elements": total,
        "within_1lsb": round(share, 6),
        "exact": round(exact / total if total else 1.0, 6),
        "max_error_lsb": max((p["max_lsb"] for p in per.values()), default=0.0),
        "min_agreement": min_agreement,
        "passed": share >= min_agreement,
        "per_output": {n: _shares(p) for n, p in sorted(per.items())},
    }


def _shares(p: _Tally) -> OutputAgreement:
    n = p["elements"]
    return {"elements": n, "within_1lsb": round(p["within_1lsb"] / n, 6) if n else 1.0,
            "exact": round(p["exact"] / n, 6) if n else 1.0, "max_lsb": p["max_lsb"]}
