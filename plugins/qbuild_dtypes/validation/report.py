"""What a model holds, for report.json: file size, IR / opset, initializer counts and bytes per
element type, and Q/DQ nodes per quantized type with how their zero points are stated.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

from onnx import ModelProto
from qbuild_onnx_common.graph import opset, real_inputs
from qbuild_onnx_common.summary import describe_values, onnx_type_name

from ..graph.qdq import find_qdq


class ModelContents(TypedDict):
    """What :func:`model_summary` reports of every model."""

    ir_version: int
    opset: int | None
    nodes: int
    initializers_by_dtype: dict[str, int]
    initializer_bytes_by_dtype: dict[str, int]
    qdq_nodes_by_dtype: dict[str, dict[str, int]]
    zero_points: dict[str, int]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


class ModelSummary(ModelContents, total=False):
    """A model's contents, and its file size when it was read from a file."""

    bytes: int


def model_summary(model: ModelProto, path: str | Path | None = None) -> ModelSummary:
    """Deterministic summary of ``model`` (and of its file size when ``path`` is given)."""
    counts: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for t in model.graph.initializer:
        counts[onnx_type_name(t.data_type)] += 1
        nbytes[onnx_type_name(t.data_type)] += t.ByteSize()
    qdq: dict[str, Counter[str]] = {"QuantizeLinear": Counter(), "DequantizeLinear": Counter()}
    zp: Counter[str] = Counter()
    for qn in find_qdq(model):
        qdq[qn.node.op_type][onnx_type_name(qn.qelem) if qn.qelem else "unknown"] += 1
        if qn.zp_name is None:
            zp["absent"] += 1
        else:
            zp["explicit"] += 1
        if qn.output_dtype:
            zp["output_dtype_attribute"] += 1
    out: ModelSummary = {
        "ir_version": model.ir_version,
        "opset": opset(model),
        "nodes": len(model.graph.node),
        "initializers_by_dtype": dict(sorted(counts.items())),
        "initializer_bytes_by_dtype": dict(sorted(nbytes.items())),
        "qdq_nodes_by_dtype": {k: dict(sorted(v.items())) for k, v in qdq.items()},
        "zero_points": dict(sorted(zp.items())),
        "inputs": describe_values(real_inputs(model)),
        "outputs": describe_values(model.graph.output),
    }
    if path is not None:
        out["bytes"] = os.path.getsize(path)
    return out
