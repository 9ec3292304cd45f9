"""Describing a model for dependents and reports: its IR version, opsets, real inputs and
outputs (name, element type, shape) and node count; deterministic, free of paths. onnx
is imported inside the functions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .graph import real_inputs

if TYPE_CHECKING:
    from onnx import ModelProto, ValueInfoProto

DEFAULT_DOMAIN = "ai.onnx"
# TensorProto element types whose numpy name differs from the lower-cased ONNX name.
_NUMPY_NAMES = {1: "float32", 11: "float64", 10: "float16", 14: "complex64",
                15: "complex128"}


def onnx_type_name(elem_type: int) -> str:
    """A TensorProto element type by its ONNX name ("FLOAT", "INT4")."""
    from onnx import TensorProto

    try:
        return str(TensorProto.DataType.Name(elem_type))
    except ValueError:
        return f"type#{elem_type}"


def numpy_type_name(elem_type: int) -> str:
    """A TensorProto element type by its numpy name where numpy has one ("float32",
    "int8", "bool"), else its ONNX name in lower case ("bfloat16", "int4")."""
    return _NUMPY_NAMES.get(elem_type) or onnx_type_name(elem_type).lower()


def value_shape(value: ValueInfoProto) -> list[int | str | None] | None:
    """Dimensions of a tensor value (int, symbolic name, or None); None without a shape."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim]


def describe_value(value: ValueInfoProto, numpy_names: bool = False) -> dict[str, Any]:
    """Name, dtype and shape of one graph input or output (non-tensors: dtype and shape
    None, and ``kind`` naming what it is)."""
    entry: dict[str, Any] = {"name": value.name}
    if not value.type.HasField("tensor_type"):
        entry.update(dtype=None, shape=None, kind=value.type.WhichOneof("value"))
        return entry
    elem = value.type.tensor_type.elem_type
    name = numpy_type_name if numpy_names else onnx_type_name
    entry["dtype"] = name(elem) if elem else None
    entry["shape"] = value_shape(value)
    return entry


def describe_values(values: Iterable[ValueInfoProto], numpy_names: bool = False
                    ) -> list[dict[str, Any]]:
    """``describe_value`` of each, in graph order."""
    return [describe_value(v, numpy_names) for v in values]


def model_info(model: ModelProto) -> dict[str, Any]:
    """IR version, opsets (by domain), producer, real inputs and outputs (numpy dtype
    names), and node count of a model."""
    opsets = {imp.domain or DEFAULT_DOMAIN: int(imp.version) for imp in model.opset_import}
    return {
        "ir_version": int(model.ir_version),
        "opset": opsets.get(DEFAULT_DOMAIN),
        "opsets": dict(sorted(opsets.items())),
        "producer": model.producer_name,
        "inputs": describe_values(real_inputs(model), numpy_names=True),
        "outputs": describe_values(model.graph.output, numpy_names=True),
        "num_nodes": len(model.graph.node),
    }
