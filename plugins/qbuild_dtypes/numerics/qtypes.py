"""Quantized element types: their ranges, the opset and IR version that introduced them, and
encoding to / decoding from TensorProto (sub-byte types packed as the ONNX spec requires).

Quantized values are handled in numpy as int32 arrays for the integer types and as float32
arrays holding exactly representable values for the float8 types; only this module knows
about packing and ml_dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from onnx import TensorProto
from qbuild_onnx_common.errors import OnnxError
from qbuild_onnx_common.summary import onnx_type_name

# Quantized values as numpy holds them: int32 codes (integer types) or float32 values on
# the float8 / float4 grid (float types).
QValues = npt.NDArray[np.int32] | npt.NDArray[np.float32]


@dataclass(frozen=True)
class QType:
    """One quantized element type as QuantizeLinear / DequantizeLinear see it."""

    name: str  # canonical lower-case name used in BUILD.toml, e.g. "int4", "float8e4m3fn"
    onnx: int  # TensorProto enum value
    kind: str  # "int" or "float"
    bits: int
    qmin: float  # integer range, or -max finite for float types
    qmax: float
    min_opset: int  # first ai.onnx opset whose QuantizeLinear / DequantizeLinear accepts it
    min_ir: int  # first IR version that defines the element type

    @property
    def signed(self) -> bool:
        return self.qmin < 0

    @property
    def packed(self) -> bool:
        return self.bits < 8


def _opt(name: str) -> int | None:
    return getattr(TensorProto, name, None)


_TABLE = [
    QType("uint8", TensorProto.UINT8, "int", 8, 0, 255, 10, 3),
    QType("int8", TensorProto.INT8, "int", 8, -128, 127, 10, 3),
    QType("uint16", TensorProto.UINT16, "int", 16, 0, 65535, 21, 3),
    QType("int16", TensorProto.INT16, "int", 16, -32768, 32767, 21, 3),
    QType("uint4", TensorProto.UINT4, "int", 4, 0, 15, 21, 10),
    QType("int4", TensorProto.INT4, "int", 4, -8, 7, 21, 10),
    QType("uint2", TensorProto.UINT2, "int", 2, 0, 3, 25, 13),
    QType("int2", TensorProto.INT2, "int", 2, -2, 1, 25, 13),
    QType("float8e4m3fn", TensorProto.FLOAT8E4M3FN, "float", 8, -448.0, 448.0, 19, 9),
    QType("float8e4m3fnuz", TensorProto.FLOAT8E4M3FNUZ, "float", 8, -240.0, 240.0, 19, 9),
    QType("float8e5m2", TensorProto.FLOAT8E5M2, "float", 8, -57344.0, 57344.0, 19, 9),
    QType("float8e5m2fnuz", TensorProto.FLOAT8E5M2FNUZ, "float", 8, -57344.0, 57344.0, 19, 9),
    QType("float4e2m1", TensorProto.FLOAT4E2M1, "float", 4, -6.0, 6.0, 23, 11),
]
QTYPES: dict[str, QType] = {q.name: q for q in _TABLE}
_BY_ENUM: dict[int, QType] = {q.onnx: q for q in _TABLE}

# IR version that introduced each element type (onnx.proto's Version comments).
_TYPE_MIN_IR: dict[int, int] = {TensorProto.BFLOAT16: 4}
_TYPE_MIN_IR.update({q.onnx: q.min_ir for q in _TABLE})
for _name, _ir in (("FLOAT8E8M0", 12), ("FLOAT6E2M3", 14), ("FLOAT6E3M2", 14)):
    _enum = _opt(_name)
    if _enum is not None:
        _TYPE_MIN_IR[_enum] = _ir

# Float types a scale may have, with the opset that first allows them.
SCALE_TYPES: dict[int, int] = {TensorProto.FLOAT: 10, TensorProto.FLOAT16: 19,
                               TensorProto.BFLOAT16: 19}


def qtype(name_or_enum: str | int, where: str = "dtype") -> QType:
    """Look a quantized type up by canonical name or TensorProto enum."""
    if isinstance(name_or_enum, int):
        q = _BY_ENUM.get(name_or_enum)
        if q is None:
            raise OnnxError(f"{where}: {onnx_type_name(name_or_enum)} is not a quantized type")
        return q
    key = str(name_or_enum).lower().replace("_", "")
    if key not in QTYPES:
        raise OnnxError(f"{where}: unknown dtype {name_or_enum!r}; "
                         f"expected one of {', '.join(QTYPES)}")
    return QTYPES[key]


def is_qtype(elem_type: int) -> bool:
    return elem_type in _BY_ENUM


def type_min_ir(elem_type: int) -> int:
    """Lowest IR version that defines ``elem_type`` (3 for the original types)."""
    return _TYPE_MIN_IR.get(elem_type, 3)


def _ml_dtype(q: QType) -> type[np.generic]:
    import ml_dtypes

    by_name: dict[str, type[np.generic]] = {
        "float8e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
        "float8e5m2": ml_dtypes.float8_e5m2,
        "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
        "float4e2m1": ml_dtypes.float4_e2m1fn,
    }
    return by_name[q.name]


def float_to_qfloat(values: npt.ArrayLike, q: QType,
                    saturate: bool = True) -> npt.NDArray[np.float32]:
    """Round float32 values to the float8/float4 grid (nearest, ties to even), returned as
    float32. With ``saturate`` out-of-range values clamp to ±max finite (NaN stays NaN)."""
    v = np.asarray(values, dtype=np.float32)
    if saturate:
        v = np.clip(v, q.qmin, q.qmax)
    return v.astype(_ml_dtype(q)).astype(np.float32)


def _pack(codes: npt.NDArray[np.integer[Any]], bits: int) -> bytes:
    """Pack unsigned codes (< 2**bits) little-end first: element i sits at bit offset
    (i % per_byte) * bits of byte i // per_byte; the last byte is zero-padded."""
    per = 8 // bits
    flat = codes.reshape(-1).astype(np.uint8)
    pad = (-flat.size) % per
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, np.uint8)])
    groups = flat.reshape(-1, per)
    out = np.zeros(groups.shape[0], np.uint8)
    for i in range(per):
        out |= (groups[:, i] & ((1 << bits) - 1)) << (i * bits)
    return out.tobytes()


def _unpack(raw: bytes, bits: int, count: int, signed: bool) -> npt.NDArray[np.int32]:
    per = 8 // bits
    b = np.frombuffer(raw, dtype=np.uint8)
    mask = (1 << bits) - 1
    codes = np.stack([(b >> (i * bits)) & mask for i in range(per)], axis=1).reshape(-1)
    codes = codes[:count].astype(np.int32)
    if signed:
        codes = np.where(codes >= (1 << (bits - 1)), codes - (1 << bits), codes)
    return codes


def make_qtensor(name: str, q: QType, values: npt.ArrayLike) -> TensorProto:
    """A TensorProto of type ``q`` from quantized values (ints, or float8-grid floats)."""
    array = np.asarray(values)
    t = TensorProto(name=name, data_type=q.onnx, dims=list(array.shape))
    if q.kind == "float":
        grid = float_to_qfloat(array, q, saturate=False)
        if q.packed:
            codes = grid.astype(_ml_dtype(q)).view(np.uint8) & 0x0F
            t.raw_data = _pack(codes, q.bits)
        else:
            t.raw_data = grid.astype(_ml_dtype(q)).tobytes()
        return t
    ints = array.astype(np.int64)
    if ints.size and (ints.min() < q.qmin or ints.max() > q.qmax):
        raise OnnxError(f"tensor {name!r}: values outside the {q.name} range "
                         f"[{int(q.qmin)}, {int(q.qmax)}]")
    if q.packed:
        t.raw_data = _pack(ints & ((1 << q.bits) - 1), q.bits)
    else:
        np_type = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16,
                   "int16": np.int16}[q.name]
        t.raw_data = ints.astype(np_type).tobytes()
    return t


def qtensor_values(t: TensorProto) -> QValues:
    """Values of a quantized TensorProto: int32 for integer types, float32 for float types.

    Reads raw_data (packed for sub-byte types) and the int32_data fallback that older writers
    (and the ONNX node tests) use.
    """
    from onnx import numpy_helper

    q = qtype(t.data_type, where=f"tensor {t.name!r}")
    count = int(np.prod(t.dims)) if len(t.dims) else 1
    shape = tuple(t.dims)
    if q.packed and t.HasField("raw_data"):
        if q.kind == "int":
            return _unpack(t.raw_data, q.bits, count, q.signed).reshape(shape)
        codes = _unpack(t.raw_data, q.bits, count, False).astype(np.uint8)
        return codes.view(_ml_dtype(q)).astype(np.float32).reshape(shape)
    arr = numpy_helper.to_array(t)
    if q.kind == "float":
        return arr.astype(np.float32)
    return arr.astype(np.int32)
