"""The order of a sensitivity ranking, and the merge of its shards: JSON only (no onnx,
onnxruntime or numpy), so ``sensitivity_merge`` stays a light action."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from qbuild_onnx_common.errors import OnnxError


def _num(x: Any) -> float:
    """A JSON number or json_float string ("inf", "-inf", "nan") as a float."""
    return float(x)


def _rank(rows: list[dict[str, Any]], mode: str) -> None:
    """Sort rows in place, most sensitive first. "only": lowest score first; "leave_out":
    largest gain first. A task metric (F1 on a few samples) ties most sites; ties go to
    the worst output SQNR (lowest first for "only", highest for "leave_out"), so the
    order past the first few sites still measures harm instead of falling back to
    names. Then by name."""
    def worst(r: Mapping[str, Any]) -> float:
        return min((_key(_num(v)) for v in r["per_output_sqnr_db"].values()), default=0.0)

    if mode == "only":
        rows.sort(key=lambda r: (_key(_num(r["score"])), worst(r), r["kind"], r["site"]))
    else:
        rows.sort(key=lambda r: (-_key(_num(r["effect"])), -worst(r), r["kind"], r["site"]))


def merge(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from the shards of one ranking (``analyze(..., shard=i, shards=n)`` for
    every i): the rows of all, ranked as ``analyze`` ranks them."""
    if not reports:
        raise OnnxError("no sensitivity reports to merge")
    first = reports[0]
    n = first.get("shards", 1)
    shards = sorted(r.get("shard", 0) for r in reports)
    if shards != list(range(n)) or any(r.get("shards", 1) != n for r in reports):
        raise OnnxError(f"sensitivity shards {shards} do not make up the {n} shard(s) of "
                        "one ranking")
    for key in ("mode", "metric", "samples", "quantized_model_score", "all_sites"):
        if any(r.get(key) != first.get(key) for r in reports):
            raise OnnxError(f"sensitivity shards disagree on '{key}': not one ranking")
    rows = [dict(row) for r in reports for row in r["ranking"]]
    _rank(rows, first["mode"])
    out = {k: v for k, v in first.items() if k not in ("shard", "shards", "all_sites")}
    out.update(sites=len(rows), ranking=rows)
    return out


def _key(x: float) -> float:
    return 1e9 if math.isinf(x) and x > 0 else (-1e9 if math.isinf(x) else x)
