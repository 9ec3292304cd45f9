"""A bound on what a rule allocates for a size that a model (or a dataset manifest)
only declares.

A model file is data, not a promise: a declared input of 100000 x 100000, a
ConstantOfShape or Expand to such a shape, a MatMul whose output is an outer product
each ask numpy or onnxruntime for tens of gigabytes from a few hundred bytes of file (a
``MemoryError`` traceback at best, the machine's out-of-memory killer at worst). So
every place a built-in rule allocates from such a size asks here first, and a tensor
over the bound is refused in one line naming it, its shape and the size
(``AllocationRefused``, an ``OnnxError``):

- ``check_shape``: one array about to be made from a declared shape (generated feeds,
  synthetic samples, a batch read from a dataset, an initializer built from an
  attribute);
- ``check_model``: every tensor of a model whose size shape inference can tell before
  anything runs (inputs, outputs, every node's outputs, in subgraphs too), checked
  before onnxruntime or onnx's reference evaluator is given the model. A tensor whose
  size depends on a symbolic dimension is not known until a feed is: that is checked
  where the feed is made.

The bound is per tensor: ``QBUILD_MAX_TENSOR_BYTES`` (bytes, or with a unit: ``512MB``,
``8GB``, ``1TB``, powers of 1024; ``none`` turns the check off); by default the smaller
of 4 GB and half the machine's physical memory. It only decides whether a rule refuses:
what a rule writes never depends on it, so it is in no key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import OnnxError

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto

ENV = "QBUILD_MAX_TENSOR_BYTES"
DEFAULT = 4 << 30
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
# bytes per element of the ONNX element types (TensorProto.DataType); 4-bit and 2-bit
# types are counted as a byte (an upper bound), strings as 8 (the pointer, at least)
_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 8: 8, 9: 1, 10: 2, 11: 8, 12: 4,
             13: 8, 14: 8, 15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1,
             23: 1, 24: 1, 25: 1, 26: 1}
_checked: dict[tuple[Any, ...], None] = {}  # model files that passed, by identity and bound


class AllocationRefused(OnnxError):
    """A tensor larger than the bound, refused before it is allocated."""


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def limit() -> int | None:
    """The bound in bytes (None: no bound), from ``QBUILD_MAX_TENSOR_BYTES`` or the
    default. A value that is not a size is an ``OnnxError`` naming the variable."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        memory = physical_memory()
        return DEFAULT if memory is None else min(DEFAULT, memory // 2)
    if text.lower() in ("none", "off", "unlimited"):
        return None
    found = _SIZE.match(text)
    unit = found.group(2).upper() if found else ""
    if found is None or unit not in _UNITS:
        raise OnnxError(f"{ENV}={text!r} is not a size (examples: 8GB, 512MB, "
                        "1073741824, none)")
    return int(float(found.group(1)) * _UNITS[unit])


def human(size: int) -> str:
    """``80000000000`` -> ``74.5 GB`` (powers of 1024, as qbuild prints sizes)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if value < 1024 or unit == "PB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def element_count(shape: Iterable[int]) -> int:
    """The number of elements of ``shape``, in Python integers (never overflows)."""
    count = 1
    for d in shape:
        count *= max(0, int(d))
    return count


def refuse(what: str, size: int, *, file: str | Path | None = None) -> None:
    """Raise ``AllocationRefused`` if ``size`` bytes for ``what`` exceed the bound."""
    bound = limit()
    if bound is not None and size > bound:
        raise AllocationRefused(f"{what} would allocate {human(size)} (limit "
                                f"{human(bound)}; {ENV} raises it)", file=file)


def check_shape(what: str, shape: Sequence[int], dtype: Any, *,
                file: str | Path | None = None) -> None:
    """Refuse making an array of ``shape`` and ``dtype`` (a numpy dtype, or anything
    ``numpy.dtype`` takes) above the bound; ``what`` names it ("input 'x'")."""
    import numpy as np

    dt = np.dtype(dtype)
    size = element_count(shape) * max(1, dt.itemsize)
    refuse(f"{what} ({dt.name} {shape_text(shape)})", size, file=file)


def check_arrays(what: str, shapes: Mapping[str, tuple[Any, Sequence[int]]], *,
                 file: str | Path | None = None) -> None:
    """``check_shape`` for each array of one feed (name -> (dtype, shape)), and for
    the feed as a whole (its arrays are held together)."""
    import numpy as np

    total = 0
    for name, (dtype, shape) in shapes.items():
        check_shape(f"{what} '{name}'", shape, dtype, file=file)
        total += element_count(shape) * max(1, np.dtype(dtype).itemsize)
    if len(shapes) > 1:
        refuse(f"{what}s {', '.join(repr(n) for n in shapes)} together", total, file=file)


def check_model(model: str | Path | bytes | ModelProto, *, what: str | None = None,
                inputs: Mapping[str, Sequence[int]] | None = None) -> None:
    """Refuse a model with a tensor over the bound whose size is known before it runs
    (static shapes after ONNX shape inference with data propagation, on a copy without
    its large weights). ``inputs`` gives the shapes of the feeds it will be run with
    (input name -> shape), so sizes that follow a symbolic dimension are known too. The
    error names the model file (for a path), the node and the tensor. A model file that
    passed is not inferred again in this process while it is unchanged. A model shape
    inference cannot read is let through: whoever loads it reports that."""
    bound = limit()
    if bound is None:
        return
    path = Path(model) if isinstance(model, (str, Path)) else None
    fed = {name: tuple(int(d) for d in shape) for name, shape in (inputs or {}).items()}
    memo: tuple[Any, ...] | None = None
    if path is not None:
        try:
            st = path.stat()
        except OSError:
            return  # (the loader says the file is missing)
        memo = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, bound,
                tuple(sorted(fed.items())))
        if memo in _checked:
            return
    found = _largest_over(model, bound, fed)
    if found is not None:
        size, described = found
        name = what or ("" if path is not None else "the model")  # (a path is the file)
        refuse(f"{name}: {described}" if name else described, size, file=path)
    if memo is not None:
        _checked[memo] = None


def _largest_over(model: str | Path | bytes | ModelProto, bound: int,
                  fed: Mapping[str, tuple[int, ...]]) -> tuple[int, str] | None:
    """(bytes, description) of the first tensor (inputs first, then nodes in graph
    order) over ``bound``, or None."""
    import onnx

    from .models import load_model, weightless

    try:
        if isinstance(model, (str, Path)):
            lean = _strip(load_model(model, external_data=False))
        elif isinstance(model, bytes):
            lean = _strip(onnx.load_from_string(model))
        else:
            lean = weightless(model)  # (the caller's model is not ours to change)
        for value in lean.graph.input:
            shape = fed.get(value.name)
            dims = value.type.tensor_type.shape.dim
            if shape is not None and len(shape) == len(dims):
                for dim, size in zip(dims, shape):
                    dim.Clear()
                    dim.dim_value = size
        inferred = onnx.shape_inference.infer_shapes(lean, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises several types for models it cannot read
        return None
    return _scan(inferred.graph, bound)


def _strip(model: ModelProto) -> ModelProto:
    """``model`` (a copy of our own) with its large initializers reduced to name, type
    and dims in place (small ones, e.g. the shape constants inference reads, stay)."""
    import onnx

    from .models import SMALL

    for t in model.graph.initializer:
        if (t.data_location != onnx.TensorProto.EXTERNAL and
                element_count(t.dims) * _ITEMSIZE.get(t.data_type, 8) > SMALL):
            t.CopyFrom(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
    return model


def _static_size(value: Any) -> tuple[int, list[int]]:
    """(bytes, shape) of a typed value; 0 bytes unless every dimension is known (an
    unknown dimension reads as 0)."""
    tt = value.type.tensor_type
    dims = [d.dim_value for d in tt.shape.dim]
    # (a negative dimension, which no valid model has, makes the size negative: that
    # tensor is for onnxruntime to refuse)
    return math.prod(dims) * _ITEMSIZE.get(tt.elem_type, 8), dims


def _type_name(value: Any) -> str:
    import onnx

    elem = value.type.tensor_type.elem_type
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem).name)
    except (KeyError, ValueError, TypeError):
        return str(onnx.TensorProto.DataType.Name(elem)).lower()


_SUBGRAPH_OPS = frozenset(("If", "Loop", "Scan", "SequenceMap"))


def _scan(graph: GraphProto, bound: int) -> tuple[int, str] | None:
    initializers = {t.name for t in graph.initializer}
    for value in graph.input:
        size, dims = _static_size(value)
        if size > bound and value.name not in initializers:
            return size, f"input '{value.name}' ({_type_name(value)} {shape_text(dims)})"
    over: dict[str, tuple[int, list[int], Any]] = {}
    for value in (*graph.value_info, *graph.output):
        size, dims = _static_size(value)
        if size > bound:
            over.setdefault(value.name, (size, dims, value))
    for node in graph.node if over else ():
        for output in node.output:
            if output in over:
                size, dims, value = over[output]
                return size, (f"{node.op_type} node '{node.name or output}' (output "
                              f"'{output}': {_type_name(value)} {shape_text(dims)})")
    for node in graph.node:
        if node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            for attribute in node.attribute:
                for sub in (*([attribute.g] if attribute.HasField("g") else []),
                            *attribute.graphs):
                    found = _scan(sub, bound)
                    if found is not None:
                        return found
    return None


__all__ = ["DEFAULT", "ENV", "AllocationRefused", "check_arrays", "check_model",
           "check_shape", "element_count", "human", "limit", "physical_memory", "refuse"]
