"""Blocked low-bit weights (4 bits by default) for MatMul with onnxruntime's
``MatMulNBitsQuantizer`` (``onnxruntime.quantization.matmul_nbits_quantizer``).

Algorithms, as onnxruntime ships them:

* ``rtn``: round to nearest per block, onnxruntime's C++ kernel ("DEFAULT"); 2, 4 or 8
  bits, symmetric or not, ``MatMulNBits`` (QOperator) or DequantizeLinear -> MatMul
  (QDQ, opset 21 int4);
* ``gptq``: GPTQ (Frantar et al., 2023) through onnxruntime's bundled copy of Intel Neural
  Compressor's weight-only code, numpy only; needs a dataset (and torch for models with
  more than one input); 4 bits, QOperator;
* ``k_quant``: the k-quant scheme of the same code; 4 bits, QOperator;
* ``hqq``: half-quadratic quantization; onnxruntime implements it with torch, so it works
  only where torch is installed (qbuild does not depend on torch).

The weights of MatMuls whose second input is a 2-D initializer are quantized in blocks
of ``block_size`` along K. Models over 2 GB are read and written with external data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qbuild_onnx_common.models import load_model

if TYPE_CHECKING:
    from onnxruntime.quantization.calibrate import CalibrationDataReader

ALGORITHMS = ("rtn", "gptq", "k_quant", "hqq")
FORMATS = ("qoperator", "qdq")
_MAX_PROTO = 2**31 - 1


class Int4Error(ValueError):
    """Options or a model the MatMulNBits quantizer cannot work with."""

    def __init__(self, message: str, attr: str | None = None) -> None:
        super().__init__(message)
        self.attr = attr


def check_options(algorithm: str, bits: int, block_size: int, quant_format: str,
                  accuracy_level: int, has_data: bool) -> None:
    if algorithm not in ALGORITHMS:
        raise Int4Error(f"algorithm = {algorithm!r}: expected one of {', '.join(ALGORITHMS)}",
                        "algorithm")
    if bits not in (2, 4, 8):
        raise Int4Error(f"bits = {bits}: expected 2, 4 or 8", "bits")
    if algorithm != "rtn" and bits != 4:
        raise Int4Error(f"bits = {bits}: algorithm {algorithm!r} makes 4-bit weights only "
                        "(use algorithm = \"rtn\" for 2 or 8 bits)", "bits")
    if block_size < 16 or block_size & (block_size - 1):
        raise Int4Error(f"block_size = {block_size}: expected a power of two >= 16",
                        "block_size")
    if quant_format not in FORMATS:
        raise Int4Error(f"format = {quant_format!r}: expected one of {', '.join(FORMATS)}",
                        "format")
    if quant_format == "qdq" and algorithm != "rtn":
        raise Int4Error(f"format = \"qdq\": onnxruntime's {algorithm} writes MatMulNBits only "
                        "(format = \"qoperator\")", "format")
    if not 0 <= accuracy_level <= 4:
        raise Int4Error(f"accuracy_level = {accuracy_level}: expected 0 (unset) to 4",
                        "accuracy_level")
    if algorithm == "gptq" and not has_data:
        raise Int4Error("algorithm = \"gptq\" needs calibration samples: set dataset",
                        "dataset")


def _reader(feeds: Sequence[Mapping[str, Any]]) -> CalibrationDataReader:
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    # onnxruntime ships no type information: its base class is Any to mypy
    class _Feeds(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self, items: Sequence[Mapping[str, Any]]) -> None:
            self.items = list(items)
            self.pos = 0

        def get_next(self) -> dict[str, Any] | None:
            if self.pos >= len(self.items):
                return None
            self.pos += 1
            return dict(self.items[self.pos - 1])

        def __iter__(self) -> Iterator[Any]:
            # onnxruntime's GPTQ path iterates a deep copy; it converts dict samples with a
            # helper that imports torch, but takes a bare array for a one-input model.
            return iter([next(iter(f.values())) for f in self.items])

        def __len__(self) -> int:
            return len(self.items)

    return _Feeds(feeds)


def quantize_int4(model_path: Path, out_path: Path, *, algorithm: str = "rtn", bits: int = 4,
                  block_size: int = 128, symmetric: bool = True, accuracy_level: int = 0,
                  quant_format: str = "qoperator", nodes_to_exclude: Iterable[str] = (),
                  feeds: Sequence[Mapping[str, Any]] | None = None,
                  external_data: bool = False, log: Callable[[str], None] | None = None
                  ) -> dict[str, Any]:
    """Quantize ``model_path``'s MatMul weights into ``out_path``; return a report."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb
    from onnxruntime.quantization.quant_utils import QuantFormat

    log = log or (lambda _m: None)
    check_options(algorithm, bits, block_size, quant_format, accuracy_level, feeds is not None)
    if algorithm == "hqq":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise Int4Error("algorithm = \"hqq\": onnxruntime's HQQ quantizer needs torch, "
                            "which is not installed; use \"rtn\" or \"gptq\"",
                            "algorithm") from None
    if algorithm == "gptq" and feeds and len(feeds[0]) != 1:
        raise Int4Error("algorithm = \"gptq\": onnxruntime's GPTQ needs torch for models "
                        "with more than one input (torch is not installed); use \"rtn\"",
                        "algorithm")
    model = load_model(model_path)  # with its external data, once
    before = sum(1 for n in model.graph.node if n.op_type == "MatMul")
    fmt = QuantFormat.QDQ if quant_format == "qdq" else QuantFormat.QOperator
    level = accuracy_level or None
    if algorithm == "rtn":
        config: Any = mnb.DefaultWeightOnlyQuantConfig(
            block_size=block_size, is_symmetric=symmetric, accuracy_level=level,
            quant_format=fmt, bits=bits)
    elif algorithm == "gptq":
        assert feeds is not None  # check_options refuses gptq without samples
        config = mnb.GPTQWeightOnlyQuantConfig(calibration_data_reader=_reader(feeds),
                                               block_size=block_size)
    elif algorithm == "k_quant":
        config = mnb.KQuantWeightOnlyQuantConfig()
    else:
        config = mnb.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
    quantizer = mnb.MatMulNBitsQuantizer(
        model, bits=bits, block_size=block_size, is_symmetric=symmetric,
        accuracy_level=level, nodes_to_exclude=list(nodes_to_exclude), quant_format=fmt,
        algo_config=config)
    del model
    quantizer.process()
    result = quantizer.model
    proto = result.model if hasattr(result, "model") else result
    after: dict[str, int] = {}
    for n in proto.graph.node:
        after[n.op_type] = after.get(n.op_type, 0) + 1
    out_path = Path(out_path)
    data_name = out_path.name + ".data"
    if external_data or proto.ByteSize() > _MAX_PROTO:
        if not external_data:
            raise Int4Error("the quantized model is over 2 GB: set external_data = true",
                            "external_data")
        onnx.save(proto, str(out_path), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
        if not (out_path.parent / data_name).exists():
            (out_path.parent / data_name).write_bytes(b"")
    else:
        onnx.save(proto, str(out_path))
    quantized = (after.get("MatMulNBits", 0) if quant_format == "qoperator"
                 else after.get("DequantizeLinear", 0))
    log(f"{algorithm}: {quantized} of {before} MatMul(s) quantized to {bits} bits, "
        f"block {block_size}")
    return {"algorithm": algorithm, "bits": bits, "block_size": block_size,
            "symmetric": symmetric, "accuracy_level": accuracy_level, "format": quant_format,
            "matmuls": before, "quantized_matmuls": quantized,
            "op_counts": dict(sorted(after.items()))}
