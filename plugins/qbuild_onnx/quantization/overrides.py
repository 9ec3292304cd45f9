"""Checks of quantization options against a model, and per-tensor / per-node overrides.

Owns the translation of the user's ``tensor_overrides`` and ``node_overrides`` tables
(plain TOML values: type names, floats, ints) into onnxruntime's ``TensorQuantOverrides``
extra option (``QuantType`` members and numpy scalars), and the checks that every node or
tensor named in the options exists in the model, so that a typo is an error instead of a
silently ignored setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from qbuild_onnx_common.errors import OnnxError

from .options import FOUR_BIT, INT_TYPES

if TYPE_CHECKING:
    from onnxruntime.quantization.quant_utils import QuantType

_KEYS = frozenset({"quant_type", "scale", "zero_point", "symmetric", "reduce_range", "rmin",
                   "rmax", "axis", "convert"})
_CONVERT_KEYS = frozenset({"quant_type", "scale", "zero_point", "symmetric", "rmin", "rmax",
                           "recv_nodes"})
_NP_INT = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16}


def quant_type(name: str, where: str, attr: str) -> QuantType:
    """onnxruntime's ``QuantType`` member for a user-facing type name such as ``"int8"``."""
    from onnxruntime.quantization.quant_utils import QuantType

    members = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16,
               "uint16": QuantType.QUInt16, "int4": QuantType.QInt4, "uint4": QuantType.QUInt4}
    if name not in members:
        raise OnnxError(f"{where}: quant_type {name!r} is not one of {', '.join(INT_TYPES)}",
                            attr=attr)
    return members[name]


def check_nodes_exist(names: Iterable[str], model: onnx.ModelProto, attr: str) -> None:
    """Raise if a node named in ``attr`` is not in the model's main graph."""
    known = {n.name for n in model.graph.node}
    missing = sorted(set(names) - known)
    if missing:
        raise OnnxError(f"{attr}: no node named {', '.join(map(repr, missing))} in the model",
                            attr=attr)


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    names = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(o for o in node.output if o)
    return names


def _number(value: Any, where: str, attr: str, kind: type) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok:
        raise OnnxError(f"{where}: expected a number, got {value!r}", attr=attr)
    return value


def _convert_entry(entry: Any, where: str, attr: str, default_type: str, is_weight: bool,
                   keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise OnnxError(f"{where}: expected a table of override options, got {entry!r}",
                            attr=attr)
    unknown = sorted(set(entry) - keys)
    if unknown:
        raise OnnxError(f"{where}: unknown override option(s) {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(keys))}", attr=attr)
    if ("scale" in entry) != ("zero_point" in entry):
        raise OnnxError(f"{where}: give both 'scale' and 'zero_point', or neither",
                            attr=attr)
    if ("rmin" in entry) != ("rmax" in entry) and "axis" in entry:
        raise OnnxError(f"{where}: give both 'rmin' and 'rmax', or neither", attr=attr)
    out: dict[str, Any] = {}
    type_name = entry.get("quant_type", default_type)
    if "quant_type" in entry:
        if entry["quant_type"] in FOUR_BIT and not is_weight:
            raise OnnxError(f"{where}: 4-bit quant_type is for weights (initializers) only",
                                attr=attr)
        out["quant_type"] = quant_type(entry["quant_type"], where, attr)
    for key in ("symmetric", "reduce_range"):
        if key in entry:
            if not isinstance(entry[key], bool):
                raise OnnxError(f"{where}: {key} must be true or false", attr=attr)
            out[key] = entry[key]
    for key in ("rmin", "rmax", "scale"):
        if key in entry:
            out[key] = np.array(_number(entry[key], f"{where}.{key}", attr, float), np.float32)
    if "zero_point" in entry:
        zp = int(_number(entry["zero_point"], f"{where}.zero_point", attr, int))
        # Weights get their zero point cast by onnxruntime; activations need the numpy type.
        out["zero_point"] = zp if is_weight or type_name not in _NP_INT else \
            np.array(zp, _NP_INT[type_name])
    if "axis" in entry:
        out["axis"] = int(_number(entry["axis"], f"{where}.axis", attr, int))
    if "recv_nodes" in entry:
        nodes = entry["recv_nodes"]
        if not isinstance(nodes, (list, tuple)) or not all(isinstance(n, str) for n in nodes):
            raise OnnxError(f"{where}.recv_nodes must be a list of node names", attr=attr)
        out["recv_nodes"] = set(nodes)
    if "convert" in entry:
        if "quant_type" not in entry["convert"] if isinstance(entry["convert"], Mapping) else True:
            raise OnnxError(f"{where}.convert must be a table with a quant_type", attr=attr)
        out["convert"] = _convert_entry(entry["convert"], f"{where}.convert", attr,
                                        entry["convert"]["quant_type"], False, _CONVERT_KEYS)
    return out


def build_tensor_overrides(
    tensor_overrides: Mapping[str, Any],
    node_overrides: Mapping[str, Any],
    model: onnx.ModelProto,
    weight_type: str,
    activation_type: str,
) -> dict[str, list[dict[str, Any]]]:
    """onnxruntime's ``TensorQuantOverrides`` value for the user's override tables.

    ``tensor_overrides`` maps a tensor name to a table (per-tensor) or a list of tables
    (per-channel, the first holding ``axis``). ``node_overrides`` maps a node name to a
    table applied to every output tensor of that node.
    """
    initializers = {i.name for i in model.graph.initializer}
    tensors = _tensor_names(model)
    nodes = {n.name: n for n in model.graph.node if n.name}
    result: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(tensor_overrides):
        where = f"tensor_overrides.{name}"
        if name not in tensors:
            raise OnnxError(f"{where}: no tensor named {name!r} in the model",
                                attr="tensor_overrides")
        is_weight = name in initializers
        default = weight_type if is_weight else activation_type
        value = tensor_overrides[name]
        entries = list(value) if isinstance(value, (list, tuple)) else [value]
        if not entries:
            raise OnnxError(f"{where}: empty list of overrides", attr="tensor_overrides")
        result[name] = [
            _convert_entry(e, f"{where}[{i}]" if len(entries) > 1 else where,
                           "tensor_overrides", default, is_weight, _KEYS)
            for i, e in enumerate(entries)
        ]
    for node_name in sorted(node_overrides):
        where = f"node_overrides.{node_name}"
        if node_name not in nodes:
            raise OnnxError(f"{where}: no node named {node_name!r} in the model",
                                attr="node_overrides")
        for out_name in nodes[node_name].output:
            if not out_name:
                continue
            if out_name in result:
                raise OnnxError(
                    f"{where}: output tensor {out_name!r} also has tensor_overrides; set it in "
                    f"one place", attr="node_overrides")
            result[out_name] = [_convert_entry(node_overrides[node_name], where,
                                               "node_overrides", activation_type, False, _KEYS)]
    return result
